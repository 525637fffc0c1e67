"""The paths a config names are checked before torch is imported (config/paths.py), with the
messages the loaders give (they call the same checks)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gputrain.config import load_config
from gputrain.config.paths import check_config_paths
from gputrain.errors import ConfigError, DataError, UsageError

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("overrides", "error", "message"),
    [
        (["data.name=csv", "data.path={tmp}/nope.csv"], DataError, "data.path: no such file: {tmp}/nope.csv"),
        (["data.name=text", "data.path={tmp}"], DataError,
         "data.path: {tmp} is a directory, not a regular file; data.name=text reads one file"),
        (["data.name=mnist", "data.path={tmp}/nope"], DataError, "data.path: no such folder: {tmp}/nope"),
        (["data.name=image_folder", "data.path={tmp}/f.csv"], DataError,
         "data.path: {tmp}/f.csv is a regular file, not a folder; data.name=image_folder reads a folder"),
        (["data.name=tokens", "data.path={tmp}/t.bin"], DataError, "{tmp}/t.bin: no such token file"),
        (["data.name=tokens", "data.path={tmp}", "data.val_path={tmp}/v.bin"], DataError, "{tmp}/v.bin: no such"),
        (["model.weights={tmp}/w.safetensors"], ConfigError, "model.weights = '{tmp}/w.safetensors': no such file"),
        (["model.name=hf", "model.hf_config={tmp}/c.json"], ConfigError, "model.hf_config = '{tmp}/c.json': no such"),
        (["model.name=hf", "model.hf_config={tmp}"], ConfigError, "is a directory without a config.json"),
        (["checkpoint.resume={tmp}/step-9"], ConfigError, "checkpoint.resume = '{tmp}/step-9': no such checkpoint"),
    ],
)
def test_a_missing_path_names_the_field_or_file(tmp_path: Path, overrides, error, message) -> None:
    (tmp_path / "f.csv").write_text("a,label\n1,0\n")
    config = load_config(None, [o.format(tmp=tmp_path) for o in overrides])
    with pytest.raises(error) as caught:
        check_config_paths(config)
    assert message.format(tmp=tmp_path) in str(caught.value)


def test_existing_paths_and_sources_without_files_pass(tmp_path: Path) -> None:
    (tmp_path / "f.csv").write_text("a,label\n1,0\n")
    (tmp_path / "ckpt").mkdir()
    check_config_paths(load_config(None, []))  # the digits default reads no path
    check_config_paths(load_config(None, ["data.name=csv", f"data.path={tmp_path / 'f.csv'}"]))
    check_config_paths(load_config(None, ["data.name=image_folder", f"data.path={tmp_path}"]))
    check_config_paths(load_config(None, [f"checkpoint.resume={tmp_path / 'ckpt'}", "checkpoint.resume=never"]))


def test_the_command_answers_before_torch_loads(tmp_path: Path) -> None:
    """The real path: `gputrain train` with a mistyped data file and a run directory that cannot be
    made exits 2 with the loader's message, and torch was never imported."""
    probe = (
        "import sys\n"
        "from gputrain.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print('torch imported' if 'torch' in sys.modules else 'torch not imported')\n"
        "raise SystemExit(code)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args, expected in [
        (["data.name=csv", "data.path=nope.csv"], "data.path: no such file: nope.csv"),
        (["--run-dir", str(tmp_path / "file" / "run")], "cannot be created or written"),
    ]:
        (tmp_path / "file").write_text("")
        result = subprocess.run([sys.executable, "-c", probe, "train", *args], capture_output=True, text=True,
                                cwd=tmp_path, env=env, timeout=60)
        assert result.returncode == 2, result.stderr
        assert expected in result.stderr and "Traceback" not in result.stderr
        assert result.stdout.strip() == "torch not imported"


def test_a_usage_error_is_what_the_cli_prints() -> None:
    assert issubclass(DataError, UsageError) and issubclass(ConfigError, UsageError)
