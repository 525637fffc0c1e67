"""The export formats: how each artifact is written from the served model (the run's preprocessing
in front of its model, use/preprocess.py) and how it is loaded again to be run.

- `safetensors`: the weights (tied ones once), the run's config.toml and preprocess.json; loaded
  by building the model from that config and spec, as a deployment would.
- `pt2`: a `torch.export` ExportedProgram (`model.pt2`) and, where it compiles, its AOTInductor
  package (`model-aoti.pt2`, ahead-of-time compiled kernels for the export's device).
- `onnx`: the dynamo-based exporter's graph at opset ONNX_OPSET, run by ONNX Runtime.

Graphs take raw samples with a dynamic batch dimension (and a dynamic sequence length up to the
context, for language models), and are captured in fp32 and eval mode.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from gputrain.checkpoint.io import save_weights
from gputrain.config import load_config
from gputrain.data.spec import DataSpec
from gputrain.errors import UsageError, first_line
from gputrain.run.files import write_json, write_text
from gputrain.run.layout import CONFIG, FINAL_WEIGHTS
from gputrain.run.output import atomic
from gputrain.use.loaded import build_trained_model
from gputrain.use.preprocess import Preprocessing, ServedModel
from gputrain.use.run_dir import WeightsSource
from gputrain.use.safe_pt2 import load_aoti_package, load_program
from gputrain.use.weights import load_weights

FORMATS = ("safetensors", "pt2", "onnx")
ONNX_OPSET = 18
"""ONNX opset of the exported graph: what the dynamo exporter targets by default, and what ONNX
Runtime 1.16 and newer run."""
Runner = Callable[[torch.Tensor], torch.Tensor]
"""Runs an artifact: raw samples in (any device), the model's outputs out, on the host."""
SAFETENSORS_FILES = (FINAL_WEIGHTS, CONFIG, "spec.json", "preprocess.json")
AOTI_PACKAGE = "model-aoti.pt2"
ONNX_DATA = "model.onnx.data"
"""The weights of an ONNX graph over 2 GB, which the exporter saves beside it and ONNX Runtime reads."""


def files_read(fmt: str, out: Path) -> list[str]:
    """The files of the export folder `out` that loading format `fmt` reads (its AOTInductor package apart)."""
    if fmt == "onnx":
        return ["model.onnx", *([ONNX_DATA] if os.path.lexists(out / ONNX_DATA) else [])]
    return ["model.pt2"] if fmt == "pt2" else list(SAFETENSORS_FILES)


def dynamic_shapes(pre: Preprocessing) -> dict[str, dict[int, Any]]:
    """The served model's dynamic dimensions: the batch, and a language model's sequence length."""
    dims: dict[int, Any] = {0: torch.export.Dim("batch", min=1)}
    if pre.task == "lm":
        dims[1] = torch.export.Dim("seq", min=1, max=pre.input_shape[0])
    return {"x": dims}


def export_program(served: ServedModel, example: torch.Tensor, pre: Preprocessing) -> torch.export.ExportedProgram:
    """The served model captured by torch.export.

    Raises:
        UsageError: torch.export cannot capture it (saying why, and which format can).
    """
    try:
        with torch.no_grad():
            return torch.export.export(served, (example,), dynamic_shapes=dynamic_shapes(pre))
    except Exception as err:  # noqa: BLE001 - whatever the tracer meets is the model's property
        raise UsageError(
            f"torch.export cannot capture this model ({first_line(err, 300)}); "
            "--format safetensors can (weights + config)"
        ) from None


def write_safetensors(run_dir: Path, served: ServedModel, spec: DataSpec, out: Path) -> list[str]:
    save_weights(served.model, out / FINAL_WEIGHTS)
    write_text(out / CONFIG, (run_dir / CONFIG).read_text())
    write_json(out / "spec.json", _spec_dict(spec))
    return list(SAFETENSORS_FILES)


def load_safetensors(out: Path, device: torch.device) -> Runner:
    """The safetensors artifact as a deployment loads it: model built from its config and spec,
    weights and preprocessing from its files."""
    config = load_config(out / CONFIG)
    saved: dict[str, Any] = {
        k: tuple(v) if isinstance(v, list) else v for k, v in _read_json(out / "spec.json").items()
    }
    spec = DataSpec(**saved)
    model = build_trained_model(config.model, spec)
    load_weights(WeightsSource("path", out / FINAL_WEIGHTS, None), model)
    pre = Preprocessing.from_dict(_read_json(out / "preprocess.json"))
    return _module_runner(ServedModel(model, pre).to(device).eval(), device)


def write_pt2(program: torch.export.ExportedProgram, out: Path) -> list[str]:
    with atomic(out / "model.pt2") as tmp:  # every file of an export: whole, or the old one kept
        torch.export.save(program, tmp)
    return ["model.pt2", "preprocess.json"]


def load_pt2(out: Path, device: torch.device) -> Runner:
    """The ExportedProgram, read weights-only (use/safe_pt2.py: an export folder may come from anyone)."""
    return _module_runner(load_program(out / "model.pt2").module(), device)


def compile_aoti(program: torch.export.ExportedProgram, out: Path) -> str:
    """AOTInductor-compile the program into `model-aoti.pt2`; the file name."""
    import torch._inductor

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # torch's own deprecations, nothing the user can act on
        with atomic(out / AOTI_PACKAGE) as tmp:
            torch._inductor.aoti_compile_and_package(program, package_path=str(tmp))
    return AOTI_PACKAGE


def load_aoti(package: Path, device: torch.device) -> Runner:
    """The AOTInductor package at `package`: native code, so only a file this process compiled or one
    checked against its export's checksums (use/export_files.py's `native_copy`)."""
    return _module_runner(load_aoti_package(package), device)


def write_onnx(served: ServedModel, example: torch.Tensor, pre: Preprocessing, out: Path) -> list[str]:
    """The dynamo exporter's graph at ONNX_OPSET.

    Raises:
        UsageError: the exporter cannot translate this model (saying why, and which formats can).
    """
    try:
        with torch.no_grad(), _quiet_onnx_exporter():
            program = torch.onnx.export(
                served,
                (example,),
                dynamo=True,
                opset_version=ONNX_OPSET,
                dynamic_shapes=dynamic_shapes(pre),
                input_names=["x"],
                output_names=["outputs"],
            )
    except Exception as err:  # noqa: BLE001 - the exporter's failures are many kinds
        raise UsageError(
            f"ONNX (opset {ONNX_OPSET}) cannot export this model ({first_line(err, 300)}); "
            "--format pt2 or safetensors can"
        ) from None
    assert program is not None
    program.save(str(out / "model.onnx"))
    return [*files_read("onnx", out), "preprocess.json"]


def load_onnx(out: Path, device: torch.device, threads: int | None = None) -> tuple[Runner, str]:
    """(a runner, "onnxruntime <version> <provider>"): ONNX Runtime's CUDA provider for a CUDA device
    where it is installed, else its CPU provider, with `threads` intra-op threads (default: its own)."""
    ort = importlib.import_module("onnxruntime")  # untyped, and optional: the export extra
    wanted = "CUDAExecutionProvider" if device.type == "cuda" else "CPUExecutionProvider"
    provider = wanted if wanted in ort.get_available_providers() else "CPUExecutionProvider"
    settings = ort.SessionOptions()
    if threads is not None:
        settings.intra_op_num_threads = threads
    session = ort.InferenceSession(str(out / "model.onnx"), settings, providers=[provider])
    name = session.get_inputs()[0].name

    def run(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(session.run(None, {name: x.cpu().numpy()})[0]).float()

    return run, f"onnxruntime {ort.__version__} {provider}"


@contextlib.contextmanager
def _quiet_onnx_exporter() -> Iterator[None]:
    """The exporter prints its progress, logs the torchvision ops it skips and warns of deprecations:
    none of it is the user's business unless it fails, which its exception then says."""
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        exporter_log.setLevel(level)


def _module_runner(module: Callable[[torch.Tensor], torch.Tensor], device: torch.device) -> Runner:
    def run(x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return module(x.to(device)).float().cpu()

    return run


def _spec_dict(spec: DataSpec) -> dict[str, Any]:
    return {field: getattr(spec, field) for field in spec.__dataclass_fields__}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise UsageError(f"{path}: missing or not JSON ({err}); export again") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: not an export's JSON object; export again")
    return data
