"""k accumulation steps of micro-batch b == one step of batch k·b (fp32, no dropout)."""

import torch
from safetensors.torch import load_file

from tests.digits_sizes import digits_train_size
from tests.unit.train.helpers import losses, make_trainer


def test_grad_accumulation_equals_the_full_batch(tmp_path):
    common = {"model.name": "mlp", "model.hidden_sizes": [32], "train.epochs": 2, "train.batch_size": 48,
              "optim.name": "sgd", "optim.lr": 0.05, "train.clip_grad_norm": 5.0}
    runs = {}
    for accum in (1, 4):
        run_dir = tmp_path / f"accum{accum}"
        make_trainer(run_dir, **common, **{"train.grad_accum": accum}).fit()
        runs[accum] = (losses(run_dir), load_file(run_dir / "model.safetensors"))
    (l1, w1), (l4, w4) = runs[1], runs[4]
    assert [s for s, _ in l1] == [s for s, _ in l4] and len(l1) == 2 * (digits_train_size() // 48)
    torch.testing.assert_close(torch.tensor([v for _, v in l4]), torch.tensor([v for _, v in l1]),
                               rtol=1e-5, atol=1e-5)
    for name in w1:
        torch.testing.assert_close(w4[name], w1[name], rtol=1e-5, atol=1e-5)


def test_micro_batch_size_with_auto_accumulation(tmp_path):
    trainer = make_trainer(tmp_path / "r", **{"train.batch_size": 64, "train.grad_accum": "auto",
                                              "train.micro_batch_size": 16})
    assert trainer.parts.place.grad_accum == 4 and trainer.parts.feed.plan.micro_batch == 16
