"""model.name=hf with the real transformers package: tiny configs written here, nothing downloaded."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest
import torch

from gputrain import Trainer
from gputrain.config import load_config
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import TensorData
from gputrain.errors import ConfigError
from gputrain.models import build_model
from gputrain.models.hf_models import HFLogits
from gputrain.observe.flops import gpt_dims, gpt_flops_per_token

transformers = pytest.importorskip("transformers", reason="transformers is not installed (pip install -e '.[test]')")

QUIET = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "checkpoint.enabled": False}
TOKENS = DataSpec(task="lm", input_shape=(16,), vocab_size=64)
LABELLED_TOKENS = DataSpec(task="classification", input_shape=(16,), num_classes=3, vocab_size=64)


def _gpt2_config(**changes: Any) -> Any:
    sizes = {"n_layer": 2, "n_head": 2, "n_embd": 32, "vocab_size": 64, "n_positions": 32,
             "bos_token_id": 0, "eos_token_id": 0, **changes}
    return transformers.GPT2Config(**sizes)


def _write_config(directory: Path, **changes: Any) -> Path:
    _gpt2_config(**changes).save_pretrained(directory)
    return directory / "config.json"


def _build(spec: DataSpec, **model: Any) -> torch.nn.Module:
    config = load_config(None, {"model.name": "hf", **{f"model.{k}": v for k, v in model.items()}})
    return build_model(config.model, spec)


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any attempt to reach the hub fails the test instead of hanging or downloading."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("tried to open a network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_cli_trains_a_causal_lm_from_a_config_file(tmp_path: Path, no_network: None) -> None:
    config_file = _write_config(tmp_path / "tiny", pad_token_id=0)  # a pad id, as many configs have
    overrides = {**QUIET, "model.name": "hf", "model.hf_config": str(config_file), "data.name": "synthetic",
                 "data.task": "lm", "data.seq_len": 16, "data.vocab_size": 64, "data.num_samples": 64,
                 "train.batch_size": 8, "train.max_steps": 2}
    trainer = Trainer.from_config(None, run_dir=tmp_path / "run", overrides=overrides)
    assert isinstance(trainer.model, HFLogits) and trainer.model.config.n_embd == 32
    summary = trainer.fit()
    assert summary["status"] == "completed" and summary["global_step"] == 2
    assert 0 < summary["test"]["loss"] < 2 * torch.log(torch.tensor(64.0)).item()  # finite, and near ln(V) or below
    # the GPT formula reads n_embd/n_layer/n_head on the wrapped model's config, seq_len from the data
    dims = gpt_dims(trainer.model, 16)
    assert dims is not None and (dims.n_layer, dims.n_head, dims.head_dim, dims.seq_len) == (2, 2, 16, 16)
    per_token = gpt_flops_per_token(dims.n_params, dims.n_layer, dims.n_head, dims.head_dim, dims.seq_len)
    assert summary["train"]["flops_per_step_formula"] == per_token * 8 * 16


def test_logits_come_back_as_a_tensor_like_gputrains_own_models(tmp_path: Path) -> None:
    model = _build(TOKENS, hf_config=str(_write_config(tmp_path)))
    logits = model(torch.randint(0, 64, (2, 16)))
    assert isinstance(logits, torch.Tensor) and logits.shape == (2, 16, 64)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_a_model_directory_with_weights_is_loaded(tmp_path: Path, no_network: None) -> None:
    torch.manual_seed(0)
    saved = transformers.GPT2LMHeadModel(_gpt2_config()).to(torch.bfloat16)  # a bf16 checkpoint
    saved.save_pretrained(tmp_path / "pretrained")
    model = _build(TOKENS, hf_config=str(tmp_path / "pretrained"))
    assert isinstance(model, HFLogits)
    for name, tensor in saved.state_dict().items():
        assert model.model.state_dict()[name].dtype == torch.float32  # trained in fp32, as gputrain's models
        assert torch.equal(model.model.state_dict()[name], tensor.float()), name
    # a config file alone (or a directory without weights) starts from random weights
    fresh = _build(TOKENS, hf_config=str(tmp_path / "pretrained" / "config.json"))
    assert not torch.equal(fresh.model.transformer.h[0].attn.c_attn.weight,
                           saved.transformer.h[0].attn.c_attn.weight.float())


def test_a_sequence_classifier_trains_on_labelled_token_windows(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _build(LABELLED_TOKENS, hf_config=str(_write_config(tmp_path / "cls", pad_token_id=0)))
    assert isinstance(model.model, transformers.GPT2ForSequenceClassification)
    ids = torch.randint(1, 64, (32, 16))
    labels = ids[:, -1] % 3  # learnable from the last token, which the classifier reads
    data = TensorData(ids, labels)
    # parallel.strategy=none: auto's memory estimate runs the model on the meta device, where the
    # classifier's padding check (it reads token values) cannot run
    config = {**QUIET, "train.batch_size": 8, "train.max_steps": 2, "parallel.strategy": "none"}
    summary = Trainer(model, data, config=config, run_dir=tmp_path / "run", spec=LABELLED_TOKENS).fit()
    assert summary["status"] == "completed" and model(ids[:4]).shape == (4, 3)


@pytest.mark.parametrize("spec, changes, model, message", [
    (LABELLED_TOKENS, {}, {}, "gives a sequence classifier that cannot take batches"),  # GPT-2 has no pad_token_id
    (DataSpec(task="lm", input_shape=(16,), vocab_size=100), {}, {},
     "model.hf_config: has vocab_size 64, fewer than the data's 100 token ids"),
    (DataSpec(task="lm", input_shape=(64,), vocab_size=64), {}, {},
     "data.seq_len = 64: windows of 64 tokens exceed the model's 32 positions"),
    (DataSpec(task="classification", input_shape=(1, 8, 8), num_classes=10), {}, {},
     "hf models take token ids [batch, tokens]; this data gives samples of shape [1, 8, 8]"),
    (TOKENS, {}, {"weights": "w.safetensors"}, "an hf model loads the weights in its model.hf_config directory"),
])
def test_what_does_not_fit_is_refused(tmp_path: Path, spec: DataSpec, changes: dict[str, Any],
                                      model: dict[str, Any], message: str) -> None:
    config_file = _write_config(tmp_path / "c", **changes)
    with pytest.raises(ConfigError) as info:
        _build(spec, hf_config=str(config_file), **model)
    assert message in str(info.value)


def test_an_init_would_overwrite_loaded_weights(tmp_path: Path) -> None:
    transformers.GPT2LMHeadModel(_gpt2_config()).save_pretrained(tmp_path / "pretrained")
    with pytest.raises(ConfigError, match=r"model\.init = 'normal': would overwrite the weights loaded from"):
        _build(TOKENS, hf_config=str(tmp_path / "pretrained"), init="normal")


@pytest.mark.parametrize("content, message", [
    (None, "model.hf_config = '{path}': no such file or directory"),
    ("{not json", "transformers cannot read it"),
    (json.dumps({"model_type": "no-such-architecture"}), "transformers cannot read it"),
])
def test_unreadable_configs_are_refused(tmp_path: Path, no_network: None, content: str | None, message: str) -> None:
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        _build(TOKENS, hf_config=str(path))
    assert message.format(path=path) in str(info.value)


def test_a_directory_without_config_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"is a directory without a config\.json"):
        _build(TOKENS, hf_config=str(tmp_path))


def test_the_final_weights_reload_into_the_same_model(tmp_path: Path) -> None:
    config_file = _write_config(tmp_path / "tiny")
    overrides = {**QUIET, "model.name": "hf", "model.hf_config": str(config_file), "data.name": "synthetic",
                 "data.task": "lm", "data.seq_len": 16, "data.vocab_size": 64, "data.num_samples": 64,
                 "train.batch_size": 8, "train.max_steps": 1}
    trainer = Trainer.from_config(None, run_dir=tmp_path / "run", overrides=overrides)
    trainer.fit()
    from safetensors.torch import load_model

    again = _build(TOKENS, hf_config=str(config_file))
    load_model(again, str(tmp_path / "run" / "model.safetensors"))  # tied embedding and head stored once
    ids = torch.randint(0, 64, (2, 16))
    trainer.model.eval(), again.eval()
    assert torch.equal(trainer.model(ids), again(ids))


def test_cli_refuses_a_sequence_classifier_on_data_without_token_ids(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """CSV columns are numbers, not token ids: refused at build time, one line, exit 2 (not an
    embedding's error about float indices at step 1)."""
    from gputrain.cli import main

    rows = ["t0,t1,t2,label"] + [f"{i % 7},{i % 5},{i % 3},{i % 2}" for i in range(40)]
    (tmp_path / "tok.csv").write_text("\n".join(rows) + "\n")
    config_file = _write_config(tmp_path / "cls", pad_token_id=0)
    code = main(["train", "--run-dir", str(tmp_path / "run"), "model.name=hf", f"model.hf_config={config_file}",
                 "data.name=csv", f"data.path={tmp_path / 'tok.csv'}", "train.device=cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0] == (
        "gputrain train: config error: model.name = 'hf': a sequence classifier takes token ids; this data gives 3 "
        "numbers per sample that are not token ids: use data.name=text_classes (a text column and a label column, "
        "read through data.tokenizer)")


class _Lines(list):  # type: ignore[type-arg]
    def write(self, record: Any) -> None:
        self.append(record.getMessage())


@pytest.mark.parametrize(("model_vocab", "data_vocab", "hint"), [
    (50257, 88, True),    # GPT-2's vocabulary over a text's characters: a hint
    (50304, 50257, False),  # padded to a multiple of 64 for speed: no hint
    (128, 88, False),     # a little room: no hint
    (2048, 88, True),
])
def test_a_model_vocabulary_far_above_the_datas_gets_one_hint(
    model_vocab: int, data_vocab: int, hint: bool, tmp_path: Path
) -> None:
    import logging

    lines = _Lines()
    handler = logging.Handler()
    handler.emit = lines.write  # type: ignore[method-assign]
    logger = logging.getLogger("gputrain")
    logger.addHandler(handler)
    try:
        _build(DataSpec(task="lm", input_shape=(16,), vocab_size=data_vocab),
               hf_config=str(_write_config(tmp_path / "m", vocab_size=model_vocab)))
    finally:
        logger.removeHandler(handler)
    said = [line for line in lines if "vocab_size" in line]
    assert len(said) == (1 if hint else 0), lines
    if hint:
        assert f'set "vocab_size": {data_vocab} in its config.json' in said[0], said
        assert f"{model_vocab - data_vocab:,} embedding and output rows are never a target" in said[0], said
