"""The rendezvous endpoint of a launch (`--rdzv-endpoint HOST:PORT`), checked before torchrun's c10d
rendezvous starts: its form, that its name resolves, and that it can serve the rendezvous (node 0
hosting it on this machine: the port is free; any other node: something answers there), each within
a bounded wait (`--rdzv-timeout`). Left to torchrun, a name that does not resolve printed c10d's
connection warnings for 100 s, then a 104-line traceback (exit 1); a port out of range, a
traceback at once. Here each is one line naming the endpoint and what to check, exit 2.
"""

from __future__ import annotations

import contextlib
import math
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from gputrain.errors import UsageError

DEFAULT_WAIT_S = 60.0
"""How long a launcher waits for its rendezvous endpoint to resolve and answer (`--rdzv-timeout`)."""
RETRY_S = 0.5
"""The pause between two attempts to reach node 0 (which may start after this node)."""

_FORM = "HOST:PORT (node 0's address and a free port, the same on every node, e.g. node0.cluster:29500)"
_WAIT = "--rdzv-timeout S waits longer"


class RendezvousFailed(UsageError):
    """The endpoint cannot serve the rendezvous: the launch stops before any rank starts."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_endpoint(text: str) -> Endpoint:
    """`HOST:PORT` or `[IPv6]:PORT`, the port in 1..65535 (0 would be a different free port on each node).

    Raises:
        UsageError: naming the option, what it holds and the form it needs.
    """
    host, sep, port = text.strip().rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    host = host[1:-1] if bracketed else host
    if not text.strip():
        why = "it is empty"
    elif text.strip().endswith("]"):  # [ADDRESS] alone
        why = "no port"
    elif ":" in host and not bracketed:  # its last group would pass for the port
        why = "more than one ':' (an IPv6 address goes in brackets: [ADDRESS]:PORT)"
    elif not sep or not port:
        why = "no port"
    elif not host:
        why = "no host"
    elif any(ch.isspace() or not ch.isprintable() for ch in host):
        why = "the host holds spaces or control characters"
    elif not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        why = "the port must be a number in 1..65535"
    else:
        return Endpoint(host, int(port))
    raise UsageError(f"--rdzv-endpoint {text!r}: {why}; give {_FORM}")


def check_wait(seconds: float) -> None:
    if not (math.isfinite(seconds) and seconds > 0):
        raise UsageError(f"--rdzv-timeout must be a number of seconds > 0, not {seconds}")


def _bounded(what: Callable[[], bool], wait_s: float) -> bool | None:
    """`what()` in a thread of its own, waited for at most `wait_s`: None where it has not returned (a
    name lookup may hang on an unanswering DNS server; the thread is left to end by itself). An
    exception of `what` is raised here."""
    box: list[bool | BaseException] = []

    def run() -> None:
        try:
            box.append(what())
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            box.append(err)

    thread = threading.Thread(target=run, name="gputrain-rdzv-lookup", daemon=True)
    thread.start()
    thread.join(wait_s)
    if not box:
        return None
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def _is_this_machine(host: str, matches: Callable[[str], bool]) -> bool:
    """Whether `host` names this machine (`matches`: torchrun's rule, by which it then hosts the
    rendezvous store here). Raises socket.gaierror where the name does not resolve."""
    socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    return bool(matches(host))


def _port_free(endpoint: Endpoint) -> bool:
    family = socket.AF_INET6 if ":" in endpoint.host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store binds: TIME_WAIT is no obstacle
        try:
            probe.bind(("", endpoint.port))
        except OSError:
            return False
    return True


def _answers(endpoint: Endpoint, wait_s: float) -> bool:
    """Whether something accepts a connection at the endpoint within `wait_s`, trying again while
    nothing does (node 0 may be starting)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = deadline - time.monotonic()
        with contextlib.suppress(OSError):
            socket.create_connection((endpoint.host, endpoint.port), timeout=max(0.1, min(left, 5.0))).close()
            return True
        if left <= RETRY_S:
            return False
        time.sleep(RETRY_S)  # paces the attempts; the deadline decides


def check_rendezvous(text: str, *, node_rank: int, wait_s: float = DEFAULT_WAIT_S) -> Endpoint:
    """The endpoint `text`, checked as torchrun's c10d rendezvous will use it, in at most about `wait_s`.

    Raises:
        RendezvousFailed: one line naming the endpoint and what to check (exit 2).
    """
    from torch.distributed.elastic.rendezvous.utils import _matches_machine_hostname  # before the clock starts

    check_wait(wait_s)
    endpoint = parse_endpoint(text)
    began = time.monotonic()
    try:
        here = _bounded(lambda: _is_this_machine(endpoint.host, _matches_machine_hostname), wait_s)
    except (OSError, UnicodeError):
        raise RendezvousFailed(
            f"--rdzv-endpoint {endpoint}: the host name {endpoint.host!r} does not resolve (check the DNS name: "
            "node 0's address as every node can reach it)"
        ) from None
    if here is None:
        raise RendezvousFailed(
            f"--rdzv-endpoint {endpoint}: looking up {endpoint.host!r} took over {wait_s:g} s (check the DNS name "
            f"and this machine's DNS servers; {_WAIT})"
        )
    if here and node_rank == 0:  # this launcher hosts the rendezvous: it binds the port
        if not _port_free(endpoint):
            raise RendezvousFailed(
                f"--rdzv-endpoint {endpoint}: port {endpoint.port} on this machine is in use by another process "
                "(choose a free port, the same on every node)"
            )
        return endpoint
    if not _answers(endpoint, max(0.0, wait_s - (time.monotonic() - began))):
        raise RendezvousFailed(
            f"--rdzv-endpoint {endpoint}: nothing answered there within {wait_s:g} s (check that node 0 has "
            f"started with this endpoint, the port, and that no firewall blocks it; {_WAIT})"
        )
    return endpoint
