"""use/bounds.py and what rests on it: generate's and bench-infer's options within named limits (the
command line and the library refuse the same values), a generation that holds only the window it
reads, its progress lines on a long run (counted under a simulated clock), and logits that cannot
be sampled from."""

from __future__ import annotations

import argparse
import io

import pytest
import torch

from gputrain.config import load_config
from gputrain.data.spec import DataSpec
from gputrain.errors import DataError, UsageError
from gputrain.models import build_model
from gputrain.use import bounds
from gputrain.use.bounds import argparse_type
from gputrain.use.generate import Sampling, generate
from gputrain.use.progress import LONG_GENERATION, PROGRESS_S, TokenProgress
from tests.sim_clock import SimClock


@pytest.mark.parametrize(
    ("check", "text", "message"),
    [
        (bounds.temperature, "5e-324", "--temperature 5e-324: give 0 (greedy: always the most likely token) or a "
         "number from 0.0001 to 100"),
        (bounds.temperature, "0.00009", "--temperature 9e-05: give 0"),
        (bounds.temperature, "100.5", "--temperature 100.5: give 0"),
        (bounds.temperature, "nan", "--temperature nan: give 0"),
        (bounds.temperature, "inf", "--temperature inf: give 0"),
        (bounds.temperature, "-0.5", "--temperature -0.5: give 0"),
        (bounds.temperature, "warm", "--temperature 'warm': not a number"),
        (bounds.seed, str(2**64), f"--seed {2**64}: outside -2**63..2**64-1, the seeds torch's generator takes"),
        (bounds.seed, str(-(2**63) - 1), f"--seed {-(2**63) - 1}: outside -2**63..2**64-1"),
        (bounds.seed, "1.5", "--seed '1.5': not a whole number"),
        (bounds.new_tokens, "0", "--max-new-tokens 0: outside 1..100,000 (MAX_NEW_TOKENS)"),
        (bounds.new_tokens, "100001", "--max-new-tokens 100001: outside 1..100,000 (MAX_NEW_TOKENS)"),
        (bounds.num_samples, "1025", "--num-samples 1025: outside 1..1,024 (MAX_NUM_SAMPLES)"),
        (bounds.bench_repeats, "100001", "--repeats 100001: outside 1..100,000 (MAX_BENCH_REPEATS)"),
        (bounds.bench_repeats, "0", "--repeats 0: outside 1..100,000"),
        (bounds.bench_batches, "1,8193", "--batch 8193: outside 1..8,192 (MAX_BENCH_BATCH)"),
        (bounds.bench_batches, "0,4", "--batch 0: outside 1..8,192"),
        (bounds.bench_batches, ",".join(map(str, range(1, 18))), "--batch: 17 batch sizes; at most 16"),
        (bounds.bench_batches, "one", "--batch 'one': give batch sizes as 1,32"),
        (bounds.bench_batches, ",", "--batch ',': give batch sizes as 1,32"),
    ],
)
def test_values_outside_the_bounds_are_refused_naming_the_range(check, text: str, message: str) -> None:
    with pytest.raises(UsageError) as err:
        check(text)
    assert str(err.value).startswith(message), err.value
    with pytest.raises(argparse.ArgumentTypeError) as as_option:  # the option's type: argparse names the option
        argparse_type(check)(text)
    assert str(as_option.value) == str(err.value).split(" ", 1)[1]


@pytest.mark.parametrize(
    ("check", "text", "value"),
    [
        (bounds.temperature, "0", 0.0),
        (bounds.temperature, "1e-4", 1e-4),
        (bounds.temperature, "100", 100.0),
        (bounds.seed, "-1", -1),
        (bounds.seed, str(2**64 - 1), 2**64 - 1),
        (bounds.seed, str(-(2**63)), -(2**63)),
        (bounds.new_tokens, "100000", 100_000),
        (bounds.bench_batches, "32,1,32", (1, 32)),
    ],
)
def test_values_at_the_bounds_are_taken(check, text: str, value: object) -> None:
    assert check(text) == value


@pytest.mark.parametrize("seed", [bounds.SEED_MIN, bounds.SEED_MAX, -1])
def test_every_seed_taken_is_one_torch_takes(seed: int) -> None:
    torch.Generator().manual_seed(seed)


def test_too_many_tokens_to_hold_are_refused_for_several_samples_only() -> None:
    bounds.check_tokens_held(bounds.MAX_NEW_TOKENS, 1)  # streamed: nothing is held
    bounds.check_tokens_held(10_000, 1_000)
    with pytest.raises(UsageError, match=r"--num-samples 101 x --max-new-tokens 100000 = 10,100,000 tokens to hold; "
                       r"at most 10,000,000 \(MAX_TOKENS_HELD\)"):
        bounds.check_tokens_held(100_000, 101)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"temperature": 5e-324}, "--temperature 5e-324"),
        ({"temperature": float("nan")}, "--temperature nan"),
        ({"seed": 2**70}, f"--seed {2**70}"),
        ({"max_new_tokens": 0}, "--max-new-tokens 0"),
        ({"max_new_tokens": 10**9}, "--max-new-tokens 1000000000"),
        ({"top_k": 0}, "--top-k 0"),
    ],
)
def test_the_library_refuses_the_values_the_command_line_does(fields: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        Sampling(**fields)


def _gpt(seq_len: int = 8, vocab: int = 30):
    torch.manual_seed(0)
    fields = {"model.name": "gpt", "model.preset": "tiny", "model.d_model": 32, "model.seq_len": seq_len}
    config = load_config({**fields, "data.seq_len": seq_len})
    return build_model(config.model, DataSpec(task="lm", input_shape=(seq_len,), vocab_size=vocab)).eval()


@pytest.mark.parametrize("prompt_length", [1, 8, 20])
def test_greedy_tokens_are_those_of_the_model_on_the_whole_history_s_last_window(prompt_length: int) -> None:
    """The generator keeps only the last context + 1 tokens: each step reads what a loop over the
    whole history (prompts longer than the context included) would give the model."""
    model = _gpt()
    prompt = [(3 * i) % 30 for i in range(prompt_length)]
    got = [int(t[0]) for t in generate(model, prompt, Sampling(30, 0.0))]
    history = list(prompt)
    with torch.no_grad():
        for _ in range(30):
            history.append(int(model(torch.tensor([history[-8:]]))[0, -1].argmax()))
    assert got == history[prompt_length:]


def test_a_generation_refuses_more_samples_than_the_bound() -> None:
    with pytest.raises(UsageError, match=r"--num-samples 1025: outside 1..1,024"):
        next(generate(_gpt(), [1], Sampling(2), num_samples=bounds.MAX_NUM_SAMPLES + 1))


def test_logits_that_are_not_finite_are_one_line_naming_the_step() -> None:
    model = _gpt()
    with torch.no_grad():
        model.lm_head.weight.fill_(float("nan"))
    with pytest.raises(DataError, match=r"^the model's logits at new token 1 are not finite numbers \(NaN or "
                       r"infinite\): its weights hold such values"):
        list(generate(model, [1, 2], Sampling(5, 1.0)))


def _progress_lines(total: int, seconds_per_token: float) -> list[str]:
    clock, out = SimClock(), io.StringIO()
    progress = TokenProgress(total, file=out, clock=clock)
    for _ in range(total):
        clock.advance(seconds_per_token)
        progress.step()
    progress.end()
    return out.getvalue().splitlines()


def test_a_long_generation_says_how_far_it_is_every_few_seconds_and_at_the_end() -> None:
    assert PROGRESS_S == 5.0
    lines = _progress_lines(2_000, 1 / 16)  # 80 tokens between lines (exact in binary): 125 s in all
    assert len(lines) == 25  # 24 on the way (at 5 s, 10 s, ... 120 s: before the last token), and the end
    assert lines[0] == "generate: 80/2,000 new tokens, 16 tokens/s"
    assert lines[1] == "generate: 160/2,000 new tokens, 16 tokens/s"
    assert lines[-1] == "generate: 2,000/2,000 new tokens, 16 tokens/s (done)"


def test_a_fast_long_generation_prints_its_end_only_and_a_short_one_nothing() -> None:
    assert _progress_lines(LONG_GENERATION, 0.0001) == [f"generate: {LONG_GENERATION:,}/{LONG_GENERATION:,} new "
                                                         "tokens, 10,000 tokens/s (done)"]
    assert _progress_lines(LONG_GENERATION - 1, PROGRESS_S) == []  # slow, but short: no line
