"""Packed instruction data (data.name=instructions, responses-only labels, gpt's document mask):
2 gloo ranks under DDP × 2 accumulation steps train exactly as one process on the whole batch
(every logged loss and the weights after 3 steps, to 1e-6), however unevenly the response tokens
fall over the ranks' sequences. About 20 s on 2 idle cores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from gputrain import Trainer
from gputrain.config import load_config
from gputrain.config.schema import ModelConfig
from gputrain.data import build_data
from gputrain.models import build_model
from tests.dist.harness import run_ranks
from tests.unit.data.test_instructions import _records
from tests.unit.data.text_files import CHATML, make_tokenizer, write_jsonl
from tests.unit.train.test_token_loss import config, step_losses


def _train(run_dir: str, data_dir: str, overrides: dict[str, Any]) -> None:
    data = load_config({"data.name": "instructions", "data.path": f"{data_dir}/sft.jsonl",
                        "data.tokenizer": f"{data_dir}/tok", "data.seq_len": 48, "data.val_fraction": 0.0,
                        "data.test_fraction": 0.0}).data  # fmt: skip
    bundle = build_data(data, seed=0)
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="gpt", n_layer=1, n_head=2, d_model=16, dropout=0.0), bundle.spec)
    Trainer(model, bundle.train, config=config(**overrides), run_dir=run_dir, spec=bundle.spec).fit()


def _job(rank: int, run_dir: str, data_dir: str) -> bool:
    _train(run_dir, data_dir, {"parallel.strategy": "ddp", "train.grad_accum": 2})
    return True


def test_two_ranks_train_packed_instructions_as_one_process(tmp_path: Path) -> None:
    make_tokenizer(tmp_path / "tok", CHATML)
    write_jsonl(tmp_path / "sft.jsonl", _records(40))
    _train(str(tmp_path / "one"), str(tmp_path), {})
    assert run_ranks(_job, str(tmp_path / "two"), str(tmp_path), timeout_s=180) == [True, True]
    expected, got = step_losses(tmp_path / "one"), step_losses(tmp_path / "two")
    assert len(expected) == len(got) == 3
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=1e-6, atol=1e-6)
    ref, weights = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    assert set(ref) == set(weights)
    for key in ref:
        torch.testing.assert_close(weights[key], ref[key], rtol=1e-6, atol=1e-6, msg=key)
