"""`gputrain plan` without --device-memory and the training console's `auto:` line plan against the
limit that binds one rank on this node (config/memory_limit.py) and name it: a process's own
address-space limit as it is (`prlimit --as`, real, in a child; not divided by --nproc-per-node), a
cgroup's shared by the ranks (faked: this machine cannot make cgroups). Under a 3 GiB `prlimit` they
said 23.5 GiB (physical memory) and that one process fits (issue 27)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gputrain.cli import main
from gputrain.config import load_config, memory_limit
from gputrain.config.memory_limit import ADDRESS_SPACE

ROOT = Path(__file__).resolve().parents[3]
GIB = 2**30
LIMIT = 3 * GIB
BIG = ["model.name=mlp", "model.hidden_sizes=[12288,12288]"]
"""151.9M parameters: 2.27 GiB per rank with AdamW, over what a rank has under a 3 GiB address-space
limit (~2.0 GiB usable), within what it has under 5 GiB."""
_LINE = re.compile(rf"{re.escape(ADDRESS_SPACE)} of (\d+\.\d\d) GiB, less the (\d+) MiB this process maps already")


def _run(limit: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "COLUMNS": "500"}
    env.pop("LOCAL_WORLD_SIZE", None)
    return subprocess.run(
        ["prlimit", f"--as={limit}", sys.executable, "-m", "gputrain", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def _plan(limit: int, nproc: int) -> tuple[int, dict[str, object]]:
    done = _run(limit, "plan", *BIG, "--nproc-per-node", str(nproc), "--json")
    assert done.returncode in (0, 1), done.stderr[-2000:]
    return done.returncode, json.loads(done.stdout[done.stdout.index("{") :])


def test_plan_under_a_prlimit_plans_against_it() -> None:
    code, one = _plan(LIMIT, 1)
    found = _LINE.fullmatch(str(one["device_limit"]))
    assert found and found[1] == "3.00", one["device_limit"]
    # the limit less what the plan process maps (its imports, data and model on meta: a rank's baseline)
    assert abs(int(one["device_bytes"]) - (LIMIT - int(found[2]) * 2**20)) <= 2**20
    assert code == 1 and one["auto"] is None  # one process does not fit under it
    # the same per-process limit binds each of 2 ranks: not halved
    _, two = _plan(LIMIT, 2)
    assert (
        _LINE.fullmatch(str(two["device_limit"])) and abs(int(two["device_bytes"]) - int(one["device_bytes"])) < 2**26
    )
    # and with more room the same job fits
    code, roomy = _plan(5 * GIB, 1)
    assert code == 0 and roomy["auto"] is not None and str(roomy["device_limit"]).startswith(f"{ADDRESS_SPACE} of 5.00")


def _fake_cgroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int) -> Path:
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "memory.max").write_text(f"{limit}\n")
    monkeypatch.setattr(memory_limit, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(memory_limit, "_self_cgroup", lambda: "0::/job\n")
    import resource

    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY,) * 2)
    return tmp_path / "job" / "memory.max"


@pytest.mark.parametrize("nproc", [1, 2])
def test_plan_divides_a_cgroups_limit_by_the_ranks_it_plans(
    nproc: int, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    limit_file = _fake_cgroup(tmp_path, monkeypatch, 4 * GIB)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    shared = f", shared by {nproc} ranks" if nproc > 1 else ""
    what = f"the cgroup's memory limit ({limit_file}) of 4.00 GiB{shared}"
    main(["plan", "model.name=mlp", "--nproc-per-node", str(nproc), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["device_bytes"] == 4 * GIB // nproc and out["device_limit"] == what
    main(["plan", "model.name=mlp", "--nproc-per-node", str(nproc)])
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith(f"device {4096 / nproc:.2f} MiB, usable {0.85 * 4096 / nproc:.2f} MiB ({what})"), header


def test_plan_says_a_given_device_memory_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    main(["plan", "model.name=mlp", "--device-memory", "1GiB", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert out["device_bytes"] == GIB and out["device_limit"] == "given with --device-memory"


def test_the_auto_line_names_a_processs_limit(tmp_path: Path) -> None:
    """A real run under `prlimit --as`: the console's auto line plans against that limit and says so."""
    done = _run(
        LIMIT,
        "train",
        "--run-dir",
        str(tmp_path / "run"),
        "model.name=mlp",
        "parallel.strategy=auto",
        "train.max_steps=1",
        "log.progress=plain",
        "log.tensorboard=false",
        "checkpoint.enabled=false",
        "eval.every_epochs=0",
    )
    text = " ".join(done.stdout.split())
    found = re.search(
        rf"auto: .* usable \((\d+\.\d\d) GiB: {re.escape(ADDRESS_SPACE)} of 3\.00 GiB, less the (\d+) "
        r"MiB this process maps already\)",
        text,
    )
    assert found, (done.returncode, text[-3000:], done.stderr[-2000:])
    assert abs(float(found[1]) * GIB - (LIMIT - int(found[2]) * 2**20)) <= 0.01 * GIB


@pytest.mark.parametrize(("limit", "path"), [(16 * GIB, "quick"), (GIB, "plan")])
def test_the_auto_line_names_a_cgroup_shared_by_the_ranks(
    limit: int, path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both of auto's ways to decide (the quick estimate far from the limit, the memory plan near it)."""
    from gputrain.distributed.auto import choose_strategy
    from gputrain.models.mlp import MLP

    limit_file = _fake_cgroup(tmp_path, monkeypatch, limit)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    config = load_config({"parallel.strategy": "auto", "model.name": "mlp"})
    model = MLP(64, [4096, 4096], 10, "relu", 0.0)  # 17M parameters: ~270 MiB of AdamW training state
    choice = choose_strategy(config, model, 2, torch.device("cpu"), torch.zeros(64))
    assert choice.reason is not None
    assert choice.reason.startswith("auto: 17.1M parameters;") == (path == "quick"), choice.reason
    assert ("(memory plan, micro-batch" in choice.reason) == (path == "plan"), choice.reason
    share = f"{limit / 2 / GIB:.2f} GiB" if limit >= 2 * GIB else f"{limit / 2 / 2**20:.2f} MiB"  # format_bytes
    named = f"({share}: the cgroup's memory limit ({limit_file}) of {limit / GIB:.2f} GiB, shared by 2 ranks)"
    assert named in choice.reason, choice.reason


def test_on_the_cpu_offloading_moves_nothing_out_of_the_limit(capsys: pytest.CaptureFixture[str]) -> None:
    """On a CPU device the host is the device: an fsdp row with cpu_offload fits only where its
    offloaded state fits too (it said "fits" at 0.72 GiB per rank with 1.98 GiB more in the same memory)."""
    args = ["plan", "model.name=mlp", "model.hidden_sizes=[1024,1024]", "--nproc-per-node", "2", "--json"]

    def offload_row(memory: int) -> dict[str, int | bool]:
        main([*args, "--device-memory", str(memory)])
        rows = json.loads(capsys.readouterr().out)["rows"]
        return next(
            r for r in rows if r["strategy"] == "fsdp" and r["cpu_offload"] and r["activation_checkpointing"] == "none"
        )

    row = offload_row(GIB)
    assert row["fits"] and row["host"] == 0  # nothing leaves the memory the limit is of
    needed = int(row["total"])
    assert not offload_row(int(needed / 0.85) - 2**20)["fits"]
    assert offload_row(int(needed / 0.85) + 2**20)["fits"]
    # and it needs what the same layout without offload needs: the shards stay in that memory
    main([*args, "--device-memory", str(GIB)])
    rows = json.loads(capsys.readouterr().out)["rows"]
    plain = next(
        r for r in rows if r["strategy"] == "fsdp" and not r["cpu_offload"] and r["activation_checkpointing"] == "none"
    )
    assert needed == int(plain["total"])
    assert offload_row(int((int(row["total"]) + int(row["host"])) / 0.85) + 2**20)["fits"]
