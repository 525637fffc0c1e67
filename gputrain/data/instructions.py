"""`data.name=instructions`: supervised fine-tuning data, a JSONL file of prompt/response records
(or of conversations), tokenized and packed into `data.seq_len` sequences with the loss on the
responses only.

A record is `{"prompt": ..., "response": ...}` (`data.prompt_field`, `data.response_field`),
the two texts concatenated as they are (a separator belongs in the data), or `{"messages":
[{"role": ..., "content": ...}, ...]}` rendered with the tokenizer's chat template (data/chat.py;
a tokenizer without one refuses conversations). Each example is followed by the tokenizer's EOS.

Labels are those of the (inputs, targets) pairs of gputrain's other language-model data: targets
are the inputs shifted by one, `-100` (no loss) where the next token is a prompt token, padding,
or another example's; the loss is the mean over the response tokens (and each example's EOS) of
the global batch (train/token_loss.py), as Hugging Face's Trainer and TRL compute it.

Packing (`data.pack`, on by default): examples in file order fill each sequence until the next
does not fit (greedy, deterministic), the rest of it is padding (the EOS id, no loss). The spec's
`document_end` (the EOS id) tells the model: the built-in gpt then keeps each example's attention
within it and restarts its positions (models/gpt.py), so an example reads exactly as it would
alone. transformers' models do that only with flash-attention-2: model.name=hf refuses packed
data; with `data.pack=false` each sequence holds one example, padded on the right, which a causal
model never attends to.

The EOS therefore cannot appear inside a packed example (a text holding it, a chat template that
writes `eos_token` after every turn): such an example is refused, naming its line, for
`data.pack=false`. Examples are split into train/val/test (seeded, `data.val_path` for a separate
validation file) before they are packed, each split in file order.

An example longer than `data.seq_len` is truncated, its end cut off, as TRL's SFTTrainer truncates
to its max_length (one warning counts them); one whose prompt leaves no response token within
`data.seq_len` trains nothing and is refused, naming its line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from gputrain.config.schema import DataConfig
from gputrain.data.chat import check_messages, render_turns
from gputrain.data.records import Record, read_jsonl, read_tokenizer, source_files, text_field
from gputrain.data.registry import DataBundle, register_data
from gputrain.data.spec import DataSpec
from gputrain.data.tensors import TensorData, split_indices
from gputrain.errors import ConfigError, DataError
from gputrain.text.tokenizer import Tokenizer

log = logging.getLogger("gputrain")

IGNORE_INDEX = -100
"""A target without a loss: torch's ignore_index, which train/token_loss.py counts out (the data
layer does not import the training one)."""


@dataclass(frozen=True, slots=True)
class Example:
    """One tokenized example: its tokens (the EOS last, unless truncated) and which are learnt."""

    line: int
    ids: list[int]
    learnt: list[bool]
    """Per token: a response token or the EOS, whose prediction carries the loss."""


def _pieces(path: Path, record: Record, config: DataConfig, tokenizer: Tokenizer) -> list[tuple[str, bool]]:
    """The example's text as (text, learnt) pieces."""
    line, values = record
    where = f"{path}: line {line}"
    if "messages" in values and config.prompt_field not in values:
        if tokenizer.chat_template is None:
            raise DataError(
                f"{where}: a 'messages' conversation, but the tokenizer ({tokenizer.source}) has no chat template; "
                "use a tokenizer directory whose tokenizer_config.json has a chat_template, or prompt/response fields"
            )
        assert tokenizer.eos_id is not None  # checked before any record is read
        eos_token = tokenizer.decode([tokenizer.eos_id])
        return render_turns(where, tokenizer.chat_template, check_messages(where, values["messages"]), eos_token)
    prompt = text_field(path, record, config.prompt_field, "data.prompt_field")
    response = text_field(path, record, config.response_field, "data.response_field")
    if not response.strip():
        raise DataError(f"{where}: field {config.response_field!r} is empty: nothing to learn from this example")
    return [(prompt, False), (response, True)]


def tokenize(path: Path, records: list[Record], config: DataConfig, tokenizer: Tokenizer) -> list[Example]:
    """The records as examples of at most data.seq_len tokens (module docstring).

    Raises:
        DataError: naming the file and line of a record that is malformed or leaves nothing to learn.
    """
    assert tokenizer.eos_id is not None
    T, truncated, examples = config.seq_len, 0, []
    pieces = [_pieces(path, record, config, tokenizer) for record in records]
    encoded = iter(tokenizer.encode_batch([text for example in pieces for text, _ in example]))  # one call: fast
    for record, example in zip(records, pieces, strict=True):
        ids: list[int] = []
        learnt: list[bool] = []
        for _, is_learnt in example:
            piece = next(encoded)
            ids += piece
            learnt += [is_learnt] * len(piece)
        if config.pack and tokenizer.eos_id in ids:
            # the model tells packed examples apart by it: the rest would not see what came before
            raise DataError(
                f"{path}: line {record[0]}: the example holds the end-of-sequence token "
                f"({tokenizer.decode([tokenizer.eos_id])!r}) inside it (in its text, or written by the chat template), "
                "and packed examples are told apart by it; set data.pack=false (one example per sequence)"
            )
        ids.append(tokenizer.eos_id)
        learnt.append(True)
        if len(ids) > T:
            truncated += 1
            ids, learnt = ids[:T], learnt[:T]
            if not any(learnt[1:]):  # the first token is never a target
                raise DataError(
                    f"{path}: line {record[0]}: the prompt fills data.seq_len = {T} tokens, leaving none of the "
                    f"response within it; raise data.seq_len or shorten the prompt"
                )
        examples.append(Example(record[0], ids, learnt))
    if truncated:
        log.warning(
            "instructions: %d of %d examples in %s are longer than data.seq_len = %d tokens and were truncated "
            "(their end cut off, as TRL's SFTTrainer does)",
            truncated,
            len(examples),
            path,
            T,
        )
    return examples


def group(lengths: list[int], seq_len: int, pack: bool) -> list[list[int]]:
    """Example indices per sequence: greedy in order (each sequence takes examples until the next
    does not fit), or one each."""
    if not pack:
        return [[i] for i in range(len(lengths))]
    rows: list[list[int]] = []
    used = seq_len
    for i, n in enumerate(lengths):
        if used + n > seq_len:
            rows.append([])
            used = 0
        rows[-1].append(i)
        used += n
    return rows


def sequences(examples: list[Example], seq_len: int, pad_id: int, pack: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each int64 [sequences, seq_len]: the examples grouped (`group`), padded
    with `pad_id`; a target is the next token of the same example where that token is learnt, else
    IGNORE_INDEX."""
    rows = group([len(e.ids) for e in examples], seq_len, pack)
    x = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)
    y = torch.full((len(rows), seq_len), IGNORE_INDEX, dtype=torch.long)
    for r, members in enumerate(rows):
        at = 0
        for i in members:
            ids, learnt = examples[i].ids, examples[i].learnt
            n = len(ids)
            x[r, at : at + n] = torch.tensor(ids)
            nxt = torch.tensor(ids[1:], dtype=torch.long)
            y[r, at : at + n - 1] = torch.where(torch.tensor(learnt[1:], dtype=torch.bool), nxt, IGNORE_INDEX)
            at += n
    return x, y


def eos_of(tokenizer: Tokenizer) -> int:
    """The tokenizer's EOS id, which ends every example.

    Raises:
        DataError: it has none.
    """
    if tokenizer.eos_id is None:
        raise DataError(
            f"data.tokenizer: {tokenizer.source} has no end-of-sequence token (eos_token in tokenizer_config.json, "
            "or <|endoftext|> / </s>): each instruction example ends with one"
        )
    return tokenizer.eos_id


def read_sequences(path: Path, config: DataConfig) -> TensorData:
    """A whole JSONL file's examples as (inputs, targets) sequences, as a split is made (new data for
    `gputrain evaluate`)."""
    tokenizer = read_tokenizer(config)
    eos = eos_of(tokenizer)
    return TensorData(*sequences(tokenize(path, read_jsonl(path), config, tokenizer), config.seq_len, eos, config.pack))


@register_data("instructions")
def build_instructions(config: DataConfig, seed: int) -> DataBundle:
    if config.task not in ("auto", "lm"):
        raise ConfigError("data.task", "instruction data is for language modelling (lm)", config.task)
    path, val_path = source_files(config)
    tokenizer = read_tokenizer(config)
    eos = eos_of(tokenizer)
    vocab_size = tokenizer.vocab_size
    if config.vocab_size is not None:
        if config.vocab_size < vocab_size:
            raise ConfigError("data.vocab_size", f"is smaller than the tokenizer's {vocab_size} ids", config.vocab_size)
        vocab_size = config.vocab_size
    examples = tokenize(path, read_jsonl(path), config, tokenizer)
    held = tokenize(val_path, read_jsonl(val_path), config, tokenizer) if val_path is not None else None
    val_fraction = 0.0 if held is not None else config.val_fraction
    train_idx, val_idx, test_idx = split_indices(len(examples), val_fraction, config.test_fraction, seed)
    if len(train_idx) == 0:
        raise DataError(f"{path}: {len(examples)} examples leave none for training after the val/test split")

    def part(chosen: list[Example]) -> TensorData | None:
        if not chosen:
            return None
        return TensorData(*sequences(chosen, config.seq_len, eos, config.pack))

    def pick(indices: torch.Tensor) -> list[Example]:
        return [examples[i] for i in sorted(indices.tolist())]  # file order: the packing is the file's

    train = part(pick(train_idx))
    assert train is not None
    spec = DataSpec(
        task="lm",
        input_shape=(config.seq_len,),
        vocab_size=vocab_size,
        document_end=eos if config.pack else None,
    )
    val = part(held) if held is not None else part(pick(val_idx))
    return DataBundle(train=train, val=val, test=part(pick(test_idx)), spec=spec, tokenizer=tokenizer)
