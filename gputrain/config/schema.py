"""The config: one dataclass per section, a docstring under every field.

Types are checked when a config is loaded (see `load.py`). Values are checked by one mechanism,
`check_values` (limits.py), which every section's `__post_init__` runs first. Rules that involve
more than one value follow in each `__post_init__`, and across sections in `validate.py`. All name
the field.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any, Literal

from gputrain.config.durations import duration_seconds
from gputrain.config.limits import RANK_DEGREE, check_values
from gputrain.config.names import ENV_ACTIONS
from gputrain.config.presets import GPTPreset, gpt_size
from gputrain.config.tracking import tracking_uri_problem
from gputrain.errors import ConfigError

Activation = Literal["auto", "relu", "leaky_relu", "gelu", "silu", "tanh", "sigmoid"]
InitScheme = Literal[
    "default",
    "constant",
    "normal",
    "trunc_normal",
    "xavier_uniform",
    "xavier_normal",
    "kaiming_uniform",
    "kaiming_normal",
    "orthogonal",
]
Precision = Literal["auto", "fp32", "tf32", "bf16", "fp16", "fp8"]
OptimizerName = Literal["sgd", "adam", "adamw", "rmsprop", "adagrad", "adadelta", "adamax", "nadam"]
ScheduleName = Literal["constant", "step", "multistep", "exponential", "cosine", "warmup_cosine", "linear", "onecycle"]
Task = Literal["auto", "classification", "regression", "lm"]


@dataclass(kw_only=True, slots=True)
class ModelConfig:
    name: str = "cnn"
    """Model family from the registry (`gputrain config show` lists them): mlp, cnn, ...; or an outside library's model: timm:<name>, torchvision:<name>, or hf (with model.hf_config)."""
    activation: Activation = "auto"
    """Hidden-layer activation: auto (gelu for gpt, relu for the others), relu, leaky_relu, gelu, silu, tanh or sigmoid."""
    init: InitScheme = "default"
    """Weight init: default (torch's), constant, normal, trunc_normal, xavier_*, kaiming_*, orthogonal."""
    dropout: float | None = None
    """Dropout probability; unset keeps the model's own default (cnn: 0.25 after the convolutions, 0.5 before the head; mlp, resnet, gpt: 0)."""
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 128])
    """mlp: widths of the hidden layers."""
    channels: list[int] = field(default_factory=lambda: [32, 64])
    """cnn: output channels of the convolutions (3x3, padding 1; max-pool after the last)."""
    hidden: int = 128
    """cnn: width of the hidden linear layer."""
    base_width: int = 64
    """resnet*: channels of the stem and first stage, doubling per stage (64 in the published models)."""
    preset: GPTPreset | None = None
    """gpt: size preset: tiny, gpt2-124m, gpt2-350m, gpt2-774m or gpt2-1.5b; unset: 6 layers, 6 heads, d_model 384."""
    n_layer: int | None = None
    """gpt: transformer blocks (overrides the preset's)."""
    n_head: int | None = None
    """gpt: attention heads; must divide d_model (overrides the preset's)."""
    d_model: int | None = None
    """gpt: embedding width (overrides the preset's)."""
    seq_len: int | None = None
    """gpt: context length, the number of learned positions; unset: the preset's (1024 for gpt2-*), else data.seq_len."""
    vocab_size: int | None = None
    """gpt: vocabulary size; unset: the data's. Larger is allowed (e.g. 50304 pads GPT-2's 50257 for speed)."""
    bias: bool = True
    """gpt: biases in the linear layers and layer norms (GPT-2 has them)."""
    weights: str | None = None
    """Local weights loaded once the model is built: a .safetensors file or a torch state dict (.pt/.pth, read with weights_only=True, so it cannot run code); an output layer sized for other classes stays new. Unset: the model's own init. Nothing is ever downloaded."""
    hf_config: str | None = None
    """hf: a local config.json, or a model directory holding one (its weights, if there, are loaded; nothing is downloaded). The data decides the head: a causal LM for data.task=lm, else a sequence classifier."""

    def __post_init__(self) -> None:
        check_values("model", self)
        if not self.channels:
            raise ConfigError("model.channels", "needs at least one convolution", self.channels)
        d_model, n_head = gpt_size(self, "d_model"), gpt_size(self, "n_head")
        if d_model is not None and n_head is not None and d_model % n_head:
            raise ConfigError(
                "model.n_head" if self.n_head is not None else "model.d_model",
                f"d_model ({d_model}) must be a multiple of n_head ({n_head})",
                self.n_head if self.n_head is not None else self.d_model,
            )


@dataclass(kw_only=True, slots=True)
class DataConfig:
    name: str = "digits"
    """Data source from the registry: digits (bundled), mnist, image_folder, csv, text, tokens, synthetic, instructions (prompt/response JSONL for fine-tuning a language model), text_classes (a text column and a label column, CSV or JSONL)."""
    path: str | None = None
    """File or folder to read: csv/text: the file; instructions: a JSONL file; text_classes: a CSV or JSONL file; mnist: the folder of IDX files; image_folder: the folder of class folders; tokens: a folder made by `gputrain prepare` (manifest.json and its train/val shards, streamed), or a nanoGPT train .bin file (or a folder with train.bin and val.bin)."""
    val_path: str | None = None
    """tokens: a separate validation .bin file (unset: val.bin beside the train file, else a val_fraction split); instructions, text_classes: a separate validation file of the same format (unset: a val_fraction split)."""
    task: Task = "auto"
    """What to learn: auto (from the data), classification, regression or lm (language modelling)."""
    val_fraction: float = 0.1
    """Share of the samples held out for validation (seeded split)."""
    test_fraction: float = 0.2
    """Share of the samples held out for the final test (seeded split)."""
    num_workers: int | Literal["auto"] = "auto"
    """DataLoader worker processes; auto: none for in-memory data or samples that read in a few us (timed at start), else from the CPU count."""
    normalize: bool = True
    """Standardise features/pixels with statistics from the training split only."""
    label_column: str | None = None
    """csv: name of the label column (default: the last column)."""
    seq_len: int = 128
    """Tokens per sample for language-modelling data (text, tokens, synthetic with task=lm); at most the model's context."""
    image_size: int | list[int] = 224
    """image_folder: size every image is resized (shorter side) and centre-cropped to: an int for square, or [H, W]."""
    max_eval_samples: int | None = None
    """tokens, image_folder: use at most this many samples of the val and test splits (evenly spaced, fixed), so evaluation stays quick on large data."""
    shape: list[int] = field(default_factory=lambda: [1, 28, 28])
    """synthetic: shape of one sample, e.g. [3, 224, 224] for images or [32] for a table."""
    num_samples: int = 2048
    """synthetic: number of samples generated (seeded)."""
    num_classes: int = 10
    """synthetic: number of classes for classification."""
    vocab_size: int | None = None
    """Vocabulary size of token data: synthetic (unset: 256); tokens (unset: largest id in the file + 1; the files are read once at load either way, and an id beyond it is an error); text (unset: the distinct characters)."""
    tokenizer: str | None = None
    """The tokenizer the token ids mean: a tokenizer.json, a model directory holding one, a .tiktoken file (gpt2, r50k_base, p50k_base, cl100k_base, o200k_base by name, else with a sibling NAME.json giving its pattern and special tokens) or a saved tokenizer folder; never downloaded. The run keeps a copy (RUN/tokenizer/, its hash in env.json), so generate, evaluate and export speak text; it also sets data.vocab_size where that is unset. Unset: model.name=hf uses its model directory's tokenizer.json where there is one; a prepared folder, its own. instructions and text_classes read their text through it (a tokenizer_config.json or chat_template.jinja beside a tokenizer.json may add a chat template)."""
    augment: list[str] = field(default_factory=list)
    """On-device augmentation of training image batches: any of "crop" (random crop, zero padding H/8) and "flip" (horizontal)."""
    prompt_field: str = "prompt"
    """instructions: the JSONL field holding each example's prompt (no loss on its tokens)."""
    response_field: str = "response"
    """instructions: the JSONL field holding each example's response (the loss is on its tokens and the EOS after it). A record with a `messages` list (role/content) instead is rendered with the tokenizer's chat template, the assistant turns being the response."""
    pack: bool = True
    """instructions: pack several examples into each data.seq_len sequence (greedy, in file order); the built-in gpt keeps attention and positions within each example. false: one example per sequence, padded (needed by model.name=hf, whose attention would cross packed examples)."""
    text_field: str = "text"
    """text_classes: the CSV column or JSONL field holding the text."""
    label_field: str = "label"
    """text_classes: the CSV column or JSONL field holding the label (class names or whole numbers: classes sorted, their names kept in the run)."""
    on_error: Literal["fail", "skip"] = "fail"
    """A sample that cannot be read (corrupt image, bad row) in any split or pass: fail naming the file, split and step, or skip it (counted in summary.json data.skipped_samples, and eval_skipped_samples per split; a training step none of whose samples can be read is left out, with no update, in one process; a split none of whose samples can be read fails)."""

    def __post_init__(self) -> None:
        check_values("data", self)
        bad = [a for a in self.augment if a not in ("crop", "flip")]
        if bad:
            raise ConfigError("data.augment", f"unknown augmentation {bad[0]!r}; choose from crop, flip", self.augment)
        if self.val_fraction + self.test_fraction >= 0.9:
            raise ConfigError(
                "data.val_fraction",
                "val_fraction + test_fraction must leave at least 10% for training",
                self.val_fraction + self.test_fraction,
            )
        size = [self.image_size] if isinstance(self.image_size, int) else self.image_size
        if len(size) not in (1, 2):
            raise ConfigError("data.image_size", "must be a size > 0 or [height, width]", self.image_size)
        if not self.shape:
            raise ConfigError("data.shape", "needs one or more sizes, each > 0", self.shape)
        if self.tokenizer is not None and self.name == "text":
            raise ConfigError(
                "data.tokenizer",
                "data.name=text is character-level (its ids are the text's characters); for a tokenizer, tokenise "
                "the text into token ids (data.name=tokens)",
                self.tokenizer,
            )


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    epochs: int = 20
    """Passes over the training data."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (whichever of epochs and max_steps comes first)."""
    batch_size: int | Literal["auto"] = 64
    """GLOBAL samples per optimizer step, summed over all devices and accumulation steps; each epoch is the whole batches of its shuffled order (the last partial batch, fewer than batch_size samples, is left out, a different one each epoch, so no rank waits on a short step); auto: the largest micro-batch that fits each device (the memory plan, then trial steps on CUDA) × data-parallel ranks × grad_accum, but a global batch of at most the default 64 or 1/64 of the training split, whichever is larger (the batch changes the optimisation: a small data set keeps the default's steps per epoch); one line says the batch chosen, why, and its steps per epoch."""
    grad_accum: int | Literal["auto"] = 1
    """Micro-batches accumulated per optimizer step; auto: batch_size / micro_batch_size (or 1)."""
    micro_batch_size: int | Literal["auto"] | None = None
    """Samples per device per forward pass; used by grad_accum=auto; auto (with batch_size fixed): the largest that fits each device and divides its share of the batch, grad_accum making up the rest."""
    clip_grad_norm: float | None = None
    """Clip the global gradient L2 norm to this value."""
    clip_grad_value: float | None = None
    """Clamp every gradient element to [-value, value]."""
    precision: Precision = "auto"
    """auto (bf16 on GPUs that support it, fp16 on older CUDA GPUs, fp32 on CPU), fp32, tf32, bf16, fp16; fp8: the large Linear layers in float8 through torchao, the rest in bf16 (GPUs of compute capability 8.9+: H100/H200, L4, L40S, RTX 4090; pip install 'gputrain[fp8]')."""
    fp8_recipe: Literal["tensorwise", "rowwise"] = "tensorwise"
    """precision=fp8: how float8 values are scaled, one scale per tensor (tensorwise: fastest) or per row (rowwise: more accurate, needs larger layers to pay)."""
    compile: bool = False
    """Apply torch.compile to the model."""
    cuda_graphs: bool = False
    """Replay each step as a CUDA graph (torch.compile mode="reduce-overhead"; static shapes only, CUDA only; one device or DDP; gradients then keep buffers of their own)."""
    device: str = "auto"
    """auto, cpu, cuda, cuda:N or mps."""
    seed: int = 0
    """Seed for the data split, shuffling, init and dropout."""
    deterministic: bool = False
    """Use deterministic algorithms (bitwise reproducible, sometimes slower)."""
    num_threads: int | Literal["auto"] = "auto"
    """CPU intra-op threads (torch.set_num_threads); auto: the cores this process may use (affinity, cgroup quota) ÷ local ranks, less those busy with other processes (not with deterministic), at most 4 on a GPU; OMP_NUM_THREADS or MKL_NUM_THREADS set in the environment win over auto."""
    on_nonfinite: Literal["stop", "skip", "off"] = "stop"
    """A NaN/Inf loss or gradient: stop (naming the step; the step is not applied) or skip the step and count it (the LR schedule does not advance); off: no check and no per-step sync, as in a hand-written loop (a NaN step is applied and shows up only in the logged loss)."""
    limit_batches: int | None = None
    """At most this many optimizer steps per epoch (the first of each epoch's order; Lightning's limit_train_batches, counted in steps of train.batch_size samples); the epoch then ends, with its validation and checkpoint. Unset: the whole epoch."""
    max_time: float | str | None = None
    """Stop cleanly at the first step boundary once the run has spent this long in its loop (steps, evaluations, checkpoints; not start-up), summed over every invocation that continued it with a limit, as Lightning's max_time (several ranks: at the next logging step, on rank 0's clock): seconds, or 45s, 90m, 2h, 1d, 1h30m. The run saves a checkpoint and ends with status timed_out (summary.json's reason says so, exit 0; no test split); `gputrain train --run-dir DIR train.max_time=<more>` continues it (each continuation takes at least one step)."""
    smoke_steps: int | None = None
    """A smoke test of the whole job (Lightning's fast_dev_run): train this many steps, validate and test on this many batches, save a checkpoint and read it back into the model, all in a temporary run directory that is removed at the end (nothing is kept; the run directory given is not touched). Ends with one line saying what passed."""

    def __post_init__(self) -> None:
        check_values("train", self)
        if self.max_time is not None:
            duration_seconds(self.max_time, "train.max_time")

    @property
    def max_time_s(self) -> float | None:
        """train.max_time in seconds (None: no limit)."""
        return None if self.max_time is None else duration_seconds(self.max_time, "train.max_time")


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    name: OptimizerName = "adamw"
    """sgd, adam, adamw, rmsprop, adagrad, adadelta, adamax or nadam (fused/foreach kernels where available)."""
    lr: float = 1e-3
    """Peak learning rate (before linear scaling, see scale_lr)."""
    weight_decay: float = 0.0
    """Weight decay (decoupled for adamw)."""
    decay: Literal["matrices", "all"] = "matrices"
    """What weight decay applies to: matrices (weights of 2 or more dimensions; biases, norm scales and other vectors are not decayed, as in nanoGPT, Hugging Face and torchtitan) or all parameters."""
    momentum: float = 0.9
    """sgd and rmsprop momentum."""
    nesterov: bool = False
    """sgd: Nesterov momentum."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam-family betas [beta1, beta2]."""
    eps: float = 1e-8
    """Adam-family / rmsprop epsilon."""
    schedule: ScheduleName = "constant"
    """LR schedule over optimizer steps: constant, step, multistep, exponential, cosine, warmup_cosine, linear, onecycle."""
    warmup_steps: int = 0
    """Linear warm-up steps (warmup_cosine, and before any other schedule)."""
    step_size: int = 1000
    """step: multiply the LR by gamma every step_size optimizer steps."""
    gamma: float = 0.1
    """step, multistep, exponential: decay factor."""
    milestones: list[int] = field(default_factory=list)
    """multistep: optimizer steps at which the LR is multiplied by gamma."""
    min_lr: float = 0.0
    """cosine, warmup_cosine, linear: LR at the end of training."""
    scale_lr: Literal["none", "linear"] = "none"
    """linear: lr * batch_size / base_batch_size (the linear scaling rule)."""
    base_batch_size: int = 256
    """Reference batch size for scale_lr=linear."""

    def __post_init__(self) -> None:
        check_values("optim", self)
        if len(self.betas) != 2:
            raise ConfigError("optim.betas", "must be two numbers in [0, 1), e.g. [0.9, 0.999]", self.betas)
        if self.nesterov and self.name == "sgd" and self.momentum == 0:
            raise ConfigError("optim.nesterov", "Nesterov needs optim.momentum > 0", self.nesterov)
        if sorted(self.milestones) != self.milestones:
            raise ConfigError("optim.milestones", "must be increasing positive step numbers", self.milestones)


@dataclass(kw_only=True, slots=True)
class EvalConfig:
    every_epochs: int = 1
    """Validate every N epochs (0: only at the end)."""
    every_steps: int = 0
    """Also validate every N optimizer steps, counted over the whole run (torchtitan's validator.freq, nanoGPT's eval_interval): rows at steps N, 2N, ... and at the end; early stopping and the best checkpoint follow every validation. With every_epochs too, a validation is due when either says so, never twice at one step (every_epochs=0: on the step cadence and at the end only). 0: off. Needs a validation split."""
    max_batches: int | None = None
    """Evaluate only the first N batches of each split (N × the evaluation batch size samples, or a DataLoader's first N batches), for validation and the test during training, Trainer.validate() and Trainer.test(); unset: the whole split."""
    metrics: list[str] | Literal["auto"] = "auto"
    """Metrics to compute; auto: accuracy, precision, recall, f1, auroc, loss (classification), mse, mae (regression), loss, perplexity (lm). Precision, recall and F1 are macro averages over the classes among the targets or predictions, AUROC one-vs-rest over the classes with positives and negatives (scikit-learn's definitions)."""
    early_stop_metric: str | None = None
    """Stop when this validation metric (e.g. loss, accuracy) has not improved for `patience` evaluations."""
    patience: int = 5
    """Evaluations without improvement before early stopping."""
    mode: Literal["auto", "min", "max"] = "auto"
    """Whether the monitored metric should fall or rise; auto: min for loss/mse/mae/perplexity, else max."""

    def __post_init__(self) -> None:
        check_values("eval", self)


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    enabled: bool = True
    """Write checkpoints under <run-dir>/checkpoints/."""
    every_steps: int = 0
    """Checkpoint every N optimizer steps (0: off)."""
    every_epochs: int = 1
    """Checkpoint at the end of every N epochs (0: off)."""
    keep_last: int = 2
    """Keep this many recent checkpoints (the best one is kept as well)."""
    keep_best: bool = True
    """Also keep the checkpoint with the best monitored validation metric."""
    max_overhead: float = 0.05
    """One process: an every_epochs/every_steps checkpoint is put off while saving would take more than this fraction of the run's time so far (a new best is kept in host memory and written with the next save); the run's end, early stop and Ctrl-C/SIGTERM always save. 0: save every time."""
    async_save: bool = False
    """Write checkpoints in the background while training continues (one save in flight): one process copies the state to host memory and writes it in a thread; several ranks use torch.distributed.checkpoint's async save."""
    resume: str = "auto"
    """auto: continue from the run directory's latest complete checkpoint; never; or a checkpoint PATH."""

    def __post_init__(self) -> None:
        check_values("checkpoint", self)


@dataclass(kw_only=True, slots=True)
class LogConfig:
    every_steps: int = 10
    """Log loss, LR, grad norm and speed every N optimizer steps (the only steps that sync host and device)."""
    tensorboard: bool = True
    """Also write TensorBoard event files into the run directory."""
    progress: Literal["auto", "bar", "plain", "none"] = "auto"
    """auto: a progress bar in a terminal, plain lines otherwise."""
    breakdown_every: int = 25
    """Time every N-th step's parts (data, copy, forward+backward, optimizer, comm) with device events; 0: off."""
    mlflow: str = ""
    """Also log the run to MLflow at this tracking URI: a folder, sqlite:///PATH, or http://HOST:PORT of an mlflow server (pip install 'gputrain[mlflow]'); empty: off."""
    wandb: Literal["off", "offline", "online"] = "off"
    """Also log the run to Weights & Biases: offline writes into <run-dir>/wandb (sync later with `wandb sync`), online sends it (pip install 'gputrain[wandb]')."""

    def __post_init__(self) -> None:
        check_values("log", self)
        problem = tracking_uri_problem(self.mlflow)
        if problem:
            raise ConfigError("log.mlflow", problem, self.mlflow)


@dataclass(kw_only=True, slots=True)
class ParallelConfig:
    strategy: Literal["auto", "none", "ddp", "fsdp", "tp", "pp", "hybrid", "tuned"] = "auto"
    """How to use several devices: auto, none, ddp, fsdp, tp, pp or hybrid; tuned: the fastest layout `gputrain tune` measured for this config and machine (parallel.tune_file), else auto's choice, said in one line."""
    dp_replicate: int = 1
    """Data-parallel replicas (hybrid); -1: the remaining ranks."""
    dp_shard: int = -1
    """Data-parallel shards (FSDP); -1: the remaining ranks."""
    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline-parallel degree."""
    pp_schedule: Literal["gpipe", "1f1b", "interleaved_1f1b"] = "1f1b"
    """Pipeline schedule: gpipe, 1f1b or interleaved_1f1b; the micro-batches are train.grad_accum."""
    activation_checkpointing: Literal["none", "full", "selective"] = "none"
    """Recompute activations in the backward pass to save memory: none, full (whole blocks) or selective (keep matmul outputs)."""
    cpu_offload: bool = False
    """fsdp: keep sharded parameters, gradients and optimizer state in CPU memory (slower, fits larger models)."""
    tune_file: str | None = None
    """strategy=tuned: the tune.json `gputrain tune` wrote (or its directory); unset: runs/<model>-<data>-tune/tune.json, tune's default."""
    timeout_s: float = 600.0
    """Seconds any collective may wait for its peers before the job fails (a dead rank never hangs the others)."""

    def __post_init__(self) -> None:
        check_values("parallel", self)
        for name in ("dp_replicate", "dp_shard", "tp", "pp"):
            if getattr(self, name) == 0:
                raise ConfigError(f"parallel.{name}", f"must be {RANK_DEGREE.text}", 0)


PPO_DEFAULTS: dict[str, dict[str, Any]] = {
    # CleanRL's ppo.py: CartPole-v1 and the other discrete-action environments
    "discrete": {
        "total_timesteps": 500_000,
        "num_envs": 4,
        "num_steps": 128,
        "num_minibatches": 4,
        "update_epochs": 4,
        "ent_coef": 0.01,
        "normalize_obs": False,
        "normalize_reward": False,
    },
    # CleanRL's ppo_continuous_action.py: Box actions, observations and rewards normalised
    "continuous": {
        "total_timesteps": 1_000_000,
        "num_envs": 1,
        "num_steps": 2048,
        "num_minibatches": 32,
        "update_epochs": 10,
        "ent_coef": 0.0,
        "normalize_obs": True,
        "normalize_reward": True,
    },
}
"""What `auto` means for each field of [rl] that has it, by the environment's kind of action."""

PPO_SHARED_DEFAULTS: dict[str, dict[str, Any]] = {
    "discrete": {"optim.lr": 2.5e-4, "optim.eps": 1e-5, "train.clip_grad_norm": 0.5},
    "continuous": {"optim.lr": 3e-4, "optim.eps": 1e-5, "train.clip_grad_norm": 0.5},
}
"""CleanRL's Adam learning rate and epsilon and its max_grad_norm, by the kind of action: the values
`gputrain rl` gives the shared fields the user leaves unset (`ppo_defaults`)."""

MOVED: dict[str, str] = {
    "rl.learning_rate": "optim.lr",
    "rl.adam_eps": "optim.eps",
    "rl.max_grad_norm": "train.clip_grad_norm",
}
"""Keys that became another section's: a config naming the old one is told the new one."""


@dataclass(kw_only=True, slots=True)
class RLConfig:
    env: str = "CartPole-v1"
    """`gputrain rl`: environment, stepped as tensors on the training device with gymnasium's dynamics: CartPole-v1, Acrobot-v1, MountainCar-v0 (discrete actions) or Pendulum-v1 (continuous)."""
    policy: Literal["auto", "categorical", "gaussian"] = "auto"
    """Policy head: categorical (discrete actions), gaussian (continuous: a state-independent log std, as CleanRL's); auto: the one the environment's actions need."""
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    """Widths of the tanh hidden layers of the actor and of the critic (separate networks, as CleanRL's)."""
    total_timesteps: int | Literal["auto"] = "auto"
    """Environment steps to train for, summed over all environments; auto: 500000 for discrete actions (CleanRL ppo.py), 1000000 for continuous (ppo_continuous_action.py)."""
    num_envs: int | Literal["auto"] = "auto"
    """Environments stepped together, summed over all ranks (each rank steps num_envs / ranks); auto: 4 (ppo.py) or 1 (ppo_continuous_action.py)."""
    num_steps: int | Literal["auto"] = "auto"
    """Steps of each environment per rollout (one PPO iteration); auto: 128 (ppo.py) or 2048 (ppo_continuous_action.py)."""
    anneal_lr: bool = True
    """Decay the learning rate (optim.lr: `gputrain rl` makes it 2.5e-4 (ppo.py) or 3e-4 (ppo_continuous_action.py) unless set) linearly to 0 over the iterations. Adam's epsilon is optim.eps (1e-5 unless set), the gradient clipping train.clip_grad_norm (0.5 unless set)."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda (Schulman et al. 2016)."""
    num_minibatches: int | Literal["auto"] = "auto"
    """Minibatches per epoch over the rollout; must divide num_envs × num_steps; auto: 4 (ppo.py) or 32 (ppo_continuous_action.py)."""
    update_epochs: int | Literal["auto"] = "auto"
    """Passes over the rollout per iteration; auto: 4 (ppo.py) or 10 (ppo_continuous_action.py)."""
    norm_adv: bool = True
    """Normalise the advantages within each minibatch."""
    clip_coef: float = 0.2
    """Surrogate clipping epsilon (also the value clipping range, with clip_vloss)."""
    clip_vloss: bool = True
    """Clip the value loss around the rollout's values, as CleanRL does."""
    ent_coef: float | Literal["auto"] = "auto"
    """Entropy bonus coefficient; auto: 0.01 (ppo.py) or 0.0 (ppo_continuous_action.py)."""
    vf_coef: float = 0.5
    """Value loss coefficient."""
    target_kl: float | None = None
    """Stop an iteration's epochs early once the approximate KL exceeds this (unset: never)."""
    normalize_obs: bool | Literal["auto"] = "auto"
    """Normalise observations by running statistics over all environments (gymnasium's NormalizeObservation), then clip to ±clip_obs; auto: off for discrete actions, on for continuous."""
    normalize_reward: bool | Literal["auto"] = "auto"
    """Scale rewards by the running std of the discounted return (gymnasium's NormalizeReward), then clip to ±clip_reward; auto: off for discrete actions, on for continuous."""
    clip_obs: float = 10.0
    """Bound of normalised observations."""
    clip_reward: float = 10.0
    """Bound of normalised rewards."""
    bootstrap_truncated: bool = True
    """Where the time limit truncates an episode, add gamma × V(last observation) to its last reward, as gymnasium advises; false treats truncation as termination, as CleanRL does."""
    max_episode_steps: int | None = None
    """Time limit of an episode; unset: gymnasium's (CartPole 500, Acrobot 500, MountainCar 200, Pendulum 200)."""
    env_dtype: Literal["auto", "float32", "float64"] = "auto"
    """Precision of the environments' state: float64 reproduces gymnasium's arithmetic; float32 is faster on GPUs with little float64 throughput; auto: float64 (float32 on MPS, which has no float64)."""
    stop_at_return: float | None = None
    """Stop (status stopped_early) once the mean return of the last 100 episodes reaches this, checked on logging iterations; e.g. 475 for CartPole-v1."""

    def __post_init__(self) -> None:
        check_values("rl", self)
        if not self.hidden_sizes:
            raise ConfigError("rl.hidden_sizes", "needs at least one hidden layer, e.g. [64, 64]", self.hidden_sizes)
        if self.env not in ENV_ACTIONS:
            by_case = {name.lower(): name for name in ENV_ACTIONS}
            close = difflib.get_close_matches(self.env.lower(), list(by_case), n=1, cutoff=0.5)
            raise ConfigError(
                "rl.env",
                "unknown environment; choose from " + ", ".join(sorted(ENV_ACTIONS)),
                self.env,
                hint=f"did you mean {by_case[close[0]]!r}?" if close else None,
            )
        kind = ENV_ACTIONS[self.env]
        needed = "categorical" if kind == "discrete" else "gaussian"
        if self.policy not in ("auto", needed):
            raise ConfigError(
                "rl.policy",
                f"{self.env} has {kind} actions, which a {self.policy} policy cannot produce",
                self.policy,
                hint=f"use rl.policy={needed} or auto",
            )
        num_envs, num_steps, minibatches = (self.value(k) for k in ("num_envs", "num_steps", "num_minibatches"))
        rollout = num_envs * num_steps
        if rollout % minibatches:
            raise ConfigError(
                "rl.num_minibatches",
                f"must divide the rollout of rl.num_envs × rl.num_steps = {num_envs} × {num_steps} = {rollout} "
                "transitions",
                minibatches,
                hint="choose num_minibatches, num_envs or num_steps so that it does",
            )
        if self.norm_adv and rollout // minibatches < 2:
            raise ConfigError(
                "rl.num_minibatches",
                f"leaves {rollout // minibatches} transition per minibatch; normalising advantages (rl.norm_adv) "
                "needs at least 2",
                minibatches,
            )
        if self.value("total_timesteps") < rollout:
            raise ConfigError(
                "rl.total_timesteps",
                f"is less than one rollout of rl.num_envs × rl.num_steps = {rollout} transitions",
                self.total_timesteps,
            )

    def value(self, name: str) -> Any:
        """The field `name` with `auto` resolved: CleanRL's default for this environment's kind of action."""
        value = getattr(self, name)
        if isinstance(value, str) and value == "auto" and name in PPO_DEFAULTS["discrete"]:
            return PPO_DEFAULTS[ENV_ACTIONS.get(self.env, "discrete")][name]
        return value

    def resolved(self) -> RLConfig:
        """This section with every `auto` resolved (the policy too): what a run reads."""
        resolved: dict[str, Any] = {name: self.value(name) for name in PPO_DEFAULTS["discrete"]}
        resolved["policy"] = "categorical" if ENV_ACTIONS[self.env] == "discrete" else "gaussian"
        return dataclasses.replace(self, **resolved)

    @property
    def batch_size(self) -> int:
        """Transitions per rollout over all ranks (CleanRL's batch_size)."""
        return int(self.value("num_envs")) * int(self.value("num_steps"))

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // int(self.value("num_minibatches"))

    @property
    def num_iterations(self) -> int:
        return int(self.value("total_timesteps")) // self.batch_size


def ppo_defaults(config: Config) -> dict[str, Any]:
    """CleanRL's values for the shared fields `gputrain rl` reads (optim.lr, optim.eps,
    train.clip_grad_norm), where the user sets none: `load_config(..., defaults=ppo_defaults)`. A
    user's train.clip_grad_value is their choice of clipping: CleanRL's norm clipping then yields
    (the two cannot be set together)."""
    defaults = PPO_SHARED_DEFAULTS[ENV_ACTIONS[config.rl.env]]
    if config.train.clip_grad_value is not None:
        return {key: value for key, value in defaults.items() if key != "train.clip_grad_norm"}
    return defaults


@dataclass(kw_only=True, slots=True)
class Config:
    """The whole run configuration, one field per section."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    rl: RLConfig = field(default_factory=RLConfig)


SECTIONS: dict[str, type] = {
    "model": ModelConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "optim": OptimConfig,
    "eval": EvalConfig,
    "checkpoint": CheckpointConfig,
    "log": LogConfig,
    "parallel": ParallelConfig,
    "rl": RLConfig,
}
