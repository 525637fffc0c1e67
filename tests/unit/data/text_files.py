"""Real text-data files for the instruction and text-class tests: a byte-level BPE tokenizer.json
trained here with the `tokenizers` library (with a chat template beside it where asked), JSONL
and CSV files, and a tiny GPT-2 model directory made from a config (nothing is downloaded)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "question: what is two plus two? answer: four",
    "hello world, this is a tiny corpus for a tiny tokenizer",
    "good movie, great plot; bad acting, terrible ending",
] * 20

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""The ChatML template (Qwen's, without its system default): a turn ends with <|im_end|>."""


def make_tokenizer(directory: Path, chat_template: str | None = None, eos: bool = True) -> Path:
    """A byte-level BPE of 300 tokens in `directory`/tokenizer.json (eos <|endoftext|>, and the ChatML
    markers as special tokens), with tokenizer_config.json naming the eos and the template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] if eos else ["<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    config: dict[str, Any] = {"eos_token": "<|endoftext|>"} if eos else {}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def write_jsonl(path: Path, records: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def tiny_gpt2_dir(directory: Path, vocab_size: int, classifier: bool = False, **extra: Any) -> Path:
    """A GPT-2 config.json of 1 layer, 2 heads, 16 wide, 64 positions (random weights: no weight files)."""
    from transformers import GPT2Config

    config = GPT2Config(
        n_layer=1, n_head=2, n_embd=16, n_positions=64, vocab_size=vocab_size, bos_token_id=0, eos_token_id=0, **extra
    )
    if classifier:
        config.architectures = ["GPT2ForSequenceClassification"]
    directory.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(str(directory))
    return directory
