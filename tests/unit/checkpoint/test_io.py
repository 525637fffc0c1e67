"""checkpoint/io.py: atomic, checksummed checkpoints, their discovery for resume, the final weights.

- Damaged checkpoints are caught by the checksums before any state is applied, and resume falls
  back to the previous valid one (issue 7, figure 3).
- SIGKILL inside checkpoint writes, synchronous and asynchronous: nothing partial at a final path,
  resume from the last complete checkpoint (issue 7, figure 2; `scripts/kill_during_save.py
  --trials 50` prints the full figure).
- Checkpoint files crafted to run code are refused, and the code never runs (issue 7, figure 5).
- The final model.safetensors of a model with tied weights loads back with the standard calls the
  README names: safetensors' `load_model`, or `load_state_dict(load_file(...), strict=False)`.
"""

from __future__ import annotations

import ast
import json
import pickle
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, load_model
from torch import nn

from gputrain import Trainer
from gputrain.checkpoint import CorruptCheckpoint, find_resumable, save_checkpoint, verify_checkpoint
from gputrain.cli import main
from gputrain.config import load_config
from gputrain.data import build_data
from gputrain.errors import RunError
from gputrain.models import build_model
from tests.unit.checkpoint.helpers import Payload, read_and_apply, reseal, sha256_of
from tests.unit.reliability.chaos import (
    REPO,
    TINY,
    check_after_crash,
    compare_runs,
    kill_during_save,
    resumed_from,
    run_train,
)

PACKAGE = Path(__file__).resolve().parents[3] / "gputrain"


# ----------------------------------------------------------------------------- damaged checkpoints
FILES = ["model.safetensors", "state.pt", "manifest.json", "COMMITTED"]


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2))


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """checkpoints/step-4 and step-8, as the trainer writes them (weights + optimizer/RNG state)."""
    root = tmp_path_factory.mktemp("pristine") / "checkpoints"
    for step in (4, 8):
        model = _model(step)
        optimizer = torch.optim.AdamW(model.parameters())
        model(torch.randn(3, 6)).sum().backward()
        optimizer.step()
        save_checkpoint(root, step, model, {"optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
                                            "loop": {"global_step": step}})
    return root


def damage(path: Path, rng: random.Random) -> str:
    """Damage one checkpoint directory in one of the ways disks and interrupted copies do."""
    kind = rng.choice(["truncate", "bitflip", "delete", "no_marker"])
    name = "COMMITTED" if kind == "no_marker" else rng.choice(FILES)
    file = path / name
    if kind in ("delete", "no_marker"):
        file.unlink()
    elif kind == "truncate":
        data = file.read_bytes()
        file.write_bytes(data[:rng.randrange(len(data))])
    else:
        data = bytearray(file.read_bytes())
        offset = rng.randrange(len(data))
        data[offset] ^= 1 << rng.randrange(8)
        file.write_bytes(bytes(data))
    return f"{kind} {name}"


def test_100_damaged_checkpoints_are_all_detected_before_any_state_is_applied(
        pristine: Path, tmp_path: Path, gputrain_warnings: list[str]) -> None:
    rng = random.Random(3)
    kinds: dict[str, int] = {}
    for trial in range(100):
        root = tmp_path / f"t{trial}" / "checkpoints"
        shutil.copytree(pristine, root)
        how = damage(root / "step-8", rng)
        kinds[how.split()[0]] = kinds.get(how.split()[0], 0) + 1
        model = _model(99)
        before = [p.detach().clone() for p in model.parameters()]
        with pytest.raises(CorruptCheckpoint, match="step-8"):
            read_and_apply(root / "step-8", model)
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())), f"{how}: weights were applied"
        gputrain_warnings.clear()
        assert find_resumable(root) == root / "step-4", how
        warnings = list(gputrain_warnings)
        assert len(warnings) == 1 and "\n" not in warnings[0], warnings
        assert warnings[0].startswith("skipping damaged checkpoint: ") and str(root / "step-8") in warnings[0]
        read_and_apply(root / "step-4", model)  # the fallback itself is intact
    assert min(kinds.values()) >= 15, kinds  # every kind of damage was exercised


def test_no_valid_checkpoint_is_an_error_never_a_restart(pristine: Path, tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    shutil.copytree(pristine, root)
    (root / "step-8" / "state.pt").write_bytes(b"")
    (root / "step-4" / "COMMITTED").unlink()
    with pytest.raises(RunError) as err:
        find_resumable(root)
    message = str(err.value)
    assert message.startswith("no valid checkpoint to resume from: ")
    assert "step-8: state.pt does not match its checksum" in message
    assert "step-4: incomplete (no COMMITTED marker)" in message
    assert "checkpoint.resume=never" in message


def test_only_unfinished_temporaries_means_a_fresh_start(tmp_path: Path) -> None:
    (tmp_path / "checkpoints" / ".step-4.tmp-123").mkdir(parents=True)
    assert find_resumable(tmp_path / "checkpoints") is None


def _cli(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gputrain", "train", "--run-dir", str(run_dir), *TINY],
                          cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_cli_resume_skips_a_damaged_latest_checkpoint(reference_run: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    _as_if_killed(run_dir)  # a complete run is never trained again: this one was stopped before its end
    latest = sorted((run_dir / "checkpoints").iterdir(), key=lambda p: int(p.name[5:]))[-1]
    data = bytearray((latest / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0x10
    (latest / "model.safetensors").write_bytes(bytes(data))
    done = _cli(run_dir)
    assert done.returncode == 0, done.stderr
    warning = [line for line in done.stderr.splitlines() if "damaged" in line]
    assert warning == [f"WARNING: skipping damaged checkpoint: {latest}: model.safetensors does not match its "
                       "checksum"], done.stderr
    assert "resumed from" in done.stdout + done.stderr
    assert compare_runs(reference_run, run_dir) == []  # redoing the lost steps gives the same run

    _as_if_killed(run_dir)
    for path in (run_dir / "checkpoints").iterdir():
        (path / "state.pt").write_bytes(b"\0" * 16)
    log_before = (run_dir / "metrics.jsonl").read_bytes()
    failed = _cli(run_dir)
    assert failed.returncode == 1
    assert "no valid checkpoint to resume from" in failed.stderr and "Traceback" not in failed.stderr
    assert (run_dir / "metrics.jsonl").read_bytes() == log_before  # nothing restarted
    assert not (run_dir / "model.safetensors").exists()
    summary = run_dir / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text())["status"] == "failed"


def _as_if_killed(run_dir: Path) -> None:
    """What a run killed before its end leaves: no summary, no final weights."""
    (run_dir / "summary.json").unlink()
    (run_dir / "model.safetensors").unlink()


# ----------------------------------------------------------------------------- killed while saving
EVERY = 4


@pytest.mark.slow
def test_sigkill_during_saves(tmp_path: Path, reference_run: Path) -> None:
    rng = random.Random(5)
    for trial in range(5):
        mode = ("sync", "async")[trial % 2]
        overrides = TINY + [f"checkpoint.async_save={str(mode == 'async').lower()}"]
        run_dir = tmp_path / f"t{trial}"
        left = kill_during_save(run_dir, overrides, rng.randint(1, 14), 0.05, rng.uniform(0, 0.4))
        assert left is not None, "the run finished before it could be killed"
        problems, resume_from = check_after_crash(run_dir)
        assert problems == [], (trial, left)
        lost = left["killed_at_step"] - (int(resume_from.name[5:]) if resume_from else 0)
        assert lost <= (EVERY if mode == "sync" else 2 * EVERY), (trial, left, resume_from)
        if trial == 1:  # one full resume (async); test_kill_resume and the script cover many more
            assert run_train(run_dir, overrides) == 0
            assert resume_from is None or resumed_from(run_dir, resume_from)
            assert not list((run_dir / "checkpoints").glob(".step-*")), "temporaries left behind"
            assert compare_runs(reference_run, run_dir) == []


def test_a_crash_between_the_renames_of_a_resave_is_repaired(tmp_path: Path) -> None:
    from gputrain.checkpoint import find_resumable, rotate_checkpoints, save_checkpoint

    root = tmp_path / "checkpoints"
    save_checkpoint(root, 4, nn.Linear(2, 2), {})
    save_checkpoint(root, 8, nn.Linear(2, 2), {})
    # what a kill between `final → .old` and `tmp → final` leaves: no step-8, its old copy, a new temporary
    (root / "step-8").rename(root / ".step-8.old-999999")
    (root / ".step-8.tmp-999999").mkdir()
    assert find_resumable(root) == root / "step-8"
    verify_checkpoint(root / "step-8")
    rotate_checkpoints(root, keep_last=2)  # the next save's rotation sweeps the debris
    assert sorted(p.name for p in root.iterdir()) == ["step-4", "step-8"]


# ----------------------------------------------------------------------------- files crafted to run code
@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("hostile") / "run"
    code = main(["train", "--run-dir", str(run_dir), "model.name=mlp", "model.hidden_sizes=[8]", "train.device=cpu",
                 "train.max_steps=2", "log.progress=none", "log.tensorboard=false", "data.name=synthetic",
                 "data.shape=[4]", "data.num_samples=256"])
    assert code == 0
    return run_dir


def _resume(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["train", "--run-dir", str(run_dir), "model.name=mlp", "model.hidden_sizes=[8]",
                 "train.device=cpu", "train.max_steps=4", "log.progress=none", "log.tensorboard=false",
                 "data.name=synthetic", "data.shape=[4]", "data.num_samples=256"])
    return code, capsys.readouterr().err


def _hostile_copy(trained_run: Path, tmp_path: Path) -> tuple[Path, Path]:
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    (ckpt,) = (run_dir / "checkpoints").iterdir()
    return run_dir, ckpt


def test_pickle_payload_in_state_pt_is_refused(trained_run: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    sentinel = tmp_path / "SENTINEL"
    run_dir, ckpt = _hostile_copy(trained_run, tmp_path)
    state = torch.load(ckpt / "state.pt", weights_only=True)
    state["loop"]["extra"] = {"note": Payload(sentinel)}
    torch.save(state, ckpt / "state.pt")
    reseal(ckpt)
    code, err = _resume(run_dir, capsys)
    assert code == 1
    assert err.strip() == (f"gputrain train: cannot resume: {ckpt}: state.pt holds objects other than tensors and "
                           "plain values; refused to load it (it could run code)")
    assert not sentinel.exists()


def test_raw_pickle_as_state_pt_is_refused(trained_run: Path, tmp_path: Path) -> None:
    sentinel = tmp_path / "SENTINEL"
    _, ckpt = _hostile_copy(trained_run, tmp_path)
    (ckpt / "state.pt").write_bytes(pickle.dumps(Payload(sentinel)))  # legacy (non-zip) torch format
    reseal(ckpt)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 8))
    with pytest.raises(CorruptCheckpoint, match="state.pt holds objects other than tensors"):
        read_and_apply(ckpt, model)
    assert not sentinel.exists()


def _seal_marker(ckpt: Path) -> None:
    """The marker alone matched to the manifest: where the manifest is the payload, `reseal` (which
    reads it) cannot run, and an attacker needs only the marker."""
    (ckpt / "COMMITTED").write_text(f"{ckpt.name[5:]} {sha256_of(ckpt / 'manifest.json')}\n")


@pytest.mark.parametrize(("name", "seal", "said"), [
    ("model.safetensors", reseal, "model.safetensors is not a valid safetensors file"),
    ("manifest.json", _seal_marker, "manifest.json is unreadable"),
])
def test_pickle_disguised_as_a_checkpoint_file_is_refused(name: str, seal: Callable[[Path], None], said: str,
                                                          trained_run: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    sentinel = tmp_path / "SENTINEL"
    run_dir, ckpt = _hostile_copy(trained_run, tmp_path)
    (ckpt / name).write_bytes(pickle.dumps(Payload(sentinel)))
    seal(ckpt)
    code, err = _resume(run_dir, capsys)
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{ckpt}: {said}" in err
    assert not sentinel.exists()


# ----------------------------------------------------------------------- no unsafe load in the package
def _unsafe_calls(source: str) -> list[str]:
    """Calls that can unpickle arbitrary objects, and Unpickler subclasses that do not restrict
    `find_class` (a subclass that allow-lists classes, like checkpoint/safe_dcp.py's, is the safe way)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("Unpickler") for b in node.bases):
            if not any(isinstance(f, ast.FunctionDef) and f.name == "find_class" for f in node.body):
                found.append(f"class {node.name}(Unpickler) without find_class at line {node.lineno}")
            continue
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        keywords = {k.arg: k.value for k in node.keywords}
        weights_only = keywords.get("weights_only")
        if any(isinstance(v, ast.Constant) and v.value is False and k == "weights_only" for k, v in keywords.items()):
            found.append(f"{func}(weights_only=False) at line {node.lineno}")
        elif func in ("pickle.load", "pickle.loads", "pickle.Unpickler", "cPickle.load", "dill.load", "dill.loads",
                      "marshal.loads", "shelve.open", "joblib.load"):
            found.append(f"{func} at line {node.lineno}")
        elif func.split(".")[-1] == "load" and func.split(".")[0] == "torch" and not (
                isinstance(weights_only, ast.Constant) and weights_only.value is True):
            found.append(f"{func} without weights_only=True at line {node.lineno}")
        elif func in ("np.load", "numpy.load") and isinstance(keywords.get("allow_pickle"), ast.Constant) and \
                keywords["allow_pickle"].value is True:  # type: ignore[union-attr]
            found.append(f"{func}(allow_pickle=True) at line {node.lineno}")
    return found


def test_the_scanner_catches_unsafe_loads() -> None:
    bad = ("import pickle, torch\npickle.load(f)\npickle.loads(b)\ntorch.load(p)\n"
           "torch.load(p, weights_only=False)\nnp.load(p, allow_pickle=True)\n")
    assert len(_unsafe_calls(bad)) == 5
    assert len(_unsafe_calls("import pickle\nclass U(pickle.Unpickler):\n    pass\n")) == 1
    assert _unsafe_calls("class U(pickle.Unpickler):\n    def find_class(self, m, n):\n        raise X\n") == []
    assert _unsafe_calls("torch.load(p, map_location='cpu', weights_only=True)\n") == []


def test_no_load_path_in_the_package_can_unpickle_arbitrary_objects() -> None:
    problems = [f"{path.relative_to(PACKAGE.parent)}: {hit}" for path in sorted(PACKAGE.rglob("*.py"))
                for hit in _unsafe_calls(path.read_text())]
    assert problems == []


def test_a_foreign_but_harmless_state_is_a_short_error(trained_run: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run_dir, ckpt = _hostile_copy(trained_run, tmp_path)
    torch.save({"optimizer": {"state": 3}}, ckpt / "state.pt")
    reseal(ckpt)
    code, err = _resume(run_dir, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1  # not this run's checkpoint: bad input
    assert err.strip() == (f"gputrain train: cannot resume: {ckpt}: state.pt: the optimizer's state entry is "
                           "an int, not a dict")


# ----------------------------------------------------------------------------- the final weights
GPT = {"model.name": "gpt", "model.n_layer": 1, "model.n_head": 2, "model.d_model": 16, "data.name": "synthetic",
       "data.task": "lm", "data.seq_len": 8, "data.num_samples": 64, "data.vocab_size": 32, "train.max_steps": 3,
       "train.batch_size": 16, "train.device": "cpu", "log.progress": "none", "log.tensorboard": False,
       "checkpoint.enabled": False}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    run_dir = tmp_path_factory.mktemp("tied") / "run"
    trainer = Trainer.from_config(None, run_dir=run_dir, overrides=GPT)
    trainer.fit()
    return run_dir / "model.safetensors", {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def _fresh() -> torch.nn.Module:
    config = load_config(None, GPT)
    torch.manual_seed(123)  # other weights than the trained ones
    return build_model(config.model, build_data(config.data, 0).spec)


def test_the_tie_is_saved_once(trained: tuple[Path, dict[str, torch.Tensor]]) -> None:
    path, _ = trained
    stored = load_file(str(path))
    assert ("wte.weight" in stored) != ("lm_head.weight" in stored)


@pytest.mark.parametrize("how", ["load_model", "load_state_dict"])
def test_the_standard_calls_restore_every_weight(trained: tuple[Path, dict[str, torch.Tensor]], how: str) -> None:
    path, weights = trained
    model = _fresh()
    if how == "load_model":
        load_model(model, str(path))
    else:
        missing, unexpected = model.load_state_dict(load_file(str(path)), strict=False)
        assert not unexpected and set(missing) <= {"wte.weight", "lm_head.weight"}  # the tie's other name
    assert model.lm_head.weight is model.wte.weight  # still tied
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, weights[name], rtol=0, atol=0, msg=name)


def test_weights_files_get_the_mode_every_other_file_of_the_run_gets(tmp_path: Path) -> None:
    """safetensors creates its file 0600: a colleague who could read the run could not read its
    weights. Both writers (a checkpoint's, the final weights') give them the umask's mode instead."""
    from gputrain.checkpoint.io import save_weights

    model = nn.Linear(3, 2)
    checkpoint = save_checkpoint(tmp_path / "checkpoints", 1, model, {"step": 1})
    save_weights(model, tmp_path / "model.safetensors")
    (tmp_path / "other.json").write_text("{}")  # as every other run file is written
    expected = (tmp_path / "other.json").stat().st_mode & 0o777
    assert expected & 0o044  # the test's point: a umask that lets others read
    for weights in (tmp_path / "model.safetensors", *checkpoint.glob("*.safetensors")):
        assert weights.stat().st_mode & 0o777 == expected, weights
