"""`model.name=hf`: a Hugging Face transformers model from a local config, as a causal LM or a
sequence classifier, whichever the data asks for.

`model.hf_config` is a config.json, or a model directory holding one. A directory that also holds
weights (model.safetensors, pytorch_model.bin, or their sharded indexes) is loaded with
`from_pretrained(local_files_only=True)`; otherwise the model is built with random weights
(`from_config`). Nothing is downloaded, and no code from the directory runs (trust_remote_code
stays off). Weights are kept in fp32, as gputrain's own models are: mixed precision is the
trainer's (`train.precision`), whatever dtype the checkpoint was saved in.

Token data padded on the right (the spec's `pad_id`: data.name=text_classes): the model is given
the attention mask of the tokens up to the last that is not padding, and its padding is the
model's own `pad_token_id` where its config has one (the data's padding is replaced by it: a
pretrained encoder such as RoBERTa numbers its positions from its pad id), else the data's, which
then becomes the model's (a decoder's classifier reads the last token that is not its pad id).
Packed instruction data is refused: transformers keeps packed documents apart only with
flash-attention-2 (position_ids restarts), so attention would cross examples; `data.pack=false`
gives one example per sequence.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gputrain.config.paths import check_hf_config_path
from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models.ecosystem import import_library
from gputrain.models.gpt import last_real_token
from gputrain.models.registry import register_model

log = logging.getLogger("gputrain")
_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


class HFLogits(nn.Module):
    """A transformers model that returns its logits tensor instead of a ModelOutput.

    The training loop computes `loss_fn(model(inputs), targets)` on tensors (train/tasks.py); a
    transformers model returns a ModelOutput, and a causal LM also its key/value cache. Wrapped, it
    takes token ids [B, T] and returns logits ([B, T, V] for a causal LM, [B, classes] for a
    classifier) like gputrain's own models, so the loop, evaluation and metrics need nothing new.
    `config` is the wrapped model's, where the GPT formula of the speed report reads its sizes
    (observe/flops.py).
    """

    def __init__(self, model: nn.Module, pad_id: int | None = None, model_pad_id: int | None = None) -> None:
        super().__init__()
        self.model = model
        self.pad_id = pad_id
        """Inputs are padded on the right with this id: attention covers each up to its last other token."""
        self.model_pad_id = model_pad_id if model_pad_id != pad_id else None
        """The model's own pad id, which replaces the data's padding, where it is another."""

    @property
    def config(self) -> Any:
        return self.model.config

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.pad_id is None:
            logits: torch.Tensor = self.model(input_ids=input_ids).logits
            return logits
        # padding is what follows the last other token (a pad id inside the text stays text)
        last = last_real_token(input_ids, self.pad_id)
        mask = torch.arange(input_ids.shape[1], device=input_ids.device) <= last[:, None]
        if self.model_pad_id is not None:
            input_ids = torch.where(mask, input_ids, self.model_pad_id)
        logits = self.model(input_ids=input_ids, attention_mask=mask.long()).logits
        return logits


def _config_file(path_text: str) -> tuple[Path, Path | None]:
    """(the config.json, the directory holding weights or None).

    Raises:
        ConfigError: naming model.hf_config: no such file, or a directory without config.json.
    """
    check_hf_config_path(path_text)
    path = Path(path_text).expanduser()
    if path.is_dir():
        config_file = path / "config.json"
        has_weights = any((path / name).is_file() for name in _WEIGHT_FILES)
        return config_file, path if has_weights else None
    return path, None


def _oversized(model_vocab: int, data_vocab: int) -> bool:
    """A model vocabulary far larger than the data's ids (GPT-2's 50,257 for a text's 88 characters),
    not one padded for speed (50,304 for 50,257, a multiple of 64 or 128)."""
    return model_vocab > max(2 * data_vocab, data_vocab + 1024)


def _check_fits_data(hf_config: Any, spec: DataSpec, model_name: str) -> None:
    """The data's token ids and windows fit the model: refused now, not as an index error at step 1."""
    if len(spec.input_shape) != 1:
        raise ConfigError(
            "model.name",
            f"hf models take token ids [batch, tokens]; this data gives samples of shape {list(spec.input_shape)}",
            model_name,
            hint="use data.name=text, tokens or synthetic with data.task=lm",
        )
    if spec.task != "lm" and spec.vocab_size is None:  # the ids are what the spec of token data states
        raise ConfigError(
            "model.name",
            f"a sequence classifier takes token ids; this data gives {spec.input_shape[0]} numbers per sample that "
            "are not token ids: use data.name=text_classes (a text column and a label column, read through "
            "data.tokenizer)",
            model_name,
        )
    if spec.document_end is not None:
        raise ConfigError(
            "data.pack",
            "packs several examples per sequence, and a transformers model would attend across them "
            "(it keeps packed documents apart only with flash-attention-2)",
            True,
            hint="set data.pack=false: one example per sequence, padded",
        )
    vocab = getattr(hf_config, "vocab_size", None)
    if spec.vocab_size is not None and isinstance(vocab, int) and vocab < spec.vocab_size:
        raise ConfigError(
            "model.hf_config",
            f"has vocab_size {vocab}, fewer than the data's {spec.vocab_size} token ids",
            None,
            hint=f"set vocab_size >= {spec.vocab_size} in its config.json",
        )
    oversized = spec.vocab_size is not None and isinstance(vocab, int) and _oversized(vocab, spec.vocab_size)
    if oversized and int(os.environ.get("RANK", "0")) == 0:  # every rank builds the model: one line
        assert isinstance(vocab, int) and spec.vocab_size is not None
        log.warning(
            "model.hf_config: vocab_size %s for data of %s token ids: %s embedding and output rows are never "
            'a target; set "vocab_size": %s in its config.json (a character vocabulary), or give the data '
            "as the ids of that model's tokenizer (data.tokenizer, gputrain prepare)",
            f"{vocab:,}",
            f"{spec.vocab_size:,}",
            f"{vocab - spec.vocab_size:,}",
            spec.vocab_size,
        )
    context = getattr(hf_config, "max_position_embeddings", None)  # n_positions for GPT-2
    if isinstance(context, int) and context < spec.input_shape[0]:
        raise ConfigError(
            "data.seq_len",
            f"windows of {spec.input_shape[0]} tokens exceed the model's {context} positions (model.hf_config)",
            spec.input_shape[0],
            hint=f"use data.seq_len <= {context}",
        )


def _auto_class(transformers: Any, spec: DataSpec, hf_config: Any) -> Any:
    """AutoModelForCausalLM for language modelling; AutoModelForSequenceClassification, with one
    output per class (or regression target), for the other tasks."""
    if spec.task == "lm":
        # gputrain's token windows are never padded; with a pad_token_id, transformers looks for
        # padding in every batch (a host-device sync per step, and an error on the meta device where
        # gputrain estimates activation memory). A causal LM reads it for nothing else.
        hf_config.pad_token_id = None
        return transformers.AutoModelForCausalLM
    hf_config.num_labels = spec.num_model_outputs
    if spec.pad_id is not None and getattr(hf_config, "pad_token_id", None) is None:
        hf_config.pad_token_id = spec.pad_id  # the data's padding, which a decoder's classifier looks for
    if spec.class_names is not None:  # after num_labels, which resets them
        hf_config.id2label = dict(enumerate(spec.class_names))
        hf_config.label2id = {name: i for i, name in enumerate(spec.class_names)}
    hf_config.problem_type = "regression" if spec.task == "regression" else "single_label_classification"
    return transformers.AutoModelForSequenceClassification


def _check_num_labels(config_file: Path, spec: DataSpec, config_path: str) -> None:
    """A config.json that declares its classifier's labels (num_labels, id2label) declares as many as the
    data has classes: a pretrained head of another size would be dropped or fail to load. A config
    that declares none (a bare GPT-2 config) gets the data's number.

    Raises:
        ConfigError: naming model.hf_config, both counts and the fix.
    """
    try:
        raw = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return  # AutoConfig read it; what it cannot read it has already refused
    declared = raw.get("num_labels") if isinstance(raw, dict) else None
    if declared is None and isinstance(raw, dict) and isinstance(raw.get("id2label"), dict):
        declared = len(raw["id2label"])
    classes = spec.num_model_outputs
    if isinstance(declared, int) and declared != classes:
        names = f" ({', '.join(spec.class_names[:10])})" if spec.class_names else ""
        raise ConfigError(
            "model.hf_config",
            f"declares a classifier of {declared} labels, but the data has {classes} classes{names}",
            config_path,
            hint=f"set num_labels (and id2label) in {config_file} to {classes} classes, or use data of {declared}",
        )


def _check_classifies_batches(model: nn.Module, config_path: str) -> None:
    """A decoder's sequence classifier reads the last token that is not padding, and without a
    `pad_token_id` refuses batches of more than one sequence; an encoder's reads the first token.
    Two 2-token sequences tell which, at the cost of 4 tokens' forward, rather than step 1."""
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):  # dropout draws leave the seeded stream alone
            model(input_ids=torch.ones(2, 2, dtype=torch.long))
    except ValueError as exc:
        raise ConfigError(
            "model.hf_config",
            f"gives a sequence classifier that cannot take batches: {exc}",
            config_path,
            hint='add "pad_token_id": <an id that marks padding> to its config.json',
        ) from exc


@register_model("hf")
def build_hf_model(config: ModelConfig, spec: DataSpec) -> nn.Module:
    """Raises ConfigError: transformers is missing, or the config cannot be read or does not fit the data."""
    if config.hf_config is None:
        raise ConfigError("model.hf_config", "model.name=hf needs a local config.json or model directory")
    if config.weights is not None:
        raise ConfigError(
            "model.weights",
            "is for timm, torchvision and gputrain's models; an hf model loads the weights in its model.hf_config "
            "directory",
            config.weights,
            hint="put the weights (model.safetensors) beside config.json and set model.hf_config to the directory",
        )
    config_file, weights_dir = _config_file(config.hf_config)
    transformers = import_library("transformers", config.name)
    try:
        hf_config = transformers.AutoConfig.from_pretrained(str(config_file), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ConfigError("model.hf_config", f"transformers cannot read it: {exc}", config.hf_config) from exc
    _check_fits_data(hf_config, spec, config.name)
    if spec.task == "classification":
        _check_num_labels(config_file, spec, config.hf_config)
    auto_class = _auto_class(transformers, spec, hf_config)
    if weights_dir is not None and config.init != "default":
        raise ConfigError(
            "model.init",
            f"would overwrite the weights loaded from {weights_dir}",
            config.init,
            hint="leave model.init=default",
        )
    # With a key/value cache, transformers' causal masking skips its packed-sequence check, which
    # reads tensor values: a host-device sync every step, and an error on the meta device, where
    # gputrain estimates activation memory (distributed/auto.py). The cache costs one copy of each
    # layer's keys and values, dropped with the outputs (the wrapper returns only the logits).
    hf_config.use_cache = True
    try:
        if weights_dir is not None:
            model = auto_class.from_pretrained(str(weights_dir), config=hf_config, local_files_only=True)
        else:
            model = auto_class.from_config(hf_config)
    except (OSError, ValueError, KeyError) as exc:  # a config no such model exists for, damaged weights
        raise ConfigError(
            "model.hf_config", f"transformers cannot build a model from it: {exc}", config.hf_config
        ) from exc
    model = model.float()
    if spec.task != "lm":
        _check_classifies_batches(model, config.hf_config)
    if spec.task == "lm":
        return HFLogits(model)
    return HFLogits(model, spec.pad_id, getattr(hf_config, "pad_token_id", None))
