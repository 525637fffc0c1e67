"""Every bad-input case of the foundation issue, through the real command: exit 2, at most three
lines on stderr, no traceback, and the field or file named."""

import pytest


def _assert_short_error(result, *words):
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert 1 <= len(lines) <= 3, result.stderr
    for word in words:
        assert word in result.stderr, (word, result.stderr)


@pytest.mark.parametrize("args, words", [
    (["train.bach_size=32"], ["train.bach_size", "did you mean 'batch_size'"]),
    (["train.epochs=ten"], ["train.epochs", "expected an integer"]),
    (["train.epochs=-1"], ["train.epochs", "must be > 0"]),
    (["optim.name=adamm"], ["optim.name", "choose from", "adamw"]),
    (["--config", "missing.toml"], ["missing.toml", "not found"]),
    (["data.name=csv", "data.path=nope.csv"], ["nope.csv", "no such file"]),
    (["train.batch_size=64", "train.grad_accum=5"], ["train.batch_size", "train.grad_accum"]),
    (["train.device=tpu"], ["train.device", "cpu, cuda, cuda:N, mps"]),
    (["train.device=cuda"], ["train.device", "CUDA is not available", "no GPU on this machine",
                             "use train.device=auto or cpu"]),
])
def test_bad_input_exits_2_with_one_short_message(cli, tmp_path, args, words):
    result = cli("train", "--run-dir", str(tmp_path / "run"), *args, cwd=tmp_path)
    _assert_short_error(result, *words)
    assert not (tmp_path / "run").exists(), "nothing may start before the input is checked"


def test_broken_toml_names_the_line(cli, tmp_path):
    (tmp_path / "bad.toml").write_text("[train]\nepochs = 3\nbatch_size = = 4\n")
    _assert_short_error(cli("train", "--config", "bad.toml", cwd=tmp_path), "bad.toml", "line 3")


def test_non_numeric_csv_feature_names_line_and_column(cli, tmp_path):
    (tmp_path / "t.csv").write_text("a,b,label\n1,2,x\n3,oops,y\n")
    result = cli("train", "data.name=csv", "data.path=t.csv", cwd=tmp_path)
    _assert_short_error(result, "t.csv", "line 3", "column 'b'", "'oops' is not a number")
