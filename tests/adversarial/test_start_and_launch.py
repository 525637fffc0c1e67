"""Starting a run and launching ranks (issue 13, second pass): a signal at any moment of the start-up
ends with one line and exit 130 (never 143 and no word), and once the run has written into its
directory, with summary.json; config errors that depend on the config alone are found by the
launching command before torchrun starts; a late error of every rank is one line, without torchrun's
own log lines about stopping the others."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gputrain import interrupts
from gputrain.cli.launching import _AgentNoise, _quiet_torchrun
from gputrain.config import load_config
from gputrain.config.validate import check_registry_layout
from gputrain.errors import ConfigError
from gputrain.run.signals import StopRequest
from tests.conftest import ROOT, run_cli
from tests.waiting import wait_until

SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGUSR1]


# ----------------------------------------------------------------------------- a signal while starting
_STARTING = """
import os, signal, sys, time
from gputrain.interrupts import startup_signals
with startup_signals("train"):
    try:
        os.kill(os.getpid(), signal.{sig})
        time.sleep(5)
    except:  # noqa: E722 - a library's bare except around an import, which a raised exception would meet
        print("swallowed")
    print("went on")
"""


def _start_and_signal(sig: signal.Signals, **job: str) -> subprocess.CompletedProcess[str]:
    """Run the start-up under `sig` as one process, or as a rank of the job `job` (its environment)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    return subprocess.run([sys.executable, "-c", _STARTING.format(sig=sig.name)], capture_output=True, text=True,
                          timeout=120, env={**env, "PYTHONPATH": str(ROOT), **job})


@pytest.mark.parametrize("sig", SIGNALS, ids=[s.name for s in SIGNALS])
def test_a_signal_while_starting_is_one_line_and_exit_130(sig: signal.Signals) -> None:
    """Wherever it lands, even in a library's bare `except:` (which would swallow a raised exception
    and go on half imported): one line, exit 130, nothing after."""
    result = _start_and_signal(sig)
    assert result.returncode == 130 and result.stdout == "", (result.returncode, result.stdout)
    assert result.stderr == (f"gputrain train: stopped by {sig.name} while starting, before training began (nothing "
                             "to resume: run the command again to start it)\n")


@pytest.mark.parametrize("job", [{"RANK": "1", "WORLD_SIZE": "2"}, {"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}],
                         ids=["torchrun", "srun"])
def test_the_other_ranks_of_a_job_stop_silently(job: dict[str, str]) -> None:
    result = _start_and_signal(signal.SIGTERM, **job)
    assert result.returncode == 130 and result.stderr == "" and result.stdout == ""


def test_without_a_signal_the_start_up_handler_is_given_back(handlers: None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with interrupts.startup_signals("train"):
        assert interrupts.is_startup_handler(signal.getsignal(signal.SIGTERM))
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_run_stopped_by_a_signal_does_not_hand_back_the_start_up_handler(handlers: None) -> None:
    """The run's handler replaces the start-up one; once it has seen a signal, a further one exits 130
    at once, rather than raising the start-up message in the middle of the run's teardown."""
    with interrupts.startup_signals("train"):
        stop = StopRequest()
        stop.install()
        stop._handle(signal.SIGTERM, None)
        stop.uninstall()
        assert signal.getsignal(signal.SIGTERM) is interrupts.leave_now


_ARMED_BEFORE_WRITING = """
import os, signal, sys
import gputrain.run.start as run_start
real = run_start.write_run_files
def write_then_signal(*args, **kwargs):
    real(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)  # right after the run's first files are written
run_start.write_run_files = write_then_signal
from gputrain.cli import main
sys.exit(main(["train", "--run-dir", sys.argv[1], "model.name=mlp", "model.hidden_sizes=[8]", "train.epochs=1",
               "log.progress=none", "log.tensorboard=false"]))
"""


def test_a_signal_right_after_the_first_files_are_written_leaves_a_summary(tmp_path: Path) -> None:
    run_dir = tmp_path / "r"
    result = subprocess.run([sys.executable, "-c", _ARMED_BEFORE_WRITING, str(run_dir)], capture_output=True, text=True,
                            timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 130, result.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert "resume with: gputrain train --run-dir" in result.stderr


def _catches(pid: int, sig: signal.Signals) -> bool:
    """Whether process `pid` has a handler of its own for `sig` (its SigCgt mask, /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    (mask,) = [line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")]
    return bool(int(mask, 16) >> (sig - 1) & 1)


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["handler", "run-dir"])
def test_sigterm_at_any_moment_of_the_start_is_130_with_a_word(tmp_path: Path, moment: str) -> None:
    """A real command and a real SIGTERM from outside, sent as soon as the process catches SIGTERM
    (the entry point's first instruction, gputrain.interrupts.guard_the_start: before it Python runs
    none of gputrain's code) or as soon as the run directory appears (the run's own handler, which
    records): exit 130, a line naming the signal, and summary.json wherever the run has written
    anything. Which stage of the start-up the signal lands in varies with the machine's load, the
    answer must not; each stage is hit on purpose in test_launch_and_signals.py (no timing: before,
    delays after the handler was seen chose the stage, and under load they fell elsewhere)."""
    run_dir = tmp_path / "r"
    proc = subprocess.Popen([sys.executable, "-m", "gputrain", "train", "--run-dir", str(run_dir), "model.name=mlp",
                             "model.hidden_sizes=[8]", "train.epochs=1000", "log.progress=none",
                             "log.tensorboard=false"], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if moment == "handler":
        wait_until(lambda: _catches(proc.pid, signal.SIGTERM) or proc.poll() is not None, what="a SIGTERM handler")
    else:
        wait_until(lambda: run_dir.exists() or proc.poll() is not None, what="the run directory")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-2000:]
    assert "stopped by SIGTERM" in err.strip().splitlines()[-1] and "Traceback" not in err, err[-2000:]
    written = [p.name for p in run_dir.iterdir()] if run_dir.exists() else []
    assert not written or "summary.json" in written, written


# ----------------------------------------------------------------------------- layouts the registry's models support
LAYOUTS = [
    ({"parallel.strategy": "pp", "model.name": "cnn"}, "parallel.strategy", "pipeline parallelism cuts"),
    ({"parallel.strategy": "pp", "model.name": "resnet18"}, "parallel.strategy", "model.name=resnet18 is neither"),
    ({"parallel.strategy": "pp", "model.name": "resnet50"}, "parallel.strategy", "model.name=resnet50 is neither"),
    ({"parallel.strategy": "pp", "model.name": "timm:resnet18"}, "parallel.strategy", "timm:resnet18 is neither"),
    ({"parallel.strategy": "tp", "model.name": "cnn"}, "parallel.strategy", "model.name=cnn has none"),
    ({"parallel.strategy": "tp", "model.name": "resnet18"}, "parallel.strategy", "model.name=resnet18 has none"),
    ({"parallel.strategy": "tp", "model.name": "resnet34"}, "parallel.strategy", "model.name=resnet34 has none"),
    ({"parallel.strategy": "tp", "model.name": "torchvision:resnet18"}, "parallel.strategy", "has none"),
    ({"parallel.strategy": "hybrid", "parallel.tp": 2, "model.name": "cnn"}, "parallel.tp", "has none"),
    ({"parallel.strategy": "hybrid", "parallel.pp": 2, "model.name": "resnet18"}, "parallel.pp", "is neither"),
]


@pytest.mark.parametrize(("overrides", "field", "words"), LAYOUTS,
                         ids=[f"{o['parallel.strategy']}-{o['model.name']}" for o, _, _ in LAYOUTS])
def test_a_layout_the_model_cannot_take_is_refused_from_the_config(overrides: dict, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        check_registry_layout(load_config(overrides))
    assert err.value.field == field and words in str(err.value)
    assert "use parallel.strategy=fsdp or ddp for this model" in str(err.value)


@pytest.mark.parametrize("overrides", [
    {"parallel.strategy": "pp", "model.name": "mlp"}, {"parallel.strategy": "pp", "model.name": "gpt"},
    {"parallel.strategy": "tp", "model.name": "mlp"}, {"parallel.strategy": "tp", "model.name": "gpt"},
    {"parallel.strategy": "fsdp", "model.name": "cnn"}, {"parallel.strategy": "hybrid", "model.name": "resnet18"},
    {"parallel.strategy": "auto", "model.name": "resnet18"},
], ids=["pp-mlp", "pp-gpt", "tp-mlp", "tp-gpt", "fsdp-cnn", "hybrid-dp-resnet", "auto-resnet"])
def test_layouts_the_model_can_take_pass(overrides: dict) -> None:
    check_registry_layout(load_config(overrides))


@pytest.mark.parametrize("args", [["parallel.strategy=pp", "model.name=cnn"],
                                  ["parallel.strategy=tp", "model.name=resnet18", "model.base_width=8"]],
                         ids=["pp-cnn", "tp-resnet18"])
def test_the_launcher_refuses_before_torchrun_starts(tmp_path: Path, args: list[str]) -> None:
    result = run_cli("train", "--nproc-per-node", "2", "--run-dir", str(tmp_path / "r"), *args, cwd=tmp_path,
                     timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gputrain train: config error: parallel.strategy = "), lines
    # one line and no run directory: torchrun never started
    assert not (tmp_path / "r").exists()


# ----------------------------------------------------------------------------- torchrun's own lines
@pytest.mark.parametrize(("message", "dropped"), [
    ("Sending process %s closing signal %s", True),
    ("failed (exitcode: %s) local_rank: %s (pid: %s) of binary: %s", True),
    ("Received %s death signal, shutting down workers", True),
    ("Unable to shutdown process %s via %s, forcefully exiting via %s", False),
    ("[%s] Rendezvous'ing worker group", False),
], ids=["closing", "exitcode", "death-signal", "unable-to-stop", "rendezvous"])
def test_torchruns_lines_about_stopping_ranks_are_dropped(message: str, dropped: bool) -> None:
    record = logging.LogRecord("torch.distributed.elastic.multiprocessing.api", logging.WARNING, "api.py", 1, message,
                               (), None)
    assert _AgentNoise().filter(record) is not dropped


def test_the_filter_is_on_torchruns_loggers_once() -> None:
    _quiet_torchrun()
    _quiet_torchrun()
    for name in ("torch.distributed.elastic.multiprocessing.api", "torch.distributed.elastic.agent.server.api"):
        assert sum(isinstance(f, _AgentNoise) for f in logging.getLogger(name).filters) == 1


@pytest.mark.slow
def test_a_late_data_error_of_every_rank_is_one_line(tmp_path: Path) -> None:
    """A CSV whose NaN is found while the ranks load the data (after torchrun started them): rank 0's
    line, and nothing of torchrun's, nor the launcher's repeat of it."""
    path = tmp_path / "t.csv"
    path.write_text("a,b,y\n" + "".join(f"{i}.5,{i},{i % 2}\n" for i in range(30)) + "nan,1,0\n")
    result = run_cli("train", "--nproc-per-node", "2", "--run-dir", str(tmp_path / "r"), "data.name=csv",
                     f"data.path={path}", "parallel.timeout_s=30", cwd=tmp_path, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{path}: line 32, column 'a'" in lines[0], result.stderr[-2000:]


@pytest.mark.parametrize(("raised", "summary_now", "said"), [
    ("usage", False, ""),  # every rank refused the input: rank 0's line is the only one
    ("interrupted", False, ""),  # stopped while starting: rank 0 said so; there is no checkpoint to name
    ("interrupted", True, "stopped by SIGTERM: the ranks saved a checkpoint; run the same command again"),
], ids=["usage", "stopped-while-starting", "stopped-running"])
def test_the_launcher_adds_no_line_where_rank_0_has_said_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           raised: str, summary_now: bool, said: str) -> None:
    import argparse

    from gputrain.cli.launching import launch_ranks
    from gputrain.distributed import launch as launch_module
    from gputrain.errors import Interrupted, UsageError

    def fake_launch(*_: object) -> int:
        if summary_now:
            (tmp_path / "summary.json").write_text("{}")
        if raised == "usage":
            raise UsageError("rank 0 failed first: it exited with code 2; ranks [1] stopped too (its message is above)")
        raise Interrupted("stopped by SIGTERM: the ranks saved a checkpoint; run the same command again")

    monkeypatch.setattr(launch_module, "launch", fake_launch)
    args = argparse.Namespace(config=None, overrides=[], nproc_per_node=2, nnodes=1, node_rank=0, rdzv_endpoint=None,
                              rdzv_timeout=60.0, max_restarts=0)
    with pytest.raises((Interrupted, UsageError)) as err:
        launch_ranks(args, "train", str(tmp_path))
    shown_by_the_cli = "" if err.value.shown else str(err.value)  # a shown error prints nothing more
    assert shown_by_the_cli == said
