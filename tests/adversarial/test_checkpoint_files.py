"""Checkpoints that are not this run's, or not what they claim (issue 13, section 5).

Every case resumes a real run directory (a tiny MLP trained 3 steps, a checkpoint at each) after
changing the run or tampering with its files, and asserts the one promised outcome:

* not this run's (another model shape, renamed or missing parameters, another optimizer or
  schedule, a state.pt of the wrong types, a resealed file whose shapes were edited):
  `CheckpointMismatch` (a UsageError, exit 2) saying `cannot resume: PATH: what differs`, and the
  model, optimizer, scheduler, precision and every RNG exactly as they were (compared bit for bit);
* damaged, or a manifest that lies (omits a file the loader reads, names a path outside the
  checkpoint, a link leading out of it or out of the run directory): skipped with one warning by
  `checkpoint.resume=auto`, which resumes from the previous checkpoint, bit-identical to a clean
  resume from it;
* a damaged metrics.jsonl: a clean resume, the good lines up to the resumed step kept byte for byte,
  one warning.

One-process checkpoints, sharded (torch.distributed.checkpoint) ones as a multi-rank job writes
them, and a one-process checkpoint loaded through the multi-rank loader are all covered.
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import struct
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint.state_dict import get_state_dict

from gputrain.checkpoint.io import commit_checkpoint_dir, read_weights
from gputrain.checkpoint.matching import CheckpointMismatch
from gputrain.cli import main
from gputrain.errors import RunError, UsageError
from gputrain.train.trainer import Trainer
from tests.unit.checkpoint.helpers import Payload, read_and_apply, reseal
from tests.unit.reliability.chaos import differences

BASE = ["model.name=mlp", "model.hidden_sizes=[8]", "data.name=synthetic", "data.shape=[4]", "data.num_samples=128",
        "train.batch_size=32", "train.device=cpu", "train.deterministic=true", "log.progress=none",
        "log.tensorboard=false", "log.every_steps=1", "checkpoint.every_steps=1", "checkpoint.keep_last=3",
        "checkpoint.max_overhead=0",
        "eval.every_epochs=0"]
SAVED_STEPS = 3  # the source run: step-1, step-2, step-3
RESUMED = ["train.max_steps=4"]
SPEED_KEYS = {"samples_per_s", "step_time_s", "achieved_flops", "mfu", "peak_memory_bytes", "tokens_per_s"}


# ----------------------------------------------------------------------------- the runs, built once
def _trainer(run_dir: Path, extra: list[str] = (), resume: str = "auto") -> Trainer:  # type: ignore[assignment]
    return Trainer.from_config(None, run_dir=run_dir, overrides=[*BASE, *RESUMED, f"checkpoint.resume={resume}",
                                                                *extra])


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("source") / "run"
    summary = Trainer.from_config(None, run_dir=run_dir, overrides=[*BASE, f"train.max_steps={SAVED_STEPS}"]).fit()
    assert summary["status"] == "completed"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step-1", "step-2", "step-3"]
    # the checkpoints are what is tried here: without the run's config.toml the config check
    # (test_run_continuation.py) cannot see a changed model or optimizer first, and the checkpoint's must
    (run_dir / "config.toml").unlink()
    return run_dir


def _to_sharded(ckpt: Path, work: Path) -> None:
    """Rewrite a one-process checkpoint as the sharded one a 2-rank job writes (ShardedSaver): DCP
    shards of {"model", "optim"} by parameter name, state.pt with every rank's RNG, manifest, marker."""
    state = torch.load(ckpt / "state.pt", weights_only=True)
    holder = Trainer.from_config(None, run_dir=work, overrides=[*BASE, "checkpoint.resume=never"])
    holder.model.load_state_dict(read_weights(ckpt))
    holder.optimizer.load_state_dict(state["optimizer"])
    model_sd, optim_sd = get_state_dict(holder.model, holder.optimizer)
    tmp = ckpt.with_name(f".{ckpt.name}.tmp")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp), no_dist=True)
    rest = {k: v for k, v in state.items() if k not in ("optimizer", "param_names")}
    torch.save({**rest, "rng": [state["rng"], state["rng"]]}, tmp / "state.pt")
    shutil.rmtree(ckpt)
    commit_checkpoint_dir(tmp, ckpt, int(ckpt.name[5:]), fmt="dcp")


@pytest.fixture(scope="module")
def sharded(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("sharded") / "run"
    shutil.copytree(source, run_dir)
    for ckpt in sorted((run_dir / "checkpoints").iterdir()):
        _to_sharded(ckpt, tmp_path_factory.mktemp("convert"))
    return run_dir


def _train_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The training steps' rows of metrics.jsonl (loss, LR, gradient norm), timings left out. The
    evaluation rows depend on where a run once ended (an end evaluates), not on the resume."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # timings differ between any two runs, and the time split is sampled on steps of its own
    return [{k: v for k, v in row.items() if k not in SPEED_KEYS and not k.startswith("time_")}
            for row in rows if "split" not in row]


@pytest.fixture(scope="module")
def continued(source: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[dict[str, Any]]]:
    """The rows of metrics.jsonl after a clean resume from step-3 and from step-2 (the previous one)."""
    rows = {}
    for step in (3, 2):
        run_dir = tmp_path_factory.mktemp(f"continued{step}") / "run"
        shutil.copytree(source, run_dir)
        for later in range(step + 1, SAVED_STEPS + 1):
            shutil.rmtree(run_dir / "checkpoints" / f"step-{later}")
        assert _trainer(run_dir).fit()["global_step"] == 4
        rows[step] = _train_rows(run_dir)
    assert rows[3] == rows[2]  # resuming is exact: the step the run continues from makes no difference
    return rows


@pytest.fixture
def run(source: Path, tmp_path: Path) -> Path:
    copy_dir = tmp_path / "run"
    shutil.copytree(source, copy_dir)
    return copy_dir


@pytest.fixture
def sharded_run(sharded: Path, tmp_path: Path) -> Path:
    copy_dir = tmp_path / "run"
    shutil.copytree(sharded, copy_dir)
    return copy_dir


# ----------------------------------------------------------------------------- what a resume may change
def snapshot(trainer: Trainer) -> dict[str, Any]:
    """Everything a resume restores: weights and buffers, optimizer, scheduler, loss scale, every RNG."""
    np_state = np.random.get_state(legacy=True)
    assert isinstance(np_state, tuple)
    return {
        "model": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()},
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
        "lrs": [group["lr"] for group in trainer.optimizer.param_groups],
        "scheduler": copy.deepcopy(trainer.scheduler.state_dict()),
        "precision": copy.deepcopy(trainer.parts.precision.state_dict()),
        "rng": {"torch": torch.get_rng_state(), "numpy": torch.from_numpy(np_state[1].astype(np.int64)),
                "numpy_pos": np_state[2], "python": random.getstate()},
    }


def refused(run_dir: Path, problem: str, extra: list[str] = (), checkpoint: str = "step-3",  # type: ignore[assignment]
            resume: str = "auto") -> None:
    """Resuming `run_dir` (with `extra` overrides) raises `cannot resume: PATH: problem`, a UsageError,
    and changes nothing of what a resume restores."""
    trainer = _trainer(run_dir, extra, resume)
    before = snapshot(trainer)
    summary_before = (run_dir / "summary.json").read_bytes() if (run_dir / "summary.json").exists() else None
    with pytest.raises(CheckpointMismatch) as err:
        trainer.fit()
    assert isinstance(err.value, UsageError) and err.value.exit_code == 2
    ckpt = run_dir / "checkpoints" / checkpoint if resume == "auto" else Path(resume)
    assert str(err.value) == f"cannot resume: {ckpt}: {problem}"
    assert "\n" not in str(err.value)
    assert differences(before, snapshot(trainer)) == [], "a refused resume changed the run's state"
    if summary_before is not None:
        assert (run_dir / "summary.json").read_bytes() == summary_before


def resumes_from(run_dir: Path, step: int, continued: dict[int, list[dict[str, Any]]],
                 extra: list[str] = ()) -> None:  # type: ignore[assignment]
    """A clean resume from `step`: the run ends at step 4 exactly as a resume from an intact
    checkpoint does (losses, LR, gradient norms, evaluations)."""
    before = (run_dir / "metrics.jsonl").read_text().splitlines()
    summary = _trainer(run_dir, extra).fit()
    assert summary["status"] == "completed" and summary["global_step"] == 4
    assert _train_rows(run_dir) == continued[step]
    kept = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert kept[:step] == [line for line in before if json.loads(line)["step"] <= step][:step]


def latest(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / f"step-{SAVED_STEPS}"


# ----------------------------------------------------------------------------- file surgery
class Replace:
    """What a change of state.pt returns to replace the whole state."""

    def __init__(self, value: Any) -> None:
        self.value = value


def edit_state(ckpt: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    """Change state.pt in place (or Replace it) and reseal the checkpoint, as someone who controls the
    files would."""
    state = torch.load(ckpt / "state.pt", weights_only=True)
    replaced = change(state)
    torch.save(replaced.value if isinstance(replaced, Replace) else state, ckpt / "state.pt")
    reseal(ckpt)


def edit_weights(ckpt: Path, change: Callable[[dict[str, torch.Tensor]], None]) -> None:
    weights = read_weights(ckpt)
    change(weights)
    save_file(weights, str(ckpt / "model.safetensors"))
    reseal(ckpt)


def edit_header(ckpt: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change model.safetensors' JSON header (shapes, dtypes) in place, keeping the data bytes."""
    data = (ckpt / "model.safetensors").read_bytes()
    size = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + size])
    change(header)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    (ckpt / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + size:])
    reseal(ckpt)


def write_manifest(ckpt: Path, files: dict[str, Any], fmt: str | None = None) -> None:
    """Replace the manifest (and the marker's checksum of it): a manifest that lies, well sealed."""
    import hashlib

    manifest: dict[str, Any] = {"step": int(ckpt.name[5:]), "files": files}
    if fmt is not None:
        manifest["format"] = fmt
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    digest = hashlib.sha256((ckpt / "manifest.json").read_bytes()).hexdigest()
    (ckpt / "COMMITTED").write_text(f"{manifest['step']} {digest}\n")


def manifest_files(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / "manifest.json").read_text())["files"]


def flip_bit(file: Path, offset_fraction: float = 0.5) -> None:
    data = bytearray(file.read_bytes())
    data[int(len(data) * offset_fraction)] ^= 0x10
    file.write_bytes(bytes(data))


# ============================================================================= not this run's: the model
@pytest.mark.parametrize(("extra", "problem"), [
    (["model.hidden_sizes=[16]"],
     "model.safetensors: 1.weight has shape [8, 4] in the checkpoint, [16, 4] in this run's model "
     "(2 more differ: 1.bias, 3.weight)"),
    (["model.hidden_sizes=[8,8]"],
     "model.safetensors: the parameters differ: this run's model has 5.weight, 5.bias, which the checkpoint lacks"),
    (["data.shape=[6]"],
     "model.safetensors: 1.weight has shape [8, 4] in the checkpoint, [8, 6] in this run's model"),
    (["data.num_classes=3"],
     "model.safetensors: 3.weight has shape [10, 8] in the checkpoint, [3, 8] in this run's model "
     "(1 more differ: 3.bias)"),
], ids=["wider", "deeper", "other_input", "other_classes"])
def test_another_model_shape(run: Path, extra: list[str], problem: str) -> None:
    refused(run, problem, extra)


def test_a_renamed_parameter(run: Path) -> None:
    edit_weights(latest(run), lambda w: w.update({"1.kernel": w.pop("1.weight")}))
    refused(run, "model.safetensors: the parameters differ: this run's model has 1.weight, which the checkpoint "
                 "lacks; the checkpoint has 1.kernel, which this run's model lacks")


def test_a_missing_parameter(run: Path) -> None:
    edit_weights(latest(run), lambda w: w.pop("3.bias"))
    refused(run, "model.safetensors: the parameters differ: this run's model has 3.bias, which the checkpoint lacks")


def test_an_extra_parameter(run: Path) -> None:
    edit_weights(latest(run), lambda w: w.update({"4.weight": torch.zeros(2, 2)}))
    refused(run, "model.safetensors: the parameters differ: the checkpoint has 4.weight, which this run's model "
                 "lacks")


def test_another_dtype(run: Path) -> None:
    edit_weights(latest(run), lambda w: w.update({"3.weight": w["3.weight"].double()}))
    refused(run, "model.safetensors: 3.weight is float64 in the checkpoint, float32 in this run's model")


def test_a_safetensors_header_whose_shapes_were_edited(run: Path) -> None:
    edit_header(latest(run), lambda h: h["1.weight"].update(shape=[4, 8]))  # the same bytes, transposed
    refused(run, "model.safetensors: 1.weight has shape [4, 8] in the checkpoint, [8, 4] in this run's model")


def test_a_safetensors_header_whose_dtype_was_edited(run: Path) -> None:
    edit_header(latest(run), lambda h: h["1.bias"].update(dtype="I32"))  # the same 4 bytes per value
    refused(run, "model.safetensors: 1.bias is int32 in the checkpoint, float32 in this run's model")


# ============================================================================= not this run's: the optimizer
@pytest.mark.parametrize(("extra", "problem"), [
    (["optim.name=sgd"], "the optimizer differs: the checkpoint's is AdamW, this run's is SGD"),
    (["optim.name=adam"], "the optimizer differs: the checkpoint's is AdamW, this run's is Adam"),
    (["optim.name=rmsprop"], "the optimizer differs: the checkpoint's is AdamW, this run's is RMSprop"),
    (["optim.schedule=onecycle"],
     "the optimizer's parameter group 0 lacks max_lr, min_lr, which this run's schedule uses "
     "(the checkpoint's optimizer is AdamW)"),
], ids=["sgd", "adam", "rmsprop", "onecycle_schedule"])
def test_another_optimizer_or_schedule(run: Path, extra: list[str], problem: str) -> None:
    refused(run, problem, extra)


def test_another_optimizer_in_a_checkpoint_that_does_not_name_its_kind(run: Path) -> None:
    edit_state(latest(run), lambda s: s.pop("optimizer_kind"))  # written before kinds were recorded
    refused(run, "the optimizer differs: the checkpoint's is AdamW, this run's is SGD", ["optim.name=sgd"])


def _state_of(state: dict[str, Any], index: int = 0) -> dict[str, Any]:
    return state["optimizer"]["state"][index]


@pytest.mark.parametrize(("change", "problem"), [
    (lambda s: s["optimizer"]["param_groups"].append(copy.deepcopy(s["optimizer"]["param_groups"][0])),
     "the optimizer has 3 parameter group(s) in the checkpoint, 2 in this run's"),  # weight-decay groups
    (lambda s: s["optimizer"]["param_groups"][0]["params"].pop(),
     "the optimizer's parameter group 0 holds 1 parameters in the checkpoint, 2 in this run's"),
    (lambda s: _state_of(s).update(exp_avgX=_state_of(s).pop("exp_avg")),
     "the optimizer state of 1.weight lacks exp_avg; has exp_avgX, which AdamW does not keep"),
    (lambda s: _state_of(s).update(exp_avg=torch.zeros(3)),
     "the optimizer state exp_avg of 1.weight has shape [3], the parameter [8, 4]"),
    (lambda s: _state_of(s, 2).update(step=torch.zeros(2)),  # group 0 holds the matrices, group 1 the vectors
     "the optimizer state step of 1.bias has shape [2], not one value"),
    (lambda s: s["optimizer"]["param_groups"][0].update(lr="fast"),
     "the optimizer setting lr is a str, this run's is a float (parameter group 0)"),
    (lambda s: s["optimizer"]["param_groups"][0].update(betas=(0.9, 0.99, 0.5)),
     "the optimizer setting betas has 3 entries, this run's has 2 (parameter group 0)"),
    (lambda s: s["optimizer"]["param_groups"][0].pop("betas"),
     "the optimizer's parameter group 0 lacks betas, which this run's AdamW uses (the checkpoint's optimizer is "
     "AdamW)"),
    (lambda s: s["optimizer"]["state"].update({99: copy.deepcopy(_state_of(s))}),
     "the optimizer holds state for 99, which no parameter group has"),
    (lambda s: s.update(optimizer=[1, 2]), "state.pt: the optimizer state is a list, not an optimizer's"),
    (lambda s: s.pop("optimizer"), "state.pt holds no optimizer state"),
], ids=["two_groups", "fewer_params", "renamed_state_key", "state_shape", "step_shape", "lr_type",
        "betas_length", "missing_setting", "stray_state", "not_a_state_dict", "no_optimizer"])
def test_an_optimizer_state_that_is_not_this_runs(run: Path, change: Callable[[dict[str, Any]], None],
                                                  problem: str) -> None:
    edit_state(latest(run), change)
    refused(run, problem)


# ============================================================================= not this run's: state.pt types
@pytest.mark.parametrize(("change", "problem"), [
    (lambda s: Replace([1, 2, 3]), "state.pt holds a list, not a training state"),
    (lambda s: s.pop("scheduler"), "state.pt lacks the scheduler state"),
    (lambda s: s.update(scheduler=[0.1]), "state.pt: the LR scheduler state is a list, not a dict"),
    (lambda s: s["scheduler"].pop("lr_lambdas"),
     "state.pt: the LR scheduler state is not this run's LambdaLR's: it lacks lr_lambdas (another optim.schedule?)"),
    (lambda s: s["scheduler"].update(last_epoch="3"),
     "state.pt: the LR scheduler's last_epoch is a str, this run's is an int"),
    (lambda s: s["scheduler"].update(base_lrs=[1e-3, 1e-3, 1e-3]),
     "state.pt: the LR scheduler's base_lrs has 3 entries, this run's has 2"),
    (lambda s: s.update(precision=[2.0]), "state.pt: the precision state is a list, not a dict"),
    (lambda s: s["loop"].update(global_step="3"), "state.pt: loop.global_step is '3', not a count"),
    (lambda s: s["loop"].update(epoch=-1), "state.pt: loop.epoch is -1, not a count"),
    (lambda s: s["loop"].update(global_step=7), "state.pt: loop.global_step is 7, the checkpoint is of step 3"),
    (lambda s: s["loop"].update(future_field=1),
     "state.pt: the loop state has future_field, which this gputrain lacks"),
    (lambda s: s["loop"].update(best_metric="0.5"), "state.pt: loop.best_metric is a str, not a number"),
    (lambda s: s["rng"].update(torch=torch.zeros(16)),
     "state.pt: the RNG state: torch's is not a generator state (a tensor rather than a byte tensor)"),
    (lambda s: s["rng"]["numpy"].update(keys=s["rng"]["numpy"]["keys"][:10]),
     "state.pt: the RNG state: numpy's is not a generator state (10 keys, not 624)"),
    (lambda s: s["rng"]["numpy"].update(pos=700),
     "state.pt: the RNG state: numpy's is not a generator state (its position is out of range)"),
    (lambda s: s["rng"].update(python=(3, (1, 2, 3), None)),
     "state.pt: the RNG state: python's is not a generator state (state vector is the wrong size)"),
    (lambda s: s["rng"].pop("numpy"), "state.pt: the RNG state lacks numpy"),
], ids=["not_a_dict", "no_scheduler", "scheduler_list", "scheduler_kind", "scheduler_value_type",
        "scheduler_groups", "precision_list", "step_type", "negative_epoch", "step_is_not_the_checkpoints",
        "unknown_loop_field", "best_metric_type", "torch_rng", "numpy_rng", "numpy_rng_position", "python_rng",
        "no_numpy_rng"])
def test_a_state_pt_of_the_wrong_types(run: Path, change: Callable[[dict[str, Any]], Any], problem: str) -> None:
    edit_state(latest(run), change)
    refused(run, problem)


def test_the_cli_says_it_in_one_line_and_exits_2(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    code = main(["train", "--run-dir", str(run), *BASE, *RESUMED, "model.hidden_sizes=[16]"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == (f"gputrain train: cannot resume: {latest(run)}: model.safetensors: 1.weight has shape [8, 4] in "
                   "the checkpoint, [16, 4] in this run's model (2 more differ: 1.bias, 3.weight)")


def test_an_explicit_checkpoint_of_another_run(run: Path, tmp_path: Path) -> None:
    """checkpoint.resume=PATH into a new run directory: the same check."""
    refused(tmp_path / "new", "the optimizer differs: the checkpoint's is AdamW, this run's is SGD", ["optim.name=sgd"],
            resume=str(run / "checkpoints" / "step-2"))


# ============================================================================= sharded (DCP) checkpoints
def test_a_sharded_checkpoint_resumes_exactly(sharded_run: Path, continued: dict[int, list[dict[str, Any]]]) -> None:
    resumes_from(sharded_run, 3, continued)


@pytest.mark.parametrize(("extra", "problem"), [
    (["model.hidden_sizes=[16]"],
     ".metadata: 1.weight has shape [8, 4] in the checkpoint, [16, 4] in this run's model "
     "(2 more differ: 1.bias, 3.weight)"),
    (["model.hidden_sizes=[8,8]"],
     ".metadata: the parameters differ: this run's model has 5.weight, 5.bias, which the checkpoint lacks"),
    (["optim.name=sgd"], "the optimizer differs: the checkpoint's is AdamW, this run's is SGD"),
    (["optim.schedule=onecycle"],
     "the optimizer's parameter group 0 lacks max_lr, min_lr, which this run's schedule uses "
     "(the checkpoint's optimizer is AdamW)"),
], ids=["wider", "deeper", "sgd", "onecycle_schedule"])
def test_a_sharded_checkpoint_of_another_run(sharded_run: Path, extra: list[str], problem: str) -> None:
    refused(sharded_run, problem, extra)


def test_a_sharded_checkpoint_that_does_not_name_its_optimizer(sharded_run: Path) -> None:
    edit_state(latest(sharded_run), lambda s: s.pop("optimizer_kind"))
    refused(sharded_run, "the optimizer differs: the checkpoint's is AdamW, this run's is RMSprop",
            ["optim.name=rmsprop"])


def test_a_sharded_checkpoint_with_a_hostile_optimizer_setting(sharded_run: Path, tmp_path: Path) -> None:
    """A pickle payload in a non-tensor DCP item is refused while checking, before any tensor is loaded."""
    ckpt = latest(sharded_run)
    import pickle

    from gputrain.checkpoint.safe_dcp import read_metadata

    metadata = read_metadata(ckpt / ".metadata")
    (index, info), = [(i, s) for i, s in metadata.storage_data.items() if i.fqn == "optim.param_groups.0.lr"]
    data = bytearray((ckpt / info.relative_path).read_bytes())
    payload = pickle.dumps(Payload(tmp_path / "PWNED"))  # torch.load takes a bare pickle too (legacy format)
    assert len(payload) <= info.length
    data[info.offset:info.offset + len(payload)] = payload
    (ckpt / info.relative_path).write_bytes(bytes(data))
    reseal(ckpt)
    trainer = _trainer(sharded_run)
    before = snapshot(trainer)
    with pytest.raises(RunError) as err:
        trainer.fit()
    assert str(err.value) == (f"cannot resume: {ckpt}: a DCP item (optim.param_groups.0.lr) holds objects other than "
                              "tensors and plain values; refused to load it (it could run code)")
    assert differences(before, snapshot(trainer)) == []
    assert not (tmp_path / "PWNED").exists()


def test_a_one_process_checkpoint_through_the_multi_rank_loader(run: Path, tmp_path: Path) -> None:
    """The loader a multi-rank job uses (by parameter name, any layout), on a one-process checkpoint."""
    trainer = _trainer(tmp_path / "other", ["model.hidden_sizes=[16]"], resume="never")
    before = snapshot(trainer)
    with pytest.raises(CheckpointMismatch) as err:
        read_and_apply(latest(run), trainer.model, trainer.optimizer, by_name=True)
    assert str(err.value) == (f"cannot resume: {latest(run)}: model.safetensors: 1.weight has shape [8, 4] in the "
                              "checkpoint, [16, 4] in this run's model (2 more differ: 1.bias, 3.weight)")
    assert differences(before, snapshot(trainer)) == []


def test_a_one_process_checkpoint_of_another_optimizer_through_the_multi_rank_loader(run: Path,
                                                                                     tmp_path: Path) -> None:
    trainer = _trainer(tmp_path / "other", ["optim.name=sgd"], resume="never")
    before = snapshot(trainer)
    with pytest.raises(CheckpointMismatch, match="the optimizer differs: the checkpoint's is AdamW, this run's is SGD"):
        read_and_apply(latest(run), trainer.model, trainer.optimizer, by_name=True)
    assert differences(before, snapshot(trainer)) == []


def test_a_one_process_checkpoint_without_parameter_names_through_the_multi_rank_loader(run: Path,
                                                                                        tmp_path: Path) -> None:
    edit_state(latest(run), lambda s: s.pop("param_names"))
    trainer = _trainer(tmp_path / "other", resume="never")
    before = snapshot(trainer)
    with pytest.raises(CheckpointMismatch, match=r"state.pt predates multi-rank resume \(no param_names\)"):
        read_and_apply(latest(run), trainer.model, trainer.optimizer, by_name=True)
    assert differences(before, snapshot(trainer)) == []


def test_a_one_process_checkpoint_through_the_multi_rank_loader_loads_it_all(run: Path, tmp_path: Path) -> None:
    trainer = _trainer(tmp_path / "other", resume="never")
    read_and_apply(latest(run), trainer.model, trainer.optimizer, by_name=True)
    for name, tensor in read_weights(latest(run)).items():
        assert torch.equal(trainer.model.state_dict()[name], tensor), name
    saved = torch.load(latest(run) / "state.pt", weights_only=True)["optimizer"]
    assert differences(saved["state"], trainer.optimizer.state_dict()["state"]) == []


# ============================================================================= damaged or lying: skipped
def skipped(run_dir: Path, warned: list[str], reason: str, continued: dict[int, list[dict[str, Any]]]) -> None:
    """resume=auto skips the latest checkpoint with one warning and resumes exactly from the one before."""
    warned.clear()
    resumes_from(run_dir, 2, continued)
    damaged = [w for w in warned if w.startswith("skipping damaged checkpoint")]
    assert damaged == [f"skipping damaged checkpoint: {latest(run_dir)}: {reason}"]


def test_a_bit_flipped_weight_file(run: Path, warned: list[str], continued: dict[int, list[dict[str, Any]]]) -> None:
    flip_bit(latest(run) / "model.safetensors", 0.9)
    skipped(run, warned, "model.safetensors does not match its checksum", continued)


def test_a_truncated_state_file(run: Path, warned: list[str], continued: dict[int, list[dict[str, Any]]]) -> None:
    state = latest(run) / "state.pt"
    state.write_bytes(state.read_bytes()[:100])
    skipped(run, warned, "state.pt does not match its checksum", continued)


def test_a_truncated_weight_file_resealed_is_damaged_not_mismatched(run: Path, tmp_path: Path) -> None:
    weights = latest(run) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-20])
    reseal(latest(run))
    trainer = _trainer(tmp_path / "new", resume=str(latest(run)))
    before = snapshot(trainer)
    with pytest.raises(RunError, match=rf"^cannot resume: {latest(run)}: model.safetensors is not a valid "
                                       r"safetensors file \(") as err:
        trainer.fit()
    assert "\n" not in str(err.value)
    assert differences(before, snapshot(trainer)) == []


def test_a_one_process_manifest_claiming_dcp_with_no_files(run: Path, warned: list[str],
                                                           continued: dict[int, list[dict[str, Any]]]) -> None:
    """The hole of issue 13: `"format": "dcp"` and an empty file list verified, and the run went on
    with bit-flipped weights."""
    flip_bit(latest(run) / "model.safetensors", 0.9)
    write_manifest(latest(run), {}, fmt="dcp")
    skipped(run, warned, "manifest.json says format 'dcp' but the directory holds a one-process checkpoint",
            continued)


def test_a_manifest_with_no_files(run: Path, warned: list[str], continued: dict[int, list[dict[str, Any]]]) -> None:
    flip_bit(latest(run) / "model.safetensors", 0.9)
    write_manifest(latest(run), {})
    skipped(run, warned, "manifest.json does not list model.safetensors, which the loader reads", continued)


def test_a_manifest_missing_the_state_file(run: Path, warned: list[str],
                                           continued: dict[int, list[dict[str, Any]]]) -> None:
    files = manifest_files(latest(run))
    files.pop("state.pt")
    write_manifest(latest(run), files)
    skipped(run, warned, "manifest.json does not list state.pt, which the loader reads", continued)


@pytest.mark.parametrize("name", ["../../metrics.jsonl", "/etc/hostname", "sub/model.safetensors", ".."],
                         ids=["dotdot", "absolute", "subdirectory", "parent"])
def test_a_manifest_naming_a_path_outside_the_checkpoint(run: Path, warned: list[str], name: str,
                                                         continued: dict[int, list[dict[str, Any]]]) -> None:
    files = manifest_files(latest(run))
    files[name] = {"sha256": "0" * 64, "bytes": 1}
    write_manifest(latest(run), files)
    skipped(run, warned, f"manifest.json lists {name!r}, a path outside the checkpoint", continued)


def test_a_weight_file_that_is_a_link_out_of_the_checkpoint(run: Path, tmp_path: Path, warned: list[str],
                                                            continued: dict[int, list[dict[str, Any]]]) -> None:
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(latest(run) / "model.safetensors", outside)
    (latest(run) / "model.safetensors").symlink_to(outside)  # the checksum still matches: the link is the lie
    skipped(run, warned, "model.safetensors is a symbolic link leading out of the checkpoint", continued)


def test_a_step_directory_that_is_a_link_out_of_the_run_directory(run: Path, tmp_path: Path, warned: list[str],
                                                                  continued: dict[int, list[dict[str, Any]]]) -> None:
    outside = tmp_path / "other-run" / "step-3"
    outside.parent.mkdir()
    shutil.move(latest(run), outside)
    latest(run).symlink_to(outside, target_is_directory=True)  # an intact checkpoint, of someone else's choosing
    skipped(run, warned, f"a symbolic link leading out of the run directory (to {outside})", continued)


def test_a_step_directory_linked_inside_the_run_directory_is_fine(run: Path, warned: list[str],
                                                                  continued: dict[int, list[dict[str, Any]]]) -> None:
    archive = run / "archive" / "step-3"
    archive.parent.mkdir()
    shutil.move(latest(run), archive)
    latest(run).symlink_to(archive, target_is_directory=True)
    warned.clear()
    resumes_from(run, 3, continued)
    assert not [w for w in warned if "damaged" in w]


def test_a_bit_flipped_shard(sharded_run: Path, warned: list[str],
                             continued: dict[int, list[dict[str, Any]]]) -> None:
    (shard,) = latest(sharded_run).glob("*.distcp")
    flip_bit(shard, 0.7)
    skipped(sharded_run, warned, f"{shard.name} does not match its checksum", continued)


def test_a_sharded_checkpoint_that_lost_its_metadata(sharded_run: Path, warned: list[str],
                                                     continued: dict[int, list[dict[str, Any]]]) -> None:
    (latest(sharded_run) / ".metadata").unlink()
    skipped(sharded_run, warned, ".metadata is missing", continued)


def test_a_sharded_manifest_with_no_files(sharded_run: Path, warned: list[str],
                                          continued: dict[int, list[dict[str, Any]]]) -> None:
    (shard,) = latest(sharded_run).glob("*.distcp")
    flip_bit(shard, 0.7)
    write_manifest(latest(sharded_run), {}, fmt="dcp")
    skipped(sharded_run, warned, "manifest.json does not list .metadata, which the loader reads", continued)


def test_a_sharded_manifest_omitting_a_shard(sharded_run: Path, warned: list[str],
                                             continued: dict[int, list[dict[str, Any]]]) -> None:
    (shard,) = latest(sharded_run).glob("*.distcp")
    flip_bit(shard, 0.7)
    files = manifest_files(latest(sharded_run))
    files.pop(shard.name)
    write_manifest(latest(sharded_run), files, fmt="dcp")
    skipped(sharded_run, warned, f"manifest.json does not list {shard.name}, which the loader reads", continued)


def test_a_sharded_checkpoint_with_an_unlisted_extra_shard(sharded_run: Path, warned: list[str],
                                                           continued: dict[int, list[dict[str, Any]]]) -> None:
    (latest(sharded_run) / "__1_0.distcp").write_bytes(b"\0" * 64)
    skipped(sharded_run, warned, "manifest.json does not list __1_0.distcp, which the loader reads", continued)


def test_a_sharded_metadata_referring_outside(sharded_run: Path, warned: list[str],
                                              continued: dict[int, list[dict[str, Any]]]) -> None:
    import pickle

    from gputrain.checkpoint.safe_dcp import read_metadata

    ckpt = latest(sharded_run)
    metadata = read_metadata(ckpt / ".metadata")
    (shard,) = ckpt.glob("*.distcp")
    shutil.copy(shard, sharded_run / "stolen.distcp")
    for info in metadata.storage_data.values():
        info.relative_path = "../../stolen.distcp"
    (ckpt / ".metadata").write_bytes(pickle.dumps(metadata))
    reseal(ckpt)
    skipped(sharded_run, warned, ".metadata refers to '../../stolen.distcp', a path outside the checkpoint", continued)


def test_a_sharded_step_directory_linked_out_of_the_run_directory(sharded_run: Path, tmp_path: Path,
                                                                  warned: list[str],
                                                                  continued: dict[int, list[dict[str, Any]]]) -> None:
    outside = tmp_path / "else" / "step-3"
    outside.parent.mkdir()
    shutil.move(latest(sharded_run), outside)
    latest(sharded_run).symlink_to(outside, target_is_directory=True)
    skipped(sharded_run, warned, f"a symbolic link leading out of the run directory (to {outside})", continued)


# ============================================================================= a damaged metrics.jsonl
def _damage_metrics(run_dir: Path, damage: Callable[[list[bytes]], list[bytes]]) -> list[bytes]:
    """Resume from step-2 (the later checkpoint is dropped); return the good lines up to step 2."""
    shutil.rmtree(latest(run_dir))
    lines = (run_dir / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    good = [line for line in lines if json.loads(line)["step"] <= 2]
    (run_dir / "metrics.jsonl").write_bytes(b"".join(damage(lines)))
    return good


@pytest.mark.parametrize("damage", [
    lambda lines: [lines[0], b"\xff\xfe not utf-8 \x80\n", *lines[1:]],
    lambda lines: [lines[0][:-2] + b"\xe9}\n", lines[0], *lines[1:]],
    lambda lines: [b"[1, 2, 3]\n", *lines, b"\"text\"\n"],
    lambda lines: [*lines[:1], b"42\n", b"null\n", *lines[1:]],
    lambda lines: [*lines, lines[-1][: len(lines[-1]) // 2]],  # torn last line (killed mid-write)
    lambda lines: [*lines[:1], b'{"step": "2", "loss": 1.0}\n', b'{"loss": 1.0}\n', *lines[1:]],
    lambda lines: [*lines[:1], b"[" * 100_000 + b"\n", *lines[1:]],  # nested too deep for the parser
    lambda lines: [*lines[:1], b'{"step": NaN}\n', b'{"step": true}\n', *lines[1:]],
], ids=["bad_utf8_line", "bad_utf8_inside_a_record", "json_arrays_and_strings", "json_scalars", "torn_last_line",
        "step_not_a_number", "deeply_nested", "step_nan_or_bool"])
def test_a_damaged_metrics_log_keeps_the_good_lines(run: Path, damage: Callable[[list[bytes]], list[bytes]],
                                                    warned: list[str],
                                                    continued: dict[int, list[dict[str, Any]]]) -> None:
    good = _damage_metrics(run, damage)
    warned.clear()
    summary = _trainer(run).fit()
    assert summary["status"] == "completed" and summary["global_step"] == 4
    lines = (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    assert lines[: len(good)] == [line.replace(b"\r\n", b"\n") for line in good]  # kept as they were
    assert _train_rows(run) == continued[2]  # nothing else survived, nothing was lost
    dropped = [w for w in warned if "metrics.jsonl" in w]
    assert len(dropped) == 1 and "damaged line" in dropped[0], warned


def test_blank_lines_and_crlf_in_the_metrics_log_are_no_damage(run: Path, warned: list[str],
                                                               continued: dict[int, list[dict[str, Any]]]) -> None:
    good = _damage_metrics(run, lambda lines: [lines[0], b"\n", b"  \r\n", *(line.replace(b"\n", b"\r\n")
                                                                             for line in lines[1:])])
    warned.clear()
    assert _trainer(run).fit()["global_step"] == 4
    assert (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)[: len(good)] == good
    assert _train_rows(run) == continued[2]
    assert not [w for w in warned if "metrics.jsonl" in w]


def test_a_metrics_log_starting_with_a_byte_order_mark_keeps_its_first_line(
        run: Path, warned: list[str], continued: dict[int, list[dict[str, Any]]]) -> None:
    good = _damage_metrics(run, lambda lines: [b"\xef\xbb\xbf" + lines[0], *lines[1:]])
    warned.clear()
    assert _trainer(run).fit()["global_step"] == 4
    assert (run / "metrics.jsonl").read_bytes().splitlines(keepends=True)[: len(good)] == good
    assert _train_rows(run) == continued[2]
    assert not [w for w in warned if "metrics.jsonl" in w]


def test_a_metrics_log_that_is_all_garbage(run: Path, warned: list[str],
                                           continued: dict[int, list[dict[str, Any]]]) -> None:
    _damage_metrics(run, lambda lines: [bytes(range(256)) * 40])
    warned.clear()
    assert _trainer(run).fit()["global_step"] == 4
    rows = _train_rows(run)
    assert rows == [row for row in continued[2] if row["step"] > 2]  # the lost lines stay lost, the rest is right
    assert len([w for w in warned if "metrics.jsonl" in w]) == 1
