"""The errors a user sees. Each maps to one exit code and prints as one short message."""

from __future__ import annotations

from typing import Any


class GputrainError(Exception):
    """Base class: `str(err)` is the whole message shown to the user, no traceback.

    `shown`: the user has seen the message already (a job's rank 0 printed it, the launcher only
    passes the ending on): the command line exits with the code and prints nothing more."""

    exit_code = 1

    def __init__(self, *args: object, shown: bool = False) -> None:
        super().__init__(*args)
        self.shown = shown


class UsageError(GputrainError):
    """Bad command line, config or input: exit code 2, raised before anything heavy starts."""

    exit_code = 2


class ConfigError(UsageError):
    """A config field has a bad value. The message names the field and what would be right."""

    def __init__(self, field: str, problem: str, value: Any = None, hint: str | None = None) -> None:
        self.field = field
        self.problem = problem
        self.value = value
        shown = "" if value is None else f" = {value!r}"
        message = f"config error: {field}{shown}: {problem}"
        if hint:
            message += f"\n  {hint}"
        super().__init__(message)


class DataError(UsageError):
    """A data file or path is missing or malformed. The message names the file."""


class RunError(GputrainError):
    """A failure while training: exit code 1. The message names the step (and rank)."""


class Interrupted(GputrainError):
    """Ctrl-C or SIGTERM: a checkpoint was written, exit code 130."""

    exit_code = 130


def first_line(err: BaseException, limit: int = 200) -> str:
    """The first line of `err`'s message, at most `limit` characters (its type's name where it has
    none): a foreign library's error, quoted inside one short message."""
    text = str(err).strip()
    return text.splitlines()[0][:limit] if text else type(err).__name__
