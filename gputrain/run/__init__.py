"""The run directory, shared by every loop and every command: where a run's files are and what they
are called (`layout`), writing them (`files`), reading them without trusting them (`reader`, with
the fields each file holds: `shapes`), the run a directory already holds (`prior`), one run
at a time (`lock`), how a loop begins there (`start`), and the record every ending leaves
(`record`, `summary`), signals included (`signals`); a file system's failures said as what they are
(`fs_errors`); a test hook that holds a run at a named point until a signal comes (`hold`).

Its names are imported on first use (gputrain/lazy.py): reading a layout name loads no torch."""

from __future__ import annotations

from gputrain.lazy import lazy_exports

_EXPORTS = {
    "default_run_dir": "files",
    "run_dir_path": "files",
    "write_json": "files",
    "write_run_files": "files",
    "write_text": "files",
    "run_dir_locked": "lock",
    "PriorRun": "prior",
    "claim_run_dir": "prior",
    "prior_run": "prior",
    "RunEnding": "record",
    "RunRecorder": "record",
    "StoppedBySignal": "signals",
    "StopRequest": "signals",
    "build_summary": "summary",
}
__all__ = sorted(_EXPORTS)  # the names `from gputrain.<package> import *` gives
__getattr__ = lazy_exports(__name__, _EXPORTS)
