"""The first hour of a newcomer (issue 33), attacked with cases of our own: which torchvision a
torch build gets and from where, which command fixes each state of an install, how an index that
cannot be reached is told at once, and MFU that never reads above 100%."""

from __future__ import annotations

import http.server
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from gputrain.observe.speed import _fraction
from gputrain.torch_builds import build_index, libraries_install, torchvision_install, torchvision_series

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import install  # scripts/ is not a package

PT = "https://download.pytorch.org/whl"

# torch version -> (torchvision series, PyTorch index of its build or None for PyPI's)
BUILDS = {
    "2.0.1+cpu": ("0.15", f"{PT}/cpu"),
    "2.5.1+cu124": ("0.20", f"{PT}/cu124"),
    "2.9.0+cu128": ("0.24", f"{PT}/cu128"),
    "2.13.0+cpu": ("0.28", f"{PT}/cpu"),
    "2.13.0": ("0.28", None),  # PyPI's own build: its torchvision is on PyPI
    "2.13.0+rocm6.3": ("0.28", f"{PT}/rocm6.3"),
    "2.13.0+xpu": ("0.28", f"{PT}/xpu"),
    "2.15.0.dev20270101+cpu": ("0.30", f"{PT}/cpu"),  # past the table: the same rule
    "2.13.0+local.build": ("0.28", None),  # a local build tag that is no index
    "1.13.1+cpu": (None, f"{PT}/cpu"),
    "3.0.0": (None, None),
}


@pytest.mark.parametrize("version", list(BUILDS))
def test_each_torch_build_gets_its_torchvision_series_and_index(version: str) -> None:
    series, index = BUILDS[version]
    assert (torchvision_series(version), build_index(version)) == (series, index)
    command = torchvision_install(version)
    assert f"'torch=={version}'" in command  # always: pip keeps this torch or fails, never swaps it
    assert (f"'torchvision=={series}.*'" if series else " torchvision ") in command
    assert command.endswith(f" --index-url {index}" if index else f"'torch=={version}'")


# installed state -> what the command must start with
STATES = {
    "missing": (False, "python -m pip install 'torchvision==0.28.*'"),
    "broken (built for another torch)": (True, "python -m pip uninstall -y torchvision && python -m pip install"),
}


@pytest.mark.parametrize("state", list(STATES))
def test_a_broken_torchvision_is_removed_before_the_install(state: str) -> None:
    broken, start = STATES[state]
    assert torchvision_install("2.13.0+cpu", broken=broken).startswith(start)


def test_a_mirror_replaces_the_build_index() -> None:
    assert torchvision_install("2.13.0+cpu", index="http://mirror/cpu").endswith("--index-url http://mirror/cpu")


@pytest.mark.parametrize(("packages", "vision", "pins"), [
    (["timm"], "0.28.0+cpu", "'torch==2.13.0+cpu' 'torchvision==0.28.0+cpu'"),
    (["timm", "transformers"], "0.28.*", "'torch==2.13.0+cpu' 'torchvision==0.28.*'"),
    (["transformers"], None, "'torch==2.13.0+cpu'"),  # no torchvision named: none pulled in
])
def test_libraries_are_installed_with_torch_and_torchvision_pinned(packages, vision, pins) -> None:
    assert libraries_install(packages, "2.13.0+cpu", vision) == f"python -m pip install {' '.join(packages)} {pins}"


# ---------------------------------------------------------------- the probe
class _Status(http.server.BaseHTTPRequestHandler):
    status = 404

    def do_HEAD(self) -> None:  # http.server's name
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.HTTPServer]:
    httpd = http.server.HTTPServer(("127.0.0.1", 0), _Status)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("status", [200, 301, 403, 404, 405, 500])
def test_any_http_answer_means_the_index_is_there(server: http.server.HTTPServer, status: int) -> None:
    _Status.status = status
    assert install.unreachable(f"http://127.0.0.1:{server.server_address[1]}/whl/cpu") is None


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:{port}/whl/cpu",  # nothing listening: refused
    "not a url",
    "ftp-ish://x/y",
    "file:///nonexistent/index",
])
def test_an_index_that_cannot_be_reached_gives_a_reason(url: str) -> None:
    why = install.unreachable(url.format(port=_closed_port()), timeout=1.0)
    assert why  # a reason to print, never an exception


def test_a_silent_server_is_given_up_after_the_timeout() -> None:
    with socket.socket() as listener:  # accepts (the kernel's backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        why = install.unreachable(f"http://127.0.0.1:{listener.getsockname()[1]}/", timeout=0.2)
    assert why and "timed out" in why


# ---------------------------------------------------------------- MFU never above 100%
@pytest.mark.parametrize(("rate", "peak", "mfu"), [
    (5.0, 10.0, 0.5),
    (10.0, 10.0, 1.0),
    (21.1, 10.0, None),  # "MFU 211%": a peak measured under load; shown as none, with a warning
    (None, 10.0, None),
    (5.0, None, None),
    (0.0, 10.0, None),
])
def test_mfu_is_a_fraction_of_the_peak_or_none(rate, peak, mfu) -> None:
    assert _fraction(rate, peak) == mfu


# ---------------------------------------------------------------- install.py --ecosystem: the plan for each state
# (torch installed, torchvision installed, it imports) -> (first command, index to probe or None, commands)
ECOSYSTEM_STATES = {
    "cpu torch, no torchvision": (("2.13.0+cpu", None, False), "install 'torchvision==0.28.*' 'torch==2.13.0+cpu' "
                                  f"--index-url {PT}/cpu", f"{PT}/cpu", 2),
    "cpu torch, PyPI's torchvision (broken)": (("2.13.0+cpu", "0.28.0", False), "uninstall -y torchvision && ",
                                               f"{PT}/cpu", 2),
    "cpu torch, its torchvision": (("2.13.0+cpu", "0.28.0+cpu", True), "install timm transformers "
                                   "'torch==2.13.0+cpu' 'torchvision==0.28.0+cpu'", None, 1),
    "PyPI's torch, no torchvision": (("2.13.0", None, False), "install 'torchvision==0.28.*' 'torch==2.13.0'", None, 2),
    "cuda torch, no torchvision": (("2.9.1+cu128", None, False), "install 'torchvision==0.24.*'", f"{PT}/cu128", 2),
}


@pytest.mark.parametrize("state", list(ECOSYSTEM_STATES))
def test_install_ecosystem_plans_for_the_installed_torch(monkeypatch: pytest.MonkeyPatch, state: str) -> None:
    (torch_version, vision, works), first, index, count = ECOSYSTEM_STATES[state]
    monkeypatch.setattr(install, "installed", {"torch": torch_version, "torchvision": vision}.get)
    monkeypatch.setattr(install, "torchvision_works", lambda: works)
    steps, needs, _ = install.ecosystem_steps(None)
    assert first in steps[0] and needs == index and len(steps) == count
    assert all(f"'torch=={torch_version}'" in step for step in steps)  # no step can replace torch
