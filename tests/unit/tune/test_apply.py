"""`parallel.strategy=tuned`: the winner applied where the machine and config fingerprints match,
else auto's choice and one line of why (tune/apply.py, tune/fingerprint.py)."""

from __future__ import annotations

import json
from pathlib import Path

from gputrain.config import load_config
from gputrain.tune.apply import resolve_tuned
from gputrain.tune.candidates import AUTO, Candidate
from gputrain.tune.fingerprint import config_fields, digest
from gputrain.tune.record import TUNE, tune_record
from gputrain.tune.scheduler import Result

MACHINE = {"device": "cpu", "name": "test cpu", "count": 1, "torch": "2.x", "cores": 2, "threads": 2}
BASE = ["model.name=mlp", "train.batch_size=16"]


def _write(folder: Path, results: list[Result], overrides=BASE, machine=MACHINE) -> Path:
    config = load_config(None, [*overrides, "parallel.strategy=auto"])
    record = tune_record(
        results,
        machine=machine,
        fields=config_fields(config),
        budget_s=60,
        spent_s=30,
        batch_size=16,
        warmup=2,
        timed=6,
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / TUNE).write_text(json.dumps(record))
    return folder


def _rows() -> list[Result]:
    return [
        Result(Candidate(1, AUTO), "ok", samples_per_s=100.0),
        Result(Candidate(1, "none", 8, 2, threads=2), "ok", samples_per_s=300.0),
        Result(Candidate(2, "ddp", 8, 1, threads=1), "ok", samples_per_s=250.0),
        Result(Candidate(2, "fsdp", 4, 2, threads=1), "oom", "out of memory"),
    ]


def _tuned(folder: Path, overrides=BASE, machine=MACHINE, ranks=None):
    config = load_config(None, [*overrides, "parallel.strategy=tuned", f"parallel.tune_file={folder}"])
    return resolve_tuned(config, machine, ranks)


def test_the_winner_is_applied_when_both_fingerprints_match(tmp_path):
    tuned = _tuned(_write(tmp_path / "t", _rows()))
    assert tuned.applied and tuned.ranks == 1
    assert "parallel.strategy=none" in tuned.overrides and "train.micro_batch_size=8" in tuned.overrides
    assert tuned.line.startswith("parallel.strategy=tuned: none ×1 2t mb8×2 (300 samples/s")
    assert "\n" not in tuned.line


def test_given_ranks_take_the_best_of_that_many_ranks(tmp_path):
    tuned = _tuned(_write(tmp_path / "t", _rows()), ranks=2)
    assert tuned.applied and tuned.ranks == 2 and "parallel.strategy=ddp" in tuned.overrides
    none = _tuned(_write(tmp_path / "u", _rows()[:2]), ranks=2)
    assert not none.applied and "no layout on 2 ranks" in none.line


def test_a_changed_config_invalidates_the_fingerprint_and_names_the_field(tmp_path):
    folder = _write(tmp_path / "t", _rows())
    tuned = _tuned(folder, overrides=[*BASE, "optim.lr=0.5"])
    assert not tuned.applied and tuned.overrides == ["parallel.strategy=auto"]
    assert tuned.line == (
        "parallel.strategy=tuned: the config changed since the tune (optim.lr); running auto's choice"
    )
    assert not _tuned(folder, overrides=["model.name=mlp", "train.batch_size=32"]).applied


def test_what_tune_chooses_and_what_a_step_never_sees_leave_the_fingerprint_as_it_is(tmp_path):
    folder = _write(tmp_path / "t", _rows())
    same = [
        *BASE,
        "train.compile=true",
        "train.micro_batch_size=4",
        "train.grad_accum=auto",
        "data.num_workers=1",
        "log.every_steps=3",
        "train.max_steps=7",
        "checkpoint.enabled=false",
        "train.seed=3",
    ]
    assert _tuned(folder, overrides=same).applied


def test_another_machine_runs_autos_choice(tmp_path):
    folder = _write(tmp_path / "t", _rows())
    tuned = _tuned(folder, machine={**MACHINE, "torch": "9.9"})
    assert not tuned.applied and "tuned on another machine or torch" in tuned.line


def test_no_tune_file_runs_autos_choice_and_says_where_it_looked(tmp_path):
    tuned = _tuned(tmp_path / "nothing")
    assert not tuned.applied and f"no tune at {tmp_path / 'nothing'}" in tuned.line


def test_the_config_fingerprint_is_the_hash_of_its_fields():
    config = load_config(None, BASE)
    fields = config_fields(config)
    assert "model.name" in fields and "train.batch_size" in fields and "optim.lr" in fields
    assert not [k for k in fields if k.startswith(("parallel.", "log.", "checkpoint."))]
    assert "train.compile" not in fields and "data.num_workers" not in fields
    assert digest(fields) == digest(dict(reversed(list(fields.items()))))
    assert digest(fields) != digest({**fields, "optim.lr": 1.0})
