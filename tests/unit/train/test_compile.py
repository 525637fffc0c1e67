"""train.compile: it compiles the models people have (torch's own module classes included), and a
compiled model whose gradients differ from eager's is caught on its first step, the run going on
eagerly with the right ones."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from gputrain import Trainer
from gputrain.distributed.compiling import compile_in_place, remove_compile
from gputrain.train.compile_check import CompileCheck

QUIET = {"train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "train.batch_size": 16,
         "checkpoint.enabled": False, "train.max_steps": 4}


def _data(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (n,), generator=g)
    return TensorDataset(torch.randn(n, 6, generator=g) + 3 * F.one_hot(y, 6).float(), y)


def _frames_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["frames"]["ok"]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_sequential_model_is_really_compiled_and_keeps_its_names(tmp_path) -> None:
    """nn.Module.compile() makes no graph for torch's own classes (nn.Sequential): train.compile
    silently trained eagerly."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    names = list(model.state_dict())
    before = _frames_compiled()
    summary = Trainer(model, _data(), config={**QUIET, "train.compile": True}, run_dir=tmp_path / "run").fit()
    assert _frames_compiled() > before
    assert type(model(torch.randn(2, 6)).grad_fn).__name__ == "CompiledFunctionBackward"
    assert list(model.state_dict()) == names  # no `_orig_mod.` in the saved weights' names
    assert summary["train"]["compile"] == "compiled (first step's gradients equal eager's)"


def test_a_deep_copy_of_a_compiled_module_runs_its_own_weights() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    compile_in_place(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin[0].weight.mul_(2)
    x = torch.randn(3, 4)
    assert not torch.equal(model(x), twin(x))
    assert torch.equal(twin(x), torch.relu(x @ twin[0].weight.T + twin[0].bias))
    remove_compile(model)
    assert type(model(x).grad_fn).__name__ == "ReluBackward0"  # eager again


class _WrongWhenCompiled(nn.Module):
    """A model whose compiled gradients are wrong, as an inductor bug makes them (torch 2.13's CPU
    inductor gives the default cnn's convolutions zero gradients): compiled, the first layer learns
    nothing."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(6, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = torch.relu(self.first(x))
        if torch.compiler.is_compiling():
            hidden = hidden.detach()
        return self.second(hidden)


def _trained(compile_: bool, tmp_path, name: str) -> tuple[dict, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = _WrongWhenCompiled()
    summary = Trainer(model, _data(), config={**QUIET, "train.compile": compile_}, run_dir=tmp_path / name).fit()
    return summary, model.state_dict()


def test_wrong_compiled_gradients_turn_compile_off_and_the_run_equals_an_eager_one(tmp_path, gputrain_warnings) -> None:
    summary, weights = _trained(True, tmp_path, "compiled")
    reason = "first.weight: gradient norm 0 compiled"
    assert summary["train"]["compile"].startswith(f"off: {reason}")
    assert len(gputrain_warnings) == 1
    assert gputrain_warnings[0].startswith(f"train.compile: turned off for this run: torch.compile's gradients "
                                           f"differ from eager's on the first batch ({reason}")
    eager_summary, eager_weights = _trained(False, tmp_path, "eager")
    assert eager_summary["train"]["compile"] is None
    # the check left no trace (random state, buffers) and the rest ran eagerly: the same weights, bit for bit
    assert all(torch.equal(weights[k], eager_weights[k]) for k in eager_weights)
    assert summary["train"]["loss"] == eager_summary["train"]["loss"]


def test_dropout_and_batchnorm_pass_the_check_and_it_leaves_no_trace() -> None:
    """Dropout draws other numbers compiled than eager (the training-mode comparison differs; eval
    mode decides); BatchNorm's statistics and every generator are as they were before."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.5), nn.Linear(32, 3))
    compile_in_place(model)
    x, y = _data(32).tensors
    check = CompileCheck(
        model, lambda m, batch: F.cross_entropy(m(batch[0]), batch[1]), contextlib.nullcontext, torch.device("cpu")
    )
    buffers = {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}
    rng = torch.get_rng_state()
    check.run((x, y))
    assert check.status == "compiled (first step's gradients equal eager's)"
    assert all(torch.equal(model.state_dict()[k], v) for k, v in buffers.items())
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.training
    assert all(p.grad is None for p in model.parameters())  # the step's own gradients are untouched


class _Sampling(nn.Module):
    """Draws noise in every mode (a VAE's reparameterisation): no draw compiled equals eager's."""

    def __init__(self) -> None:
        super().__init__()
        self.encode, self.decode = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.encode(x)
        return self.decode(z + torch.randn_like(z))


def test_a_model_that_samples_in_eval_mode_stays_compiled_unchecked() -> None:
    torch.manual_seed(0)
    model = _Sampling()
    compile_in_place(model)
    x, y = _data(32).tensors
    check = CompileCheck(
        model, lambda m, batch: F.cross_entropy(m(batch[0]), batch[1]), contextlib.nullcontext, torch.device("cpu")
    )
    check.run((x, y))
    assert check.status == "compiled (not checked: its gradients are random even in eval mode)"
    assert type(model(x).grad_fn).__name__ == "CompiledFunctionBackward"


def test_no_memory_for_the_eager_pass_leaves_the_model_compiled_unchecked() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    compile_in_place(model)
    x, y = _data(16).tensors

    def loss_that_runs_out(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    check = CompileCheck(model, loss_that_runs_out, contextlib.nullcontext, torch.device("cpu"))
    check.run((x, y))
    assert check.status == "compiled (not checked: no memory for an eager pass beside it)"
    assert type(model(x).grad_fn).__name__ == "CompiledFunctionBackward"
