"""Writes the text of examples/text_char_gpt*.toml: Tiny Shakespeare (char-rnn's input.txt, the text of
nanoGPT's shakespeare_char, 1,115,394 characters, 65 distinct), or, where it cannot be downloaded,
Python's own language reference as a stand-in that every CPython carries (pydoc_data, ~465,000
characters), so the example runs offline too. Run from the repository root:

    python examples/text_data/shakespeare.py                  # data/shakespeare.txt
    python examples/text_data/shakespeare.py --offline        # the stand-in, without trying the network

A file already there is kept (a stand-in written offline is replaced once the download works). Exit 1
with one line where the download answers with something that is not Tiny Shakespeare.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
CHARACTERS = 1_115_394
DISTINCT = 65


def stand_in() -> str:
    """Python's language reference, as `help()` shows it: English prose with code, in every CPython."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


def download(timeout: float) -> str:
    with urllib.request.urlopen(URL, timeout=timeout) as response:
        text: str = response.read().decode("utf-8")
    if len(text) != CHARACTERS or len(set(text)) != DISTINCT:
        raise ValueError(
            f"{URL} answered {len(text):,} characters ({len(set(text))} distinct), "
            f"not Tiny Shakespeare's {CHARACTERS:,} ({DISTINCT})"
        )
    return text


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide a data file from other users
    os.replace(tmp, path)  # never half a file


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/shakespeare.txt"))
    parser.add_argument("--offline", action="store_true", help="write the stand-in without trying the network")
    parser.add_argument("--timeout", type=float, default=15.0, help="seconds to wait for the download")
    args = parser.parse_args(argv)
    out: Path = args.out
    if out.is_file():
        kept = out.read_text(encoding="utf-8", errors="replace")
        if args.offline or kept != stand_in():
            print(f"{out}: kept ({len(kept):,} characters, {len(set(kept))} distinct)")
            return 0
    if not args.offline:
        try:
            text = download(args.timeout)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        except (urllib.error.URLError, OSError) as e:  # no network, a proxy, a timeout
            reason = getattr(e, "reason", e)
            print(
                f"could not download {URL} ({reason}): writing the offline stand-in instead; "
                f"save that file as {out} for Tiny Shakespeare itself"
            )
        else:
            write(out, text)
            print(f"{out}: Tiny Shakespeare, {len(text):,} characters, {len(set(text))} distinct")
            return 0
    try:
        text = stand_in()
    except ImportError:  # a Python packaged without its docs
        print(f"error: this Python has no pydoc_data for the stand-in: save {URL} as {out}", file=sys.stderr)
        return 1
    write(out, text)
    print(
        f"{out}: Python's language reference (pydoc_data) as a stand-in for Tiny Shakespeare, "
        f"{len(text):,} characters, {len(set(text))} distinct"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
