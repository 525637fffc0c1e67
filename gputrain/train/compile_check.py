"""A compiled model's first step checked against eager, before its update.

torch.compile can give wrong gradients without an error: torch 2.13's CPU inductor gives the
convolutions of gputrain's default cnn zero gradients (conv → ReLU → max-pool → hidden linear), and
pytorch/pytorch has more such reports for pooling backwards. A run on wrong gradients ends with a worse
model and nothing that says why, so the first micro-batch a process trains is run twice more: through
the compiled model and through the same model eagerly (`set_stance("force_eager")`). Each parameter's
gradient is compared by two numbers, its norm and its projection on the parameter, so the check never
holds a second copy of the gradients (at most one set, as the step itself).

Training mode first: that is the graph training compiles anyway, so a model without randomness costs
no extra compile. Random ops (dropout) draw different numbers compiled and eager, so a difference there
is decided in eval mode (one more graph compiled, on that path only). Buffers (BatchNorm statistics)
and every random generator are put back: the run goes on as if the check had not run. Where the
gradients differ, compile is turned off for the run, with a warning that names the parameter.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from gputrain.distributed.compiling import remove_compile
from gputrain.distributed.context import DistContext

log = logging.getLogger("gputrain")

NORM_TOLERANCE = 0.1
"""Relative difference of a gradient's norm, compiled against eager, that counts as different: bf16
autocast and inductor's fused reductions move it by well under 1%; a wrong gradient by far more."""
PROJECTION_TOLERANCE = 0.1
"""Difference of the cosine between gradient and parameter, compiled against eager."""
NEGLIGIBLE = 1e-3
"""Gradients below this share of the largest gradient's norm are rounding noise: not compared."""

Autocast = Callable[[], contextlib.AbstractContextManager[Any]]
ComputeLoss = Callable[[nn.Module, Any], torch.Tensor]


def unchecked(why: str) -> str:
    """summary.json's `train.compile` for a compiled model whose first step was not checked."""
    return f"compiled (not checked: {why})"


class CompileCheck:
    """Runs once, on the first micro-batch: `status` then says what it found (summary.json's
    `train.compile`).

    Args:
        model: the compiled module, unwrapped: under DDP the module inside it, so that neither pass
            runs the gradient all-reduce (autograd.grad accumulates into no `.grad`, which DDP's
            hooks wait for).
        compute_loss: the step's loss of a batch.
        autocast: the run's precision context.
        device: where the model is (its random generator is put back too).
        dist: the job, where it has several ranks: they agree on the verdict (one all-gather, once).
    """

    def __init__(
        self,
        model: nn.Module,
        compute_loss: ComputeLoss,
        autocast: Autocast,
        device: torch.device,
        dist: DistContext | None = None,
    ) -> None:
        self.model, self.compute_loss, self.autocast, self.device = model, compute_loss, autocast, device
        self.dist = dist
        self.status = "compiled (its first step not checked yet)"
        self.done = False

    def skip(self, why: str) -> None:
        """The check cannot run in this run's layout: the model stays compiled, unchecked."""
        self.done = True
        self.status = unchecked(why)

    def run(self, batch: Any) -> None:
        """Compare compiled and eager gradients on `batch` (this rank's); where they differ on any
        rank, turn compile off on every rank."""
        self.done = True
        difference, unchecked = None, None
        try:
            with self._leaving_no_trace():
                difference = self._difference(batch, training=True)
                if difference is not None:  # random ops differ compiled and eager: eval mode decides
                    difference = self._difference(batch, training=False)
                if difference is not None and self._random_in_eval(batch):
                    difference, unchecked = None, "its gradients are random even in eval mode"
        except _Inconclusive as why:
            unchecked = str(why)
        except torch.OutOfMemoryError:  # the eager pass may keep more activations than the compiled step
            unchecked = "no memory for an eager pass beside it"
        difference = self._agreed(difference)
        if difference is None:
            self.status = "compiled (first step's gradients equal eager's)"
            if unchecked is not None:
                self.skip(unchecked)
            return
        remove_compile(self.model)
        self.status = f"off: {difference}"
        log.warning(
            "train.compile: turned off for this run: torch.compile's gradients differ from eager's on the first "
            "batch (%s; torch %s). Training goes on eagerly, with the right gradients",
            difference,
            torch.__version__,
        )

    def _agreed(self, difference: str | None) -> str | None:
        """The job's verdict: the first rank's difference, or None where no rank found one (every rank
        then goes on compiled or eager alike, and the summary says what rank 0 did)."""
        if self.dist is None or not self.dist.enabled:
            return difference
        found: list[str | None] = [None] * self.dist.world_size
        torch.distributed.all_gather_object(found, difference)
        return next((f"rank {rank}: {text}" for rank, text in enumerate(found) if text is not None), None)

    @contextlib.contextmanager
    def _leaving_no_trace(self) -> Iterator[None]:
        """Random generators, buffers and the training flag as they were before."""
        model = self.model
        buffers = [(b, b.detach().clone()) for b in model.buffers()]
        was_training = model.training
        devices = [self.device] if self.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                yield
        finally:
            model.train(was_training)
            with torch.no_grad():
                for buffer, saved in buffers:
                    buffer.copy_(saved)

    def _difference(self, batch: Any, training: bool) -> str | None:
        """What differs between compiled and eager on `batch`, or None. Both passes start from the
        same random state.

        Raises:
            _Inconclusive: the eager loss or gradients are not finite: nothing to compare against.
        """
        self.model.train(training)
        named = self._trained_parameters()
        rng = torch.random.get_rng_state()
        device_rng = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        with torch.compiler.set_stance("force_eager"):
            eager = self._fingerprint(batch, named)
        if not all(math.isfinite(v) for v in eager):
            raise _Inconclusive("the first batch's loss or gradients are not finite")
        torch.random.set_rng_state(rng)
        if device_rng is not None:
            torch.cuda.set_rng_state(device_rng, self.device)
        return _compare(eager, self._fingerprint(batch, named), list(named))

    def _random_in_eval(self, batch: Any) -> bool:
        """Whether two eager passes in eval mode differ: the model samples (a VAE's noise), and
        no comparison with compiled code can tell a wrong gradient from another draw."""
        named = self._trained_parameters()
        with torch.compiler.set_stance("force_eager"):
            return _compare(self._fingerprint(batch, named), self._fingerprint(batch, named), list(named)) is not None

    def _trained_parameters(self) -> dict[str, nn.Parameter]:
        return {name: p for name, p in self.model.named_parameters() if p.requires_grad}

    def _fingerprint(self, batch: Any, named: dict[str, nn.Parameter]) -> list[float]:
        """[loss, then per parameter: gradient norm, gradient · parameter, parameter norm] (fp32
        sums: no copy of a parameter beyond its gradient)."""
        params = list(named.values())
        with self.autocast():
            loss = self.compute_loss(self.model, batch)
        grads = torch.autograd.grad(loss.float(), params, allow_unused=True)
        figures = [loss.detach().float().reshape(())]
        for param, grad in zip(params, grads, strict=True):
            weights = param.detach().flatten().float()
            g = torch.zeros_like(weights) if grad is None else grad.flatten().float()
            figures += [torch.linalg.vector_norm(g), torch.dot(g, weights), torch.linalg.vector_norm(weights)]
        return torch.stack(figures).double().tolist()  # the one read: every figure at once


class _Inconclusive(Exception):
    """The first batch cannot show whether compiled gradients are right (the run stays compiled)."""


def _compare(eager: list[float], compiled: list[float], names: list[str]) -> str | None:
    loss_e, loss_c = eager[0], compiled[0]
    if not abs(loss_c - loss_e) <= NORM_TOLERANCE * max(abs(loss_e), 1e-6):  # also a NaN loss
        return f"the loss is {loss_c:.4g} compiled, {loss_e:.4g} eager"
    rows = [(eager[i : i + 3], compiled[i : i + 3]) for i in range(1, len(eager), 3)]
    largest = max((e[0] for e, _ in rows), default=0.0)
    for name, (e, c) in zip(names, rows, strict=True):
        if e[0] <= NEGLIGIBLE * largest:
            continue
        if not abs(c[0] - e[0]) <= NORM_TOLERANCE * e[0]:
            return f"{name}: gradient norm {c[0]:.3g} compiled, {e[0]:.3g} eager"
        scale = e[0] * e[2]
        if scale > 0 and not abs(c[1] - e[1]) <= PROJECTION_TOLERANCE * scale:
            return f"{name}: the gradient points elsewhere compiled than eager"
    return None
