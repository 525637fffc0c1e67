"""data.name=text_classes (data/text_classes.py): a text column and a label column, CSV or JSONL,
through a real tokenizer into padded token ids and class ids whose names the run keeps; trained by
the built-in gpt's classification head and by a Hugging Face sequence classifier, which both read a
text alike however much padding follows it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gputrain.config import load_config
from gputrain.config.schema import ModelConfig
from gputrain.data import build_data
from gputrain.data.registry import DataBundle
from gputrain.data.spec import DataSpec
from gputrain.text.tokenizer import load_tokenizer
from gputrain.errors import ConfigError
from gputrain.models import build_model
from tests.conftest import run_cli
from tests.unit.data.text_files import make_tokenizer, tiny_gpt2_dir, write_jsonl

TEXTS = {
    "pos": ["good movie", "great plot", "hello world"],
    "neg": ["bad acting", "terrible ending", "the lazy dog"],
    "meh": ["tiny corpus", "quick brown fox"],
}


def _records(n: int = 48, label: Any = None) -> list[dict[str, Any]]:
    names = sorted(TEXTS)
    out = []
    for i in range(n):
        name = names[i % len(names)]
        out.append({"text": TEXTS[name][i % len(TEXTS[name])], "label": name if label is None else label(name)})
    return out


def _bundle(tmp: Path, path: Path, **fields: Any) -> DataBundle:
    tok = tmp / "tok" if (tmp / "tok").exists() else make_tokenizer(tmp / "tok")
    values = {"data.name": "text_classes", "data.path": str(path), "data.tokenizer": str(tok), "data.seq_len": 16}
    values.update({f"data.{k}": v for k, v in fields.items()})
    return build_data(load_config(values).data, seed=0)


def test_jsonl_text_and_names_become_padded_ids_and_sorted_classes(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", _records(18))
    bundle = _bundle(tmp_path, path, val_fraction=0.0, test_fraction=0.0)
    tok = load_tokenizer(tmp_path / "tok")
    spec = bundle.spec
    assert spec.class_names == ("meh", "neg", "pos") and spec.num_classes == 3 and spec.task == "classification"
    assert spec.pad_id == tok.eos_id and spec.vocab_size == tok.vocab_size
    x, y = bundle.train.tensors
    for row, label in zip(x, y, strict=True):
        text = tok.decode([t for t in row.tolist() if t != spec.pad_id])
        assert text in TEXTS[spec.class_names[int(label)]], (text, int(label))
        ids = tok.encode(text)
        assert row[: len(ids)].tolist() == ids and (row[len(ids) :] == spec.pad_id).all()  # padded on the right


def test_csv_whole_number_labels_sort_by_value_and_long_texts_are_truncated(tmp_path: Path) -> None:
    lines = ["review,stars"] + [
        f'"{TEXTS["pos"][i % 3]} {"and more " * (i % 2) * 20}",{(i % 3) * 5}' for i in range(12)
    ]
    (tmp_path / "t.csv").write_text("\n".join(lines) + "\n")
    bundle = _bundle(tmp_path, tmp_path / "t.csv", text_field="review", label_field="stars", val_fraction=0.0,
                     test_fraction=0.0)  # fmt: skip
    assert bundle.spec.class_names == ("0", "5", "10")  # by value, not as text ("10" < "5")
    x, y = bundle.train.tensors
    assert x.shape[1] == 16 and sorted(set(y.tolist())) == [0, 1, 2]
    assert ((x != bundle.spec.pad_id).sum(dim=1) == 16).any()  # the long ones fill the whole window


def _tiny_gpt(spec: DataSpec) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(ModelConfig(name="gpt", n_layer=1, n_head=2, d_model=16, dropout=0.0), spec).eval()


def test_gpt_classifies_at_the_last_real_token_whatever_the_padding(tmp_path: Path) -> None:
    tok = load_tokenizer(make_tokenizer(tmp_path / "tok"))
    spec = DataSpec(task="classification", input_shape=(16,), num_classes=3, vocab_size=tok.vocab_size,
                    pad_id=tok.eos_id)  # fmt: skip
    model = _tiny_gpt(spec)
    ids = tok.encode("the quick brown fox")
    padded = torch.tensor([ids + [tok.eos_id] * (16 - len(ids))])
    with torch.no_grad():
        out, alone = model(padded), model(torch.tensor([ids]))
    assert out.shape == (1, 3)
    torch.testing.assert_close(out, alone)
    with torch.no_grad():  # and not at the last position, which is padding
        wrong = model.cls_head(model.ln_f(_hidden(model, padded))[:, -1])
    assert not torch.allclose(out, wrong)


def _hidden(model: Any, idx: torch.Tensor) -> torch.Tensor:
    x = model.wte(idx) + model.wpe(torch.arange(idx.shape[1]))
    for block in model.blocks:
        x = block(x)
    return x


@pytest.mark.parametrize("kind", ["gpt2", "gpt2-own-pad", "bert", "roberta"])
def test_an_hf_classifier_reads_a_padded_text_as_the_text_alone(tmp_path: Path, kind: str) -> None:
    """GPT-2 pools its last real token (pad_token_id is set to the data's padding); BERT pools the
    first and attends both ways, so without the attention mask its padding would change the logits."""
    tok = load_tokenizer(make_tokenizer(tmp_path / "tok"))
    if kind == "gpt2":
        directory = tiny_gpt2_dir(tmp_path / "m", vocab_size=300, classifier=True)
    elif kind == "gpt2-own-pad":  # pools at its last token that is not ITS pad id: the data's padding becomes it
        directory = tiny_gpt2_dir(tmp_path / "m", vocab_size=300, classifier=True, pad_token_id=5)
    elif kind == "roberta":  # its own pad id (1), from which it numbers positions: kept, the padding made of it
        from transformers import RobertaConfig

        directory = tmp_path / "m"
        RobertaConfig(vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                      max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                      pad_token_id=1).save_pretrained(str(directory))  # fmt: skip
    else:
        from transformers import BertConfig

        directory = tmp_path / "m"
        BertConfig(vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                   max_position_embeddings=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                   ).save_pretrained(str(directory))  # fmt: skip
    spec = DataSpec(task="classification", input_shape=(16,), num_classes=2, vocab_size=tok.vocab_size,
                    pad_id=tok.eos_id, class_names=("neg", "pos"))  # fmt: skip
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="hf", hf_config=str(directory)), spec).eval()
    ids = tok.encode("the quick brown fox")
    with torch.no_grad():
        padded = model(torch.tensor([ids + [tok.eos_id] * (16 - len(ids))]))
        alone = model.model(input_ids=torch.tensor([ids])).logits
    torch.testing.assert_close(padded, alone, rtol=1e-5, atol=1e-6)
    assert model.config.id2label == {0: "neg", 1: "pos"}
    assert model.config.pad_token_id == {"roberta": 1, "gpt2-own-pad": 5}.get(kind, tok.eos_id)


def test_an_hf_classifier_of_another_number_of_labels_is_refused_in_one_line(tmp_path: Path) -> None:
    directory = tiny_gpt2_dir(tmp_path / "m", vocab_size=300, classifier=True, num_labels=5)
    spec = DataSpec(task="classification", input_shape=(16,), num_classes=3, vocab_size=300, pad_id=0,
                    class_names=("a", "b", "c"))  # fmt: skip
    with pytest.raises(ConfigError) as err:
        build_model(ModelConfig(name="hf", hf_config=str(directory)), spec)
    message = str(err.value)
    assert "declares a classifier of 5 labels, but the data has 3 classes (a, b, c)" in message


@pytest.mark.parametrize("model", ["gpt", "hf"])
def test_gputrain_train_on_text_classes_end_to_end_and_predict_names_the_classes(tmp_path: Path, model: str) -> None:
    tok = make_tokenizer(tmp_path / "tok")
    data = write_jsonl(tmp_path / "t.jsonl", _records(60))
    if model == "gpt":
        model_args = ["model.name=gpt", "model.n_layer=1", "model.n_head=2", "model.d_model=16"]
    else:
        model_args = ["model.name=hf", f"model.hf_config={tiny_gpt2_dir(tmp_path / 'm', 300, classifier=True)}"]
    run = tmp_path / "run"
    data_args = ["data.name=text_classes", f"data.path={data}", f"data.tokenizer={tok}", "data.seq_len=16"]
    steps = ["train.max_steps=40", "train.batch_size=8", "optim.lr=0.01", "train.device=cpu", "log.progress=none"]
    result = run_cli("train", "--run-dir", str(run), *data_args, *model_args, *steps)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == 40 and summary["test"]["accuracy"] == 1.0
    bundle = _bundle(tmp_path, data)
    np.save(tmp_path / "ids.npy", bundle.test.tensors[0][:4].numpy())
    predicted = run_cli("predict", str(run), str(tmp_path / "ids.npy"))
    assert predicted.returncode == 0, predicted.stderr[-2000:]
    lines = predicted.stdout.strip().splitlines()
    assert lines[0] == "input,predicted,p_meh,p_neg,p_pos"
    names = ("meh", "neg", "pos")
    assert [line.split(",")[1] for line in lines[1:]] == [names[int(i)] for i in bundle.test.tensors[1][:4]]
    if model == "gpt":  # new labelled data, by class name: the whole file scored against the model's classes
        evaluated = run_cli("evaluate", str(run), f"data.path={data}", "--name", "again", "--device", "cpu")
        assert evaluated.returncode == 0, evaluated.stderr[-2000:]
        again = json.loads((run / "eval-again.json").read_text())
        assert again["samples"] == 60 and again["metrics"]["accuracy"] == 1.0
