"""Artifacts that gputrain did not write are never executed or unpickled (issue 34, mechanism 6).

Two kinds of file a `use` command loads could carry code:

* an export folder (use/export_files.py): every file a loader reads must match the checksum its
  export.json records, and an AOTInductor package (native code: loading it runs its shared library's
  constructors) is loaded only from a private copy of the checked bytes, and only where no other
  user could have written it. Each case changes one thing of a real export (a replaced or planted
  package whose `.so` would create a sentinel file when loaded, a replaced program or graph, an
  edited export.json, a link, a FIFO) and asserts exit 2, the one line naming the file, and that the
  sentinel was never created;
* a checkpoint's `state.pt`, read by `--checkpoint best` (its loop state names the best step) and
  by every checkpoint load: verified against the checkpoint's manifest, then read weights-only.
  Each case puts a hostile or malformed state.pt in a real run (resealed, as someone who controls
  the folder can) and asserts exit 2, one line naming the file, no traceback and no code run.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gputrain.checkpoint.io import list_checkpoints, read_state
from gputrain.cli import main
from tests.one_thread import one_thread  # noqa: F401  (an autouse fixture)
from tests.unit.checkpoint.helpers import Payload, reseal
from tests.unit.use.conftest import needs_onnx, tiny_runs

SENTINEL_ENV = "GPUTRAIN_TEST_SENTINEL"
CONSTRUCTOR = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void ran(void) {
    const char *path = getenv("GPUTRAIN_TEST_SENTINEL");
    FILE *f = path ? fopen(path, "w") : NULL;
    if (f) { fputs("native code ran\n", f); fclose(f); }
}
"""
REFUSED = "was not written by this export (checksum differs); re-export"
UNRECORDED = "was not written by this export (export.json records no checksum for it); re-export"


# ----------------------------------------------------------------------------- shared pieces
@pytest.fixture(scope="module")
def constructor_so(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shared library whose constructor writes the file $GPUTRAIN_TEST_SENTINEL names, built with `cc`."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) to build a shared library with a constructor")
    folder = tmp_path_factory.mktemp("native")
    (folder / "ctor.c").write_text(CONSTRUCTOR)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / "ctor.so"), str(folder / "ctor.c")], check=True)
    return folder / "ctor.so"


def _hostile_package(path: Path, so: Path) -> None:
    """An AOTInductor package whose shared library is `so`: torch's loader extracts it and dlopens it,
    which runs its constructor before any symbol is looked up."""
    path.unlink(missing_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("model/.data/version", "1\n")
        archive.write(so, "model/data/aotinductor/model/ctor.so")
        archive.writestr("model/data/aotinductor/model/ctor_metadata.json", '{"AOTI_DEVICE_KEY": "cpu"}')


@pytest.fixture
def sentinel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file hostile code creates if it runs (the constructor, or an unpickled os.system)."""
    path = tmp_path / "SENTINEL"
    monkeypatch.setenv(SENTINEL_ENV, str(path))
    return path


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], *fragments: str) -> str:
    """Run the command: exit 2 and one line on stderr holding every fragment; that line."""
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def _edit_record(out: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    record = _json(out / "export.json")
    change(record)
    (out / "export.json").write_text(json.dumps(record))


# ----------------------------------------------------------------------------- runs and exports, made once
@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """tiny_run(name) -> a tiny trained run (tests/unit/use/conftest.py's), trained on first use."""
    return tiny_runs(tmp_path_factory.mktemp("use-runs"))


@pytest.fixture(scope="module")
def exports(tiny_run: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """exports(kind) -> an export folder of that kind (pt2, pt2-aoti, safetensors, onnx), made on first use."""
    root = tmp_path_factory.mktemp("exports")
    made: dict[str, Path] = {}
    specs = {
        "pt2": ("csv_mlp", ["--format", "pt2", "--aoti", "off"]),
        "pt2-aoti": ("csv_regression", ["--format", "pt2", "--aoti", "on"]),
        "safetensors": ("csv_mlp", ["--format", "safetensors"]),
        "onnx": ("csv_mlp", ["--format", "onnx"]),
    }

    def get(kind: str) -> Path:
        if kind not in made:
            run, args = specs[kind]
            assert main(["export", str(tiny_run(run)), *args, "-o", str(root / kind)]) == 0
            made[kind] = root / kind
        return made[kind]

    return get


@pytest.fixture
def export_copy(exports: Callable[[str], Path], tmp_path: Path) -> Callable[[str], Path]:
    """export_copy(kind) -> a copy of that export to tamper with (its export.json names the same run)."""

    def get(kind: str) -> Path:
        target = tmp_path / f"export-{kind}"
        shutil.copytree(exports(kind), target)
        return target

    return get


def _verify(out: Path, fmt: str = "pt2") -> list[str]:
    """`export --verify-only` of the folder (RUN_DIR is not read: export.json names the run)."""
    return ["export", "unused-run", "--format", fmt, "--verify-only", "-o", str(out)]


def _program_of(module: torch.nn.Module, path: Path, inputs: int) -> None:
    torch.export.save(torch.export.export(module.eval(), (torch.randn(2, inputs),)), path)


# ----------------------------------------------------------------------------- the AOTInductor package
@pytest.mark.slow
def test_a_genuine_aoti_export_verifies_again_from_its_private_copy(export_copy, capsys, sentinel) -> None:
    out = export_copy("pt2-aoti")
    assert main(_verify(out)) == 0, capsys.readouterr().err
    checks = _json(out / "export.json")["verification"]["checks"]
    assert checks["pt2-aoti"]["passed"] and checks["pt2-aoti"]["runtime"] == "AOTInductor"


@pytest.mark.slow
def test_a_replaced_aoti_package_is_refused_and_its_code_never_runs(
    export_copy, constructor_so, capsys, sentinel
) -> None:
    out = export_copy("pt2-aoti")
    _hostile_package(out / "model-aoti.pt2", constructor_so)
    _refused(_verify(out), capsys, f"{out / 'model-aoti.pt2'} {REFUSED}")
    assert not sentinel.exists()


@pytest.mark.slow
def test_a_rebuilt_aoti_package_of_the_same_program_is_refused(export_copy, capsys) -> None:
    """A package that still loads (same kernels, one source member changed) is not this export's either."""
    out = export_copy("pt2-aoti")
    package = out / "model-aoti.pt2"
    with zipfile.ZipFile(package) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    source = next(name for name in members if name.endswith(".cpp"))
    members[source] += b"\n// rebuilt\n"
    with zipfile.ZipFile(package, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    _refused(_verify(out), capsys, f"{package} {REFUSED}")


@pytest.mark.slow
@pytest.mark.parametrize("what", ["package", "export.json", "folder"])
def test_an_aoti_export_other_users_can_write_is_refused(export_copy, capsys, what) -> None:
    out = export_copy("pt2-aoti")
    target = {"package": out / "model-aoti.pt2", "export.json": out / "export.json", "folder": out}[what]
    target.chmod(target.stat().st_mode | 0o002)
    _refused(
        _verify(out), capsys, f"{out / 'model-aoti.pt2'}: native code, refused: {target} is writable by every user"
    )


@pytest.mark.slow
def test_an_aoti_package_owned_by_another_user_is_refused(export_copy, capsys) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    out = export_copy("pt2-aoti")
    os.chown(out / "model-aoti.pt2", 65534, 65534)
    _refused(_verify(out), capsys, "native code, refused", "owned by another user (uid 65534)")


@pytest.mark.slow
def test_an_aoti_package_whose_checksum_was_removed_is_refused(export_copy, constructor_so, capsys, sentinel) -> None:
    out = export_copy("pt2-aoti")
    _hostile_package(out / "model-aoti.pt2", constructor_so)
    _edit_record(out, lambda r: r["checksums"].pop("model-aoti.pt2"))
    _refused(_verify(out), capsys, f"{out / 'model-aoti.pt2'} {UNRECORDED}")
    assert not sentinel.exists()


@pytest.mark.slow
def test_an_aoti_package_that_is_a_link_is_refused(export_copy, tmp_path, capsys) -> None:
    out = export_copy("pt2-aoti")
    elsewhere = tmp_path / "elsewhere.pt2"
    (out / "model-aoti.pt2").rename(elsewhere)  # the genuine bytes, reached through a link
    (out / "model-aoti.pt2").symlink_to(elsewhere)
    _refused(_verify(out), capsys, f"{out / 'model-aoti.pt2'}: not a plain file")


@pytest.mark.parametrize("named", ["model-aoti.pt2", "../../elsewhere/evil.pt2"])
def test_an_aoti_package_planted_beside_a_pt2_export_is_refused(
    export_copy, constructor_so, capsys, sentinel, named
) -> None:
    """export.json edited to claim a package (whatever file it names) that the export never wrote."""
    out = export_copy("pt2")
    _hostile_package(out / "model-aoti.pt2", constructor_so)
    _edit_record(out, lambda r: r.update(aoti={"file": named}))
    _refused(_verify(out), capsys, f"{out / 'model-aoti.pt2'} {UNRECORDED}")
    assert not sentinel.exists()


def test_a_planted_aoti_package_with_a_forged_checksum_in_a_folder_others_write_is_refused(
    export_copy, constructor_so, capsys, sentinel
) -> None:
    """export.json rewritten to vouch for the planted package: from a folder every user can write,
    native code is not loaded whatever export.json says."""
    out = export_copy("pt2")
    _hostile_package(out / "model-aoti.pt2", constructor_so)
    from gputrain.checkpoint.io import file_digest

    _edit_record(
        out,
        lambda r: (
            r.update(aoti={"file": "model-aoti.pt2"}),
            r["checksums"].update({"model-aoti.pt2": file_digest(out / "model-aoti.pt2")}),
        ),
    )
    out.chmod(0o777)
    _refused(_verify(out), capsys, "native code, refused", "is writable by every user")
    assert not sentinel.exists()


# ----------------------------------------------------------------------------- the ExportedProgram and export.json
def test_a_replaced_program_is_refused_before_it_is_read(export_copy, capsys) -> None:
    out = export_copy("pt2")
    _program_of(torch.nn.Linear(3, 3), out / "model.pt2", 3)  # a genuine program, of another model
    _refused(_verify(out), capsys, f"{out / 'model.pt2'} {REFUSED}")


def test_a_program_carrying_a_pickle_is_refused_and_never_unpickled(export_copy, capsys, sentinel) -> None:
    out = export_copy("pt2")
    with zipfile.ZipFile(out / "model.pt2", "a") as archive:
        archive.writestr("model/data/constants/opaque_obj_0", pickle.dumps(Payload(sentinel)))
    _refused(_verify(out), capsys, f"{out / 'model.pt2'} {REFUSED}")
    assert not sentinel.exists()


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (lambda out: (out / "model.pt2").unlink(), "{out}/model.pt2: missing; re-export"),
        (lambda out: _fifo(out / "model.pt2"), "{out}/model.pt2: not a plain file"),
        (
            lambda out: (out / "model.pt2").write_bytes((out / "model.pt2").read_bytes()[:-10]),
            "{out}/model.pt2 " + REFUSED,
        ),
        (
            lambda out: _edit_record(out, lambda r: r["checksums"]["model.pt2"].update(sha256="0" * 64)),
            "{out}/model.pt2 " + REFUSED,
        ),
        (
            lambda out: _edit_record(out, lambda r: r["checksums"]["model.pt2"].update(bytes=True)),
            "{out}/model.pt2 " + UNRECORDED,
        ),
        (lambda out: _edit_record(out, lambda r: r.update(checksums=["model.pt2"])), "{out}/model.pt2 " + UNRECORDED),
        (lambda out: _edit_record(out, lambda r: r.pop("checksums")), "{out}/model.pt2 " + UNRECORDED),
        (lambda out: (out / "export.json").write_text('{"format": "pt2"'), "{out}/export.json: unreadable or not JSON"),
        (lambda out: (out / "export.json").write_text("[1, 2]"), "{out}/export.json: not an export's JSON object"),
        (lambda out: (out / "export.json").write_text(" " * (1 << 20) + "{}"), "{out}/export.json: over 1048576 bytes"),
        (
            lambda out: (out / "export.json").write_text("[" * 100000 + "]" * 100000),
            "{out}/export.json: unreadable or not JSON",
        ),
        (lambda out: _link_record(out), "{out}/export.json: not a plain file"),
        (
            lambda out: _edit_record(out, lambda r: r.update(run_dir=["x"])),
            "{out}/export.json: no run_dir, weights.path",
        ),
        (lambda out: _edit_record(out, lambda r: r.update(weights="w")), "{out}/export.json: no run_dir, weights.path"),
        (
            lambda out: _edit_record(out, lambda r: r.update(format="exe")),
            "{out}/export.json: no export format recorded",
        ),
    ],
    ids=[
        "missing",
        "fifo",
        "truncated",
        "wrong-sha",
        "bool-size",
        "checksums-a-list",
        "no-checksums",
        "record-truncated",
        "record-a-list",
        "record-huge",
        "record-deep",
        "record-a-link",
        "run-dir-a-list",
        "weights-a-string",
        "unknown-format",
    ],
)
def test_a_tampered_pt2_export_is_one_line(export_copy, capsys, tamper, message) -> None:
    out = export_copy("pt2")
    tamper(out)
    _refused(_verify(out), capsys, message.format(out=out))


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o600)  # opening it would wait for a writer forever


def _link_record(out: Path) -> None:
    real = out.parent / "record-elsewhere.json"
    (out / "export.json").rename(real)
    (out / "export.json").symlink_to(real)


# ----------------------------------------------------------------------------- safetensors and ONNX exports
@pytest.mark.parametrize("name", ["model.safetensors", "config.toml", "spec.json", "preprocess.json"])
def test_a_replaced_safetensors_export_file_is_refused(export_copy, capsys, name) -> None:
    out = export_copy("safetensors")
    with (out / name).open("ab") as f:
        f.write(b" ")  # still a valid file of its kind: JSON, TOML and safetensors allow trailing space
    _refused(_verify(out, "safetensors"), capsys, f"{out / name} {REFUSED}")


@pytest.mark.parametrize(
    "argv",
    [
        ["evaluate", "{run}", "--checkpoint", "{out}", "--device", "cpu"],
        ["evaluate", "{run}", "--checkpoint", "{out}/model.safetensors", "--device", "cpu"],
        ["predict", "{out}", "{rows}", "--device", "cpu"],
    ],
    ids=["checkpoint-folder", "checkpoint-file", "export-as-run"],
)
def test_a_replaced_weights_file_of_an_export_given_to_a_use_command_is_refused(
    export_copy,
    tiny_run,
    tmp_path,
    capsys,
    argv,
) -> None:
    out = export_copy("safetensors")
    weights = out / "model.safetensors"
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(weights))
    save_file({k: v + 1 for k, v in tensors.items()}, str(weights))  # the same model, other weights
    rows = tmp_path / "rows.csv"
    rows.write_text("a,b,c\n1,2,3\n")
    names = {"run": str(tiny_run("csv_mlp")), "out": str(out), "rows": str(rows)}
    _refused([arg.format(**names) for arg in argv], capsys, f"{weights} {REFUSED}")


def test_an_untouched_safetensors_export_still_loads_as_weights(exports, tiny_run, tmp_path, capsys) -> None:
    out = exports("safetensors")
    argv = [
        "evaluate",
        str(tiny_run("csv_mlp")),
        "--checkpoint",
        str(out),
        "--device",
        "cpu",
        "--output-dir",
        str(tmp_path),
    ]
    assert main(argv) == 0, capsys.readouterr().err


@needs_onnx
def test_a_replaced_onnx_graph_is_refused(export_copy, capsys) -> None:
    import onnx
    from onnx import numpy_helper

    out = export_copy("onnx")
    model = onnx.load(out / "model.onnx")
    weight = model.graph.initializer[0]
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.5, weight.name))
    onnx.save(model, out / "model.onnx")
    _refused(_verify(out, "onnx"), capsys, f"{out / 'model.onnx'} {REFUSED}")


@needs_onnx
def test_onnx_external_data_planted_beside_the_graph_is_refused(export_copy, capsys) -> None:
    out = export_copy("onnx")
    (out / "model.onnx.data").write_bytes(b"\0" * 64)
    _refused(_verify(out, "onnx"), capsys, f"{out / 'model.onnx.data'} {UNRECORDED}")


# ----------------------------------------------------------------------------- state.pt of a checkpoint
@pytest.fixture
def run_copy(tiny_run, tmp_path: Path) -> Path:
    """A copy of the digits run: two checkpoints, and a best step in their loop state."""
    target = tmp_path / "run"
    shutil.copytree(tiny_run("digits_cnn"), target)
    return target


def _newest(run: Path) -> Path:
    return list_checkpoints(run / "checkpoints")[0]


def _put_state(checkpoint: Path, write: Callable[[Path], Any], sealed: bool = True) -> None:
    """Replace state.pt by what `write` makes of it; resealed (manifest and marker) as someone who
    controls the folder would, unless `sealed` is False."""
    write(checkpoint / "state.pt")
    if sealed:
        reseal(checkpoint)


def _with_loop(**loop: Any) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        state = read_state(path.parent)
        state["loop"] = {**state["loop"], **loop}
        torch.save(state, path)

    return write


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def _save(value: Callable[[Path], Any]) -> Callable[[Path], None]:
    return lambda path: torch.save(value(path), path)


HOSTILE_STATES: list[tuple[str, Callable[[Path], Any], str]] = [
    (
        "os-system",
        _save(lambda p: Payload(Path(os.environ[SENTINEL_ENV]))),
        "state.pt holds objects other than tensors and plain values; refused to load it (it could run code)",
    ),
    (
        "os-system-inside",
        _save(lambda p: {"loop": {"best_step": Payload(Path(os.environ[SENTINEL_ENV]))}}),
        "state.pt holds objects other than tensors and plain values",
    ),
    ("plain-pickle", lambda p: p.write_bytes(pickle.dumps(Payload(Path(os.environ[SENTINEL_ENV])))), "state.pt"),
    ("eval-global", lambda p: p.write_bytes(b"cbuiltins\neval\n(S'1'\ntR."), "state.pt"),
    (
        "truncated",
        lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
        "state.pt is not a readable torch file",
    ),
    ("empty", lambda p: p.write_bytes(b""), "state.pt is not a readable torch file"),
    ("noise", lambda p: p.write_bytes(os.urandom(4096)), "state.pt"),
    ("a-list", _save(lambda p: [1, 2]), "state.pt holds a list, not a training state"),
    ("int-keys", _save(lambda p: {1: 2}), "state.pt holds a dict, not a training state"),
    ("loop-a-string", _save(lambda p: {"loop": "x"}), "state.pt: loop is a str, not the loop's state"),
    ("best-a-string", _with_loop(best_step="3"), "state.pt: loop.best_step is a str, not a step number"),
    ("best-a-bool", _with_loop(best_step=True), "state.pt: loop.best_step is a bool, not a step number"),
    ("best-a-float", _with_loop(best_step=1.0), "state.pt: loop.best_step is a float, not a step number"),
    ("best-a-tensor", _with_loop(best_step=torch.tensor(1)), "state.pt: loop.best_step is a tensor"),
    ("best-negative", _with_loop(best_step=-1), "state.pt: loop.best_step is out of range"),
    ("best-huge", _with_loop(best_step=10**30), "state.pt: loop.best_step is out of range"),
    ("best-thousands-of-digits", _with_loop(best_step=10**6000), "state.pt"),
    ("best-nested", _with_loop(best_step=_deep(200)), "state.pt: loop.best_step is a list"),
    ("best-not-kept", _with_loop(best_step=999), "step 999's checkpoint is not in"),
]


@pytest.mark.parametrize(("write", "message"), [c[1:] for c in HOSTILE_STATES], ids=[c[0] for c in HOSTILE_STATES])
def test_checkpoint_best_with_a_hostile_state_pt_is_one_line_and_runs_nothing(
    run_copy, capsys, sentinel, write, message
) -> None:
    newest = _newest(run_copy)
    _put_state(newest, write)
    _refused(
        ["evaluate", str(run_copy), "--checkpoint", "best", "--device", "cpu"],
        capsys,
        f"gputrain evaluate: {run_copy}: --checkpoint best: ",
        message,
    )
    assert not sentinel.exists()


@pytest.mark.parametrize("name", ["os-system", "plain-pickle", "truncated", "a-list", "int-keys"])
@pytest.mark.parametrize("choice", ["last", "path"])
def test_checkpoint_last_or_a_path_with_a_hostile_state_pt_is_one_line_and_runs_nothing(
    run_copy, capsys, sentinel, name, choice
) -> None:
    newest = _newest(run_copy)
    write = next(c[1] for c in HOSTILE_STATES if c[0] == name)
    _put_state(newest, write)
    checkpoint = "last" if choice == "last" else str(newest)
    _refused(
        ["evaluate", str(run_copy), "--checkpoint", checkpoint, "--device", "cpu"],
        capsys,
        "gputrain evaluate: cannot load weights: ",
        str(newest),
        "state.pt",
    )
    assert not sentinel.exists()


def test_an_unsealed_hostile_state_pt_is_never_read(run_copy, capsys, sentinel) -> None:
    """Not resealed: the manifest's checksum stops it before torch sees a byte (every checkpoint)."""
    for checkpoint in list_checkpoints(run_copy / "checkpoints"):
        _put_state(checkpoint, next(c[1] for c in HOSTILE_STATES if c[0] == "os-system"), sealed=False)
    _refused(
        ["evaluate", str(run_copy), "--checkpoint", "best", "--device", "cpu"],
        capsys,
        "--checkpoint best: no usable checkpoint",
        "state.pt does not match its checksum",
    )
    assert not sentinel.exists()


def test_predict_and_generate_share_the_refusal(run_copy, tmp_path, capsys, sentinel) -> None:
    _put_state(_newest(run_copy), next(c[1] for c in HOSTILE_STATES if c[0] == "os-system"))
    rows = tmp_path / "x.npy"
    import numpy as np

    np.save(rows, np.zeros((1, 8, 8), dtype=np.float32))
    _refused(
        ["predict", str(run_copy), str(rows), "--checkpoint", "best", "--device", "cpu"],
        capsys,
        "gputrain predict: ",
        "state.pt holds objects other than tensors",
    )
    assert not sentinel.exists()
