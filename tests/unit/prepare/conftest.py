"""Fixtures of the `gputrain prepare` tests: a tokenizer.json trained by `tokenizers` on the test texts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.prepare.corpus import documents, write_tokenizer


@pytest.fixture(scope="session")
def tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json", documents(200, seed=99))
