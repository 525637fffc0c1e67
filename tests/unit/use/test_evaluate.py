"""gputrain evaluate: the run's own test metrics again, from the run directory alone; new data with
the run's preprocessing; the files the report reads; the weights it picks; under torchrun."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from gputrain.cli import main
from gputrain.evaluate.scores import load_scores
from gputrain.use.evaluate import evaluate_run
from gputrain.use.loaded import load_run

ROOT = Path(__file__).resolve().parents[3]
ALL_RUNS = ["digits_cnn", "csv_mlp", "csv_regression", "images_resnet", "mnist_mlp", "text_gpt", "tokens_gpt"]


def _summary_test(run_dir: Path) -> dict[str, float]:
    return json.loads((run_dir / "summary.json").read_text())["test"]


@pytest.mark.parametrize("name", ALL_RUNS)
def test_the_final_weights_give_the_runs_own_test_metrics(tiny_run, name: str, capsys) -> None:
    run_dir = tiny_run(name)
    assert main(["evaluate", str(run_dir), "--device", "cpu"]) == 0
    record = json.loads((run_dir / "eval-test.json").read_text())
    expected = _summary_test(run_dir)
    assert record["metrics"].keys() == expected.keys()
    for metric, value in expected.items():
        assert math.isclose(record["metrics"][metric], value, rel_tol=1e-6, abs_tol=1e-7), (metric, name)
    assert record["weights"]["kind"] == "final" and record["split"] == "test"
    assert "test:" in capsys.readouterr().out


def test_scores_equal_the_ones_training_kept_for_the_report(tiny_run) -> None:
    run_dir = tiny_run("csv_mlp")
    trained = load_scores(run_dir / "scores-test.npz")
    result = evaluate_run(run_dir, device="cpu", out_dir=run_dir / "again")
    again = load_scores(run_dir / "again" / "scores-test.npz")
    assert result.scores is not None and again.task == "classification"
    np.testing.assert_allclose(again.scores, trained.scores, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(again.targets, trained.targets)


def test_new_csv_rows_are_read_with_the_runs_columns_classes_and_statistics(tiny_run, tmp_path) -> None:
    """New rows in another column order and with only two of the three classes: the metrics are those
    of the run's model on the same rows as its own data pipeline prepared them."""
    run_dir = tiny_run("csv_mlp")
    loaded = load_run(run_dir, device="cpu")
    test = loaded.data.test
    raw = _raw_test_rows(loaded)
    names = loaded.pre.class_names
    assert names == ("cat", "dog", "eel")
    keep = [i for i in range(len(raw)) if int(test.targets[i]) != 2][:20]
    rows = raw.tolist()  # floats that read back as the same float32 values
    lines = ["label,c,b,a"] + [
        f"{names[int(test.targets[i])]},{rows[i][2]!r},{rows[i][1]!r},{rows[i][0]!r}" for i in keep
    ]
    (tmp_path / "new.csv").write_text("\n".join(lines) + "\n")
    result = evaluate_run(run_dir, device="cpu", overrides=[f"data.path={tmp_path / 'new.csv'}"], out_dir=tmp_path)
    assert result.name == "new" and (tmp_path / "eval-new.json").is_file() and (tmp_path / "scores-new.npz").is_file()
    with torch.no_grad():
        logits = loaded.model(test.inputs[keep])
    loss = torch.nn.functional.cross_entropy(logits, test.targets[keep]).item()
    accuracy = (logits.argmax(1) == test.targets[keep]).float().mean().item()
    assert math.isclose(result.metrics["loss"], loss, rel_tol=1e-5)
    assert math.isclose(result.metrics["accuracy"], accuracy, rel_tol=1e-6)
    assert result.record["samples"] == len(keep) and result.record["data"]["new"] is True


def _raw_test_rows(loaded) -> torch.Tensor:
    """The test split's features before normalisation (the same seeded split, built raw)."""
    import dataclasses

    from gputrain.data import build_data

    return build_data(dataclasses.replace(loaded.config.data, normalize=False), loaded.config.train.seed).test.inputs


def test_new_text_is_encoded_with_the_runs_vocabulary(tiny_run, tmp_path) -> None:
    run_dir = tiny_run("text_gpt")
    text = Path(load_run(run_dir, device="cpu").config.data.path).read_text()
    (tmp_path / "more.txt").write_text(text[-400:])
    result = evaluate_run(run_dir, device="cpu", overrides=[f"data.path={tmp_path / 'more.txt'}"], out_dir=tmp_path)
    assert result.name == "more" and result.scores is None  # language models keep no scores
    assert result.metrics["loss"] > 0 and math.isclose(result.metrics["perplexity"], math.exp(result.metrics["loss"]))
    (tmp_path / "odd.txt").write_text("the quick QUOKKA")
    with pytest.raises(Exception, match=r"'A'.*'K'.*'O'.*'Q'.*'U'"):
        evaluate_run(run_dir, device="cpu", overrides=[f"data.path={tmp_path / 'odd.txt'}"], out_dir=tmp_path)


def test_other_checkpoints_are_named_in_the_files(tiny_run, tmp_path, capsys) -> None:
    run_dir = tiny_run("digits_cnn")
    argv = ["evaluate", str(run_dir), "--device", "cpu", "--checkpoint", "best", "--split", "val"]
    assert main([*argv, "--output-dir", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "eval-val-best.json").read_text())
    assert record["weights"]["kind"] == "best" and record["weights"]["step"] is not None
    assert (tmp_path / "scores-val-best.npz").is_file()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train.epochs=3"], "only data overrides apply"),
        (["data.name=csv"], "data.name is the run's"),
        (["--checkpoint", "nowhere"], "nowhere: no such file or directory"),
    ],
)
def test_bad_requests_are_one_line_and_exit_2(tiny_run, capsys, argv: list[str], message: str) -> None:
    assert main(["evaluate", str(tiny_run("csv_mlp")), "--device", "cpu", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_a_missing_split_names_the_ones_there_are(tiny_run, tmp_path, capsys) -> None:
    run_dir = tiny_run("csv_mlp")
    assert main(["evaluate", str(run_dir), "--device", "cpu", "data.test_fraction=0.0"]) == 2
    assert "no test split" in capsys.readouterr().err


@pytest.mark.slow
def test_under_torchrun_two_ranks_give_the_same_metrics(tiny_run, tmp_path) -> None:
    run_dir = tiny_run("csv_mlp")
    single = evaluate_run(run_dir, device="cpu", out_dir=tmp_path / "one")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "gputrain", "evaluate", str(run_dir), "--device", "cpu", "--output-dir", str(tmp_path / "two")]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "two" / "eval-test.json").read_text())
    assert record["world_size"] == 2
    for metric, value in single.metrics.items():
        assert math.isclose(record["metrics"][metric], value, rel_tol=1e-5), metric
    two = load_scores(tmp_path / "two" / "scores-test.npz")
    assert two.total == single.record["samples"]  # each sample scored once, on one of the ranks


def test_a_split_rebuilt_by_overrides_gets_its_own_name(tiny_run, tmp_path) -> None:
    """The run's scores-test.npz (the report's) is never replaced by a differently built test split."""
    result = evaluate_run(
        tiny_run("images_resnet"), device="cpu", overrides=["data.max_eval_samples=5"], out_dir=tmp_path
    )
    assert result.name == "test-custom" and result.record["samples"] == 5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval-test-custom.json", "scores-test-custom.npz"]
