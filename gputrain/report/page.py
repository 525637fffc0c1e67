"""The HTML around the plots: one page with its style and script inline (it must open from
file:// on a machine that is offline), sections, tables and figures.

The script is small and optional: without it every plot and table is still there; with it, the
values under the pointer show on line charts, and a click on a column heading sorts a table.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

from gputrain.report.escape import css_colour, data_number, esc
from gputrain.report.scale import format_number
from gputrain.report.svg import Figure

STYLE = """
:root{--bg:#fff;--fg:#1d2330;--muted:#5b6475;--line:#d9dde5;--grid:#eceef3;--card:#f7f8fa;--accent:#1f77b4}
@media (prefers-color-scheme:dark){:root{--bg:#15181e;--fg:#e3e6ec;--muted:#9aa3b2;--line:#333a46;
--grid:#252a33;--card:#1c2028;--accent:#6aaee0}}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
main{max-width:1280px;margin:0 auto;padding:8px 20px 60px}
nav{position:sticky;top:0;z-index:2;background:var(--bg);border-bottom:1px solid var(--line);padding:6px 20px;
font-size:13px;display:flex;flex-wrap:wrap;gap:4px 14px}
nav a{color:var(--muted);text-decoration:none}nav a:hover{color:var(--accent)}
h1{font-size:22px;margin:18px 0 2px}
h2{font-size:18px;margin:30px 0 10px;padding-top:6px;border-top:1px solid var(--line)}
h3{font-size:15px;margin:16px 0 6px}
.path{color:var(--muted);font-family:ui-monospace,monospace;font-size:12px;word-break:break-all}
.badge{display:inline-block;padding:1px 9px;border-radius:10px;font-size:12px;font-weight:600;color:#fff;
vertical-align:middle;margin-left:8px}
.s-completed,.s-stopped_early{background:#2ca02c}.s-failed{background:#d62728}.s-interrupted,.s-timed_out{background:#e08a0b}
.s-running{background:#1f77b4}.s-lr-find{background:#9467bd}.s-unknown{background:#7f7f7f}
.facts{display:grid;grid-template-columns:repeat(auto-fill,minmax(190px,1fr));gap:8px;margin:12px 0}
.fact{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:6px 10px}
.fact b{display:block;font-size:11px;font-weight:500;color:var(--muted);text-transform:uppercase;letter-spacing:.03em}
.fact span{font-size:15px;font-variant-numeric:tabular-nums}
.note{color:var(--muted);font-size:13px;margin:4px 0}
.alert{border-left:4px solid #d62728;background:var(--card);padding:8px 12px;margin:10px 0;border-radius:4px}
.alert.warn{border-color:#e08a0b}.alert.info{border-color:#1f77b4}
.plots{display:grid;grid-template-columns:repeat(auto-fill,minmax(470px,1fr));gap:14px}
figure{margin:0;background:var(--card);border:1px solid var(--line);border-radius:6px;padding:8px 10px 6px;
position:relative}
figcaption{font-weight:600;font-size:13px;margin-bottom:2px}
svg.chart{width:100%;height:auto;display:block;font-size:11px}
svg.chart text{fill:var(--muted)}
svg.chart .frame{fill:none;stroke:var(--line)}
svg.chart .grid line{stroke:var(--grid)}
svg.chart path.series{fill:none;stroke-linejoin:round;stroke-linecap:round}
svg.chart .chance{stroke:var(--muted);stroke-dasharray:4 4;stroke-width:1}
svg.chart .mark{stroke-dasharray:5 3;stroke-width:1.5}
svg.chart text.mark-label{font-weight:600}
svg.chart .cell-text text{fill:var(--fg)}
svg.chart .cells rect{stroke:var(--line);stroke-width:.5}
svg.chart text.on-bar{fill:#fff;font-weight:600}
svg.chart .cross{stroke:var(--muted);stroke-width:1;pointer-events:none}
.legend{display:flex;flex-wrap:wrap;gap:2px 12px;font-size:12px;color:var(--muted);margin-top:2px}
.legend i{display:inline-block;width:14px;height:3px;margin-right:5px;vertical-align:middle;border-radius:1px}
.legend i.dash{background-image:linear-gradient(90deg,transparent 50%,var(--card) 50%);background-size:6px 3px}
table{border-collapse:collapse;font-size:13px;margin:6px 0;font-variant-numeric:tabular-nums}
th,td{border-bottom:1px solid var(--line);padding:3px 10px;text-align:left;vertical-align:top}
th{font-weight:600;color:var(--muted);cursor:pointer;user-select:none}
td.num{text-align:right}td.best{font-weight:700;color:var(--accent)}
.scroll{overflow-x:auto;max-height:520px;overflow-y:auto}
details{margin:8px 0}summary{cursor:pointer;color:var(--accent)}
pre{background:var(--card);border:1px solid var(--line);border-radius:6px;padding:10px;overflow:auto;font-size:12px;
max-height:560px}
.tip{position:fixed;pointer-events:none;background:var(--bg);border:1px solid var(--line);border-radius:5px;
padding:5px 8px;font-size:12px;box-shadow:0 2px 8px rgba(0,0,0,.15);display:none;z-index:5;white-space:nowrap}
.tip i{display:inline-block;width:9px;height:9px;border-radius:5px;margin-right:5px}
footer{margin-top:40px;color:var(--muted);font-size:12px}
"""

SCRIPT = """
(function () {
  "use strict";
  var tip = document.createElement("div");
  tip.className = "tip";
  document.body.appendChild(tip);
  function axis(text) {
    var p = text.split(" ").map(Number);
    return {lo: p[0], hi: p[1], p0: p[2], p1: p[3], log: p[4] === 1};
  }
  function invert(a, px) {
    var t = (px - a.p0) / (a.p1 - a.p0);
    if (a.log) {
      var lo = Math.log10(a.lo), hi = Math.log10(a.hi);
      return Math.pow(10, lo + t * (hi - lo));
    }
    return a.lo + t * (a.hi - a.lo);
  }
  function fmt(v) {
    var m = Math.abs(v);
    if (!isFinite(v)) return String(v);
    if (m !== 0 && (m >= 1e5 || m < 1e-3)) return v.toExponential(3);
    return String(Number(v.toPrecision(5)));
  }
  function points(path) {
    if (!path._points) {
      var n = (path.getAttribute("d").match(/-?[0-9.]+/g) || []).map(Number), pts = [];
      for (var i = 0; i + 1 < n.length; i += 2) pts.push([n[i], n[i + 1]]);
      path._points = pts;
    }
    return path._points;
  }
  function escapeText(s) {
    var entities = {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"};
    return String(s).replace(/[&<>"]/g, function (c) { return entities[c]; });
  }
  document.querySelectorAll("svg.chart[data-kind=line]").forEach(function (svg) {
    var ax = axis(svg.getAttribute("data-x")), ay = axis(svg.getAttribute("data-y"));
    var cross = document.createElementNS("http://www.w3.org/2000/svg", "line");
    cross.setAttribute("class", "cross");
    cross.setAttribute("y1", Math.min(ay.p0, ay.p1));
    cross.setAttribute("y2", Math.max(ay.p0, ay.p1));
    cross.style.display = "none";
    svg.appendChild(cross);
    function hide() { tip.style.display = "none"; cross.style.display = "none"; }
    svg.addEventListener("mouseleave", hide);
    svg.addEventListener("mousemove", function (ev) {
      var ctm = svg.getScreenCTM();
      if (!ctm) return;
      var pt = svg.createSVGPoint();
      pt.x = ev.clientX; pt.y = ev.clientY;
      var p = pt.matrixTransform(ctm.inverse());
      if (p.x < Math.min(ax.p0, ax.p1) - 4 || p.x > Math.max(ax.p0, ax.p1) + 4) { hide(); return; }
      var rows = [], xAt = null;
      svg.querySelectorAll("path.series").forEach(function (path) {
        var best = null, gap = Infinity;
        points(path).forEach(function (q) { var d = Math.abs(q[0] - p.x); if (d < gap) { gap = d; best = q; } });
        if (best && gap < 14) {
          if (xAt === null) xAt = best[0];
          rows.push('<div><i style="background:' + path.getAttribute("stroke") + '"></i>' +
            escapeText(path.getAttribute("data-name")) + ": <b>" + fmt(invert(ay, best[1])) + "</b></div>");
        }
      });
      if (!rows.length) { hide(); return; }
      cross.setAttribute("x1", xAt); cross.setAttribute("x2", xAt); cross.style.display = "";
      tip.innerHTML = "<div>" + escapeText(svg.getAttribute("data-xname") || "x") + " " + fmt(invert(ax, xAt)) +
        "</div>" + rows.join("");
      tip.style.display = "block";
      var left = ev.clientX + 14, room = window.innerWidth - tip.offsetWidth - 8;
      tip.style.left = Math.min(left, room) + "px";
      tip.style.top = (ev.clientY + 12) + "px";
    });
  });
  document.querySelectorAll("table.sortable th").forEach(function (th, column) {
    th.addEventListener("click", function () {
      var table = th.closest("table"), body = table.tBodies[0];
      var index = Array.prototype.indexOf.call(th.parentNode.children, th);
      var down = th.getAttribute("data-down") !== "1";
      th.setAttribute("data-down", down ? "1" : "0");
      var rows = Array.prototype.slice.call(body.rows);
      function key(row) {
        var cell = row.cells[index];
        if (!cell) return "";
        var v = cell.getAttribute("data-value");
        return v !== null && v !== "" && !isNaN(Number(v)) ? Number(v) : cell.textContent;
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b);
        var c = (typeof x === "number" && typeof y === "number") ? x - y : String(x).localeCompare(String(y));
        return down ? -c : c;
      });
      rows.forEach(function (row) { body.appendChild(row); });
    });
  });
})();
"""


@dataclass(frozen=True, slots=True)
class Cell:
    """A table cell: its text, and the number behind it (sorting, and the exact value for
    anyone reading the file: `data-value`)."""

    text: str
    value: float | None = None
    best: bool = False


Row = list["str | Cell"]
"""A table row: plain text cells and number cells."""


def num(value: float | None, digits: int = 4) -> Cell:
    """A number cell: `digits` decimals for figures in [0, 1] and near, else compact."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):  # a string where a number belongs
        return Cell("–" if value is None else str(value))
    if isinstance(value, float) and not math.isfinite(value):
        return Cell("–")
    shown = f"{value:.{digits}f}" if abs(value) < 1e4 and (value == 0 or abs(value) >= 1e-3) else format_number(value)
    return Cell(shown, float(value))


def number(value: object) -> float | None:
    """`value` where it is a number, else None: a hand-edited file may hold text where a number
    belongs, and a figure computed from it (a share, a scaled unit) is left out rather than guessed."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:  # an integer past a float's range
            return None
    return None


def shown(value: object, spec: str) -> str:
    """A number formatted by `spec`; anything else (a string where a number belongs, in a hand-edited
    file) as its own text, for the caller to escape like any text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format(value, spec)
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[str | Cell]], sortable: bool = True) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for cell in row:
            if isinstance(cell, Cell):
                number = data_number(cell.value)
                classes = " ".join(c for c in ("num" if number else "", "best" if cell.best else "") if c)
                value = f' data-value="{esc(number)}"' if number else ""
                cells.append(f'<td class="{classes}"{value}>{esc(cell.text)}</td>')
            else:
                cells.append(f"<td>{esc(cell)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    cls = ' class="sortable"' if sortable else ""
    return f'<div class="scroll"><table{cls}><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def facts(pairs: Sequence[tuple[str, str]]) -> str:
    """Headline facts as tiles."""
    tiles = "".join(f'<div class="fact"><b>{esc(k)}</b><span>{esc(v)}</span></div>' for k, v in pairs)
    return f'<div class="facts">{tiles}</div>'


def figure(fig: Figure, x_name: str = "") -> str:
    legend = "".join(
        f'<span><i class="{"dash" if dash else ""}" style="background-color:{css_colour(colour)}"></i>'
        f"{esc(name)}</span>"
        for name, colour, dash in fig.legend
    )
    svg = fig.svg.replace("<svg ", f'<svg data-xname="{esc(x_name)}" ', 1) if x_name else fig.svg
    note = f'<div class="note">{esc(fig.note)}</div>' if fig.note else ""
    return (
        f"<figure><figcaption>{esc(fig.title)}</figcaption>{svg}"
        + (f'<div class="legend">{legend}</div>' if legend else "")
        + f"{note}</figure>"
    )


def plots(figures: Sequence[Figure], x_name: str = "") -> str:
    return f'<div class="plots">{"".join(figure(f, x_name) for f in figures)}</div>' if figures else ""


@dataclass(frozen=True, slots=True)
class Section:
    anchor: str
    title: str
    body: str


GENERATOR = '<meta name="generator" content="gputrain">'
"""Marks a page as gputrain's: `gputrain report` replaces no other file (report/build.py's is_report)."""
POLICY = (
    "default-src 'none'; "
    f"script-src 'sha256-{base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()}'; "
    "style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
)
"""The page's Content-Security-Policy, a second wall behind escape.py: only the page's own script
runs (named by its hash: no inline handler, no other <script>), and nothing is fetched (no image,
frame, font or connection, so no style could send anything anywhere). Styles stay inline-allowed:
the legend's colours are style attributes, and without a fetch a style can only change looks."""


def page(title: str, top: str, sections: Sequence[Section], footer: str) -> str:
    """The whole document: no external reference of any kind (no URL is fetched when it opens)."""
    shown = [s for s in sections if s.body]
    nav = "".join(f'<a href="#{esc(s.anchor)}">{esc(s.title)}</a>' for s in shown)
    body = "".join(f'<section id="{esc(s.anchor)}"><h2>{esc(s.title)}</h2>{s.body}</section>' for s in shown)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{esc(POLICY)}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"{GENERATOR}<title>{esc(title)}</title><style>{STYLE}</style></head><body>"
        f"<nav>{nav}</nav><main>{top}{body}<footer>{footer}</footer></main>"
        f"<script>{SCRIPT}</script></body></html>\n"
    )
