"""`gputrain generate RUN_DIR --prompt TEXT`: sample text from a run's language model (KV-cached)."""

from __future__ import annotations

import argparse
import sys

from gputrain.use import bounds
from gputrain.use.bounds import argparse_type
from gputrain.use.options import add_run_arguments, positive_int

EPILOG = """\
Tokenizer: a character-level run (data.name=text) reads the characters of its training text; a prompt
with any other character is refused, naming it. A token-id run that keeps its tokenizer (RUN/tokenizer/:
data.tokenizer, a prepared folder's, an HF model directory's) reads --prompt as text and prints text.
Another token-id run (data.name=tokens or synthetic) reads ids: give --prompt as ids ("464 2068 7586")
and read ids back; its tokenizer is not part of the run.
The same --seed gives the same text (on the same device). --no-cache recomputes every step's whole window:
the same tokens, slower (for checking). A generation of 1,000 tokens or more reports its progress on stderr
every 5 s, unless its text streams into a terminal.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_arguments(parser)
    parser.add_argument(
        "--prompt", required=True, help="the text to continue (ids for a token-id model without its tokenizer)"
    )
    parser.add_argument(
        "--max-new-tokens",
        type=argparse_type(bounds.new_tokens),
        default=200,
        help=f"tokens to add, 1..{bounds.MAX_NEW_TOKENS:,} (default 200)",
    )
    parser.add_argument(
        "--temperature",
        type=argparse_type(bounds.temperature),
        default=1.0,
        help=f"softmax temperature: 0 is greedy (always the most likely token), else {bounds.MIN_TEMPERATURE:g} to "
        f"{bounds.MAX_TEMPERATURE:g} (default 1.0)",
    )
    parser.add_argument("--top-k", type=positive_int, help="sample among the K most likely tokens only")
    parser.add_argument(
        "--seed", type=argparse_type(bounds.seed), default=0, help="the sampling seed, -2**63..2**64-1 (default 0)"
    )
    parser.add_argument(
        "--num-samples",
        type=argparse_type(bounds.num_samples),
        default=1,
        help=f"independent samples, 1..{bounds.MAX_NUM_SAMPLES:,} (default 1)",
    )
    parser.add_argument("--no-cache", action="store_true", help="recompute the whole window every step")
    parser.epilog = EPILOG


def run(args: argparse.Namespace) -> int:
    from gputrain.models.gpt import GPT
    from gputrain.use.generate import Sampling, Tokenizer, generate, has_kv_cache
    from gputrain.use.loaded import load_run
    from gputrain.use.progress import TokenProgress

    bounds.check_tokens_held(args.max_new_tokens, args.num_samples)  # before the run is loaded
    loaded = load_run(args.run_dir, checkpoint=args.checkpoint, device=args.device)
    tokenizer = Tokenizer.of(loaded.pre, loaded.tokenizer)
    prompt = tokenizer.encode(args.prompt)  # refuses characters outside the vocabulary, naming them
    if loaded.weights.note:
        print(loaded.weights.note, file=sys.stderr)
    print(f"tokenizer: {tokenizer.describe()}; {loaded.weights.describe()}; device {loaded.device}", file=sys.stderr)
    if not has_kv_cache(loaded.model) and not args.no_cache:
        name = loaded.config.model.name
        print(f"model.name={name} has no KV cache here: each token recomputes the window", file=sys.stderr)
    sampling = Sampling(args.max_new_tokens, args.temperature, args.top_k, args.seed)
    allowed = tokenizer.allowed
    steps = generate(
        loaded.model,
        prompt,
        sampling,
        num_samples=args.num_samples,
        allowed=allowed,
        use_cache=not args.no_cache,
        context=loaded.pre.input_shape[0] if not isinstance(loaded.model, GPT) else None,
    )
    streamed = args.num_samples == 1
    # the text streaming into a terminal is its own progress; elsewhere (a file, a pipe, several
    # samples printed at the end) a long generation says how far it is on stderr
    progress = TokenProgress(args.max_new_tokens) if not (streamed and sys.stdout.isatty()) else None
    if streamed:  # streamed as it is sampled
        sys.stdout.write(tokenizer.decode_prompt(prompt))
        stream = tokenizer.stream(prompt)
        for token in steps:
            sys.stdout.write(stream.add(int(token[0])))
            sys.stdout.flush()
            if progress is not None:
                progress.step()
        sys.stdout.write(stream.end() + "\n")
        if progress is not None:
            progress.end()
        return 0
    columns = []
    for token in steps:
        columns.append(list(map(int, token.tolist())))
        if progress is not None:
            progress.step()
    if progress is not None:
        progress.end()
    for i in range(args.num_samples):
        if i:
            sys.stdout.write("\n---\n")
        sys.stdout.write(
            tokenizer.decode_prompt(prompt) + tokenizer.continuation(prompt, [step[i] for step in columns])
        )
    sys.stdout.write("\n")
    return 0
