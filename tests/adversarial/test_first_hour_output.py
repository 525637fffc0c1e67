"""What a newcomer meets in the first hour (issue 33), pushed at its edges: train.batch_size=auto's cap
for every size of training split (never the whole split in a step, never a batch over the split, at
least 64 steps an epoch where the split allows), the line that says so, the hint for an hf vocabulary
far above the data's, the harmless library lines silenced and no other, the model-name error that
names the library forms whatever was mistyped, and `plan`'s rows for several ranks."""

from __future__ import annotations

import logging

import pytest
from torch import nn

import gputrain  # noqa: F401  (installs the log filters)
from gputrain.config import load_config
from gputrain.errors import ConfigError
from gputrain.models.hf_models import _oversized
from gputrain.plan import batch
from gputrain.plan.feasible import row_problem

# ----------------------------------------------------------------- batch_size=auto's cap
SPLITS = [
    None,
    0,
    1,
    2,
    7,
    40,
    63,
    64,
    65,
    127,
    128,
    129,
    500,
    1000,
    1258,
    4095,
    4096,
    4097,
    8191,
    8192,
    64 * 300,
    100_000,
    1_000_003,
    60_000_000,
    2**40,
]


@pytest.mark.parametrize("samples", SPLITS)
def test_the_cap_never_takes_the_split_in_a_step(samples: int | None) -> None:
    cap = batch.auto_batch_cap(samples)
    assert cap >= 1
    if samples is None:
        assert cap == batch.MAX_MICRO_BATCH  # no length: memory alone
        return
    assert cap <= max(64, samples // batch.MIN_STEPS_PER_EPOCH)
    if samples >= 1:
        assert cap <= samples and samples // cap >= 1  # at least one step an epoch
    if samples >= 64 * 64:
        assert samples // cap >= batch.MIN_STEPS_PER_EPOCH
    if 64 <= samples < 64 * 64:
        assert cap == 64  # the default batch: the default job's optimisation


@pytest.mark.parametrize(
    ("fits", "micro", "capped_at", "samples", "batch_size", "words"),
    [
        (1258, 64, 64, 1258, 64, ["memory allows 1258", "at most 64", "19 steps per epoch of 1258", "last 42"]),
        (40, 40, 64, 40, 40, ["the whole training split", "1 step per epoch of 40 samples"]),
        (16, 16, 64, 1258, 16, ["the most that fits each device", "78 steps per epoch", "last 10"]),
        (300, 300, 300, 19200, 300, ["the most that fits", "64 steps per epoch of 19200 samples"]),
        (4096, 300, 300, 19200, 300, ["memory allows 4096", "64 steps per epoch"]),
        (4096, 100, 100, None, 100, ["memory allows 4096"]),
        (16, 16, 16, None, 16, ["the most that fits each device"]),
    ],
)
def test_the_line_says_why_and_the_steps(
    fits: int, micro: int, capped_at: int, samples: int | None, batch_size: int, words: list[str]
) -> None:
    line = batch._why(fits, micro, capped_at, "the plan", batch.auto_batch_cap(samples), samples, batch_size)
    for word in words:
        assert word in line, (word, line)
    if samples is None:
        assert "per epoch" not in line
    elif samples % batch_size == 0:
        assert "left out" not in line


# ----------------------------------------------------------------- an hf vocabulary far above the data's
@pytest.mark.parametrize(
    ("model", "data", "hint"),
    [
        (50257, 88, True),
        (50257, 65, True),
        (50304, 50257, False),
        (50257, 50257, False),
        (151936, 151643, False),
        (128, 88, False),
        (256, 65, False),
        (2048, 88, True),
        (1200, 100, True),
        (1124, 100, False),
        (32000, 32000, False),
        (32000, 256, True),
        (65, 65, False),
        (2, 1, False),
        (3000, 1, True),
    ],
)
def test_the_vocabulary_hint_only_where_most_rows_are_never_a_target(model: int, data: int, hint: bool) -> None:
    assert _oversized(model, data) is hint


# ----------------------------------------------------------------- the library lines silenced, and no other
SO = "/usr/lib/python3/site-packages/torchao/_C_mxfp8.cpython-310-x86_64-linux-gnu.so"


@pytest.mark.parametrize(
    ("logger", "message", "dropped"),
    [
        ("torchao", f"Failed to load {SO}: Could not load this library", True),
        ("torchao", "Failed to load C:\\x\\torchao\\_C_mxfp8.pyd: no", False),  # not the form seen: kept
        ("torchao", f"failed to load {SO}", False),  # another message
        ("torchao", f"Loading {SO}", False),
        ("torchao", "Failed to load /x/torchao/_C_cutlass_90a.abi3.so: undefined symbol", True),
        ("torchao", "Failed to load /x/torchao/kernels.so: undefined symbol", False),  # not one of its _C kernels
        ("torchao.quantization", f"Failed to load {SO}", False),
        (
            "torch.utils._pytree",
            "<enum 'X'> is an Enum subclass and is now natively supported by torch.compile as",
            True,
        ),
        ("torch.utils._pytree", "<class 'X'> is not a pytree", False),
        ("torch._dynamo", "<enum 'X'> is an Enum subclass and is now natively supported by torch.compile as", False),
        ("gputrain", "anything at all", False),
        ("root", f"Failed to load {SO}", False),
    ],
)
def test_only_known_lines_are_dropped(logger: str, message: str, dropped: bool) -> None:
    record = logging.getLogger(logger).makeRecord(logger, logging.WARNING, __file__, 1, message, (), None)
    assert (not all(f.filter(record) for f in logging.getLogger(logger).filters)) is dropped


# ----------------------------------------------------------------- the model-name error names the forms
@pytest.mark.parametrize(
    "name",
    [
        "resnt18",
        "resnet99",
        "vit_b_16",
        "gpt3",
        "RESNET18",
        "efficientnet_b0",
        "convnext_tiny",
        "mlpp",
        "cnnn",
        "hf2",
        "timm",
        "torchvision",
        "llama",
    ],
)
def test_an_unknown_model_name_names_the_library_forms(name: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"model.name={name}"])
    first = str(info.value).splitlines()[0]
    assert "timm:<name>, torchvision:<name>" in first and "choose from cnn, gpt, hf" in first, first


# ----------------------------------------------------------------- plan: a one-process row is no row of N ranks
@pytest.mark.parametrize("world", [1, 2, 3, 4, 8, 64, 1024])
def test_none_is_a_layout_of_one_process_only(world: int) -> None:
    problem = row_problem(nn.Linear(4, 4), "none", world, "1f1b")
    assert (problem is None) is (world == 1)
    if problem is not None:
        assert f"launched on {world} ranks it is refused" in problem
