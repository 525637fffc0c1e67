"""Token-level losses (train/token_loss.py) against the labels and models that could break them:
micro-batches and whole steps without a valid token, labels of another dtype or out of the
vocabulary, dict batches without labels or with their own shift_labels, models that do or do not
take `num_items_in_batch`, and the losses that keep their mean. Each case behaves as
token_loss.py documents; an error is one line.

The step cases run `train_step` on micro-batches chosen here (the Trainer's plan would shuffle
which rows share one) and compare it with the whole batch in one micro-batch."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gputrain import Trainer
from gputrain.errors import GputrainError
from gputrain.precision import Precision
from gputrain.train.guard import build_guard
from gputrain.train.step import StepParts, StepResult, train_step
from gputrain.train.token_loss import IGNORE_INDEX, LM_TOKEN_LOSS, TokenNorm, hf_token_loss
from tests.unit.train.test_token_loss import SPEC, T, V, config, tiny_gpt, uneven_data

CPU = torch.device("cpu")


def _step(
    micro_batches: list[Any], on_nonfinite: str = "stop", model: nn.Module | None = None, token_loss: Any = None
) -> tuple[StepResult, nn.Module, dict[str, Any]]:
    """One SGD step of the tiny GPT (or `model`, with its `token_loss`) over `micro_batches`;
    (result, model, the gradients it applied)."""
    model = model if model is not None else tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    precision = Precision("fp32", CPU)
    grads: dict[str, Any] = {}
    optimizer.register_step_pre_hook(
        lambda *_: grads.update({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    )
    parts = StepParts(
        model=model,
        optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        precision=precision,
        guard=build_guard(on_nonfinite, optimizer, precision, device=CPU, distributed=False),
        tokens=TokenNorm(token_loss or LM_TOKEN_LOSS),
    )
    result = train_step(parts, micro_batches, measure_grad_norm=True)
    return result, model, grads


def _rows(masked: list[int], n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """n rows; row i's first masked[i] labels are -100 (T: the whole row)."""
    inputs = uneven_data().tensors[0][:n].clone()
    targets = inputs.roll(-1, dims=1)
    for i, k in enumerate(masked):
        targets[i, :k] = IGNORE_INDEX
    return inputs, targets


def _split(batch: tuple[torch.Tensor, torch.Tensor], parts: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(zip(batch[0].chunk(parts), batch[1].chunk(parts), strict=True))


def _same_as_whole(masked: list[int], parts: int) -> None:
    whole = _rows(masked)
    one, _, one_grads = _step([whole])
    split, _, split_grads = _step(_split(whole, parts))
    assert torch.isfinite(split.loss) and split.verdict.kind == "apply"
    torch.testing.assert_close(split.loss, one.loss, rtol=1e-6, atol=1e-6)
    for name, grad in one_grads.items():
        torch.testing.assert_close(split_grads[name], grad, rtol=1e-6, atol=1e-6, msg=name)
    model = tiny_gpt()
    with torch.no_grad():
        logits = model(whole[0])
    expected = F.cross_entropy(logits.flatten(0, 1), whole[1].flatten(), ignore_index=IGNORE_INDEX)
    torch.testing.assert_close(one.loss, expected, rtol=1e-6, atol=1e-6)


def _no_valid_token(on_nonfinite: str, verdict: str) -> None:
    """A whole step of -100: its loss NaN (a mean over nothing), its gradients 0 (never NaN), and
    train.on_nonfinite decides: stop and skip do not apply it; off applies a zero gradient."""
    before = {k: v.clone() for k, v in tiny_gpt().state_dict().items()}
    result, model, grads = _step(_split(_rows([T] * 4), 2), on_nonfinite)
    assert torch.isnan(result.loss) and result.verdict.kind == verdict
    assert bool(grads) == (verdict == "apply")  # the optimizer stepped (and the gradients were read) or not
    assert all(torch.count_nonzero(g) == 0 for g in grads.values())
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0, msg=key)  # SGD: a zero gradient moves nothing


class _MaskedSumLM(nn.Module):
    """A dict-batch LM that declares num_items_in_batch and masks its token losses by multiplying:
    a scale of 1/0 = inf would reach its backward as inf × 0 = NaN."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(V, V)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, num_items_in_batch: Any = None) -> Any:
        logits = self.emb(input_ids).flatten(0, 1)
        per_token = F.cross_entropy(logits, labels.clamp(min=0).flatten(), reduction="none")
        loss = (per_token * (labels.flatten() != IGNORE_INDEX)).sum() / num_items_in_batch
        return type("Out", (), {"logits": logits, "loss": loss})()


def _no_valid_token_masked_by_multiplying() -> None:
    model = _MaskedSumLM()
    batches = [{"input_ids": torch.zeros(2, T, dtype=torch.long), "labels": torch.full((2, T), IGNORE_INDEX)}] * 2
    result, _, grads = _step(batches, "off", model, hf_token_loss(model))  # off: the gradients are applied
    assert torch.isnan(result.loss) and result.verdict.kind == "apply" and grads
    assert all(torch.count_nonzero(g) == 0 for g in grads.values()), grads  # zeros: no inf × 0 in the backward


def _one_token() -> None:
    inputs, targets = _rows([T, T, T, T - 1])
    result, _, _ = _step(_split((inputs, targets), 4))
    with torch.no_grad():
        logits = tiny_gpt()(inputs)
    torch.testing.assert_close(result.loss, F.cross_entropy(logits[3, -1:], targets[3, -1:]), rtol=1e-6, atol=1e-6)


def _trainer_error(targets: Callable[[torch.Tensor], torch.Tensor], words: str, tmp: Path) -> None:
    inputs, labels = uneven_data().tensors
    from gputrain.data.tensors import TensorData

    with pytest.raises(GputrainError) as caught:
        Trainer(tiny_gpt(), TensorData(inputs, targets(labels)), config=config(), run_dir=tmp / "r", spec=SPEC).fit()
    message = str(caught.value)
    assert words in message and "\n" not in message, message


def _with(labels: torch.Tensor, row: int, col: int, value: int) -> torch.Tensor:
    labels = labels.clone()
    labels[row, col] = value
    return labels


# --- dict batches (a Hugging Face model's): which models take num_items_in_batch, what is counted


def _gpt2(**changes: Any) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=16, vocab_size=V, n_positions=T, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(cfg)
    for name, value in changes.items():
        target = model.config if name == "is_encoder_decoder" else model
        setattr(target, name, value)
    return model


class _KwargsLM(nn.Module):
    """A user's dict-batch LM whose forward takes **kwargs and ignores them: not HF's contract."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(V, V)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, **kwargs: Any) -> Any:
        logits = self.emb(input_ids)
        return type("Out", (), {"logits": logits, "loss": F.cross_entropy(logits.flatten(0, 1), labels.flatten())})()


class _NamedLM(_KwargsLM):
    """A user's LM that declares num_items_in_batch: counted over its labels as they are."""

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, num_items_in_batch: Any = None
    ) -> Any:
        return super().forward(input_ids, labels)


_LABELS = torch.tensor([[IGNORE_INDEX, IGNORE_INDEX, 3, 4], [5, IGNORE_INDEX, 7, 8]])
_BATCH = {"input_ids": torch.zeros(2, 4, dtype=torch.long), "labels": _LABELS}


def _counts(model: Callable[[], nn.Module], where: str | None, count: int | None, batch: Any = None) -> None:
    token_loss = hf_token_loss(model())
    if where is None:
        assert token_loss is None
        return
    assert token_loss is not None and token_loss.where == where
    assert int(token_loss.count(batch if batch is not None else _BATCH)) == count


def _dict_without_labels(tmp: Path) -> None:
    class Rows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"input_ids": torch.arange(T) % V}

    with pytest.raises(GputrainError) as caught:
        Trainer(_gpt2(), Rows(), config=config(), run_dir=tmp / "r").fit()
    message = str(caught.value)
    assert "no .loss" in message and "no 'labels'" in message and "\n" not in message, message


def _later_batch_without_labels() -> None:
    token_loss = hf_token_loss(_gpt2())
    assert token_loss is not None
    from gputrain.errors import RunError

    with pytest.raises(RunError, match=r"^a batch has no 'labels' tensor \(input_ids\)") as caught:
        token_loss.count({"input_ids": _BATCH["input_ids"]})
    assert "\n" not in str(caught.value)


def _not_a_pair() -> None:
    """A batch of another structure reaching the task's token loss: one line, counted or summed."""
    from gputrain.errors import RunError

    for call in (lambda: LM_TOKEN_LOSS.count({"x": 1}), lambda: LM_TOKEN_LOSS.summed(tiny_gpt(), [torch.ones(1)])):
        with pytest.raises(RunError, match=r"^batches are not \(inputs, targets\): pass step_fn") as caught:
            call()
        assert "\n" not in str(caught.value)


def _keeps_the_mean(tmp: Path, **kwargs: Any) -> None:
    trainer = Trainer(
        tiny_gpt(), uneven_data(), config=config(**{"train.max_steps": 1}), run_dir=tmp / "r", spec=SPEC, **kwargs
    )
    trainer.fit()
    assert trainer.parts.step.tokens is None and trainer.parts.task.token_loss is None


def _classification_keeps_the_mean(tmp: Path) -> None:
    g = torch.Generator().manual_seed(0)
    from gputrain.data.tensors import TensorData

    data = TensorData(torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g))
    trainer = Trainer(nn.Linear(6, 3), data, config=config(**{"train.max_steps": 1}), run_dir=tmp / "r")
    trainer.fit()
    assert trainer.parts.task.kind == "classification" and trainer.parts.step.tokens is None


def _val_without_a_valid_token(tmp: Path) -> None:
    """A split whose labels are all -100 has no mean: its loss and perplexity are NaN, not 0."""
    inputs, labels = uneven_data(n=6, seed=3).tensors
    from gputrain.data.tensors import TensorData

    trainer = Trainer(tiny_gpt(), uneven_data(), config=config(**{"train.max_steps": 1}), run_dir=tmp / "r", spec=SPEC)
    trainer.fit()
    got = trainer.parts.evaluator.evaluate(TensorData(inputs, torch.full_like(labels, IGNORE_INDEX)), "val").metrics
    assert set(got) == {"loss", "perplexity"} and all(v != v for v in got.values()), got


CASES: list[tuple[str, Callable[[Path], None]]] = [
    ("one micro-batch all -100", lambda _: _same_as_whole([T, T, 0, 3], 2)),
    ("one micro-batch all -100 among four", lambda _: _same_as_whole([0, T, 5, 1], 4)),
    ("uneven -100s in every micro-batch", lambda _: _same_as_whole([1, 7, 0, 4], 4)),
    ("no -100 at all", lambda _: _same_as_whole([0, 0, 0, 0], 2)),
    ("one valid token in the whole step", lambda _: _one_token()),
    ("a whole step of -100, on_nonfinite=stop", lambda _: _no_valid_token("stop", "nonfinite")),
    ("a whole step of -100, on_nonfinite=skip", lambda _: _no_valid_token("skip", "nonfinite")),
    ("a whole step of -100, on_nonfinite=off", lambda _: _no_valid_token("off", "apply")),
    ("a whole step of -100, a loss masked by multiplying", lambda _: _no_valid_token_masked_by_multiplying()),
    ("labels int32", lambda tmp: _trainer_error(lambda y: y.int(), "expected target dtype to be Long", tmp)),
    ("labels float", lambda tmp: _trainer_error(lambda y: y.float(), "expected target dtype to be Long", tmp)),
    ("a label = vocab", lambda tmp: _trainer_error(lambda y: _with(y, 5, 7, V), f"Target {V} is out of bounds", tmp)),
    ("a label -1", lambda tmp: _trainer_error(lambda y: _with(y, 5, 7, -1), "Target -1 is out of bounds", tmp)),
    ("dict batches without labels", _dict_without_labels),
    ("a later dict batch without labels", lambda _: _later_batch_without_labels()),
    ("a batch that is no (inputs, targets) pair", lambda _: _not_a_pair()),
    ("HF causal LM: counts labels[..., 1:]", lambda _: _counts(_gpt2, "labels[..., 1:]", 4)),
    (
        "HF causal LM with shift_labels in the batch",
        lambda _: _counts(
            _gpt2,
            "labels[..., 1:]",
            2,
            {**_BATCH, "shift_labels": torch.tensor([[1, IGNORE_INDEX], [IGNORE_INDEX, 2]])},
        ),
    ),
    ("HF masked-LM loss: counts all labels", lambda _: _counts(lambda: _gpt2(loss_type="ForMaskedLM"), "labels", 5)),
    ("HF encoder-decoder: counts all labels", lambda _: _counts(lambda: _gpt2(is_encoder_decoder=True), "labels", 5)),
    (
        "HF model with accepts_loss_kwargs=False",
        lambda _: _counts(lambda: _gpt2(accepts_loss_kwargs=False), None, None),
    ),
    ("a user's model with a bare **kwargs", lambda _: _counts(_KwargsLM, None, None)),
    ("a user's model naming num_items_in_batch", lambda _: _counts(_NamedLM, "labels", 5)),
    (
        "a user's loss_fn",
        lambda tmp: _keeps_the_mean(tmp, loss_fn=lambda o, t: F.cross_entropy(o.flatten(0, 1), t.flatten())),
    ),
    (
        "a user's step_fn",
        lambda tmp: _keeps_the_mean(tmp, step_fn=lambda m, b: F.cross_entropy(m(b[0]).flatten(0, 1), b[1].flatten())),
    ),
    ("a classification task", _classification_keeps_the_mean),
    ("a validation split of only -100", _val_without_a_valid_token),
]


@pytest.mark.parametrize(("name", "case"), CASES, ids=[name for name, _ in CASES])
def test_token_loss(name: str, case: Callable[[Path], None], tmp_path: Path) -> None:
    case(tmp_path)
