"""gpu_proof.json as markdown: one row per part, then one row per goal the issue sets."""

from __future__ import annotations

from typing import Any


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _value(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def render_markdown(proof: dict[str, Any]) -> str:
    parts = proof["parts"]
    title = "GPU proof" + (" — DRY RUN on CPU (tiny sizes; figures are not GPU figures)" if proof["dry_run"] else "")
    lines = [f"# {title}", "", f"Started {proof['started']}, {proof['wall_s']} s in all.", "",
             ]
    facts = proof.get("machine") or {}
    if facts:
        lines += ["| machine | |", "| --- | --- |", *(f"| {k} | {_cell(_value(v))} |" for k, v in facts.items()), ""]
    if proof.get("verdicts"):
        lines += ["| issue goal | value | verdict |", "| --- | --- | --- |",
                  *(f"| {_cell(v['goal'])} | {_value(v['value'])} | {v['verdict']} |" for v in proof["verdicts"]), ""]
    lines += ["| part | status | seconds (cap) | result |", "| --- | --- | --- | --- |"]
    for r in parts:
        outcome = r.get("result", {}).get("summary") if r["status"] == "ok" else r.get("error", "")
        lines.append(f"| {r['part']} | {r['status']} | {r['seconds']} ({r['budget_s']}) | {_cell(outcome)} |")
    goals = [(r["part"], g) for r in parts for g in (r.get("result") or {}).get("goals", [])]
    if goals:
        lines += ["", "| part | goal | value | target | met |", "| --- | --- | --- | --- | --- |"]
        for part, g in goals:
            lines.append(f"| {part} | {_cell(g['goal'])} | {_value(g['value'])} | {_value(g['target'])} | "
                         f"{'yes' if g['met'] else 'NO'} |")
    return "\n".join(lines) + "\n"
