"""A real headless browser (Chromium, driven by its own command-line flags) opening a report from
file:// with every network name unresolvable, as on a machine that is offline.

`probe(page)` opens a copy of the page with one script appended after the page's own. That script
measures what the browser drew (each plot's marks and their extent, from the layout), moves the
pointer over a line chart and clicks a table heading (the page's script must answer both), and
writes the result into the DOM, which `--dump-dom` prints. Every console message the page caused is
collected from Chromium's log: a report must cause none.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

_PROBE = """
<script>
(function () {
  var charts = Array.prototype.map.call(document.querySelectorAll("svg.chart"), function (svg) {
    var marks = svg.querySelectorAll("path.series, .dots circle, rect.segment, .cells rect, .bars rect");
    var x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity, drawn = 0;
    Array.prototype.forEach.call(marks, function (m) {
      var b = m.getBBox();
      var visible = getComputedStyle(m).display !== "none";
      if (visible && (b.width > 0 || b.height > 0)) {
        drawn++;
        x0 = Math.min(x0, b.x); y0 = Math.min(y0, b.y);
        x1 = Math.max(x1, b.x + b.width); y1 = Math.max(y1, b.y + b.height);
      }
    });
    var r = svg.getBoundingClientRect();
    return {title: svg.getAttribute("aria-label"), kind: svg.getAttribute("data-kind"), marks: marks.length,
            drawn: drawn, extent: drawn ? [x1 - x0, y1 - y0] : [0, 0], screen: [r.width, r.height]};
  });
  var hover = null, line = document.querySelector("svg.chart[data-kind=line] path.series");
  if (line) {
    var svg = line.ownerSVGElement, first = line.getAttribute("d").match(/-?[0-9.]+/g).map(Number);
    var pt = svg.createSVGPoint();
    pt.x = first[0]; pt.y = first[1];
    var at = pt.matrixTransform(svg.getScreenCTM());
    svg.dispatchEvent(new MouseEvent("mousemove", {clientX: at.x, clientY: at.y, bubbles: true}));
    var tip = document.querySelector(".tip");
    hover = tip && tip.style.display === "block" ? tip.textContent : null;
  }
  var sorted = null, table = document.querySelector("table.sortable tbody tr td[data-value]");
  if (table) {
    var cell = table, column = Array.prototype.indexOf.call(cell.parentNode.children, cell);
    var body = cell.closest("tbody");
    cell.closest("table").tHead.rows[0].cells[column].click();
    sorted = Array.prototype.map.call(body.rows, function (row) {
      return Number(row.cells[column].getAttribute("data-value"));
    });
  }
  var out = document.createElement("pre");
  out.id = "gputrain-probe";
  out.textContent = JSON.stringify({charts: charts, hover: hover, sorted: sorted, ms: performance.now()});
  document.body.appendChild(out);
})();
</script>
"""


def find_browser() -> str | None:
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Probe:
    charts: list[dict[str, Any]]
    hover: str | None
    sorted: list[float] | None
    script_ms: float
    """performance.now() when the probe ran: parsing the page, its script and the layout."""
    wall_s: float
    """The browser process, start to exit."""
    console: list[str]
    """Console messages (errors included) the page caused."""


def _flags(browser: str, profile: str) -> list[str]:
    flags = [browser, "--headless", "--disable-gpu", "--disable-background-networking", "--no-first-run",
             f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr",
             "--v=0", "--virtual-time-budget=5000"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        flags.append("--no-sandbox")  # Chromium refuses to run as root with its sandbox
    return flags


POLICY = re.compile(r'<meta http-equiv="Content-Security-Policy" content="[^"]*">')


def with_script(text: str, script: str) -> str:
    """The page with `script` (a whole <script> element) appended after its own, and allowed by the
    page's Content-Security-Policy (its hash added to script-src, as the page names its own)."""
    body = script.strip().removeprefix("<script>").removesuffix("</script>")
    digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
    text = text.replace("script-src ", f"script-src &#x27;sha256-{digest}&#x27; ", 1)
    return text.replace("</body>", script.strip() + "</body>", 1)


def run_script(page: Path, browser: str, script: str, result_id: str, *, policy: bool = True,
               timeout: float = 120) -> tuple[Any, list[str], float]:
    """Open a copy of `page` with `script` appended (`policy` False: without the page's
    Content-Security-Policy); (the JSON the script wrote into <pre id=result_id>, the console
    messages the page caused, the browser's wall time)."""
    with tempfile.TemporaryDirectory(prefix="gputrain-browser-") as tmp:
        copy = Path(tmp) / page.name
        text = page.read_text()
        if not policy:
            text = POLICY.sub("", text, count=1)
        copy.write_text(with_script(text, script))
        started = time.perf_counter()
        result = subprocess.run([*_flags(browser, f"{tmp}/profile"), "--dump-dom", copy.as_uri()],
                                capture_output=True, text=True, timeout=timeout)
        wall = time.perf_counter() - started
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line and page.name in line]
    found = re.search(rf'<pre id="{result_id}">(.*?)</pre>', result.stdout, re.S)
    if found is None:
        raise AssertionError(f"the probe did not run (exit {result.returncode}); console: {console}; "
                             f"stderr tail: {result.stderr[-2000:]}")
    return json.loads(html.unescape(found.group(1))), console, wall


def probe(page: Path, browser: str, timeout: float = 120, policy: bool = True) -> Probe:
    data, console, wall = run_script(page, browser, _PROBE, "gputrain-probe", policy=policy, timeout=timeout)
    return Probe(data["charts"], data["hover"], data["sorted"], data["ms"], wall, console)


def screenshot(page: Path, browser: str, out: Path, width: int = 1280, height: int = 2400) -> None:
    with tempfile.TemporaryDirectory(prefix="gputrain-browser-") as tmp:
        subprocess.run([*_flags(browser, f"{tmp}/profile"), "--hide-scrollbars", f"--window-size={width},{height}",
                        f"--screenshot={out}", page.as_uri()], capture_output=True, timeout=120, check=True)
