"""examples/instructions_gpt.toml and examples/text_classes_gpt.toml read the data and tokenizer
shipped in examples/text_data as written (from the repository root), with what they promise: a chat
template, both kinds of records, two classes by name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gputrain.config import load_config
from gputrain.data import build_data

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("name", ["instructions_gpt", "text_classes_gpt"])
def test_the_text_examples_read_their_shipped_data(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    config = load_config(ROOT / "examples" / f"{name}.toml")
    bundle = build_data(config.data, seed=config.train.seed)
    assert bundle.tokenizer is not None and bundle.tokenizer.chat_template is not None
    assert len(bundle.train) > 0 and bundle.val is not None and os.path.isfile(config.data.path or "")
    if name == "text_classes_gpt":
        assert bundle.spec.class_names == ("negative", "positive")
    else:
        x, y = bundle.train.tensors
        assert bundle.spec.document_end is not None and (x == bundle.spec.document_end).sum(dim=1).min() >= 2
        assert 0 < int((y != -100).sum()) < y.numel() // 2  # the responses only
