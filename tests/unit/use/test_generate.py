"""gputrain generate: the KV cache gives the tokens a full forward pass gives, a seed gives one text,
and prompts the model cannot read are refused naming what it reads."""

from __future__ import annotations

import pytest
import torch

from gputrain.cli import main
from gputrain.config import load_config
from gputrain.data.spec import DataSpec
from gputrain.models import build_model
from gputrain.models.gpt import KVCache
from gputrain.use.generate import Sampling, generate
from gputrain.use.loaded import load_run


def _gpt(seq_len: int = 12, vocab: int = 30):
    torch.manual_seed(0)
    fields = {"model.name": "gpt", "model.preset": "tiny", "model.d_model": 32, "model.seq_len": seq_len}
    config = load_config({**fields, "data.seq_len": seq_len})
    return build_model(config.model, DataSpec(task="lm", input_shape=(seq_len,), vocab_size=vocab)).eval()


def test_cached_logits_equal_the_full_forward_pass_chunk_by_chunk() -> None:
    """A prompt read in one piece, then one token, then a chunk: each position's logits as forward's."""
    model = _gpt()
    tokens = torch.randint(30, (3, 12))
    cache = KVCache(model, batch=3)
    with torch.no_grad():
        full = model(tokens)
        parts = [model.forward_cached(tokens[:, a:b], cache) for a, b in ((0, 5), (5, 6), (6, 12))]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    assert cache.length == 12
    with pytest.raises(ValueError, match="exceed the context"):
        model.forward_cached(tokens[:, :1], cache)


@pytest.mark.parametrize("sampling", [Sampling(40, 0.0), Sampling(40, 1.3, top_k=5, seed=3), Sampling(40, 0.8)])
def test_the_cache_changes_the_cost_not_the_tokens(sampling: Sampling) -> None:
    """40 new tokens from a 3-token prompt in a 12-token context: the window slides for the last 31."""
    model = _gpt()
    prompt = [1, 2, 3]
    cached = torch.stack(list(generate(model, prompt, sampling, num_samples=2)), dim=1)
    full = torch.stack(list(generate(model, prompt, sampling, num_samples=2, use_cache=False)), dim=1)
    assert cached.shape == (2, 40)
    assert torch.equal(cached, full)


def test_the_seed_alone_decides_the_sample() -> None:
    model = _gpt()
    draw = lambda seed: torch.cat(list(generate(model, [4], Sampling(30, 1.0, seed=seed))))  # noqa: E731
    assert torch.equal(draw(7), draw(7))
    assert not torch.equal(draw(7), draw(8))


def test_tokens_beyond_a_padded_vocabulary_are_never_drawn() -> None:
    model = _gpt(vocab=30)
    with torch.no_grad():
        model.lm_head.weight[25:] += 5.0  # make the padding ids the likeliest
    tokens = torch.cat(list(generate(model, [1], Sampling(50, 1.0), allowed=25)))
    assert int(tokens.max()) < 25


def test_the_command_continues_a_character_prompt_the_same_with_and_without_cache(tiny_run, capsys) -> None:
    run_dir = str(tiny_run("text_gpt"))
    args = ["generate", run_dir, "--prompt", "the quick", "--max-new-tokens", "30", "--seed", "5", "--top-k", "8"]
    assert main(args) == 0
    first = capsys.readouterr()
    assert main([*args, "--no-cache"]) == 0
    assert capsys.readouterr().out == first.out
    assert first.out.startswith("the quick") and len(first.out.rstrip("\n")) == len("the quick") + 30
    assert "character-level" in first.err
    vocab = set(load_run(run_dir, device="cpu").pre.vocab or ())
    assert set(first.out.rstrip("\n")) <= vocab


def test_a_token_id_model_reads_and_writes_ids(tiny_run, capsys) -> None:
    run_dir = str(tiny_run("tokens_gpt"))
    assert main(["generate", run_dir, "--prompt", "1 4 13", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    out = capsys.readouterr()
    ids = [int(word) for word in out.out.split()]
    assert ids[:3] == [1, 4, 13] and len(ids) == 8 and all(0 <= i < 50 for i in ids)
    assert "token ids 0..49" in out.err


@pytest.mark.parametrize(
    ("run", "prompt", "message"),
    [
        ("text_gpt", "The Quick!", "3 character(s) outside the model's vocabulary: '!', 'Q', 'T'"),
        ("tokens_gpt", "hello", "this model reads token ids (0..49)"),
        ("tokens_gpt", "3 99", "token id 99 is outside the vocabulary (0..49)"),
        ("csv_mlp", "x", "not a language model"),
    ],
)
def test_prompts_the_model_cannot_read_are_refused(tiny_run, capsys, run: str, prompt: str, message: str) -> None:
    assert main(["generate", str(tiny_run(run)), "--prompt", prompt, "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


class _Bigram(torch.nn.Module):
    """A language model that is not gputrain's GPT (as model.name=hf is): ids [B, T] -> logits [B, T, V]."""

    def __init__(self, vocab: int = 20) -> None:
        super().__init__()
        self.table = torch.nn.Embedding(vocab, vocab)
        self.windows: list[int] = []

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        self.windows.append(idx.shape[1])
        return self.table(idx)


def test_another_language_model_is_sampled_without_a_cache_within_its_context() -> None:
    torch.manual_seed(0)
    model = _Bigram()
    sampling = Sampling(12, 1.0, seed=2)
    first = torch.cat(list(generate(model, [1, 2, 3], sampling, context=8)))
    assert max(model.windows) == 8 and model.windows[0] == 3  # the window grows to the context, then slides
    assert torch.equal(first, torch.cat(list(generate(model, [1, 2, 3], sampling, context=8, use_cache=False))))
    with pytest.raises(ValueError, match="context is required"):
        next(generate(model, [1], sampling))
