"""Checkpoint files crafted to run code are refused, and the code never runs (issue 7, figure 5)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import pickle
from pathlib import Path

import pytest
import torch

from gputrain.checkpoint import CorruptCheckpoint, load_checkpoint
from gputrain.cli import main

PACKAGE = Path(__file__).resolve().parents[3] / "gputrain"


class Payload:
    """Unpickling this runs `touch <sentinel>`: what a malicious checkpoint would carry."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self) -> tuple:
        return os.system, (f"touch {self.sentinel}",)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def reseal(ckpt: Path) -> None:
    """Rewrite manifest and marker to match the files, as an attacker who controls them would."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for name in manifest["files"]:
        manifest["files"][name] = {"sha256": _sha(ckpt / name), "bytes": (ckpt / name).stat().st_size}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    (ckpt / "COMMITTED").write_text(f"{manifest['step']} {_sha(ckpt / 'manifest.json')}\n")


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
        load_checkpoint(ckpt, model)
    assert not sentinel.exists()


def test_pickle_disguised_as_safetensors_is_refused(trained_run: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    sentinel = tmp_path / "SENTINEL"
    run_dir, ckpt = _hostile_copy(trained_run, tmp_path)
    (ckpt / "model.safetensors").write_bytes(pickle.dumps(Payload(sentinel)))
    reseal(ckpt)
    code, err = _resume(run_dir, capsys)
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert f"{ckpt}: model.safetensors is not a valid safetensors file" in err
    assert not sentinel.exists()


def test_pickle_disguised_as_manifest_is_refused(trained_run: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    sentinel = tmp_path / "SENTINEL"
    run_dir, ckpt = _hostile_copy(trained_run, tmp_path)
    (ckpt / "manifest.json").write_bytes(pickle.dumps(Payload(sentinel)))
    (ckpt / "COMMITTED").write_text(f"{ckpt.name[5:]} {_sha(ckpt / 'manifest.json')}\n")
    code, err = _resume(run_dir, capsys)
    assert code == 1 and "Traceback" not in err
    assert f"{ckpt}: manifest.json is unreadable" in err
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
