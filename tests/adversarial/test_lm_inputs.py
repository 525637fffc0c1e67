"""Instruction data and text classes as a careless user gives them (issue 30, parts 4 and 5): JSONL
lines that are not objects, fields missing or of the wrong kind, empty responses, conversations with
unknown roles or no assistant, chat templates that fail or rewrite earlier turns, prompts that leave
no response within data.seq_len, tokenizers that are not one or lack an EOS, label columns of one
class, labels the training file never had, a classifier of another number of labels.

Each case runs `gputrain train` in this process and asserts exit 2, one line holding the case's key
words (never a traceback), and that nothing was written: the run directory does not exist.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gputrain.cli import main
from tests.unit.data.text_files import CHATML, make_tokenizer, tiny_gpt2_dir

Make = Callable[[Path], list[str]]
"""Writes the case's files into the folder; returns its config overrides."""

GOOD = {"prompt": "hello ", "response": "world"}
CHAT = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}]


def _lines(tmp: Path, name: str, lines: list[str]) -> Path:
    (tmp / name).write_text("".join(line + "\n" for line in lines))
    return tmp / name


def _tok(tmp: Path, template: str | None = CHATML, eos: bool = True) -> Path:
    return make_tokenizer(tmp / "tok", template, eos=eos)


def sft(*records: object, template: str | None = CHATML, extra: tuple[str, ...] = ()) -> Make:
    """instructions from these records (dicts as JSON; strings as they are), the good one first."""

    def make(tmp: Path) -> list[str]:
        lines = [json.dumps(GOOD)] + [r if isinstance(r, str) else json.dumps(r) for r in records]
        path = _lines(tmp, "sft.jsonl", lines * 2)
        tok = _tok(tmp, template)
        return ["data.name=instructions", f"data.path={path}", f"data.tokenizer={tok}", "data.seq_len=32", *extra]

    return make


def classes(lines: list[str], name: str = "t.jsonl", extra: tuple[str, ...] = ()) -> Make:
    def make(tmp: Path) -> list[str]:
        path = _lines(tmp, name, lines)
        tok = _tok(tmp)
        return ["data.name=text_classes", f"data.path={path}", f"data.tokenizer={tok}", "data.seq_len=16", *extra]

    return make


def _rows(n: int = 8, label: Callable[[int], object] = lambda i: ["pos", "neg"][i % 2]) -> list[str]:
    return [json.dumps({"text": "good movie" if i % 2 == 0 else "bad acting", "label": label(i)}) for i in range(n)]


def _with_val(val_lines: list[str]) -> Make:
    def make(tmp: Path) -> list[str]:
        _lines(tmp, "val.jsonl", val_lines)
        return [*classes(_rows())(tmp), f"data.val_path={tmp / 'val.jsonl'}"]

    return make


def _no_eos(tmp: Path) -> list[str]:
    path = _lines(tmp, "sft.jsonl", [json.dumps(GOOD)] * 4)
    return ["data.name=instructions", f"data.path={path}", f"data.tokenizer={_tok(tmp, eos=False)}"]


def _not_a_tokenizer(tmp: Path) -> list[str]:
    path = _lines(tmp, "sft.jsonl", [json.dumps(GOOD)] * 4)
    (tmp / "tok.json").write_text('{"version": "1.0", "model": 3}')
    return ["data.name=instructions", f"data.path={path}", f"data.tokenizer={tmp / 'tok.json'}"]


def _no_tokenizer(tmp: Path) -> list[str]:
    return ["data.name=instructions", f"data.path={_lines(tmp, 'sft.jsonl', [json.dumps(GOOD)] * 4)}"]


def _latin1(tmp: Path) -> list[str]:
    (tmp / "sft.jsonl").write_bytes(json.dumps(GOOD).encode() + b'\n{"prompt": "caf\xe9", "response": "x"}\n')
    return ["data.name=instructions", f"data.path={tmp / 'sft.jsonl'}", f"data.tokenizer={_tok(tmp)}"]


def _hf(classifier_labels: int | None, make: Make) -> Make:
    def with_model(tmp: Path) -> list[str]:
        extra = {"num_labels": classifier_labels} if classifier_labels else {}
        model = tiny_gpt2_dir(tmp / "gpt2", 300, classifier=classifier_labels is not None, **extra)
        return [*make(tmp), "model.name=hf", f"model.hf_config={model}"]

    return with_model


def _model(name: str, make: Make, *extra: str) -> Make:
    def with_model(tmp: Path) -> list[str]:
        return [*make(tmp), f"model.name={name}", *extra]

    return with_model


_REWRITES = (  # marks the last turn: rendered again with one more, the earlier text changes
    "{% for m in messages %}{{ m['role'] + ':' + m['content'] + ('!' if loop.last else '') + '\n' }}{% endfor %}"
)
_EOS_TURNS = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + eos_token }}{% endfor %}"
_RAISES = "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"

CASES: list[tuple[str, Make, list[str]]] = [
    # ---- instructions: the file
    ("sft-line-is-a-list", sft("[1, 2]"), ["sft.jsonl: line 2", "a JSON list, not an object"]),
    ("sft-line-is-a-string", sft('"hello"'), ["line 2", "a JSON str, not an object"]),
    ("sft-line-not-json", sft("{'prompt': 'single quotes'}"), ["line 2", "not JSON"]),
    (
        "sft-empty-file",
        lambda tmp: [*sft()(tmp)[:1], f"data.path={_lines(tmp, 'e.jsonl', ['', ' '])}", *sft()(tmp)[2:]],
        ["e.jsonl", "no records"],
    ),
    ("sft-latin1", _latin1, ["sft.jsonl: line 2", "not UTF-8"]),
    # ---- instructions: the fields
    ("sft-missing-prompt", sft({"question": "a", "response": "b"}), ["no field 'prompt'", "data.prompt_field"]),
    ("sft-missing-response", sft({"prompt": "a"}), ["line 2", "no field 'response'", "data.response_field"]),
    ("sft-renamed-fields-not-there", sft(extra=("data.prompt_field=instruction",)), ["no field 'instruction'"]),
    ("sft-empty-response", sft({"prompt": "a", "response": "  "}), ["line 2", "'response' is empty"]),
    ("sft-response-a-number", sft({"prompt": "a", "response": 4}), ["line 2", "'response' is a JSON int", "string"]),
    ("sft-prompt-null", sft({"prompt": None, "response": "b"}), ["line 2", "'prompt' is a JSON NoneType"]),
    (
        "sft-prompt-fills-seq-len",
        sft({"prompt": "hello world " * 40, "response": "four"}),
        ["line 2", "fills data.seq_len = 32", "none of the response"],
    ),
    # ---- instructions: conversations
    (
        "chat-unknown-role",
        sft({"messages": [{"role": "wizard", "content": "hi"}, CHAT[1]]}),
        ["line 2", "messages[0] has role 'wizard'", "system, user, assistant, tool"],
    ),
    ("chat-no-assistant", sft({"messages": [CHAT[0]]}), ["line 2", "no assistant message"]),
    ("chat-not-a-list", sft({"messages": "hello"}), ["line 2", "'messages' must be a non-empty list"]),
    ("chat-empty-list", sft({"messages": []}), ["line 2", "'messages' must be a non-empty list"]),
    (
        "chat-content-not-text",
        sft({"messages": [CHAT[0], {"role": "assistant", "content": ["x"]}]}),
        ["messages[1] (assistant) has no text 'content'"],
    ),
    ("chat-message-not-object", sft({"messages": ["hello", CHAT[1]]}), ["messages[0] is not an object"]),
    ("chat-without-template", sft({"messages": CHAT}, template=None), ["line 2", "has no chat template"]),
    ("chat-template-rewrites", sft({"messages": CHAT}, template=_REWRITES), ["cannot be told apart"]),
    ("sft-eos-inside-packed", sft({"prompt": "a <|endoftext|> b", "response": "c"}), ["line 2", "data.pack=false"]),
    ("chat-template-eos-per-turn", sft({"messages": CHAT}, template=_EOS_TURNS), ["'<|endoftext|>'", "pack=false"]),
    ("chat-template-raises", sft({"messages": CHAT}, template=_RAISES), ["chat template fails", "must alternate"]),
    # ---- instructions: the tokenizer and the model
    ("sft-no-tokenizer", _no_tokenizer, ["data.tokenizer", "tokenizer.json"]),
    ("sft-tokenizer-not-one", _not_a_tokenizer, ["tok.json: not a tokenizer the tokenizers library reads"]),
    (
        "sft-tokenizer-missing",
        lambda tmp: [*_no_tokenizer(tmp), f"data.tokenizer={tmp / 'nope'}"],
        ["data.tokenizer", "no such file or directory"],
    ),
    ("sft-tokenizer-without-eos", _no_eos, ["has no end-of-sequence token"]),
    ("sft-vocab-smaller-than-tokenizer", sft(extra=("data.vocab_size=10",)), ["data.vocab_size", "300 ids"]),
    ("sft-task-classification", sft(extra=("data.task=classification",)), ["data.task", "language modelling"]),
    ("sft-val-path-missing", sft(extra=("data.val_path=/nonexistent/val.jsonl",)), ["data.val_path: no such file"]),
    ("sft-packed-into-hf", _hf(None, sft()), ["data.pack", "data.pack=false"]),
    # ---- text classes
    ("cls-missing-text", classes([json.dumps({"review": "x", "label": "a"})] * 4), ["line 1", "no field 'text'"]),
    ("cls-missing-label", classes([json.dumps({"text": "x"})] * 4), ["no field 'label'", "data.label_field"]),
    (
        "cls-text-a-number",
        classes([*_rows(), json.dumps({"text": 42, "label": "pos"})]),
        ["line 9", "'text' is a JSON int, not a string"],
    ),
    ("cls-text-empty", classes([*_rows(), json.dumps({"text": "", "label": "pos"})]), ["line 9", "is empty"]),
    ("cls-one-class", classes(_rows(label=lambda i: "pos")), ["holds one class ('pos')", "at least two"]),
    ("cls-label-float", classes([*_rows(), json.dumps({"text": "x", "label": 1.5})]), ["line 9", "JSON float"]),
    ("cls-label-bool", classes([*_rows(), json.dumps({"text": "x", "label": True})]), ["line 9", "JSON bool"]),
    ("cls-label-null", classes([*_rows(), json.dumps({"text": "x", "label": None})]), ["line 9", "JSON NoneType"]),
    ("cls-names-and-numbers", classes(_rows(label=lambda i: ["pos", 3][i % 2])), ["is a name while others"]),
    (
        "cls-csv-empty-label",
        classes(["text,label", "good movie,pos", "bad acting,", "x,neg"], "t.csv"),
        ["t.csv: line 3", "no label"],
    ),
    ("cls-csv-no-header", classes(["1,2", "3,4"], "t.csv"), ["line 1", "must name the columns"]),
    (
        "cls-csv-ragged-row",
        classes(["text,label", "good movie,pos", "bad,acting,neg"], "t.csv"),
        ["line 3 has 3 columns, expected 2"],
    ),
    (
        "cls-unseen-at-evaluation",
        _with_val([json.dumps({"text": "good movie", "label": "meh"})]),
        ["val.jsonl: line 1", "label 'meh' is not a class of the training file"],
    ),
    ("cls-task-lm", classes(_rows(), extra=("data.task=lm",)), ["data.task", "classification"]),
    ("cls-hf-other-num-labels", _hf(5, classes(_rows())), ["classifier of 5 labels", "2 classes (neg, pos)"]),
    ("cls-into-an-mlp", _model("mlp", classes(_rows())), ["mlp reads numeric features", "use gpt or hf"]),
    ("cls-gpt-context-too-short", _model("gpt", classes(_rows()), "model.seq_len=8"), ["data.seq_len", "16"]),
    ("cls-line-not-object", classes([*_rows(), "[1]"]), ["line 9", "not an object"]),
]


@pytest.mark.parametrize(("make", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_lm_inputs_are_one_line_exit_2_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Make, words: list[str]
) -> None:
    overrides = make(tmp_path)
    run_dir = tmp_path / "run"
    base = ["model.name=gpt", "model.n_layer=1", "model.n_head=2", "model.d_model=16", "train.device=cpu"]
    args = ["train", "--run-dir", str(run_dir), *base, "log.progress=none", *overrides]
    try:
        code = main(args)
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else 1
    err_text = capsys.readouterr().err.strip()
    assert "Traceback" not in err_text, err_text
    lines = [line for line in err_text.splitlines() if not line.startswith("[transformers]")]
    assert code == 2, err_text
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("  ")), err_text  # a ConfigError's hint
    for word in words:
        assert word in err_text, (word, err_text)
    assert not run_dir.exists()


@pytest.fixture(scope="module")
def classes_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A text_classes run (gpt, 2 steps) on pos/neg, to evaluate new files against."""
    root = tmp_path_factory.mktemp("classes_run")
    overrides = classes(_rows())(root)
    base = ["model.name=gpt", "model.n_layer=1", "model.n_head=2", "model.d_model=16", "train.device=cpu"]
    steps = ["train.max_steps=2", "train.batch_size=4", "log.progress=none", "data.val_fraction=0.25"]
    assert main(["train", "--run-dir", str(root / "run"), *base, *steps, *overrides]) == 0
    return root / "run"


@pytest.mark.parametrize(
    ("lines", "words"),
    [
        (
            [json.dumps({"text": "good movie", "label": "meh"})],
            ["line 1", "label 'meh' is not a class of the model (neg, pos)"],
        ),
        ([json.dumps({"text": "good movie", "label": 1})], ["label 1 is not a class of the model"]),
        ([json.dumps({"text": ["good"], "label": "pos"})], ["'text' is a JSON list, not a string"]),
        (["not json"], ["line 1", "not JSON"]),
    ],
    ids=["unseen-name", "unseen-number", "text-a-list", "not-json"],
)
def test_evaluate_on_new_text_classes_refuses_what_the_model_cannot_score(
    classes_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: list[str], words: list[str]
) -> None:
    capsys.readouterr()
    before = sorted(p.name for p in classes_run.iterdir())
    new = _lines(tmp_path, "new.jsonl", lines)
    code = main(["evaluate", str(classes_run), f"data.path={new}", "--name", "new", "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, (word, err)
    assert sorted(p.name for p in classes_run.iterdir()) == before  # no eval-new.json
