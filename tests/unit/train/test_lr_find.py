"""`gputrain lr-find`: the LR range test leaves the run it is pointed at untouched (but for
lr_find.json), suggests an LR within a factor of 3 of the best of a sweep by hand on digits (a small
MLP, and the default job's cnn), reads its rule off a smoothing that does not lag the losses, names
its rule, works with accumulation, bf16 and fp16's skipped steps. (Two ranks: tests/dist/test_lr_find.py;
fp16 and tf32 for real: tests/gpu/test_lr_find_cuda.py.)"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from gputrain.cli import main
from gputrain.config import load_config
from gputrain.report.build import write_report
from gputrain.train.lr_find import LRCurve, Sweep, build_sweep_parts, run_sweep, suggest_lr
from gputrain.train.step import StepResult
from gputrain.train.trainer import Trainer
from tests.one_thread import one_thread  # noqa: F401 - autouse: tiny models, one thread

# the default job's data and optimizer (digits, adamw), a small MLP so the test takes seconds
RUN = ["model.name=mlp", "train.device=cpu", "log.progress=none", "log.tensorboard=false", "train.epochs=2"]


def _fingerprint(root: Path) -> dict[str, tuple[str, int]]:
    """Every file under `root`: (SHA-256, modification time)."""
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[str, int]], str]:
    """A completed run (with checkpoints), then `gputrain lr-find --run-dir` on it: (run, the run's
    files before the sweep, what lr-find printed)."""
    run_dir = tmp_path_factory.mktemp("lr-find") / "run"
    Trainer.from_config(load_config(None, RUN), run_dir=run_dir).fit()
    before = _fingerprint(run_dir)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["lr-find", "--run-dir", str(run_dir)]) == 0
    return run_dir, before, printed.getvalue()


def test_the_run_directory_is_untouched_but_for_lr_find_json(swept):
    run_dir, before, _ = swept
    after = _fingerprint(run_dir)
    assert set(after) - set(before) == {"lr_find.json"}
    assert {k: v for k, v in after.items() if k != "lr_find.json"} == before
    assert any(k.startswith("checkpoints/") for k in before)  # there were checkpoints to disturb


def test_it_prints_the_suggestion_and_its_rule_and_records_the_curve(swept, tmp_path):
    run_dir, _, stdout = swept
    record = json.loads((run_dir / "lr_find.json").read_text())
    assert f"config: {run_dir / 'config.toml'} (the run's own)" in " ".join(stdout.split())
    assert f"suggested optim.lr={record['suggested_lr']:.2e} (rule: steepest descent of the smoothed loss" in stdout
    assert record["rule"] == "steepest" and "minimum" in record["other_rules"]
    lrs = np.asarray(record["lrs"])
    assert lrs[0] == pytest.approx(1e-7) and np.all(np.diff(np.log(lrs)) == pytest.approx(math.log(1e8) / 99))
    assert record["stopped"] in ("completed", "diverged") and len(record["losses"]) == record["steps_run"]
    assert record["config"]["model"]["name"] == "mlp" and record["world_size"] == 1
    # and the report draws it, the suggestion marked
    out = tmp_path / "r.html"
    write_report([run_dir], out)
    page = out.read_text()
    assert "<h2>LR finder</h2>" in page and f">{record['suggested_lr']:.2e}</text>" in page


def _hand_sweep_best(run: list[str], lrs: list[float], tmp: Path) -> tuple[float, dict[float, float]]:
    """Train the same run at each LR for 3 epochs; the LR of the lowest validation loss."""
    found = {}
    for lr in lrs:
        config = load_config(None, [*run, "train.epochs=3", f"optim.lr={lr}", "checkpoint.enabled=false"])
        found[lr] = Trainer.from_config(config, run_dir=tmp / f"lr-{lr}").fit()["val"]["loss"]
    best = min(found, key=found.__getitem__)
    assert lrs[0] < best < lrs[-1], found  # the grid brackets the best
    return best, found


def test_the_suggestion_is_within_3x_of_the_best_lr_of_a_sweep_by_hand(swept, tmp_path):
    suggested = json.loads((swept[0] / "lr_find.json").read_text())["suggested_lr"]
    best, losses = _hand_sweep_best(RUN, [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1, 3e-1], tmp_path)
    assert best / 3 <= suggested <= best * 3, (suggested, losses)


def test_on_the_default_cnn_the_suggestion_is_within_3x_of_a_sweep_by_hand(tmp_path):
    """The default job's model (dropout, convolutions): its losses fall fastest near 4e-3, and its
    hand sweep's best is 3e-3 on this grid (5e-3 on a finer one). A running average's lag put the
    suggestion at 1.0e-2, 3.4 times the grid's best."""
    cnn = ["model.name=cnn", *RUN[1:]]
    assert main(["lr-find", "--run-dir", str(tmp_path / "sweep"), *cnn]) == 0
    suggested = json.loads((tmp_path / "sweep" / "lr_find.json").read_text())["suggested_lr"]
    best, losses = _hand_sweep_best(cnn, [3e-4, 1e-3, 3e-3, 1e-2, 3e-2], tmp_path)
    assert best / 3 <= suggested <= best * 3, (suggested, losses)


def _running_average(losses: list[float], sweep: Sweep) -> list[float]:
    """The stop rule's debiased running average, as run_sweep keeps it."""
    average, out = 0.0, []
    for n, loss in enumerate(losses, 1):
        average = sweep.smoothing * average + (1 - sweep.smoothing) * loss
        out.append(average / (1 - sweep.smoothing**n))
    return out


def test_the_rules_read_a_smoothing_that_does_not_lag_the_losses():
    """A noiseless loss falling fastest at lr 1e-3, then rising: the steepest rule finds 1e-3 (one
    point of the sweep is a factor of 1.2). Read off the running average it was 2.3e-3: the average
    trails the losses by up to 9 steps, 0.7 of a decade."""
    sweep = Sweep()  # the default: 100 steps from 1e-7 to 10
    lrs = [sweep.lr_at(i) for i in range(80)]
    x = np.log10(lrs)
    losses = list(0.3 + 2.0 / (1 + np.exp((x + 3) / 0.3)) + np.where(x > -1.5, 5 * (x + 1.5) ** 2, 0.0))
    curve = LRCurve(lrs, losses, _running_average(losses, sweep), "completed")
    assert suggest_lr(curve).lr == pytest.approx(1e-3, rel=0.2)


def _sweep(tmp: Path, *overrides: str, steps: int = 30) -> LRCurve:
    config = load_config(None, [*RUN, "checkpoint.enabled=false", *overrides])
    return run_sweep(build_sweep_parts(config, tmp), Sweep(1e-5, 1.0, steps))


@pytest.mark.parametrize(
    ("overrides", "layers"),
    [
        (["model.name=mlp"], []),
        (["model.name=cnn"], ["dropout"]),  # the default job's model: 0.25 and 0.5
        (["model.name=cnn", "model.dropout=0"], []),
        (["model.name=resnet18", "model.base_width=4"], ["batch normalisation"]),
    ],
)
def test_the_layers_that_make_ranks_sweep_another_curve_are_named(overrides, layers):
    """N ranks sweep the one-process curve exactly where they train as one process: without these."""
    from gputrain.data import build_data
    from gputrain.models import build_model
    from gputrain.train.lr_find import rank_dependent_layers

    config = load_config(None, [*RUN, *overrides])
    assert rank_dependent_layers(build_model(config.model, build_data(config.data, 0).spec)) == layers


def test_accumulation_sweeps_the_same_curve(tmp_path):
    # the loss of a step is the mean over its micro-batches: two halves of the batch, one curve
    whole = _sweep(tmp_path / "a")
    halves = _sweep(tmp_path / "b", "train.grad_accum=2")
    assert whole.lrs == halves.lrs
    assert np.allclose(whole.losses[:20], halves.losses[:20], rtol=1e-4)


def test_bf16_sweeps_and_suggests(tmp_path):
    fp32, bf16 = _sweep(tmp_path / "a"), _sweep(tmp_path / "b", "train.precision=bf16")
    assert all(math.isfinite(x) for x in bf16.losses[:20])
    assert abs(bf16.losses[0] - fp32.losses[0]) < 0.05  # the same model and batch, in lower precision
    assert 1 / 3 <= suggest_lr(bf16).lr / suggest_lr(fp32).lr <= 3


def test_without_a_run_dir_it_makes_a_new_one_holding_only_lr_find_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["lr-find", "--steps", "20", "--start-lr", "1e-4", "--end-lr", "1", *RUN]) == 0
    made = list((tmp_path / "runs").iterdir())
    assert len(made) == 1 and re.fullmatch(r"mlp-digits-\d{8}-\d{6}-lr-find", made[0].name)
    assert [p.name for p in made[0].iterdir()] == ["lr_find.json"]
    # its report: the sweep, said to be one (not a run still in progress), with the device it ran on
    page = tmp_path / "r.html"
    write_report([made[0]], page)
    text = page.read_text()
    assert 'class="badge s-lr-find"' in text and "An LR range test" in text and "<h2>LR finder</h2>" in text
    assert "device</b><span>cpu" in text and "Running" not in text and "<h2>Test split</h2>" not in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "2"], "--steps must be at least 5"),
        (["--start-lr", "1", "--end-lr", "0.1"], "--end-lr (0.1) must be larger than --start-lr (1)"),
        (["--start-lr", "0"], "--start-lr must be a number > 0"),
    ],
)
def test_bad_arguments_exit_2_naming_them(args, message, capsys):
    assert main(["lr-find", *args]) == 2
    assert message in capsys.readouterr().err


def _curve(losses: list[float]) -> LRCurve:
    lrs = [1e-4 * 10 ** (i / 10) for i in range(len(losses))]
    return LRCurve(lrs, losses, losses, "completed")


def test_the_rules_on_a_known_curve():
    # flat, then falling fastest between points 9 and 11, then a minimum at 14, then rising; at ten
    # points a decade the smoothing (a quarter of a decade) moves each by a point at most
    losses = [2.0] * 8 + [1.9, 1.7, 1.0, 0.6, 0.5, 0.45, 0.4, 0.6, 1.5, 4.0]
    curve = _curve(losses)
    steepest = suggest_lr(curve, "steepest")
    assert steepest.index in (9, 10) and steepest.lr == curve.lrs[steepest.index]
    minimum = suggest_lr(curve, "minimum")
    assert minimum.index in (13, 14) and minimum.lr == pytest.approx(curve.lrs[minimum.index] / 10)
    with pytest.raises(ValueError, match="usable points"):
        suggest_lr(_curve([1.0, math.nan]))


def test_fp16_overflow_steps_are_taken_again_not_recorded(tmp_path, monkeypatch):
    """A GradScaler overflow skips the update and leaves the LR where it was: no point of the curve.
    (fp16 needs CUDA; here the first steps' verdicts are made overflows.)"""
    import gputrain.train.lr_find as lr_find
    from gputrain.train.nonfinite import Verdict

    real_step, calls = lr_find.train_step, []

    def overflowing_first(parts, micro_batches, **kwargs):
        calls.append(micro_batches)
        if len(calls) in (1, 2, 5):  # the scaler skips these: neither the weights nor the LR move
            return StepResult(torch.tensor(2.3), None, Verdict("overflow", "fp16 loss scale overflow"))
        return real_step(parts, micro_batches, **kwargs)

    plain = _sweep(tmp_path / "a", steps=12)
    monkeypatch.setattr(lr_find, "train_step", overflowing_first)
    curve = _sweep(tmp_path / "b", steps=12)
    assert len(calls) == len(curve.lrs) + 3 and len(curve.lrs) >= 10
    assert curve.lrs == plain.lrs[: len(curve.lrs)]  # every LR once, in order: no point doubled
    assert curve.stopped != "overflow"
    monkeypatch.setattr(lr_find, "train_step", lambda *a, **k: StepResult(torch.tensor(2.3), None, Verdict("overflow")))
    assert _sweep(tmp_path / "c", steps=12).stopped == "overflow"  # Inf at every scale: it gives up
