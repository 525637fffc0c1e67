"""No import circles inside gputrain, and its layers kept apart: lower layers (config, data, models,
distributed, plan, observe) never import the training loop (train), distributed code never imports
the data sources, and config is checked without torch or the registries (LAYER_RULES below).

Read with `ast`: nothing of gputrain is imported, except by the one subprocess test of issue 13.

What counts as an import (an edge of the graph):
- every `import gputrain...` / `from gputrain... import ...` in a file, at module level AND inside
  functions and methods: a function-level import only moves the circle to run time;
- relative imports, resolved against the importing module's package;
- what sits under `if TYPE_CHECKING:` too, as a type-only edge (its `else:` branch runs: an
  ordinary edge). It never runs, but it ties the two modules all the same: the importer's types are
  the imported module's, so neither can be read, moved or tested without the other, and a circle
  of them is a circle of the design (issue 26). So type-only edges count for circles and for the
  "anywhere" layer rules (a lower layer naming the loop's types depends on the loop), and NOT for
  the "on import" rules, which are about what importing loads (torch) and a type-only import loads
  nothing. Break such a circle with a small Protocol in the lower module, or by moving the type to
  the module that owns it; not by dropping the annotation;
- NOT `importlib.import_module(...)` with a computed name (the registries, the CLI's subcommands):
  those are not statements ast can read.

Resolution: `from gputrain.x import y` is an edge to `gputrain.x.y` where `gputrain/x/y.py` (or the
package `gputrain/x/y/`) exists, and to `gputrain.x` (its `__init__.py` runs first) where that is a
module. Importing `gputrain.a.b.c` runs every package `__init__.py` on the way, so each of them is
an edge too. Directories without an `__init__.py` (namespace packages such as `gputrain/train/`) run
no code and are no node.

Package `__init__` edges, decided thus:
- `gputrain.pkg` (the `__init__`) -> `gputrain.pkg.sub` is an ordinary edge (re-exporting).
- The packages that enclose the importing module are NOT edges from it: Python has started them
  before the module itself can run, so `gputrain.pkg.sub` importing `gputrain.pkg.other` does not
  make `gputrain.pkg.sub -> gputrain.pkg` (that would put every re-exported submodule on a false
  circle through its own `__init__`).
- Except where the module reads a NAME from an enclosing package's `__init__`
  (`from gputrain.pkg import SomeName`, SomeName not a submodule): that needs the `__init__`
  finished, so it is an edge, and with the `__init__` importing the submodule back it is a real
  circle (an ImportError when the submodule is imported first).
- A module importing itself is ignored.

A circle is a strongly connected component of more than one module; each one is reported as the
shortest circles through each of its edges, `a -> b -> a`, with the file and line of each edge.
"""

from __future__ import annotations

import ast
import functools
import itertools
import os
import subprocess
import sys
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "gputrain"

# Layer rules: (importer, must not import, where). Each name covers its submodules.
# "anywhere": no import statement of the importer's files may name it, function-level and type-only included.
# "on import": importing the importer must not load it, following module-level imports transitively
#   (issue 13: config checks run before torch is imported); type-only imports load nothing.
LAYER_RULES: list[tuple[str, str, str]] = [
    ("gputrain.distributed", "gputrain.data", "anywhere"),
    ("gputrain.config", "gputrain.data", "anywhere"),
    ("gputrain.config", "gputrain.models", "anywhere"),
    ("gputrain.config", "torch", "on import"),
    ("gputrain.cli", "torch", "on import"),  # a usage error answers before torch loads
    ("gputrain.run.layout", "torch", "on import"),  # config/paths.py and the CLI read the run's names
    ("gputrain.observe", "gputrain.train", "anywhere"),
    ("gputrain.distributed", "gputrain.train", "anywhere"),
    ("gputrain.plan", "gputrain.train", "anywhere"),
    ("gputrain.data", "gputrain.train", "anywhere"),
    ("gputrain.models", "gputrain.train", "anywhere"),
]


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    """A gputrain module, or the full dotted name of anything else (`torch.nn`)."""
    path: str
    line: int
    module_level: bool
    type_only: bool = False
    """Under `if TYPE_CHECKING:`: never runs, a tie all the same (module docstring)."""

    def where(self) -> str:
        kind = " (type-only)" if self.type_only else "" if self.module_level else " (function-level)"
        return f"{self.path}:{self.line}{kind}"


def _module_names(root: Path = ROOT) -> dict[str, Path]:
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool, bool]]:
    """Every import statement, with whether it runs when the module is imported and whether it is
    type-only (under `if TYPE_CHECKING:`, so it never runs)."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool, bool]] = []

    def visit(node: ast.AST, module_level: bool, type_only: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, module_level and not type_only, type_only))
            return
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for branch in node.body:
                visit(branch, module_level, True)
            for branch in node.orelse:
                visit(branch, module_level, type_only)
            return
        inner = module_level and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner, type_only)

    visit(tree, True, False)
    return found


def _encloses(package: str, module: str) -> bool:
    return module == package or module.startswith(package + ".")


def _targets(source: str, is_package: bool, node: ast.Import | ast.ImportFrom,
             modules: dict[str, Path]) -> list[str]:
    def with_packages(name: str) -> list[str]:
        """`name` and each package __init__ on the way to it that does not enclose `source`."""
        parts = name.split(".")
        out = [".".join(parts[:i]) for i in range(1, len(parts))]
        out = [p for p in out if p in modules and not _encloses(p, source)]
        return out + [name]

    if isinstance(node, ast.Import):
        out = []
        for alias in node.names:
            out += with_packages(alias.name) if alias.name.split(".")[0] == PACKAGE else [alias.name]
        return out
    if node.level:
        package = source if is_package else source.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    if base.split(".")[0] != PACKAGE:
        return [base]
    out = with_packages(base)[:-1]
    reads_names = False
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in modules:
            out += [sub]
        else:
            reads_names = True
    if base in modules and (reads_names or not _encloses(base, source)):
        out.append(base)
    return out


@functools.cache
def collect_edges(root: Path = ROOT) -> tuple[Edge, ...]:
    modules = _module_names(root)
    edges = []
    for source, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rel = path.relative_to(root).as_posix()
        for node, module_level, type_only in _import_nodes(tree):
            for target in dict.fromkeys(_targets(source, path.name == "__init__.py", node, modules)):
                if target != source:
                    edges.append(Edge(source, target, rel, node.lineno, module_level, type_only))
    return tuple(edges)


def _internal_graph(edges: tuple[Edge, ...]) -> dict[str, dict[str, list[Edge]]]:
    graph: dict[str, dict[str, list[Edge]]] = defaultdict(lambda: defaultdict(list))
    for e in edges:
        if e.target.split(".")[0] == PACKAGE:
            graph[e.source][e.target].append(e)
    return graph


def _components(graph: dict[str, dict[str, list[Edge]]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, {})):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(out)


def _shortest_path(graph: dict[str, dict[str, list[Edge]]], start: str, goal: str, allowed: set[str]) -> list[str]:
    previous = {start: start}
    queue = deque([start])
    while queue:
        v = queue.popleft()
        if v == goal:
            path = [v]
            while path[-1] != start:
                path.append(previous[path[-1]])
            return path[::-1]
        for w in sorted(graph.get(v, {})):
            if w in allowed and w not in previous:
                previous[w] = v
                queue.append(w)
    raise AssertionError(f"{goal} unreachable from {start} inside its component")


def find_cycles(root: Path = ROOT) -> list[str]:
    """Each circle as `a -> b -> a`, followed by the file and line of each of its edges."""
    graph = _internal_graph(collect_edges(root))
    reports = []
    for component in _components(graph):
        members = set(component)
        seen: set[tuple[str, ...]] = set()
        for u in component:
            for v in sorted(w for w in graph[u] if w in members):
                cycle = [u, *_shortest_path(graph, v, u, members)][:-1]
                turn = cycle.index(min(cycle))
                canonical = tuple(cycle[turn:] + cycle[:turn])
                if canonical in seen:
                    continue
                seen.add(canonical)
                ring = [*canonical, canonical[0]]
                lines = [" -> ".join(ring)]
                for a, b in itertools.pairwise(ring):
                    lines.append(f"    {a} -> {b}: " + ", ".join(e.where() for e in graph[a][b]))
                reports.append("\n".join(lines))
    return reports


def test_no_import_cycles():
    cycles = find_cycles()
    assert not cycles, f"{len(cycles)} import circle(s) in gputrain:\n" + "\n".join(cycles)


def _layer_violations(root: Path = ROOT, rules: list[tuple[str, str, str]] = LAYER_RULES) -> list[str]:
    edges = collect_edges(root)
    module_level: dict[str, list[Edge]] = defaultdict(list)
    for e in edges:
        if e.module_level:
            module_level[e.source].append(e)
    out = []
    for importer, forbidden, where in rules:
        sources = [s for s in _module_names(root) if _encloses(importer, s)]
        if where == "anywhere":
            statements: dict[tuple[str, int], Edge] = {}  # one line per statement, naming its deepest module
            for e in edges:
                if _encloses(importer, e.source) and _encloses(forbidden, e.target):
                    known = statements.setdefault((e.path, e.line), e)
                    if len(e.target) > len(known.target):
                        statements[(e.path, e.line)] = e
            out += [f"{importer} must not import {forbidden}: {e.source} -> {e.target} at {e.where()}"
                    for e in statements.values()]
            continue
        assert where == "on import", where
        for start in sources:  # breadth first over module-level imports, so the chain shown is a shortest one
            reached: dict[str, Edge | None] = {start: None}
            queue = deque([start])
            hit = None
            while queue and hit is None:
                for e in module_level.get(queue.popleft(), []):
                    if e.target in reached:
                        continue
                    reached[e.target] = e
                    if _encloses(forbidden, e.target):
                        hit = e
                        break
                    queue.append(e.target)
            if hit is not None:
                chain = [hit]
                while reached[chain[-1].source] is not None:
                    chain.append(reached[chain[-1].source])  # type: ignore[arg-type]
                steps = " -> ".join(f"{e.target} ({e.where()})" for e in reversed(chain))
                out.append(f"importing {start} loads {forbidden}: {start} -> {steps}")
    return out


def test_layers():
    violations = _layer_violations()
    assert not violations, "layer rules broken (LAYER_RULES in this file):\n" + "\n".join(violations)


def test_config_loads_and_validates_without_torch():
    """Issue 13: `gputrain.config` checks a config before torch is imported (the real thing, in a subprocess)."""
    code = ("import sys; import gputrain.config as c; c.load_config(None, ['model.name=mlp']); "
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('gputrain'))")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checker_on_a_small_tree(tmp_path):
    """The rules of the module docstring, on a package built for the purpose."""
    root = _tree(tmp_path, {
        "gputrain/__init__.py": "",
        # a package re-exporting its submodules; one sibling imports another: no circle
        "gputrain/pkg/__init__.py": "from gputrain.pkg.a import A\nfrom .b import B\n",
        "gputrain/pkg/a.py": "from gputrain.pkg.b import B\nA = 1\n",
        "gputrain/pkg/b.py": "from gputrain.pkg import c\nB = 2\n",
        "gputrain/pkg/c.py": "",
        # a name read from the enclosing package's __init__, which imports this module back: a circle
        "gputrain/bad/__init__.py": "from gputrain.bad.x import X\nY = 1\n",
        "gputrain/bad/x.py": "from gputrain.bad import Y\nX = 2\n",
        # function-level imports count; TYPE_CHECKING ones too, as type-only; their else branch runs
        "gputrain/f.py": "def g():\n    from gputrain import h\n",
        "gputrain/h.py": "import torch\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gputrain.f\n"
                         "else:\n    from . import k\n",
        "gputrain/k.py": "def late():\n    import gputrain.f\n",
        "gputrain/light.py": "import gputrain.h\n",
    })
    edges = {(e.source, e.target, e.module_level, e.type_only) for e in collect_edges(root)
             if e.target.startswith("gputrain")}
    assert ("gputrain.pkg.a", "gputrain.pkg", True, False) not in edges  # its own package: no edge
    assert ("gputrain.bad.x", "gputrain.bad", True, False) in edges  # reads Y from its own package: edge
    assert ("gputrain.h", "gputrain.f", False, True) in edges and ("gputrain.h", "gputrain.k", True, False) in edges
    cycles = find_cycles(root)
    assert [c.splitlines()[0] for c in cycles] == [
        "gputrain.bad -> gputrain.bad.x -> gputrain.bad",
        "gputrain.f -> gputrain.h -> gputrain.f",
        "gputrain.f -> gputrain.h -> gputrain.k -> gputrain.f",
    ]
    assert "gputrain/f.py:2 (function-level)" in cycles[2] and "gputrain/h.py:4 (type-only)" in cycles[1]
    rules = [("gputrain.light", "torch", "on import"), ("gputrain.f", "torch", "on import"),
             ("gputrain.f", "gputrain.h", "anywhere"), ("gputrain.h", "gputrain.f", "anywhere")]
    assert _layer_violations(root, rules) == [
        ("importing gputrain.light loads torch: gputrain.light -> gputrain.h (gputrain/light.py:1) "
         "-> torch (gputrain/h.py:1)"),
        "gputrain.f must not import gputrain.h: gputrain.f -> gputrain.h at gputrain/f.py:2 (function-level)",
        "gputrain.h must not import gputrain.f: gputrain.h -> gputrain.f at gputrain/h.py:4 (type-only)",
    ]


def test_a_circle_of_type_only_imports_is_a_circle(tmp_path):
    """Issue 26: run/files.py named train/build.py's Placement under TYPE_CHECKING while build.py
    imported run/files.py; the import ran, but the two modules were one. A type-only import of torch
    loads nothing, so the "on import" rules pass it."""
    root = _tree(tmp_path, {
        "gputrain/__init__.py": "",
        "gputrain/low.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import torch\n"
                           "    from gputrain.high import Placement\n",
        "gputrain/high.py": "from gputrain.low import write\n",
    })
    assert find_cycles(root) == [
        "gputrain.high -> gputrain.low -> gputrain.high\n"
        "    gputrain.high -> gputrain.low: gputrain/high.py:1\n"
        "    gputrain.low -> gputrain.high: gputrain/low.py:4 (type-only)"
    ]
    assert _layer_violations(root, [("gputrain.low", "torch", "on import")]) == []
