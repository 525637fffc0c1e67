"""What `log.mlflow` accepts as a tracking URI, judged when the config is read (before torch loads),
so a URI MLflow could not open is one line and exit 2 before training, not a tracker that fails
at the first step.

Accepted: a local folder (a path, or a `file:` URI: MLflow's file store), a database
(`sqlite:///path`, `postgresql://...`, `mysql://...`, `mssql://...`: MLflow's SQLAlchemy store), or
the address of an `mlflow server` (`http://host:port`, `https://...`). The empty string: no MLflow.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

DATABASES = ("sqlite", "postgresql", "mysql", "mssql")
"""The SQLAlchemy dialects MLflow's tracking store takes (a driver may follow: postgresql+psycopg2)."""

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
SHAPES = "a folder, file:/PATH, sqlite:///PATH, postgresql://..., or http(s)://HOST:PORT of an mlflow server"


def tracking_uri_problem(uri: str) -> str | None:
    """None where MLflow can open `uri` as a tracking store, else what is wrong with it."""
    if not uri:
        return None
    if uri != uri.strip():
        return "has spaces around it"
    match = _SCHEME.match(uri)
    if match is None or (len(match.group(1)) == 1 and uri[2:3] in ("\\", "/")):  # C:\ is a path
        return None  # a folder: MLflow's file store
    scheme = match.group(1).lower()
    try:
        parts = urlsplit(uri)
        port = parts.port  # a port that is no number raises here
    except ValueError as exc:
        return f"is not a URI MLflow can open ({exc}); use {SHAPES}"
    if scheme == "file":
        return None if parts.path else f"names no folder; use {SHAPES}"
    if scheme in ("http", "https"):
        if not parts.hostname:
            return f"names no host; use {SHAPES}"
        return None if port is None or port > 0 else "has port 0; use the port the mlflow server listens on"
    if scheme.split("+")[0] in DATABASES:
        if scheme.startswith("sqlite"):
            # sqlite:// alone is an in-memory database: the run would be lost when the process ends
            return None if parts.path.strip("/") else "names no database file; use sqlite:///PATH (three slashes)"
        return None if parts.hostname else f"names no database host; use {SHAPES}"
    return f"has scheme {scheme!r}, which MLflow's tracking does not take here; use {SHAPES}"
