"""Sampling text from a run's language model, with a KV cache (models/gpt.py's `KVCache`).

The cache changes the cost, not the result: each step computes the logits of the last position of
the same window of at most the model's context as a full forward pass does (checked by the tests),
and the sample is drawn from a generator seeded with `seed` alone, so a seed gives the same text
every time on the same device. Past the context the window slides, which learned positions do not
allow a cache to follow: each token then costs one full-window pass, as without the cache.

Other language models (model.name=hf) are sampled the same way without a cache: each token costs
a forward pass over the window (at most the run's data.seq_len).

Tokenizers: a character-level run (data.name=text) maps each character of its training file to an
id; a token-id run that keeps its tokenizer (RUN/tokenizer/: data.tokenizer, a prepared folder's, an
HF model directory's) reads and writes text through it; another token-id run (tokens, synthetic) was
trained on ids whose tokenizer is not part of the run, so its prompt and output are ids.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn

from gputrain.errors import DataError, UsageError
from gputrain.models.gpt import GPT, KVCache
from gputrain.text.tokenizer import Tokenizer as TextTokenizer
from gputrain.use import bounds
from gputrain.use.preprocess import Preprocessing


@dataclass(frozen=True, slots=True)
class Tokenizer:
    """Text ↔ the ids a run's language model reads."""

    vocab: tuple[str, ...] | None
    """Character-level: the character of each id; None: the model reads ids."""
    vocab_size: int
    text: TextTokenizer | None = None
    """The run's own tokenizer (text/tokenizer.py), where it keeps one: prompts and output are text."""

    @classmethod
    def of(cls, pre: Preprocessing, text: TextTokenizer | None = None) -> Tokenizer:
        if pre.task != "lm":
            raise UsageError(
                f"this run is {pre.task} (data.name={pre.source}), not a language model: "
                "gputrain generate samples from runs of model.name=gpt; use gputrain predict"
            )
        assert pre.vocab_size is not None
        return cls(pre.vocab, pre.vocab_size, text if pre.vocab is None else None)

    @property
    def allowed(self) -> int | None:
        """Ids at or above it are never drawn: those beyond the characters or the tokenizer's tokens."""
        if self.vocab is not None:
            return len(self.vocab)
        return self.text.vocab_size if self.text is not None else None

    def describe(self) -> str:
        if self.text is not None:
            return f"the run's {self.text.kind} tokenizer, {self.text.vocab_size:,} tokens ({self.text.hash[:19]}...)"
        if self.vocab is not None:
            return f"character-level: {len(self.vocab)} characters of the training text"
        return f"token ids 0..{self.vocab_size - 1} (the run's tokenizer is not part of it: prompts and output are ids)"

    def encode(self, prompt: str) -> list[int]:
        """The prompt's ids.

        Raises:
            UsageError: an empty prompt, characters outside a character vocabulary (naming them), or
                a token-id prompt that is not ids below the vocabulary size.
        """
        if not prompt:
            raise UsageError("--prompt is empty: the model needs at least one token to continue")
        if self.text is not None:
            ids = self.text.encode(prompt)
            if not ids:
                raise UsageError(f"--prompt {prompt!r}: the tokenizer gives no token for it")
            return ids
        if self.vocab is None:
            return self._ids(prompt)
        index = {ch: i for i, ch in enumerate(self.vocab)}
        unknown = sorted({ch for ch in prompt if ch not in index})
        if unknown:
            shown = ", ".join(repr(ch) for ch in unknown[:10]) + (" ..." if len(unknown) > 10 else "")
            raise UsageError(
                f"--prompt: {len(unknown)} character(s) outside the model's vocabulary: {shown}; it knows the "
                f"{len(self.vocab)} characters of its training text: {''.join(self.vocab)!r}"
            )
        return [index[ch] for ch in prompt]

    def _ids(self, prompt: str) -> list[int]:
        words = prompt.replace(",", " ").split()
        # ASCII digits only: int() also reads '1_000', '٣' and other scripts' digits as numbers
        if not all(re.fullmatch(r"[+-]?[0-9]+", word) for word in words):
            shown = prompt if len(prompt) <= 60 else prompt[:57] + "..."
            raise UsageError(
                f"--prompt {shown!r}: this model reads token ids (0..{self.vocab_size - 1}), and its tokenizer is "
                "not part of the run: give the ids the training data was tokenized with, e.g. --prompt '464 2068' "
                "(nanoGPT's prepare.py uses GPT-2's BPE, tiktoken's 'gpt2')"
            )
        if not words:
            raise UsageError(f"--prompt {prompt!r}: no token ids; the model needs at least one to continue")
        # an id of more digits than any vocabulary has is outside it (int() refuses past 4,300 digits)
        bad = [w for w in words if len(w.lstrip("+-").lstrip("0")) > 12 or not 0 <= int(w) < self.vocab_size]
        if bad:
            shown = bad[0] if len(bad[0]) <= 40 else f"{bad[0][:20]}...({len(bad[0])} digits)"
            raise UsageError(f"--prompt: token id {shown} is outside the vocabulary (0..{self.vocab_size - 1})")
        return [int(word) for word in words]

    def decode(self, ids: list[int]) -> str:
        if self.text is not None:
            return self.text.decode(ids)
        if self.vocab is None:
            return "".join(f" {i}" for i in ids)
        return "".join(self.vocab[i] for i in ids)

    def decode_prompt(self, ids: list[int]) -> str:
        return self.decode(ids) if self.text is not None else self.decode(ids).lstrip(" ")

    def continuation(self, prompt: list[int], new: list[int]) -> str:
        """The text `new` adds after `prompt` (a tokenizer's text of the whole, less the prompt's)."""
        if self.text is None:
            return self.decode(new)
        return self.decode(prompt + new)[len(self.decode(prompt)) :]

    def stream(self, prompt: list[int]) -> TextStream:
        """Text as new ids come, for printing them one by one (after `decode_prompt(prompt)`)."""
        return TextStream(self, prompt)


class TextStream:
    """The text new tokens add, given one at a time. A tokenizer's token may be part of a character
    (byte-level BPE) and its text may depend on the tokens before (a sentencepiece space), so the
    ids since the last line break are decoded together and what was not printed yet is given, held
    back while it ends inside a character (U+FFFD) (transformers' TextStreamer does the same)."""

    def __init__(self, tokenizer: Tokenizer, prompt: list[int]) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt) if tokenizer.text is not None else []
        self.shown = len(tokenizer.decode(self.ids)) if self.ids else 0

    def add(self, token: int) -> str:
        if self.tokenizer.text is None:  # one id is one character, or one number
            return self.tokenizer.decode([token])
        self.ids.append(token)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        new, self.shown = text[self.shown :], len(text)
        if new.endswith("\n"):  # a fresh start: decoding stays short
            self.ids, self.shown = [], 0
        return new

    def end(self) -> str:
        """What was held back (a character cut short at the end)."""
        if self.tokenizer.text is None or not self.ids:
            return ""
        return self.tokenizer.decode(self.ids)[self.shown :]


@dataclass(frozen=True, slots=True)
class Sampling:
    """How to sample, within use/bounds.py's limits (checked when made: UsageError naming the option)."""

    max_new_tokens: int = 200
    temperature: float = 1.0
    """Logits are divided by it; 0 picks the most likely token (greedy)."""
    top_k: int | None = None
    """Sample among the k most likely tokens only."""
    seed: int = 0

    def __post_init__(self) -> None:
        bounds.check_new_tokens(self.max_new_tokens)
        bounds.check_temperature(self.temperature)
        bounds.check_seed(self.seed)
        if self.top_k is not None and self.top_k < 1:
            raise UsageError(f"--top-k {self.top_k}: must be at least 1")


@torch.no_grad()
def generate(
    model: nn.Module,
    prompt: list[int],
    sampling: Sampling,
    *,
    num_samples: int = 1,
    allowed: int | None = None,
    use_cache: bool = True,
    context: int | None = None,
) -> Iterator[torch.Tensor]:
    """The new tokens, one step at a time: each a [num_samples] tensor of ids on the model's device.

    Args:
        model: token ids [B, T] -> logits [B, T, vocab]: gputrain's GPT, or another language model
            (model.name=hf), which is run without a KV cache.
        allowed: ids at or above it are never drawn (a vocabulary padded beyond its characters).
        use_cache: False recomputes every step's whole window (the reference the cache must equal).
        context: the longest window the model reads (default: a GPT's own context; required otherwise).
    """
    device = next(model.parameters()).device
    if context is None:
        if not isinstance(model, GPT):
            raise ValueError("context is required for a model other than gputrain's GPT")
        context = model.shape.seq_len
    generator = torch.Generator(device=device).manual_seed(sampling.seed)
    bounds.check_num_samples(num_samples)
    # the last context + 1 tokens only: what the next window reads, and whether it slid
    tokens = torch.tensor([prompt[-(context + 1) :]] * num_samples, dtype=torch.long, device=device)
    cache = KVCache(model, num_samples) if use_cache and isinstance(model, GPT) else None
    for step in range(sampling.max_new_tokens):
        logits = _next_logits(model, tokens[:, -context:], cache, slid=tokens.shape[1] > context)
        token = _sample(logits.float(), sampling, generator, allowed, step)
        tokens = torch.cat([tokens[:, -context:], token[:, None]], dim=1)
        yield token


def has_kv_cache(model: nn.Module) -> bool:
    """Whether `generate` can run the model with a KV cache (gputrain's GPT; other models recompute)."""
    return isinstance(model, GPT)


def _next_logits(model: nn.Module, window: torch.Tensor, cache: KVCache | None, slid: bool) -> torch.Tensor:
    """The logits [B, vocab] after `window`, reading only the tokens the cache lacks."""
    if cache is None:
        return model(window)[:, -1]
    assert isinstance(model, GPT)
    if slid:  # positions moved under the cached keys: start again from the window
        cache.reset()
    return model.forward_cached(window[:, cache.length :], cache)[:, -1]


def _sample(
    logits: torch.Tensor, sampling: Sampling, generator: torch.Generator, allowed: int | None, step: int
) -> torch.Tensor:
    if allowed is not None and allowed < logits.shape[-1]:
        logits[:, allowed:] = float("-inf")
    if sampling.temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth = logits.topk(sampling.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    try:
        return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator)[:, 0]
    except RuntimeError as err:  # torch's check of the probabilities: NaN or infinite logits
        if "probability tensor" not in str(err):
            raise
        raise DataError(
            f"the model's logits at new token {step + 1} are not finite numbers (NaN or infinite): its weights "
            "hold such values, or its training diverged; nothing can be sampled from them"
        ) from None
