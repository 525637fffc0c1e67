"""data.name=instructions (data/instructions.py): prompt tokens carry no loss, examples pack into
sequences greedily, and the built-in gpt reads a packed example exactly as it reads it alone; the
loss a step logs is the mean cross-entropy of the global batch's response tokens, computed here by
hand from each example run alone through the model, for gpt and for a tiny Hugging Face GPT-2."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from gputrain import Trainer
from gputrain.config import load_config
from gputrain.config.schema import ModelConfig
from gputrain.data import build_data
from gputrain.data.instructions import group
from gputrain.data.registry import DataBundle
from gputrain.text.tokenizer import load_tokenizer
from gputrain.models import build_model
from tests.conftest import run_cli
from tests.unit.data.text_files import CHATML, make_tokenizer, tiny_gpt2_dir, write_jsonl

PAIRS = [
    ("question: what is two plus two? ", "answer: four"),
    ("hello ", "world"),
    ("the quick brown fox ", "jumps over the lazy dog"),
    ("", "good movie"),  # no prompt: the first response token has nothing before it to predict it from
    ("bad acting, ", "terrible ending, great plot"),
    ("tiny ", "corpus"),
]


def _records(n: int = 24) -> list[dict[str, str]]:
    return [{"prompt": PAIRS[i % len(PAIRS)][0], "response": PAIRS[i % len(PAIRS)][1]} for i in range(n)]


def _bundle(tmp: Path, records: list[Any], **fields: Any) -> DataBundle:
    tok = make_tokenizer(tmp / "tok", CHATML) if not (tmp / "tok").exists() else tmp / "tok"
    path = write_jsonl(tmp / "sft.jsonl", records)
    values = {"data.name": "instructions", "data.path": str(path), "data.tokenizer": str(tok), "data.seq_len": 48}
    values.update({f"data.{k}": v for k, v in fields.items()})
    return build_data(load_config(values).data, seed=0)


def test_labels_are_minus_100_on_the_prompt_and_the_response_and_eos_are_targets(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, _records(1), val_fraction=0.0, test_fraction=0.0)
    tok = load_tokenizer(tmp_path / "tok")
    prompt, response = tok.encode(PAIRS[0][0]), tok.encode(PAIRS[0][1])
    eos = tok.eos_id
    n = len(prompt) + len(response) + 1
    x, y = bundle.train.tensors
    assert x[0, :n].tolist() == prompt + response + [eos]
    assert (x[0, n:] == eos).all()  # padding
    # position i predicts token i+1: no loss while the next token is the prompt's, none after the EOS
    expected = [-100] * (len(prompt) - 1) + response + [eos] + [-100] * (48 - n + 1)
    assert y[0].tolist() == expected
    assert bundle.spec.document_end == eos and bundle.tokenizer is not None


def test_packing_is_greedy_in_file_order_and_an_example_never_straddles_sequences() -> None:
    assert group([10, 20, 15, 30, 5], 40, pack=True) == [[0, 1], [2], [3, 4]]
    assert group([10, 20], 40, pack=False) == [[0], [1]]
    assert group([40, 1, 39], 40, pack=True) == [[0], [1, 2]]


def test_a_packed_sequence_holds_several_examples_each_ending_with_eos(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, _records(12), val_fraction=0.0, test_fraction=0.0)
    x, y = bundle.train.tensors
    eos = bundle.spec.document_end
    ends = (x == eos).sum(dim=1)
    assert len(x) < 12 and int(ends.max()) >= 2  # several examples per sequence
    unpacked = _bundle(tmp_path, _records(12), val_fraction=0.0, test_fraction=0.0, pack=False)
    assert len(unpacked.train) == 12 and unpacked.spec.document_end is None
    # the same targets, only laid out differently
    assert sorted((y[y != -100]).tolist()) == sorted(
        unpacked.train.tensors[1][unpacked.train.tensors[1] != -100].tolist()
    )


def test_a_conversation_learns_the_assistant_turns_only(tmp_path: Path) -> None:
    convo = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "world"},
            {"role": "user", "content": "two plus two?"},
            {"role": "assistant", "content": "four"},
        ]
    }
    bundle = _bundle(tmp_path, [convo], val_fraction=0.0, test_fraction=0.0, seq_len=128)
    tok = load_tokenizer(tmp_path / "tok")
    x, y = bundle.train.tensors
    learnt = tok.decode([t for t in y[0].tolist() if t != -100])
    # the assistant's words and the template's end of turn; the EOS after the example
    assert learnt == "world<|im_end|>\nfour<|im_end|>\n<|endoftext|>"
    read = tok.decode(x[0].tolist())
    assert read.startswith("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n")


def _alone_mean_loss(model: torch.nn.Module, tok: Any, pairs: list[tuple[str, str]]) -> float:
    """By hand: each example ALONE through the model (a batch of one, no padding, no packing), the
    cross-entropy of each response token and of the EOS given everything before it, averaged over
    all those tokens of all examples."""
    total, count = 0.0, 0
    with torch.no_grad():
        for prompt, response in pairs:
            p, r = tok.encode(prompt), tok.encode(response)
            ids = p + r + [tok.eos_id]
            logits = model(torch.tensor([ids]))[0].double()
            logp = logits.log_softmax(dim=-1)
            for i in range(max(len(p), 1), len(ids)):  # target ids[i] predicted at position i-1
                total -= logp[i - 1, ids[i]].item()
                count += 1
    return total / count


def _logged_first_loss(tmp: Path, model: torch.nn.Module, bundle: DataBundle) -> float:
    config = load_config(
        None,
        {
            "log.progress": "none",
            "log.tensorboard": False,
            "log.every_steps": 1,
            "train.batch_size": len(bundle.train),
            "train.grad_accum": len(bundle.train),  # one sequence per micro-batch: uneven token counts
            "train.max_steps": 1,
            "checkpoint.enabled": False,
            "eval.every_epochs": 0,
            "train.device": "cpu",
        },
    )
    Trainer(model, bundle.train, config=config, run_dir=tmp / "run", spec=bundle.spec).fit()
    rows = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    return next(row["loss"] for row in rows if "split" not in row)


def _pairs_of(n: int) -> list[tuple[str, str]]:
    return [PAIRS[i % len(PAIRS)] for i in range(n)]


def test_the_gpt_sft_loss_is_the_hand_computed_mean_over_response_tokens(tmp_path: Path) -> None:
    """Packed (several examples per sequence, unevenly many response tokens per micro-batch): the
    step's loss equals the mean over every response token of the examples each run alone."""
    bundle = _bundle(tmp_path, _records(8), val_fraction=0.0, test_fraction=0.0)
    assert len(bundle.train) < 8  # packed
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="gpt", n_layer=2, n_head=2, d_model=16, dropout=0.0), bundle.spec)
    expected = _alone_mean_loss(model, load_tokenizer(tmp_path / "tok"), _pairs_of(8))
    assert _logged_first_loss(tmp_path, model, bundle) == pytest.approx(expected, rel=1e-5)


def test_the_hf_gpt2_sft_loss_is_the_hand_computed_mean_over_response_tokens(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, _records(8), val_fraction=0.0, test_fraction=0.0, pack=False)
    hf_dir = tiny_gpt2_dir(tmp_path / "gpt2", vocab_size=300)
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="hf", hf_config=str(hf_dir)), bundle.spec)
    model.eval()  # GPT-2's dropout: the hand computation runs the same weights without it
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    expected = _alone_mean_loss(model, load_tokenizer(tmp_path / "tok"), _pairs_of(8))
    assert _logged_first_loss(tmp_path, model, bundle) == pytest.approx(expected, rel=1e-5)


def test_packed_documents_give_the_logits_each_has_alone(tmp_path: Path) -> None:
    """The proof that attention (and position) does not cross documents: every packed example's
    logits equal those of the example run alone, for all three examples of one sequence."""
    bundle = _bundle(tmp_path, _records(3), val_fraction=0.0, test_fraction=0.0, seq_len=128)
    x = bundle.train.tensors[0]
    assert len(x) == 1  # the three share one sequence
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="gpt", n_layer=2, n_head=2, d_model=16, dropout=0.0), bundle.spec).eval()
    tok = load_tokenizer(tmp_path / "tok")
    with torch.no_grad():
        packed = model(x)[0]
        at = 0
        for prompt, response in _pairs_of(3):
            ids = tok.encode(prompt) + tok.encode(response) + [tok.eos_id]
            alone = model(torch.tensor([ids]))[0]
            torch.testing.assert_close(packed[at : at + len(ids)], alone, rtol=1e-5, atol=1e-5)
            at += len(ids)
        assert at > 0 and not math.isclose(float(packed[at - 1].sum()), 0.0)


def test_an_hf_model_refuses_packed_instructions_in_one_line(tmp_path: Path) -> None:
    bundle = _bundle(tmp_path, _records(4), val_fraction=0.0, test_fraction=0.0)
    hf_dir = tiny_gpt2_dir(tmp_path / "gpt2", vocab_size=300)
    from gputrain.errors import ConfigError

    with pytest.raises(ConfigError, match=r"data\.pack") as err:
        build_model(ModelConfig(name="hf", hf_config=str(hf_dir)), bundle.spec)
    assert "data.pack=false" in str(err.value)


def test_gputrain_train_on_instructions_end_to_end(tmp_path: Path) -> None:
    tok = make_tokenizer(tmp_path / "tok", CHATML)
    data = write_jsonl(tmp_path / "sft.jsonl", _records(40))
    run = tmp_path / "run"
    result = run_cli(
        "train",
        "--run-dir",
        str(run),
        "data.name=instructions",
        f"data.path={data}",
        f"data.tokenizer={tok}",
        "data.seq_len=48",
        "model.name=gpt",
        "model.n_layer=1",
        "model.n_head=2",
        "model.d_model=16",
        "train.max_steps=3",
        "train.batch_size=4",
        "train.device=cpu",
        "log.progress=none",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == 3
    assert math.isfinite(summary["val"]["loss"]) and math.isfinite(summary["test"]["loss"])
    evaluated = run_cli("evaluate", str(run), f"data.path={data}", "--name", "again", "--device", "cpu")
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    again = json.loads((run / "eval-again.json").read_text())
    assert again["samples"] == len(_bundle(tmp_path, _records(40), val_fraction=0.0, test_fraction=0.0).train)
    assert math.isfinite(again["metrics"]["loss"])


def test_a_chat_template_saved_as_chat_template_jinja_is_read(tmp_path: Path) -> None:
    """transformers >= 4.43 saves the template beside tokenizer_config.json, as chat_template.jinja."""
    tok = make_tokenizer(tmp_path / "tok")
    (tok / "chat_template.jinja").write_text(CHATML)
    convo = {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "world"}]}
    bundle = _bundle(tmp_path, [convo], val_fraction=0.0, test_fraction=0.0)
    learnt = [t for t in bundle.train.tensors[1][0].tolist() if t != -100]
    assert load_tokenizer(tok).decode(learnt) == "world<|im_end|>\n<|endoftext|>"


def test_a_template_writing_eos_after_every_turn_trains_unpacked(tmp_path: Path) -> None:
    """Llama-2/Zephyr-style templates end every turn with eos_token: packed, the EOS would split the
    conversation (refused: tests/adversarial/test_lm_inputs.py); with data.pack=false it is one example."""
    template = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + eos_token }}{% endfor %}"
    tok = make_tokenizer(tmp_path / "tok", template)
    convo = {
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "world"},
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "four"},
        ]
    }
    bundle = _bundle(tmp_path, [convo], val_fraction=0.0, test_fraction=0.0, pack=False)
    assert bundle.spec.document_end is None
    learnt = [t for t in bundle.train.tensors[1][0].tolist() if t != -100]
    # no generation prompt in this template: the role's words are part of the turn it adds
    expected = "assistant: world<|endoftext|>assistant: four<|endoftext|><|endoftext|>"
    assert load_tokenizer(tok).decode(learnt) == expected
