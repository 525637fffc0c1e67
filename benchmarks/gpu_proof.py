"""The GPU proof in one call: every GPU figure of issue 28 from one command of at most 9 minutes on
one H100/H200, written as one JSON file and one markdown table with a verdict per goal of the issue.

Parts, in order (each in a process of its own, under its own time cap and the overall deadline; a
part that fails, hangs or crashes is recorded with its error and the next part runs):

    gpt2         GPT-2 124M, bf16, T=1024, compile, fused AdamW: gputrain against a hand loop compiled whole
    fp8_large    a GPT of d_model 2048 (12 layers) in fp8 against bf16: tokens/s and loss at every logged step
    ablate       gpu_gpt2.py --ablate: gputrain's defaults off one at a time, both loops compiled per block
    anatomy      step_anatomy.py --device cuda: kernel launches and host waits per step, gputrain against the hand
                 loop (a 2-layer GPT-2-shaped GPT, bf16, eager and compiled whole)
    resnet50     ResNet-50 bf16 channels_last: hand loop, gputrain on synthetic data and on JPEG files
    fp8          GPT-2 124M in fp8 against bf16, and gputrain's fp8 advisor's plan for it
    pipeline     the prefetcher's overlap (share of the hideable host→device copy time hidden, pinned and
                 pageable batches) and syncs per step
    batch_auto   train.batch_size=auto against the largest micro-batch a real step fits (bisection)
    bench_infer  `gputrain bench-infer` on CUDA of a ResNet-50 run (eager, compile) and a GPT-2 124M run (eager)
    in_memory    TensorDatasets, Subsets, ConcatDatasets and Dataset subclasses through Trainer.fit on CUDA
    tests_gpu    pytest tests/gpu
    (--all adds issue 15's doctor, nccl, smoke, default_job and bench; --only PART ... runs some)

    python benchmarks/gpu_proof.py OUT_DIR --wheels .whl  # on the GPU machine, ≤ 9 minutes
    python benchmarks/gpu_proof.py OUT_DIR --dry-run      # the same code at tiny sizes on a CPU (CI)

Writes OUT_DIR/gpu_proof.json, OUT_DIR/gpu_proof.md and OUT_DIR/gpu_proof.log (every part's output).
Exit code 0 when every part ran (goals met or not: the figures are the result), 1 when a part failed.

The parts are forked from a server that has imported torch and gputrain once (multiprocessing's
forkserver, which never touches CUDA itself), so a part costs no interpreter start; each part's
process group is killed at its cap, subprocesses included. This driver never imports torch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from proof_report import render_markdown  # noqa: E402

# (name, module, cap in seconds on the GPU machine): issue 28's parts, the figures it most needs first,
# so the overall deadline cuts the least needed; the caps add up to 495 s, inside it. Compiles the
# earlier parts made are in inductor's cache (the same /tmp) for the later ones.
PARTS: list[tuple[str, str, int]] = [
    ("gpt2", "proof_models", 80),
    ("fp8_large", "proof_issue28", 65),
    ("ablate", "proof_issue28", 70),
    ("anatomy", "proof_issue28", 30),
    ("resnet50", "proof_models", 40),
    ("fp8", "proof_models", 35),
    ("pipeline", "proof_pipeline", 25),
    ("batch_auto", "proof_issue28", 20),
    ("bench_infer", "proof_issue28", 40),
    ("in_memory", "proof_issue28", 20),
    ("tests_gpu", "proof_parts", 70),
]
EXTRA_PARTS: list[tuple[str, str, int]] = [
    ("doctor", "proof_parts", 45),
    ("nccl", "proof_parts", 45),
    ("smoke", "proof_parts", 90),
    ("default_job", "proof_parts", 60),
    ("bench", "proof_parts", 90),
]
"""Issue 15's parts that issue 28 does not need: run with --all or --only."""
DEADLINE_S = 505  # 9 minutes less the wheel install, the start and the report
DRY_RUN_CAP_S = 60


def _child(name: str, module: str, dry_run: bool, budget_s: float, work: str, log_path: str) -> None:
    """Runs in the forked process: its own process group, its output to the log, its result to JSON."""
    os.setsid()  # the driver kills the whole group at the cap, pytest and CLI children included
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for stream in (sys.stdout, sys.stderr):  # a part killed at its cap still leaves its last lines
        stream.reconfigure(line_buffering=True)  # type: ignore[attr-defined]
    import importlib
    import traceback

    from proof_parts import Context

    if dry_run:  # CI's few shared cores: intra-op threads would only contend with each other and the loaders
        import torch

        torch.set_num_threads(1)
    ctx = Context(dry_run=dry_run, work=Path(work), budget_s=budget_s)
    try:
        result = getattr(importlib.import_module(module), f"part_{name}")(ctx)
        record: dict[str, Any] = {"status": "ok", "result": result}
    except Exception as err:  # noqa: BLE001 - recorded; the driver goes on with the next part
        traceback.print_exc()
        record = {"status": "failed", "error": f"{type(err).__name__}: {err}"}
    (Path(work) / f"{name}.json").write_text(json.dumps(record, default=str))
    sys.stdout.flush()
    sys.stderr.flush()


def _tail(path: Path, chars: int = 2000) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return text[-chars:]


def run_part(ctx: Any, name: str, module: str, budget_s: float, dry_run: bool, work: Path) -> dict[str, Any]:
    log_path = work / f"{name}.log"
    started = time.monotonic()
    process = ctx.Process(target=_child, args=(name, module, dry_run, budget_s, str(work), str(log_path)))
    process.start()
    process.join(budget_s)
    timed_out = process.is_alive()
    if timed_out:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the part and everything it started
        process.join(10)
    seconds = round(time.monotonic() - started, 1)
    result_file = work / f"{name}.json"
    if timed_out:
        record = {"status": "timeout", "error": f"stopped at its cap of {budget_s:.0f} s", "log_tail": _tail(log_path)}
    elif not result_file.exists():
        record = {"status": "failed", "error": f"the part's process died (exit code {process.exitcode})",
                  "log_tail": _tail(log_path)}
    else:
        record = json.loads(result_file.read_text())
        if record["status"] != "ok":
            record["log_tail"] = _tail(log_path)
    return {"part": name, "seconds": seconds, "budget_s": round(budget_s), **record}


def _preload() -> list[str]:
    """What the fork server imports once for every part (importing CUDA-free modules only)."""
    return ["torch", "gputrain", "gputrain.train.trainer", "proof_parts"]


ISSUE_GOALS: list[tuple[str, str, str]] = [
    ("GPT-2 124M ≥ 1.00× the hand loop compiled whole", "gpt2", "GPT-2 124M gputrain / hand loop"),
    ("GPT-2 124M MFU ≥ 40% of the bf16 datasheet peak", "gpt2", "GPT-2 124M MFU"),
    ("ResNet-50 ≥ 1.00× the hand loop", "resnet50", "ResNet-50 gputrain / hand loop"),
    ("fp8 ≥ 1.15× bf16 at d_model ≥ 2048", "fp8_large", "fp8 / bf16 tokens/s at d_model"),
    ("fp8 loss within 3% of bf16 at every logged step, d_model ≥ 2048", "fp8_large", "fp8 loss within"),
    ("fp8 at GPT-2 124M faster than bf16, or refused by the advisor", "fp8", "fp8 / bf16 tokens/s"),
    ("prefetcher hides ≥ 90% of the hideable host→device time", "pipeline", "prefetcher: share"),
    ("batch_size=auto within 10% of the largest batch that fits", "batch_auto", "batch_size=auto"),
]
"""Issue 28's goals: (goal, part, the start of the part's goal name that measures it)."""


def verdicts(records: list[dict[str, Any]], dry_run: bool) -> list[dict[str, Any]]:
    """One verdict per issue goal: met, missed, or unmeasured (with why: the part's status, or a dry run)."""
    by_part = {r["part"]: r for r in records}
    out = []
    for text, part, prefix in ISSUE_GOALS:
        record = by_part.get(part)
        found = [g for g in ((record or {}).get("result") or {}).get("goals", []) if g["goal"].startswith(prefix)]
        if dry_run:
            verdict, value = "unmeasured (dry run)", found[0]["value"] if found else None
        elif record is None or record["status"] != "ok" or not found:
            why = "not run" if record is None else record["status"]
            verdict, value = f"unmeasured ({part}: {why})", None
        else:
            verdict, value = ("met" if found[0]["met"] else "missed"), found[0]["value"]
        out.append({"goal": text, "part": part, "value": value, "verdict": verdict})
    return out


def _command(cmd: list[str]) -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        if done.returncode == 0:
            return done.stdout.strip() or None
    return None


def machine_facts() -> dict[str, Any]:
    """Device, driver and package versions, read without importing torch (nor starting CUDA) here."""
    from importlib import metadata

    versions = {}
    for name in ("torch", "torchao", "triton", "gputrain"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    import importlib.util

    spec = importlib.util.find_spec("gputrain")  # finds, does not import: which checkout the parts run
    versions["gputrain_from"] = str(Path(spec.origin).parent) if spec and spec.origin else None
    gpu = _command(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    return {"gpu": gpu or "none (nvidia-smi found no GPU)", "python": sys.version.split()[0], **versions,
            "commit": _command(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"])}


def install_wheels(folder: Path, work: Path) -> list[str]:
    """pip-installs the wheels in `folder` (no index, no dependencies: the machine has no network and
    its own torch) into a folder put first on this process's and every part's path."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:  # said, not fatal: the parts that need a missing package fail with its name
        print(f"gpu_proof: no wheels in {folder} (was it named in the device call's carry?)", flush=True)
        return []
    target = work / "site"
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--no-cache-dir", "--target", str(target), *map(str, wheels)], check=True, timeout=120)
    except (subprocess.SubprocessError, OSError) as err:  # the parts that need them fail naming the package
        print(f"gpu_proof: installing {', '.join(w.name for w in wheels)} failed: {err}", flush=True)
        return []
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, str(target))
    return [w.name for w in wheels]


def write_proof(out_dir: Path, proof: dict[str, Any], work: Path) -> None:
    """gpu_proof.json, .md and .log (every part's output so far, from the parts' logs in `work`)."""
    (out_dir / "gpu_proof.json").write_text(json.dumps(proof, indent=2, default=str))
    (out_dir / "gpu_proof.md").write_text(render_markdown(proof))
    names = [r["part"] for r in proof["parts"] if (work / f"{r['part']}.log").exists()]
    logs = "".join(f"===== {name} =====\n{(work / f'{name}.log').read_text(errors='replace')}\n" for name in names)
    (out_dir / "gpu_proof.log").write_text(logs)


def main(argv: list[str] | None = None) -> int:
    every = PARTS + EXTRA_PARTS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, help="where gpu_proof.json, gpu_proof.md and gpu_proof.log go")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on the CPU: the same code path, for CI")
    parser.add_argument("--only", nargs="*", choices=[p[0] for p in every], help="run these parts only")
    parser.add_argument("--all", action="store_true", help="issue 15's parts too (doctor, nccl, smoke, default_job, "
                        "bench), after issue 28's")
    parser.add_argument("--deadline", type=float, default=DEADLINE_S, help="seconds for all parts together")
    parser.add_argument("--wheels", type=Path, help="a folder of wheels to install first (without network)")
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    started, wall_start = time.monotonic(), time.time()
    # torch.cuda.is_available() through NVML: even an indirect call while the fork server imports
    # must not start CUDA there, or no forked part could use the GPU
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    # every part, and the fork server, import this checkout's gputrain (the GPU machine has no install)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))
    records: list[dict[str, Any]] = []
    facts: dict[str, Any] = {}

    def proof_of(records: list[dict[str, Any]]) -> dict[str, Any]:
        return {"dry_run": args.dry_run, "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall_start)),
                "wall_s": round(time.monotonic() - started, 1), "machine": facts,
                "verdicts": verdicts(records, args.dry_run), "parts": records}

    with tempfile.TemporaryDirectory(prefix="gpu-proof-") as tmp:
        work = Path(tmp)
        installed = install_wheels(args.wheels, work) if args.wheels else []
        facts.update(machine_facts(), wheels_installed=installed)
        print("gpu_proof: " + ", ".join(f"{k} {v}" for k, v in facts.items()), flush=True)
        ctx = multiprocessing.get_context("forkserver")  # after the wheels: the server inherits their path
        ctx.set_forkserver_preload(_preload())
        chosen = every if args.all or args.only else PARTS
        for name, module, cap in chosen:
            if args.only and name not in args.only:
                continue
            left = args.deadline - (time.monotonic() - started)
            budget = min(DRY_RUN_CAP_S if args.dry_run else cap, left)
            if budget < 5:
                records.append({"part": name, "seconds": 0.0, "budget_s": 0, "status": "not run",
                                "error": f"the overall deadline of {args.deadline:.0f} s was reached"})
            else:
                records.append(run_part(ctx, name, module, budget, args.dry_run, work))
            print(f"{name:12s} {records[-1]['status']:8s} {records[-1]['seconds']:6.1f} s  "
                  f"{records[-1].get('result', {}).get('summary') or records[-1].get('error', '')}", flush=True)
            write_proof(args.out_dir, proof_of(records), work)  # a command killed from outside still leaves these
        proof = proof_of(records)
        write_proof(args.out_dir, proof, work)
    failed = [r["part"] for r in records if r["status"] != "ok"]
    print(f"gpu_proof: {len(records) - len(failed)} of {len(records)} parts ran in {proof['wall_s']} s"
          + (f"; not ok: {', '.join(failed)}" if failed else "") + f" -> {args.out_dir}/gpu_proof.md")
    for v in proof["verdicts"]:
        print(f"  {v['verdict']:28s} {v['goal']} ({v['value'] if v['value'] is not None else 'n/a'})")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
