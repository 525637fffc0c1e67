"""Which files of an export folder may be loaded: those its export.json vouches for by checksum.

`export` records in export.json the SHA-256 and size of every file it wrote (checkpoint/io.py's
`file_digest`: the checkpoints' manifest entries). Whatever loads an export folder again (the
verification of `export` and `export --verify-only`, `--checkpoint EXPORT_DIR`, a safetensors
export given as the run) checks each file it will read against that record first; a file whose
checksum is missing or differs, a link, or anything but a plain file is refused in one line naming
it (a UsageError: exit 2) before a byte of it is loaded.

An AOTInductor package (`model-aoti.pt2`) is native code: loading it runs its shared library's
constructors. It is loaded from a private copy whose bytes were hashed as they were copied, so what
was checked is what runs whatever happens to the folder meanwhile; and only when export.json, the
package and the folder are the user's own (owned by them or by root, writable by no other user):
an export in a place others can write is someone else's code.

The trust boundary: export.json is written by gputrain but not signed. Checksums that match it say
the files are the ones whoever wrote that export.json wrote. So a replaced, added or damaged artifact
beside an export.json that gputrain wrote is refused; a folder made whole by someone else, export.json
included, is their code, as a program of theirs would be: load an AOTInductor package only from an
export you made (docs/use.md). The other formats are data: `.pt2` programs are read weights-only and
pickle-free (use/safe_pt2.py), safetensors and ONNX hold no code.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from gputrain.checkpoint.io import file_digest
from gputrain.errors import RunError, UsageError
from gputrain.run.layout import EXPORT_RECORD

RECORD_LIMIT = 1 << 20
"""export.json's largest size: gputrain writes a few kilobytes."""
_REEXPORT = "re-export"


class UntrustedFile(UsageError):
    """A file an export loader would read is not the one the export wrote; the message names it."""


def record_checksums(out: Path, files: Iterable[str]) -> dict[str, dict[str, Any]]:
    """export.json's `checksums`: each written file's SHA-256 and size."""
    return {name: file_digest(out / name) for name in files}


def read_record(out: Path) -> dict[str, Any]:
    """The export.json of the export folder `out`: a plain file of at most RECORD_LIMIT bytes holding a
    JSON object (what is in it is the caller's to check).

    Raises:
        UsageError: there is none, or it is not such a file.
    """
    path = out / EXPORT_RECORD
    try:
        mode = path.lstat().st_mode
    except OSError:
        raise UsageError(f"{out}: no {EXPORT_RECORD}; give the folder gputrain export wrote") from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"{path}: not a plain file; give the folder gputrain export wrote")
    try:
        with path.open("rb") as f:
            text = f.read(RECORD_LIMIT + 1)
        if len(text) > RECORD_LIMIT:
            raise UsageError(f"{path}: over {RECORD_LIMIT} bytes, not what gputrain export writes; {_REEXPORT}")
        record = json.loads(text)
    except (OSError, ValueError, RecursionError):
        raise UsageError(f"{path}: unreadable or not JSON; {_REEXPORT}") from None
    if not isinstance(record, dict):
        raise UsageError(f"{path}: not an export's JSON object; {_REEXPORT}")
    return record


def check_files(out: Path, record: dict[str, Any], names: Iterable[str]) -> None:
    """Each of `names` in `out` is the file the export wrote, by export.json's checksum (module docstring).

    Raises:
        UntrustedFile: naming the first that is not.
    """
    for name in names:
        _compare(out / name, _expected(out, record, name), _digest_in_place(out / name))


@contextlib.contextmanager
def native_copy(out: Path, record: dict[str, Any], name: str) -> Iterator[Path]:
    """A private copy of the native-code file `out/name`, its bytes hashed as they are copied and checked
    against export.json; removed on leaving. Refused unless export.json, the file and `out` are the
    user's own (module docstring).

    Raises:
        UntrustedFile: the file is not the one the export wrote, or other users could have changed it.
        RunError: no room for the copy.
    """
    file = out / name
    expected = _expected(out, record, name)
    check_native_owners(out, name)
    private = Path(tempfile.mkdtemp(prefix="gputrain-export-"))  # mode 0700: no one else can swap it
    try:
        copy = private / name
        _compare(file, expected, _copy_hashed(file, copy))
        yield copy
    finally:
        shutil.rmtree(private, ignore_errors=True)


def check_native_owners(out: Path, name: str) -> None:
    """`out`, its export.json and the native-code file `out/name` are the user's own: no other user
    could have replaced them (module docstring).

    Raises:
        UntrustedFile: naming the path others could change.
    """
    file = out / name
    checked = [out, file]
    if os.path.lexists(out / EXPORT_RECORD):  # an export being made holds its record in memory alone
        checked.insert(1, out / EXPORT_RECORD)
    for path in checked:
        _check_owner(path, file)


def _expected(out: Path, record: dict[str, Any], name: str) -> dict[str, Any]:
    checksums = record.get("checksums")
    entry = checksums.get(name) if isinstance(checksums, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) or type(entry.get("bytes")) is not int:
        raise UntrustedFile(
            f"{out / name} was not written by this export ({EXPORT_RECORD} records no checksum for it); {_REEXPORT}"
        )
    return entry


def _compare(file: Path, expected: dict[str, Any], got: dict[str, Any]) -> None:
    if got["bytes"] != expected["bytes"] or got["sha256"] != expected["sha256"]:
        raise UntrustedFile(f"{file} was not written by this export (checksum differs); {_REEXPORT}")


def _plain_file(file: Path) -> os.stat_result:
    """`file`'s status, refused unless it is a plain file (not a link, a FIFO, a device)."""
    try:
        status = file.lstat()
    except OSError:
        raise UntrustedFile(f"{file}: missing; {_REEXPORT}") from None
    if not stat.S_ISREG(status.st_mode):
        raise UntrustedFile(f"{file}: not a plain file (an export writes only plain files); {_REEXPORT}")
    return status


def _digest_in_place(file: Path) -> dict[str, Any]:
    _plain_file(file)
    try:
        return file_digest(file)
    except OSError as err:
        raise UntrustedFile(f"{file}: unreadable ({err.strerror}); {_REEXPORT}") from None


def _copy_hashed(file: Path, copy: Path) -> dict[str, Any]:
    """Copy `file` to `copy`, hashing the bytes written; their digest."""
    _plain_file(file)
    digest, size = hashlib.sha256(), 0
    try:
        with file.open("rb") as src, copy.open("wb") as dst:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                digest.update(chunk)
                dst.write(chunk)
                size += len(chunk)
    except OSError as err:
        raise RunError(f"cannot copy {file} to a private folder to load it ({err.strerror})") from None
    return {"sha256": digest.hexdigest(), "bytes": size}


def _check_owner(path: Path, file: Path) -> None:
    """Refuse native code where a user other than this one (or root) owns `path` or may write to it."""
    try:
        status = path.stat()
    except OSError:
        raise UntrustedFile(f"{path}: missing; {_REEXPORT}") from None
    mode = status.st_mode
    # a world-writable folder with the sticky bit (/tmp) lets no one else replace our files
    others_write = mode & stat.S_IWOTH and not (stat.S_ISDIR(mode) and mode & stat.S_ISVTX)
    if status.st_uid not in (os.geteuid(), 0) or others_write:
        who = "writable by every user" if others_write else f"owned by another user (uid {status.st_uid})"
        raise UntrustedFile(
            f"{file}: native code, refused: {path} is {who}, so this export may not be yours; "
            f"{_REEXPORT} into a folder of your own"
        )
