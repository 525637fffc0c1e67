"""Script injection into report.html: a report is a file people send each other, and everything a
run directory holds is untrusted text there. Every field of every file the report reads (summary.json,
env.json, config.toml's keys and values, metrics.jsonl's keys and values, lr_find.json, the profile's
findings, error.log, scores-test.npz's task, the directory's own name) holds a hostile string, in five
runs of different states (failed, an interrupted RL run, an LR sweep's own directory, one still going,
one interrupted before its first row). Per payload, the failed run's page and the five compared are
opened in a real headless Chromium; the other runs' pages once, with every payload in every field.
They open without the page's Content-Security-Policy: escaping alone must hold (the policy is
tested on its own in tests/unit/report/test_browser.py). No payload may run (each sets
document.title), and the DOM may hold no element or attribute the report does not write: no
handler, no image, no frame, no link out. Each value must show as its own characters (escaped
once: not dropped, not escaped twice).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gputrain.config.load import read_toml
from gputrain.report.build import write_report
from tests.unit.report.browser import NAMES, find_browser, run_script

BROWSER = find_browser()
pytestmark = pytest.mark.skipif(
    BROWSER is None, reason=f"no headless browser ({', '.join(NAMES)} not on PATH): apt-get install chromium"
)

RUN = "document.title=1337"
"""What every payload runs: the page's title changed (a title is set only by the page itself)."""

PAYLOADS = {
    "script element": f"<script>{RUN}</script>",
    "attribute broken by a double quote": f'"><img src=x onerror={RUN}>',
    "script element ended": f"</script><script>{RUN}</script>",
    "javascript: URL": f"javascript:{RUN}",
    "attribute broken by a single quote": f"' autofocus onfocus={RUN} x='",
    "SVG foreignObject": f"<svg><foreignObject><img src=x onerror={RUN}></foreignObject></svg>",
    "raw-text elements ended": f"</title></style></textarea></pre><img src=x onerror={RUN}>",
    "comment ended": f"--><img src=x onerror={RUN}><!--",
    "entities that must stay text": f"&lt;img src=x onerror={RUN}&gt;&#60;b&#62;&amp;",
    "line separators and a frame": f"\u2028\u2029<iframe srcdoc='<script>parent.{RUN}</script>'></iframe>",
    "SVG element with a handler": f"<svg onload={RUN}><a href=javascript:{RUN}><text>x</text></a></svg>",
    "unquoted attribute and style": f"x onmouseover={RUN} style=background:url(javascript:{RUN})",
}

TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "script",
    "body",
    "nav",
    "main",
    "footer",
    "section",
    "h1",
    "h2",
    "h3",
    "div",
    "span",
    "p",
    "b",
    "i",
    "a",
    "code",
    "pre",
    "details",
    "summary",
    "ul",
    "li",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "figure",
    "figcaption",
    "svg",
    "g",
    "defs",
    "clippath",
    "rect",
    "line",
    "path",
    "circle",
    "text",
}
"""Every element the report writes (lower case, as the DOM names them)."""
ATTRIBUTES = {
    "lang",
    "charset",
    "http-equiv",
    "name",
    "content",
    "class",
    "id",
    "href",
    "style",
    "data-value",
    "data-down",
    "data-kind",
    "data-x",
    "data-y",
    "data-xname",
    "data-name",
    "data-part",
    "viewbox",
    "role",
    "aria-label",
    "x",
    "y",
    "x1",
    "y1",
    "x2",
    "y2",
    "cx",
    "cy",
    "r",
    "d",
    "width",
    "height",
    "transform",
    "text-anchor",
    "font-size",
    "fill",
    "fill-opacity",
    "stroke",
    "stroke-width",
    "stroke-opacity",
    "stroke-dasharray",
    "clip-path",
}
"""Every attribute the report (and its script) writes."""
STYLE = re.compile(
    r"(background(-color)?:\s*(#[0-9a-f]{3,6}|rgb\([0-9, ]+\));?\s*)?(display: (none|block);\s*)?"
    r"(left: [0-9.-]+px; top: [0-9.-]+px;\s*)?"
)

_INSPECT = """<script>
addEventListener("load", function () {
  var tags = {}, attributes = {}, hrefs = [], styles = [], tips = "";
  function walk(root) {
    [root].concat(Array.prototype.slice.call(root.querySelectorAll("*"))).forEach(function (el) {
      tags[el.localName.toLowerCase()] = 1;
      Array.prototype.forEach.call(el.attributes, function (a) {
        attributes[a.name.toLowerCase()] = 1;
        if (a.name === "href") hrefs.push(a.value);
        if (a.name === "style") styles.push(a.value);
      });
    });
  }
  // the pointer over each line chart's first point: the page's script writes the names under it
  // into its tooltip as markup, and each tooltip is inspected before the next replaces it
  document.querySelectorAll("svg.chart[data-kind=line]").forEach(function (svg) {
    var path = svg.querySelector("path.series");
    if (!path) return;
    var first = path.getAttribute("d").match(/-?[0-9.]+/g).map(Number), pt = svg.createSVGPoint();
    pt.x = first[0]; pt.y = first[1];
    var at = pt.matrixTransform(svg.getScreenCTM());
    svg.dispatchEvent(new MouseEvent("mousemove", {clientX: at.x, clientY: at.y, bubbles: true}));
    var tip = document.querySelector(".tip");
    if (tip && tip.style.display === "block") { walk(tip); tips += tip.textContent + "\\n"; }
  });
  walk(document.documentElement);
  var out = {title: document.title, tags: Object.keys(tags), attributes: Object.keys(attributes), hrefs: hrefs,
             styles: styles, scripts: document.scripts.length, text: document.body.textContent, tips: tips};
  var pre = document.createElement("pre");
  pre.id = "gputrain-inspect";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string (escapes \\" \\\\ \\n \\uXXXX) is a TOML basic string


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value))


def _config(p: str) -> str:
    q = _toml(p)
    return (
        f"{_toml(p + ' ')} = {q}\n"  # a key outside any table
        f"[data]\nname = {q}\ntask = {q}\n{q} = {q}\n"
        f"[model]\nname = {q}\nhidden_sizes = [{q}]\n"
        f"[parallel]\nstrategy = {q}\ntp = {q}\npp = {q}\n"
        f"[train]\nprecision = {q}\nepochs = {q}\n"
        f"[log]\nevery_steps = {q}\n"
        f"[rl]\nenv = {q}\nstop_at_return = {q}\n"
        f"[{q}]\n{q} = {q}\nlist = [{q}, {{ {q} = {q} }}]\n"
    )


def _numbers_and(p: str, keys: list[str]) -> dict[str, Any]:
    return dict.fromkeys(keys, p)


def _summary(p: str, status: str, rl: bool) -> dict[str, Any]:
    train_keys = [
        "samples_per_s",
        "step_time_s",
        "tokens_per_s",
        "flops_per_step",
        "achieved_flops",
        "mfu",
        "mfu_formula",
        "mfu_peak_source",
        "peak_memory_bytes",
        "host_peak_rss_bytes",
    ]
    summary: dict[str, Any] = {
        "status": status,
        "error": p,
        "global_step": p,
        "epochs_completed": p,
        "wall_s": p,
        "world_size": p,
        "device": p,
        "precision": p,
        "layout": p,
        p: p,
        "train": {**_numbers_and(p, train_keys), "time_breakdown": {"data": p, "forward_backward": p, p: p}},
        "test": {"accuracy": p, "loss": p, p: p},
        "val": {"accuracy": p, p: p},
    }
    if rl:
        summary["rl"] = {
            "env": p,
            "env_steps": p,
            "episodes": p,
            "episodic_return": p,
            "env_steps_per_s": p,
            "solved": p,
        }
    return summary


def _metrics(p: str, rl: bool) -> str:
    rows: list[dict[str, Any]] = []
    for step in range(1, 7):
        row: dict[str, Any] = {
            "step": step,
            "epoch": p,
            "loss": 1.0 / step,
            "lr": 0.1,
            "grad_norm": 1.0 + step,
            "samples_per_s": 100.0 + step,
            "step_time_s": 0.01,
            "mfu": 0.1,
            "peak_memory_bytes": 1e6,
            "time_data": 0.2,
            "time_forward_backward": 0.8,
            p: p,
            f"{p} number": 1.0,
        }
        if rl:
            row.update(
                episodic_return=float(step),
                return_last_100=float(step),
                env_steps=64.0 * step,
                env_steps_per_s=1000.0,
                episodes=2.0,
            )
        rows.append(row)
        if step % 3 == 0:
            rows.append({"step": step, "split": "val", "epoch": p, "accuracy": 0.5, p: 0.25 * step})
            rows.append({"step": step, "split": p, p: 0.5, "loss": p})
    rows.append({"step": p, "loss": 1.0})  # a row whose step is text: counted as damaged
    return "\n".join(json.dumps(r) for r in rows) + "\n"


def _lr_find(p: str) -> dict[str, Any]:
    lrs = np.geomspace(1e-5, 1, 30)
    losses = (2 - np.log10(lrs) / 5 + np.where(lrs > 0.1, 20 * lrs, 0)).tolist()
    return {
        "lrs": lrs.tolist(),
        "losses": losses,
        "smoothed": losses,
        "suggested_lr": p,
        "rule_text": p,
        "other_rules": {p: p, "steepest": 1e-3},
        "steps_run": p,
        "steps": p,
        "stopped": p,
        "batch_size": p,
        "precision": p,
        "world_size": p,
        "device": p,
        "layout": p,
        p: p,
    }


def _profile(p: str) -> dict[str, Any]:
    op = {"name": p, "calls": p, "self_device_us": p, "self_host_us": p}
    return {
        "findings": [{"bottleneck": p, "evidence": p, "change": p}, p],
        "facts": {p: p, "step_time_s": p},
        "top_device_ops": [op, p],
        "top_host_ops": [op],
        p: p,
    }


def _env(p: str) -> dict[str, Any]:
    return {
        "run": {"device": p, "precision": p, "world_size": p, "layout": p},
        p: p,
        "gpus": [{"name": p, p: p}],
        "torch": {p: [p, p]},
    }


def _scores(path: Path, p: str) -> None:
    values = np.linspace(0, 1, 40).reshape(40, 1)
    np.savez(path, task=np.array(p), scores=values, targets=values[::-1], total=np.array(40))


def hostile_runs(root: Path, p: str) -> list[Path]:
    """Five runs whose every field holds `p`: failed, an RL run interrupted, an LR sweep's own
    directory, one still going (rows newer than its summary), and one interrupted before its first
    row (its summary's step, text, shown). Their names hold `p` too (less its slashes: a name cannot
    hold one; its first 200 bytes, a name's limit being 255)."""
    name = p.replace("/", "").encode()[:200].decode(errors="ignore")
    failed, rl, sweep, running, early = (
        root / name,
        root / f"rl {name}",
        root / f"sweep {name}",
        root / f"running {name}",
        root / f"early {name}",
    )
    # the step each summary ends at: after the rows (ended), before them (resumed and going on), or
    # text, which counts as no step (the early run has no rows to be behind)
    for run, status, step in (
        (failed, "failed", 6),
        (rl, "interrupted", 100),
        (running, p, 1),
        (early, "interrupted", p),
    ):
        run.mkdir(parents=True)
        (run / "config.toml").write_text(_config(p))
        _write_json(run / "summary.json", {**_summary(p, status, rl=run == rl), "global_step": step})
        if run != early:
            (run / "metrics.jsonl").write_text(_metrics(p, rl=run == rl))
        _write_json(run / "env.json", _env(p))
        _write_json(run / "profile.json", _profile(p))
        _write_json(run / "lr_find.json", _lr_find(p))
        (run / "error.log").write_text(f"Traceback\n{p}\n{p}\n")
        _scores(run / "scores-test.npz", p)
    sweep.mkdir()
    _write_json(sweep / "lr_find.json", {**_lr_find(p), "config": read_toml(failed / "config.toml")})
    return [failed, rl, sweep, running, early]


def _inspect(page: Path) -> tuple[dict[str, Any], list[str]]:
    assert BROWSER is not None
    try:
        data, console, _ = run_script(page, BROWSER, _INSPECT, "gputrain-inspect", policy=False)
    except AssertionError as err:  # the inspector never ran: a payload opened a comment or raw text to the end
        raise AssertionError(f"{page.name}: the page's end was swallowed by a payload: {err}") from None
    return data, console


def _assert_inert(page: Path, title: str, payload: str, *, hovered: str = "") -> None:
    """`hovered`: text the tooltips over the line charts must show (a curve's name)."""
    seen, console = _inspect(page)
    assert hovered in seen["tips"], f"{page.name}: the tooltips show {seen['tips']!r}, not {hovered!r}"
    where = f"{page.name}: "
    assert console == [], where + str(console)
    assert seen["title"] == title, where + "a payload ran (the title changed)"
    assert set(seen["tags"]) <= TAGS, where + f"elements the report does not write: {set(seen['tags']) - TAGS}"
    extra = set(seen["attributes"]) - ATTRIBUTES
    assert not extra, where + f"attributes the report does not write: {extra}"
    assert all(h.startswith("#") for h in seen["hrefs"]), where + str(seen["hrefs"])
    assert all(STYLE.fullmatch(s) for s in seen["styles"]), where + str(seen["styles"])
    assert seen["scripts"] == 2, where + f"{seen['scripts']} scripts (the page's and the inspector's)"
    assert payload in seen["text"], where + "the value does not show as its own characters"


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_hostile_text_in_every_field_shows_as_text_and_runs_nothing(payload: str, tmp_path: Path) -> None:
    """The failed run's page (every section of a run's page), and the five runs compared."""
    runs = hostile_runs(tmp_path / "runs", payload)
    failed = write_report([runs[0]], tmp_path / "failed.html")
    _assert_inert(failed.path, f"gputrain report: {runs[0].name}", payload, hovered=payload)  # a split's name
    compared = write_report(runs, tmp_path / "compared.html")
    _assert_inert(compared.path, f"gputrain report: {len(runs)} runs", payload, hovered=runs[0].name)


@pytest.mark.parametrize(
    "state",
    [1, 2, 3, 4],
    ids=[
        "an interrupted RL run",
        "an LR sweep's directory",
        "a run going on",
        "a run interrupted before its first row",
    ],
)
def test_every_payload_at_once_in_the_other_runs_pages(state: int, tmp_path: Path) -> None:
    """The pages of the other states (their own header, status and figures), every payload in
    each field at once: one unescaped place lets at least one of them in."""
    payload = "".join(PAYLOADS.values())
    run = hostile_runs(tmp_path / "runs", payload)[state]
    written = write_report([run], tmp_path / "run.html")
    _assert_inert(written.path, f"gputrain report: {run.name}", payload)
