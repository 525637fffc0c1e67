"""`export`: a run's model as a deployable artifact (use/artifacts.py), verified before it is kept.

Verification runs the artifact, loaded back from its files, on a held-out batch of the run's own
data given raw (as the data source gives samples), and compares its outputs with the eager model
fed the same samples as training preprocessed them (use/held_out.py). It checks the whole batch and
a batch of one (the dynamic batch dimension), and for a language model a shorter sequence too. It
passes when max|artifact − eager| <= atol + rtol · max|eager|; the figures go into export.json:

- safetensors: bitwise (atol = rtol = 0): the same weights and preprocessing, the same kernels;
- pt2, its AOTInductor package, and onnx (run by ONNX Runtime): atol = rtol = 1e-4 by default, room
  for fused and reordered fp32 arithmetic, far below any change of a weight.

A failed verification is a RunError (exit 1); export.json says by how much, and the artifact stays
for inspection.

export.json records every written file's checksum, and each file is checked against it before it is
loaded, here and wherever an export folder is read (use/export_files.py: only what this export wrote
is loaded; its AOTInductor package, native code, from a private copy of the checked bytes).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gputrain.errors import RunError, UsageError, first_line
from gputrain.run.files import write_json
from gputrain.run.layout import EXPORT, EXPORT_RECORD
from gputrain.run.output import Owner, check_output_folder, json_record, make_folder, marked, read_json
from gputrain.use import artifacts
from gputrain.use.artifacts import AOTI_PACKAGE, FORMATS, ONNX_OPSET, Runner, files_read
from gputrain.use.export_files import check_files, check_native_owners, native_copy, read_record, record_checksums
from gputrain.use.extras import EXPORT_EXTRA, require_export_extra
from gputrain.use.held_out import HeldOut, example_pair, held_out_batch
from gputrain.use.loaded import LoadedRun, load_run

log = logging.getLogger("gputrain")

TOLERANCES = {"safetensors": (0.0, 0.0), "pt2": (1e-4, 1e-4), "pt2-aoti": (1e-4, 1e-4), "onnx": (1e-4, 1e-4)}
"""(atol, rtol) of each artifact's verification (module docstring)."""
VERIFY_SAMPLES = 32
_EXPORT_RECORD = json_record("export", "format", "files", "run_dir", "verification")


@dataclass(frozen=True, slots=True)
class ExportOptions:
    fmt: str
    out: Path | None = None
    checkpoint: str = "final"
    device: str = "cpu"
    aoti: str = "auto"
    """pt2: also AOTInductor-compile: on, off, or auto (try; a failure is recorded, not fatal)."""
    atol: float | None = None
    rtol: float | None = None
    samples: int = VERIFY_SAMPLES


def default_out(run_dir: Path, fmt: str) -> Path:
    """Where an export goes without -o: RUN_DIR/export/FORMAT."""
    return run_dir / EXPORT / fmt


def is_export_folder(folder: Path) -> bool:
    """Whether `folder` is an export gputrain wrote: its export.json, and only the files that lists
    (run/output.py: an export is written into nothing else but a new or empty folder)."""
    if not _EXPORT_RECORD(folder / EXPORT_RECORD):
        return False
    files = read_json(folder / EXPORT_RECORD).get("files")
    if not isinstance(files, list) or not all(isinstance(f, str) and Path(f).name == f for f in files):
        return False
    try:
        return {p.name for p in folder.iterdir()} <= {*files, EXPORT_RECORD}
    except OSError:
        return False


def _out_folder(out: Path | None, run_dir: Path, fmt: str, inputs: list[str | Path | None]) -> Path:
    """The export's folder, checked before any work (run/output.py): -o, or RUN_DIR/export/FORMAT."""
    owner = Owner.of(runs=[run_dir], designated=[f"{EXPORT}/*"], inputs=inputs)
    option = "-o" if out is not None else "-o (default)"
    return check_output_folder(out if out is not None else default_out(run_dir, fmt), option, owner, is_export_folder)


def export_run(run_dir: str | Path, options: ExportOptions) -> dict[str, Any]:
    """Export and verify; return export.json's content.

    Raises:
        UsageError: a format this model cannot take (why, and which can), a missing extra, bad run.
        RunError: the artifact does not reproduce the model within the tolerance.
    """
    fmt = options.fmt
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: choose from {', '.join(FORMATS)}")
    if fmt == "onnx":
        require_export_extra("--format onnx")
    loaded = load_run(run_dir, checkpoint=options.checkpoint, device=options.device)
    data = loaded.config.data
    out = _out_folder(options.out, loaded.run_dir, fmt, [loaded.weights.path, data.path, data.val_path])
    make_folder(out, "-o")
    held = held_out_batch(loaded, options.samples)
    served = loaded.served()
    example = example_pair(held.raw).to(loaded.device)
    files: list[str]
    extra: dict[str, Any] = {}
    if fmt == "safetensors":
        files = artifacts.write_safetensors(loaded.run_dir, served, loaded.data.spec, out)
    elif fmt == "pt2":
        program = artifacts.export_program(served, example, loaded.pre)
        files = artifacts.write_pt2(program, out)
        extra["aoti"] = _aoti(program, out, options.aoti, files)
    else:
        files = artifacts.write_onnx(served, example, loaded.pre, out)
        extra["opset"] = ONNX_OPSET
    write_json(out / "preprocess.json", loaded.pre.to_dict())
    if loaded.tokenizer is not None:  # beside the model, so the export speaks text as the run does
        tokenizer_files = loaded.tokenizer.write_files(out)
        files = [*files, *tokenizer_files]
        extra["tokenizer"] = {"kind": loaded.tokenizer.kind, "hash": loaded.tokenizer.hash, "files": tokenizer_files}
    record = {
        "format": fmt,
        "files": files,
        "run_dir": str(loaded.run_dir.resolve()),  # export.json is read from elsewhere (--verify-only)
        "weights": {**loaded.weights.to_dict(), "path": str(loaded.weights.path.resolve())},
        "device": str(loaded.device),
        "input": loaded.pre.describe_input(),
        "output": _describe_output(loaded),
        "dynamic": ["batch", "seq"] if loaded.pre.task == "lm" else ["batch"],
        "precision": "fp32",
        "versions": _versions(fmt),
        **extra,
        **marked("export"),
        "checksums": record_checksums(out, files),
    }
    return _verified(out, record, loaded, held, options)


def verify_export(out: str | Path, options: ExportOptions) -> dict[str, Any]:
    """Verify an artifact already written to `out` (export.json names the run and weights it came from).

    Raises:
        UsageError: `out` holds no export.
        RunError: it no longer reproduces the model.
    """
    path = Path(out)
    record = read_record(path)
    if record.get("format") not in FORMATS:
        raise UsageError(f"{path / EXPORT_RECORD}: no export format recorded; export again")
    weights, device = record.get("weights"), record.get("device", "cpu")
    weights_path = weights.get("path") if isinstance(weights, dict) else None
    if not all(isinstance(text, str) for text in (record.get("run_dir"), weights_path, device)):
        raise UsageError(f"{path / EXPORT_RECORD}: no run_dir, weights.path or device recorded as text; export again")
    if record["format"] == "onnx":
        require_export_extra("verifying an ONNX export")
    # what would be loaded and run is this export's, checked first (use/export_files.py)
    aoti = record.get("aoti")
    native = [AOTI_PACKAGE] if isinstance(aoti, dict) and aoti.get("file") else []
    check_files(path, record, [*files_read(record["format"], path), *native])
    for name in native:
        check_native_owners(path, name)
    # export.json is rewritten with the new figures: only in an export folder of gputrain's own
    _out_folder(path, Path(str(record.get("run_dir"))), record["format"], [])
    loaded = load_run(record["run_dir"], checkpoint=str(weights_path), device=device)
    held = held_out_batch(loaded, options.samples)
    return _verified(path, record, loaded, held, options)


def _verified(
    out: Path, record: dict[str, Any], loaded: LoadedRun, held: HeldOut, options: ExportOptions
) -> dict[str, Any]:
    """Run every artifact of the export against the eager model; write export.json; raise if one fails.

    Raises:
        UntrustedFile: a file to load is not the one this export wrote (checked before anything loads).
    """
    fmt = record["format"]
    check_files(out, record, files_read(fmt, out))
    aoti = record.get("aoti")
    with contextlib.ExitStack() as stack:
        loaders: dict[str, Callable[[], tuple[Runner, str]]] = {}
        if fmt == "safetensors":
            loaders["safetensors"] = lambda: (artifacts.load_safetensors(out, loaded.device), "gputrain (eager)")
        elif fmt == "pt2":
            loaders["pt2"] = lambda: (artifacts.load_pt2(out, loaded.device), "torch.export ExportedProgram.module()")
            if isinstance(aoti, dict) and aoti.get("file"):
                package = stack.enter_context(native_copy(out, record, AOTI_PACKAGE))
                loaders["pt2-aoti"] = lambda: (artifacts.load_aoti(package, loaded.device), "AOTInductor")
        else:
            loaders["onnx"] = lambda: artifacts.load_onnx(out, loaded.device)
        checks = {name: _check(name, load, loaded, held, options) for name, load in loaders.items()}
    record["verification"] = {
        "split": held.split,
        "samples": len(held.raw),
        "rule": "max|artifact - eager| <= atol + rtol * max|eager|",
        "checks": checks,
        "passed": all(c["passed"] for c in checks.values()),
    }
    write_json(out / EXPORT_RECORD, {**record, **marked("export")})
    failed = [f"{name}: {_failure(c)}" for name, c in checks.items() if not c["passed"]]
    if failed:
        raise RunError(f"export verification failed ({'; '.join(failed)}); the figures: {out / EXPORT_RECORD}")
    return record


def _check(
    name: str, load: Callable[[], tuple[Runner, str]], loaded: LoadedRun, held: HeldOut, options: ExportOptions
) -> dict[str, Any]:
    atol, rtol = TOLERANCES[name]
    atol = options.atol if options.atol is not None else atol
    rtol = options.rtol if options.rtol is not None else rtol
    result: dict[str, Any] = {"atol": atol, "rtol": rtol}
    try:
        run, runtime = load()
        result["runtime"] = runtime
        worst_abs = worst_scale = 0.0
        shapes = []
        for raw, inputs in _probes(held, loaded.pre.task == "lm"):
            with torch.no_grad():
                eager = loaded.model(inputs.to(loaded.device)).float().cpu()
            got = run(raw)
            if got.shape != eager.shape:
                raise RunError(f"outputs of shape {list(got.shape)}, the model's are {list(eager.shape)}")
            diff = (got - eager).abs().max()
            # a NaN would slip through max(); any non-finite difference is infinitely wrong
            worst_abs = max(worst_abs, float(diff) if torch.isfinite(diff) else math.inf)
            worst_scale = max(worst_scale, float(eager.abs().max()))
            shapes.append(list(raw.shape))
    except Exception as err:  # noqa: BLE001 - an artifact that cannot even run fails its check
        return {**result, "passed": False, "error": first_line(err, 300)}
    result.update(
        batches=shapes,
        max_abs_diff=worst_abs,
        max_rel_diff=worst_abs / worst_scale if worst_scale else worst_abs,
        passed=worst_abs <= atol + rtol * worst_scale,
    )
    return result


def _probes(held: HeldOut, lm: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(raw, model inputs) pairs: the whole batch, one sample, and a shorter sequence for a language model."""
    probes = [(held.raw, held.model_inputs), (held.raw[:1], held.model_inputs[:1])]
    length = held.raw.shape[-1] if lm else 0
    if lm and length > 1:
        probes.append((held.raw[:, : length // 2], held.model_inputs[:, : length // 2]))
    return probes


def _failure(check: dict[str, Any]) -> str:
    if "error" in check:
        return f"it does not run ({check['error']})"
    return (
        f"max abs diff {check['max_abs_diff']:.3g} above atol {check['atol']:g} + rtol {check['rtol']:g} x max|eager|"
    )


def _aoti(program: torch.export.ExportedProgram, out: Path, mode: str, files: list[str]) -> dict[str, Any]:
    """AOTInductor-compile where asked or (auto) where it works here; what happened, for export.json."""
    stale = out / "model-aoti.pt2"
    stale.unlink(missing_ok=True)  # an earlier export's package would be verified against this one
    if mode == "off":
        return {"file": None, "skipped": "--aoti off"}
    try:
        name = artifacts.compile_aoti(program, out)
    except Exception as err:  # noqa: BLE001 - no compiler, an unsupported op: the ExportedProgram stands alone
        text = first_line(err, 300)
        if mode == "on":
            raise RunError(f"AOTInductor could not compile the exported program: {text}") from None
        log.warning("AOTInductor could not compile the exported program (%s); model.pt2 is exported alone", text)
        return {"file": None, "error": text}
    files.insert(1, name)
    return {"file": name}


def _describe_output(loaded: LoadedRun) -> dict[str, Any]:
    pre = loaded.pre
    if pre.task == "classification":
        return {
            "shape": ["batch", len(pre.class_names or ())],
            "meaning": "logits (softmax: probabilities)",
            "classes": list(pre.class_names or ()),
        }
    if pre.task == "regression":
        return {"shape": ["batch", loaded.data.spec.num_model_outputs], "meaning": "predicted values"}
    return {"shape": ["batch", "seq", pre.vocab_size], "meaning": "next-token logits"}


def _versions(fmt: str) -> dict[str, str]:
    versions = {"torch": str(torch.__version__)}
    if fmt == "onnx":
        for name in EXPORT_EXTRA:  # imported by name: optional and untyped
            versions[name] = str(getattr(importlib.import_module(name), "__version__", "?"))
    return versions
