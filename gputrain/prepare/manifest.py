"""The records of a prepared folder: `manifest.json` (contract §3: what S and T read) and, while the
work goes on, `.prepare-state.json` (what a rerun of the same command continues from).

Both name the corpus by its files' resolved paths, sizes and sha256, and the settings the ids depend
on. A rerun compares them with its own: the same → continue (or, complete, leave as it is); other
paths or settings → another corpus, refused; the same paths with other bytes → "a corpus that changed
since prepare", refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gputrain.checksum import sha256_of
from gputrain.errors import DataError, UsageError
from gputrain.prepare.sources import SourceFile
from gputrain.run.output import atomic, marked, read_json

MANIFEST = "manifest.json"
STATE = ".prepare-state.json"
SOURCES = ".prepare-sources.json"
"""The state's list of source files, written once at the start: the state, saved after every batch,
stays small whatever the number of files."""
FORMAT = "gputrain-tokens"
VERSION = 1


def fingerprint(files: list[SourceFile]) -> list[dict[str, Any]]:
    """Each source file's resolved path, size and sha256 (the manifest's "sources")."""
    rows = []
    for f in files:
        try:
            digest = sha256_of(f.path)
        except OSError as err:
            raise DataError(f"{f.path}: cannot be read ({err.strerror or err})") from None
        rows.append({"path": str(f.path), "bytes": f.path.stat().st_size, "sha256": digest})
    return rows


def write_json(path: Path, data: dict[str, Any]) -> None:
    """`data` as sorted, indented JSON, written whole or not at all."""
    with atomic(path) as tmp:
        tmp.write_text(json.dumps(data, sort_keys=True, indent=1) + "\n", encoding="utf-8")


def read_state(out: Path) -> dict[str, Any] | None:
    """The resume state with its sources (None where there is none, or it is not prepare's)."""
    data = read_json(out / STATE)
    if not (isinstance(data, dict) and data.get("written_by") == marked("prepare")["written_by"]):
        return None
    sources = read_json(out / SOURCES)
    return {**data, "sources": sources.get("sources") if isinstance(sources, dict) else None}


def write_state(out: Path, state: dict[str, Any], *, first: bool = False) -> None:
    """The resume state (its sources only `first`, to their own file)."""
    if first:
        write_json(out / SOURCES, {**marked("prepare"), "sources": state["sources"]})
    write_json(out / STATE, {k: v for k, v in state.items() if k != "sources"})


def read_manifest(out: Path) -> dict[str, Any] | None:
    data = read_json(out / MANIFEST)
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def same_corpus(out: Path, recorded: dict[str, Any], sources: list[dict[str, Any]], settings: dict[str, Any]) -> None:
    """`recorded` (a manifest or a state) is of this command's corpus and settings.

    Raises:
        UsageError: other sources or settings (another corpus: another --out is wanted).
        DataError: the same files with other bytes: a corpus that changed since prepare.
    """
    before = recorded.get("settings")
    if before != settings:
        changed = sorted(k for k in {*settings, *(before or {})} if (before or {}).get(k) != settings.get(k))
        raise UsageError(
            f"--out {out}: was prepared with other settings ({', '.join(changed)}); run the same command, or "
            "choose another --out"
        )
    paths = [row["path"] for row in sources]
    old = recorded.get("sources") or []
    if [row.get("path") for row in old] != paths:
        raise UsageError(
            f"--out {out}: was prepared from other source files ({len(old)} before, {len(paths)} now); "
            "a corpus that changed since prepare: choose another --out"
        )
    for now, then in zip(sources, old, strict=True):
        if now != then:
            raise DataError(
                f"{now['path']}: a corpus that changed since prepare ({then.get('bytes')} bytes then, {now['bytes']} "
                f"now{', other content' if now['bytes'] == then.get('bytes') else ''}); prepare it into another --out"
            )


def manifest(
    *,
    dtype: str,
    vocab_size: int,
    eos_id: int,
    tokenizer: dict[str, Any],
    splits: dict[str, Any],
    sources: list[dict[str, Any]],
    settings: dict[str, Any],
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "dtype": dtype,
        "vocab_size": vocab_size,
        "eos_id": eos_id,
        "tokenizer": tokenizer,
        "splits": splits,
        "sources": sources,
        "settings": settings,
    }
