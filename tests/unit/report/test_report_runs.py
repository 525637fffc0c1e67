"""`gputrain report` on each kind of run a user has: completed, failed, interrupted, still running,
regression, language model, profiled; and the command every `gputrain train` ends by printing."""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import shutil
import signal
from pathlib import Path

from gputrain.cli import main
from gputrain.observe.advisor import RunFacts, advise
from gputrain.observe.profiler import ProfileReport
from gputrain.report.build import write_report
from tests.conftest import run_cli
from tests.unit.reliability.chaos import logged_step, start_train
from tests.unit.report.conftest import TINY, train_in_process, visible_text
from tests.waiting import wait_until


def _page(run_dir: Path, tmp_path: Path) -> str:
    out = tmp_path / "report.html"
    write_report([run_dir], out)
    return out.read_text()


def _titles(page: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r"<figcaption>([^<]*)</figcaption>", page)]


def test_train_ends_by_printing_the_command_that_makes_its_report(completed_run, tmp_path):
    run_dir, stdout = completed_run
    last = stdout.strip().splitlines()[-1]
    assert last == f"see it: gputrain report {run_dir}"
    result = run_cli(*shlex.split(last.removeprefix("see it: "))[1:])  # the command, as printed, works
    assert result.returncode == 0, result.stderr
    assert (run_dir / "report.html").is_file() and "wrote" in result.stdout


def test_the_printed_command_quotes_a_path_with_spaces(tmp_path, capsys):
    run_dir = tmp_path / "my runs" / "first try"
    train_in_process(run_dir, [*TINY, "train.epochs=1"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == f"see it: gputrain report '{run_dir}'"
    assert main(shlex.split(last.removeprefix("see it: "))[1:]) == 0
    assert (run_dir / "report.html").is_file()


def test_a_completed_run_shows_every_part(completed_run, tmp_path):
    run_dir, _ = completed_run
    page = _page(run_dir, tmp_path)
    text = visible_text(page)
    assert 'class="badge s-completed"' in page
    for section in ("Training", "Evaluation", "Test split", "Speed", "Machine", "Config"):
        assert f"<h2>{section}</h2>" in page
    titles = _titles(page)
    for title in ("training loss", "learning rate", "gradient norm (before clipping)", "throughput (samples/s)",
                  "accuracy", "auroc", "loss", "ROC curves (one class against the rest)", "precision-recall curves",
                  "confusion matrix (shade: share of the true class)", "where a step's time goes"):
        assert title in titles, title
    summary = json.loads((run_dir / "summary.json").read_text())
    assert f"test accuracy {summary['test']['accuracy']:.4f}" in text and "device cpu" in text
    # the header's config table: the keys this run changed, against their defaults, and no other
    changed = re.search(r"what differs from the defaults</h3>(.*?)</table>", page, re.S)
    assert changed is not None
    rows = re.findall(r"<tr><td>([^<]+)</td><td>([^<]+)</td><td>([^<]+)</td></tr>", changed.group(1))
    assert ("model.name", "mlp", "cnn") in rows and ("train.epochs", "2", "20") in rows
    assert {key for key, _, _ in rows} == {"model.name", "model.hidden_sizes", "train.epochs", "train.device",
                                           "log.every_steps", "log.tensorboard", "log.progress"}
    assert "<details><summary>config.toml" in page and "[optim]" in page  # the whole config, folded
    assert "torch_build" in page  # env.json
    # one class per row of the per-class table, 10 digits
    per_class = page.split("<h3>per class</h3>")[1].split("</table>")[0]
    assert per_class.count("<tr>") == 1 + 10


def test_the_page_needs_no_network(completed_run, tmp_path):
    page = _page(completed_run[0], tmp_path)
    assert re.findall(r"href=", page) and not re.search(r"""(src|href)\s*=\s*(?!["']?#)""", page)
    assert not re.search(r"url\((?!#)", page) and "@import" not in page and "<link" not in page
    assert "fetch(" not in page and "XMLHttpRequest" not in page


def test_a_failed_run_shows_the_failure_and_what_ran_before_it(failed_run, tmp_path):
    page = _page(failed_run, tmp_path)
    text = visible_text(page)
    assert 'class="badge s-failed"' in page
    error = json.loads((failed_run / "summary.json").read_text())["error"]  # the step: forwards before training vary
    assert error.endswith("RuntimeError: test fault injected at forward 7") and f"Failed : {error}" in text
    assert "error.log (last lines)" in page and "RuntimeError: test fault injected at forward 7" in page
    assert "training loss" in _titles(page)  # the six steps before the failure
    assert "No scores-test.npz: the run has not reached its test evaluation" in text


def test_a_run_in_progress_then_interrupted(tmp_path):
    run_dir = tmp_path / "run"
    proc = start_train(run_dir, [*TINY, "train.epochs=1000", "log.every_steps=1", "checkpoint.every_epochs=0"])
    try:
        wait_until(lambda: logged_step(run_dir) >= 5 or proc.poll() is not None, what="step 5")
        assert proc.poll() is None, run_dir.with_suffix(".log").read_text()
        running = _page(run_dir, tmp_path)
        assert not (run_dir / "summary.json").exists()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
    assert proc.returncode == 130, run_dir.with_suffix(".log").read_text()
    assert 'class="badge s-running"' in running
    assert "no summary.json yet: the run is still going" in visible_text(running)
    assert "training loss" in _titles(running)
    assert "so far" in visible_text(running)
    # what the run resolved at its start (env.json), not "–" or the configured "auto"
    started = {"device": "cpu", "precision": "fp32", "world size": "1", "parallel layout": "one process"}
    for name, value in started.items():
        assert f"<b>{name}</b><span>{value}</span>" in running, name

    interrupted = _page(run_dir, tmp_path)
    assert 'class="badge s-interrupted"' in interrupted
    assert f"gputrain train --run-dir {run_dir}" in visible_text(interrupted)


def test_a_torn_last_line_is_skipped_and_said(completed_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(completed_run[0], run_dir)
    (run_dir / "summary.json").unlink()  # killed mid-write: no summary, half a row
    with (run_dir / "metrics.jsonl").open("a") as rows:
        rows.write('{"step": 99, "epoch": 3, "lo')
    page = _page(run_dir, tmp_path)
    assert "metrics.jsonl: 1 damaged line(s) skipped" in page and 'class="badge s-running"' in page


def test_a_regression_run_shows_predictions_and_residuals(regression_run, tmp_path):
    page = _page(regression_run, tmp_path)
    titles = _titles(page)
    assert "predicted against true" in titles and "residuals (predicted − true)" in titles
    assert "ROC curves (one class against the rest)" not in titles
    assert "R²" in visible_text(page.split("residuals")[-1])
    assert page.count('data-kind="scatter"') == 1 and page.count('data-kind="histogram"') == 1


def test_a_language_model_shows_loss_and_perplexity(lm_run, tmp_path):
    titles = _titles(_page(lm_run, tmp_path))
    assert {"training loss", "training perplexity", "perplexity", "loss", "throughput (tokens/s)"} <= set(titles)


def test_a_profiled_run_shows_the_advisors_findings(completed_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(completed_run[0], run_dir)
    facts = RunFacts(device_type="cpu", precision="fp32", batch_size=64, step_time_s=0.01, data_fraction=0.4)
    findings = advise(facts)
    assert findings, "the advisor should call this run data-bound"
    (run_dir / "profile.json").write_text(json.dumps(ProfileReport(facts, findings).to_dict()))
    page = _page(run_dir, tmp_path)
    assert "<h2>Profile findings</h2>" in page
    assert findings[0].bottleneck in page and findings[0].evidence in page


def test_a_resumed_run_whose_summary_is_older_than_its_rows_is_running(completed_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(completed_run[0], run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary.update(status="interrupted", global_step=10)  # the first attempt; the rows go on past it
    (run_dir / "summary.json").write_text(json.dumps(summary))
    page = _page(run_dir, tmp_path)
    assert 'class="badge s-running"' in page
    assert "resumed after an earlier attempt (interrupted at step 10) and not finished yet" in visible_text(page)


def test_an_rl_run_shows_its_environment_steps_and_returns_and_no_test_split(rl_run, tmp_path):
    summary = json.loads((rl_run / "summary.json").read_text())["rl"]
    page = _page(rl_run, tmp_path)
    header = page.split("<section", 1)[0]
    for name, value in (
        ("task", "reinforcement learning (PPO)"),
        ("steps", f"{summary['iterations']:,} iterations"),  # PPO iterations, and no epochs
        ("environment", "CartPole-v1"),
        ("env steps", f"{summary['env_steps']:,}"),
        ("episodes", f"{summary['episodes']:,}"),
        ("return (last 100 episodes)", f"{summary['episodic_return']:.2f}"),
        ("env steps/s", f"{summary['env_steps_per_s']:,.0f}"),
    ):
        assert f"<b>{name}</b><span>{value}</span>" in header, name
    assert "samples/s" not in visible_text(page)  # its samples are environment steps, and named so
    assert "<h2>Test split</h2>" not in page and "scores-test.npz" not in page and "MFU" not in visible_text(page)
    titles = _titles(page)
    assert {"episodic return", "environment steps/s", "approximate KL"} <= set(titles)
    assert "PPO loss (policy − ent_coef·entropy + vf_coef·value)" in titles

    (rl_run / "summary.json").rename(tmp_path / "summary.json")  # the same run, still going
    try:
        running = _page(rl_run, tmp_path)
    finally:
        (tmp_path / "summary.json").rename(rl_run / "summary.json")
    assert 'class="badge s-running"' in running and "<h2>Test split</h2>" not in running
    assert f"<b>env steps</b><span>{summary['env_steps']:,}</span>" in running  # from the last logged row
    assert f"<b>episodes</b><span>{summary['episodes']:,}</span>" in running  # summed over the rows
    assert "<b>device</b><span>cpu</span>" in running
    assert f"<b>steps</b><span>{summary['iterations']:,} iterations so far</span>" in running

    solved = tmp_path / "solved"  # stopped at rl.stop_at_return: not by a validation metric, which it has none of
    shutil.copytree(rl_run, solved)
    config = (solved / "config.toml").read_text()
    (solved / "config.toml").write_text(config.replace("# stop_at_return = (unset)", "stop_at_return = 20.0"))
    (solved / "summary.json").write_text(json.dumps({**json.loads((rl_run / "summary.json").read_text()),
                                                     "status": "stopped_early"}))
    assert ("Stopped early: the mean return of the last 100 episodes reached rl.stop_at_return = 20.0"
            in visible_text(_page(solved, tmp_path)))
