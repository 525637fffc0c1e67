"""Memory that cannot be allocated never reaches torch (issue 13, second pass): a model whose weights,
gradients and optimizer state alone exceed the memory of the device that holds them is refused
before it is built, naming the sizes, the limit and what to change; the limit is this process's
(its own cgroup's, v1 or v2, and its ulimit), not the root cgroup's; and an allocation that fails
while the model is built anyway (the documented override) is recorded, not a raw traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gputrain import Trainer
from gputrain.config import load_config, memory_limit, sizes
from gputrain.config.memory_limit import MemoryLimit, rank_memory_limit
from gputrain.config.sizes import SKIP_MEMORY_CHECK_ENV, check_training_state_fits
from gputrain.data.tensors import TensorData
from gputrain.errors import ConfigError, UsageError
from gputrain.optim.states import optimizer_states_per_param

GIB = 2**30
QUIET = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "train.epochs": 1,
         "train.batch_size": 16, "checkpoint.enabled": False}


def _fits(config: Any, model: nn.Module, shards: int, memory: tuple[int, str], where: str) -> None:
    states = optimizer_states_per_param(config.optim.name, config.optim.momentum)
    check_training_state_fits(config, model, states, shards, memory, where)


def _params(*shapes: tuple[int, ...]) -> nn.Module:
    """A module of the user's holding meta parameters of these shapes."""
    module = nn.Module()
    for i, shape in enumerate(shapes):
        module.register_parameter(f"p{i}", nn.Parameter(torch.empty(shape, device="meta")))
    return module


# ----------------------------------------------------------------------------- the training state against the limit
@pytest.mark.parametrize(("optimizer", "momentum", "state_gib"), [
    ("adamw", 0.9, 8.0), ("adam", 0.9, 8.0), ("sgd", 0.0, 0.0), ("sgd", 0.9, 4.0), ("rmsprop", 0.9, 8.0),
    ("adagrad", 0.9, 4.0),
], ids=["adamw", "adam", "sgd", "sgd-momentum", "rmsprop-momentum", "adagrad"])
def test_the_state_is_weights_gradients_and_the_optimizers(optimizer: str, momentum: float, state_gib: float) -> None:
    config = load_config({"optim.name": optimizer, "optim.momentum": momentum})
    params = _params((2**15, 2**15))  # 1 Gi parameters: 4 GiB of fp32
    needed = (8 + state_gib) * GIB
    _fits(config, params, 1, (int(needed), "test"), "the host")  # exactly fits
    with pytest.raises(UsageError) as err:
        _fits(config, params, 1, (int(needed) - 1, "a test limit"), "the host")
    message = str(err.value)
    assert re.search(rf"need 4\.0 GiB of weights, 4\.0 GiB of gradients and {state_gib:.1f} GiB of {optimizer} "
                     rf"state = {needed / GIB:.1f} GiB per rank, before any activation, but the host has "
                     r"[\d.]+ GiB \(a test limit\)", message), message
    assert f"or set {SKIP_MEMORY_CHECK_ENV}=1 to try anyway" in message and "\n" not in message


@pytest.mark.parametrize("shards", [2, 4, 8])
def test_sharding_divides_the_state_over_the_ranks(shards: int) -> None:
    config = load_config({"optim.name": "sgd", "optim.momentum": 0.0})
    params = _params((2**15, 2**15))  # 8 GiB of weights and gradients
    _fits(config, params, shards, (8 * GIB // shards, "test"), "cuda:0")
    with pytest.raises(UsageError, match=rf"per rank over {shards} ranks"):
        _fits(config, params, shards, (8 * GIB // shards - 1, "test"), "cuda:0")


def test_frozen_parameters_have_no_gradient_or_state() -> None:
    config = load_config({"optim.name": "adamw"})
    frozen = _params((2**15, 2**15))
    frozen.requires_grad_(False)
    _fits(config, frozen, 1, (4 * GIB, "test"), "the host")  # the 4 GiB of weights alone: fits exactly
    with pytest.raises(UsageError) as err:
        _fits(config, frozen, 1, (4 * GIB - 1, "test"), "the host")
    assert ("need 4.0 GiB of weights, 0.0 GiB of gradients and 0.0 GiB of adamw state = 4.0 GiB per rank"
            in str(err.value))


def test_the_override_lets_it_try(monkeypatch: pytest.MonkeyPatch) -> None:
    too_big = (load_config(), _params((2**15, 2**15)), 1, (GIB, "test"), "the host")
    with pytest.raises(UsageError):
        _fits(*too_big)
    monkeypatch.setenv(SKIP_MEMORY_CHECK_ENV, "1")
    _fits(*too_big)  # the same model and limit: no longer refused


def test_the_trainer_refuses_before_the_model_is_materialised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gputrain.train.build.state_memory", lambda *_: ((2**20, "a test limit"), "the host"))
    materialised: list[bool] = []
    from gputrain.models import meta

    real = meta.MetaInit.materialize
    monkeypatch.setattr(meta.MetaInit, "materialize", lambda *a, **k: (materialised.append(True), real(*a, **k)))
    with pytest.raises(ConfigError) as err:
        Trainer.from_config(None, run_dir=tmp_path / "r", overrides={
            **QUIET, "model.name": "mlp", "model.hidden_sizes": [512, 512]}).setup()
    assert err.value.field == "model.hidden_sizes" and "(a test limit)" in str(err.value)
    assert not materialised


def test_a_users_own_model_is_refused_without_a_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gputrain.train.build.state_memory", lambda *_: ((2**10, "a test limit"), "the host"))
    data = TensorData(torch.randn(64, 64), torch.randint(0, 3, (64,)))
    with pytest.raises(UsageError) as err:
        Trainer(nn.Linear(64, 3), data, loss_fn=F.cross_entropy, config=QUIET, run_dir=tmp_path / "r").setup()
    assert not isinstance(err.value, ConfigError)
    assert str(err.value).startswith("the model's 195 parameters need ") and "use a smaller model" in str(err.value)


def test_the_cli_refuses_the_probes_model_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """[40000, 40000]: 1.6 G parameters, ~24 GiB with AdamW; refused on a 16 GiB limit, exit 2."""
    from gputrain.cli import main

    monkeypatch.setattr(sizes, "rank_memory_limit", lambda *_: MemoryLimit(16 * GIB, "a test's ulimit -v"))
    assert main(["train", "--run-dir", str(tmp_path / "r"), "model.name=mlp", "model.hidden_sizes=[40000,40000]",
                 "log.progress=none"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("gputrain train: config error: model.hidden_sizes = [40000, 40000]: the model's 1.6B "
                           "parameters need 6.0 GiB of weights, 6.0 GiB of gradients and 11.9 GiB of adamw state")
    assert "(a test's ulimit -v)" in line
    assert not (tmp_path / "r" / "summary.json").exists()


# ----------------------------------------------------------------------------- whose limit
def _cgroup(root: Path, rel: str, name: str, value: str) -> None:
    path = root / rel / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(value + "\n")


@pytest.mark.parametrize(("self_cgroup", "files", "limit"), [
    # v2: the process's own cgroup, below the root
    ("0::/user.slice/app.scope\n", {"user.slice/app.scope/memory.max": "1073741824"}, GIB),
    # v2: a limit set higher up bounds it too
    ("0::/a/b/c\n", {"a/b/c/memory.max": "max", "a/memory.max": "2147483648"}, 2 * GIB),
    # v1: the memory controller's line, not the root file
    ("4:memory:/process_api/abc\n3:cpu:/\n", {"memory/process_api/abc/memory.limit_in_bytes": "536870912",
                                              "memory/memory.limit_in_bytes": "9223372036854771712"}, GIB // 2),
    # v1 with controllers sharing a line
    ("5:cpuacct,memory:/job\n", {"memory/job/memory.limit_in_bytes": "805306368"}, 768 * 2**20),
    # inside a container whose own cgroup is the root it sees
    ("0::/\n", {"memory.max": "3221225472"}, 3 * GIB),
    ("4:memory:/docker/xyz\n", {"memory/memory.limit_in_bytes": "1610612736"}, 3 * GIB // 2),
], ids=["v2-own", "v2-ancestor", "v1-own", "v1-joined", "v2-container-root", "v1-container-root"])
def test_the_limit_is_this_processs_cgroups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, self_cgroup: str,
                                            files: dict[str, str], limit: int) -> None:
    for rel, value in files.items():
        _cgroup(tmp_path, str(Path(rel).parent), Path(rel).name, value)
    monkeypatch.setattr(memory_limit, "CGROUP_ROOT", tmp_path)
    monkeypatch.setattr(memory_limit, "_self_cgroup", lambda: self_cgroup)
    found = rank_memory_limit(ranks=1)
    assert found is not None and found.bytes == limit and "the cgroup's memory limit" in found.what


def test_the_address_space_limit_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    real = resource.getrlimit
    monkeypatch.setattr(resource, "getrlimit",
                        lambda which: (10**9, 10**9) if which == resource.RLIMIT_AS else real(which))
    (tmp_path / "status").write_text("Name:\tpython\nVmSize:\t  1000 kB\nVmData:\t  10 kB\n")
    monkeypatch.setattr(memory_limit, "PROC_STATUS", tmp_path / "status")
    assert rank_memory_limit(ranks=1) == MemoryLimit(
        10**9 - 1000 * 1024, f"{memory_limit.ADDRESS_SPACE} of 954 MiB, less the 1 MiB this process maps already")


# ----------------------------------------------------------------------------- an allocation that fails anyway
def test_an_allocation_failing_while_building_is_recorded(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from gputrain.cli import main
    from gputrain.models import meta

    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: you tried "
                           "to allocate 6400000000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(meta.MetaInit, "materialize", fail)
    run_dir = tmp_path / "r"
    assert main(["train", "--run-dir", str(run_dir), "model.name=mlp", "log.progress=none"]) == 1
    line = capsys.readouterr().err.strip()
    assert line == ("gputrain train: training failed at start-up (building the data, the model and its placement): "
                    "RuntimeError: [enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory: "
                    "you tried to allocate 6400000000 bytes. Error code 12 (Cannot allocate memory) (traceback in "
                    f"{run_dir / 'error.log'})")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["global_step"] == 0 and "DefaultCPUAllocator" in summary["error"]
    assert "Traceback (most recent call last)" in (run_dir / "error.log").read_text()


def _keys(summary: dict[str, Any], prefix: str = "") -> set[str]:
    """Every key path of a summary, its metric blocks (val, test) left out: they name the run's metrics."""
    keys = set()
    for key, value in summary.items():
        keys.add(prefix + key)
        if isinstance(value, dict) and key not in ("val", "test", "time_breakdown", "time_breakdown_s",
                                                   "eval_skipped_samples"):
            keys |= _keys(value, f"{prefix}{key}.")
    return keys


def test_a_start_up_failure_leaves_every_key_of_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """summary.json's keys are a promise (README: status, device, precision, ...): a run that failed
    while building has them too, null where nothing was known."""
    from gputrain.cli import main
    from gputrain.models import meta

    quick = ["model.name=mlp", "model.hidden_sizes=[8]", "train.epochs=1", "log.progress=none", "log.tensorboard=false"]
    assert main(["train", "--run-dir", str(tmp_path / "done"), *quick]) == 0
    monkeypatch.setattr(meta.MetaInit, "materialize", lambda *a, **k: (_ for _ in ()).throw(MemoryError()))
    assert main(["train", "--run-dir", str(tmp_path / "failed"), *quick]) == 1
    done, failed = (json.loads((tmp_path / name / "summary.json").read_text()) for name in ("done", "failed"))
    assert _keys(failed) == _keys(done) | {"error"}
    assert failed["device"] is None and failed["precision"] is None and failed["train"]["mfu"] is None


def test_a_failure_while_building_leaves_another_runs_files_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from gputrain.cli import main
    from gputrain.models import meta

    run_dir = tmp_path / "r"
    assert main(["train", "--run-dir", str(run_dir), "model.name=mlp", "model.hidden_sizes=[8]", "train.epochs=1",
                 "log.progress=none", "log.tensorboard=false"]) == 0
    before = (run_dir / "summary.json").read_bytes()
    monkeypatch.setattr(meta.MetaInit, "materialize", lambda *a, **k: (_ for _ in ()).throw(MemoryError()))
    capsys.readouterr()
    assert main(["train", "--run-dir", str(run_dir), "train.epochs=2", "log.progress=none"]) == 1
    assert capsys.readouterr().err.strip().endswith(f"(nothing written: {run_dir} holds another run's files)")
    assert (run_dir / "summary.json").read_bytes() == before and not (run_dir / "error.log").exists()
