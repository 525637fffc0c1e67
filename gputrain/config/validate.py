"""Checks that involve more than one field or a registry's names; run once the sections are built."""

from __future__ import annotations

import difflib
import re

from gputrain.config.names import MODEL_LIBRARIES, choices
from gputrain.config.schema import Config, ModelConfig
from gputrain.config.sizes import check_fits_in_memory
from gputrain.errors import ConfigError


def _check_choice(field: str, value: str, choices: list[str], also: str = "") -> None:
    """`also`: the other forms the field takes, named in the message whether or not a close
    choice is suggested (`model.name`'s `timm:<name>`, `torchvision:<name>`)."""
    if value not in choices:
        close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
        raise ConfigError(
            field,
            "unknown choice; choose from " + ", ".join(choices) + (f", {also}" if also else ""),
            value,
            hint=f"did you mean {close[0]!r}?" if close else None,
        )


# A library's model name as `model.name=<library>:<name>` takes it: letters, digits, `_`, `-`, `.` (timm's
# `resnet18.a1_in1k` names a pretrained tag). No `/` or `:`, which would name a hub repository.
_LIBRARY_MODEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_LIBRARY_FORMS = ", ".join(f"{library}:<name>" for library in MODEL_LIBRARIES)


def check_model_name(model: ModelConfig) -> None:
    """`model.name` is a registered family, or `<library>:<name>` for a library gputrain builds models
    from; `hf` comes with `model.hf_config`. Whether the library has that name is checked when the
    model is built (it needs the library imported).

    Raises:
        ConfigError: naming model.name (or model.hf_config), with the choices or the form to use.
    """
    name = model.name
    library, colon, model_name = name.partition(":")
    if not colon:
        _check_choice(
            "model.name",
            name,
            choices("model.name"),
            also=f"or a library's model: {_LIBRARY_FORMS}, or hf with model.hf_config",
        )
        if name == "hf" and not model.hf_config:
            raise ConfigError(
                "model.hf_config",
                "model.name=hf needs a Hugging Face model config: a local config.json or a model directory",
                None,
                hint="e.g. model.hf_config=path/to/config.json (nothing is downloaded)",
            )
        return
    if library not in MODEL_LIBRARIES:
        close = difflib.get_close_matches(library, MODEL_LIBRARIES, n=1, cutoff=0.6)
        raise ConfigError(
            "model.name",
            f"unknown library {library!r}; models from a library are named {_LIBRARY_FORMS}",
            name,
            hint=f"did you mean '{close[0]}:{model_name}'?" if close else None,
        )
    if not _LIBRARY_MODEL.fullmatch(model_name):
        downloads = "/" in model_name or ":" in model_name
        raise ConfigError(
            "model.name",
            f"{library}:<name> takes a model name of letters, digits, '_', '-' and '.'"
            + ("; hub repositories are not downloaded" if downloads else ""),
            name,
            hint=f"e.g. {library}:resnet18" + ("; pretrained weights: model.weights=<local file>" if downloads else ""),
        )


def resolve_grad_accum(config: Config, dp_degree: int = 1) -> int:
    """The number of micro-batches per optimizer step, checking that the global batch divides.

    Raises:
        ConfigError: naming train.batch_size and the field it does not divide by.
    """
    train = config.train
    if train.batch_size == "auto" or train.micro_batch_size == "auto":
        return 1  # decided when the run starts (gputrain.plan.batch.resolve_auto_batch)
    per_rank, rem = divmod(train.batch_size, dp_degree)
    if rem:
        raise ConfigError(
            "train.batch_size",
            f"must divide evenly over the {dp_degree} data-parallel ranks",
            train.batch_size,
            hint=f"use a multiple of {dp_degree}",
        )
    if train.grad_accum == "auto":
        micro = train.micro_batch_size
        if micro is None or micro >= per_rank:
            return 1
        accum, rem = divmod(per_rank, micro)
        if rem:
            raise ConfigError(
                "train.batch_size",
                f"with grad_accum=auto must be a multiple of "
                f"train.micro_batch_size ({micro}) × data-parallel ranks ({dp_degree})",
                train.batch_size,
            )
        return accum
    if per_rank % train.grad_accum:
        raise ConfigError(
            "train.batch_size",
            f"is not divisible by train.grad_accum={train.grad_accum}"
            + (f" × {dp_degree} ranks" if dp_degree > 1 else ""),
            train.batch_size,
            hint="the micro-batch is batch_size / (ranks × grad_accum): make it a whole number",
        )
    if train.micro_batch_size is not None and train.micro_batch_size != per_rank // train.grad_accum:
        raise ConfigError(
            "train.micro_batch_size",
            f"disagrees with train.batch_size={train.batch_size} / "
            f"(ranks {dp_degree} × train.grad_accum {train.grad_accum}); set grad_accum=auto",
            train.micro_batch_size,
        )
    return train.grad_accum


# Strategies whose step CUDA graph trees (train.cuda_graphs) cannot replay, and why.
_NO_CUDA_GRAPHS = {
    "fsdp": "CUDA graph trees do not support FSDP2, whose gathered parameters are new tensors every step",
    "hybrid": "CUDA graph trees do not support FSDP2, whose gathered parameters are new tensors every step",
    "pp": "pipeline schedules run several micro-batches forward before their backward passes, and each "
    "replay overwrites the graph outputs the earlier ones still need",
    "tp": "the tensor-parallel collectives inside the compiled blocks are not captured into CUDA graphs",
}


def check_cuda_graphs(cuda_graphs: bool, strategy: str, chosen_by_auto: bool = False) -> None:
    """train.cuda_graphs works with one device or DDP only; refuse the rest before anything runs."""
    if cuda_graphs and strategy in _NO_CUDA_GRAPHS:
        picked = f"parallel.strategy=auto chose {strategy}" if chosen_by_auto else f"parallel.strategy={strategy}"
        raise ConfigError(
            "train.cuda_graphs",
            f"cannot be used with {picked}: {_NO_CUDA_GRAPHS[strategy]}",
            True,
            hint="use parallel.strategy=none or ddp, or set train.cuda_graphs=false",
        )


EAGER_FP8_SPEED = 0.45
"""fp8 without compile against bf16's tokens/s, measured (H200, GPT-2 124M; benchmarks/RESULTS.md)."""


def check_fp8_compile(precision: str, compile: bool) -> None:
    """train.precision=fp8 needs train.compile: torchao's float8 casts and amax reductions are separate
    kernels in eager mode, fused only by torch.compile (torchtitan runs its float8 recipes compiled).
    Refused rather than turned on: compiling changes the run's start-up and memory, the user decides."""
    if precision == "fp8" and not compile:
        raise ConfigError(
            "train.compile",
            "train.precision=fp8 needs train.compile=true: torchao's float8 casts and scales are fused only "
            f"by torch.compile (eager fp8 ran at {EAGER_FP8_SPEED}× bf16's tokens/s); set train.compile=true",
            compile,
        )


def check_pipeline_precision(precision: str, pipelined: bool) -> None:
    """fp16 needs a GradScaler to scale the loss before backward; a pipeline schedule runs the
    backward passes itself, so there is no loss to scale."""
    if pipelined and precision == "fp16":
        raise ConfigError(
            "train.precision",
            "fp16 cannot be used with pipeline parallelism: the schedule runs "
            "the backward passes itself, so the loss cannot be scaled",
            precision,
            hint="use train.precision=bf16 (no loss scaling needed) or fp32",
        )


PIPELINE_MODELS = ("mlp", "gpt")
"""Registry models pipeline parallelism can cut: the mlp (an nn.Sequential) between layers, the gpt between blocks."""
TP_MODELS = ("mlp", "gpt")
"""Registry models with a tensor-parallel plan of their own (models/plans.py)."""


def check_registry_layout(config: Config) -> None:
    """The model the registry builds for `config` supports the tensor or pipeline parallelism the
    config asks for. Checked from the config alone where a command builds the model by name (the
    launcher, before torchrun starts, and each rank before torch loads); a model given in Python may
    bring its own plan (`tp_plan=`) or be an nn.Sequential, so the Trainer checks the module itself.

    Raises:
        ConfigError: naming the parallel field, the model and what to use instead.
    """
    par, name = config.parallel, config.model.name
    hybrid = par.strategy == "hybrid"
    if (par.strategy == "pp" or (hybrid and par.pp > 1)) and name not in PIPELINE_MODELS:
        raise ConfigError(
            "parallel.pp" if hybrid else "parallel.strategy",
            f"pipeline parallelism cuts the mlp between layers and the gpt between blocks (in Python, any "
            f"nn.Sequential); model.name={name} is neither",
            par.pp if hybrid else par.strategy,
            hint="use parallel.strategy=fsdp or ddp for this model",
        )
    if (par.strategy == "tp" or (hybrid and par.tp > 1)) and name not in TP_MODELS:
        raise ConfigError(
            "parallel.tp" if hybrid else "parallel.strategy",
            f"tensor parallelism needs a plan for the model: the mlp and the gpt have theirs, model.name={name} "
            "has none (in Python, pass tp_plan= to the Trainer)",
            par.tp if hybrid else par.strategy,
            hint="use parallel.strategy=fsdp or ddp for this model",
        )


_DEVICE = re.compile(r"auto|cpu|mps|cuda(:[0-9]{1,4})?")


def check_device_name(device: str) -> None:
    """`train.device` is spelled as one of the devices gputrain knows; whether this machine has it
    is decided when the run starts (`gputrain.env.device.resolve_device`, which needs torch)."""
    if not _DEVICE.fullmatch(device):
        raise ConfigError("train.device", "unknown device", device, hint="choose from auto, cpu, cuda, cuda:N, mps")


def validate_config(config: Config) -> None:
    """Registry choices, cross-field rules, and sizes against this machine's memory.

    Raises:
        ConfigError: naming the field.
    """
    check_model_name(config.model)
    _check_choice("data.name", config.data.name, choices("data.name"))
    check_device_name(config.train.device)
    resolve_grad_accum(config)
    if config.model.name == "gpt":
        from gputrain.config.presets import check_gpt_context

        check_gpt_context(config.model, config.data.seq_len)
    if config.train.clip_grad_norm is not None and config.train.clip_grad_value is not None:
        raise ConfigError(
            "train.clip_grad_value",
            "set either train.clip_grad_norm or train.clip_grad_value, not both",
            config.train.clip_grad_value,
        )
    check_cuda_graphs(config.train.cuda_graphs, config.parallel.strategy)
    check_fp8_compile(config.train.precision, config.train.compile)
    check_pipeline_precision(
        config.train.precision,
        config.parallel.strategy == "pp" or (config.parallel.strategy == "hybrid" and config.parallel.pp > 1),
    )
    if config.eval.early_stop_metric is not None and config.eval.every_epochs == 0 and not config.eval.every_steps:
        raise ConfigError(
            "eval.early_stop_metric",
            "needs validation during training: set eval.every_epochs >= 1 or eval.every_steps >= 1",
            config.eval.early_stop_metric,
        )
    check_smoke(config)
    check_fits_in_memory(config)


def check_smoke(config: Config) -> None:
    """train.smoke_steps starts from nothing in a directory of its own and keeps nothing: a
    checkpoint to resume from (checkpoint.resume=PATH) contradicts it.

    Raises:
        ConfigError: naming checkpoint.resume.
    """
    resume = config.checkpoint.resume
    if config.train.smoke_steps is not None and resume not in ("auto", "never"):
        raise ConfigError(
            "checkpoint.resume",
            "a smoke run (train.smoke_steps) starts from nothing and keeps nothing: it resumes no checkpoint",
            resume,
            hint="leave checkpoint.resume=auto, or unset train.smoke_steps to continue that checkpoint",
        )
