"""The import graph of rankexp, analysis and hydra_plugins, read from the source (AST).

Two truths: no import circle, counting every import statement wherever it sits (a function's
body, ``if TYPE_CHECKING:``); and a function-local import of a project module exists only to
defer a heavy dependency — the module it imports brings in torch, mlflow or transformers.
``from pkg import mod`` is an edge to the module ``pkg.mod``, ``from pkg.mod import name`` to
``pkg.mod``.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("rankexp", "analysis", "hydra_plugins")
HEAVY = frozenset({"torch", "mlflow", "transformers"})


def modules() -> dict[str, Path]:
    """Dotted module name → its file, for every module of :data:`PACKAGES`."""
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]):
    """``(target, line, function_local, heavy_names)`` for each import statement of a module:
    the project modules it names (``target``: a dotted name of ``known``) or the top-level
    names of what it imports from outside the project."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def project(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def visit(node: ast.AST, local: bool):
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield project(alias.name), alias.name.split(".")[0], child.lineno, local
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([child.module] if child.module else []))
                else:
                    base = child.module or ""
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    yield (full if full in known else project(base)), base.split(".")[0], \
                        child.lineno, local
            yield from visit(child, inner)

    tree = ast.parse(path.read_text(), str(path))
    for target, top, line, local in visit(tree, False):
        if target is None:
            yield None, top, line, local
            continue
        if target == name:
            continue
        yield target, top, line, local


def graph() -> tuple[dict[str, dict[str, tuple[int, bool]]], dict[str, set[str]]]:
    """``edges[module][target] = (line, local)`` (module-level wins over local) and, per module,
    the outside top-level names it imports at module level."""
    known = modules()
    edges: dict[str, dict[str, tuple[int, bool]]] = {}
    outside: dict[str, set[str]] = {}
    for name, path in known.items():
        deps, ext = {}, set()
        for target, top, line, local in _imports(name, path, known):
            if target is None:
                if not local:
                    ext.add(top)
            elif target not in deps or deps[target][1] and not local:
                deps[target] = (line, local)
        edges[name], outside[name] = deps, ext
    return edges, outside


def circles(edges: dict[str, dict[str, tuple[int, bool]]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in edges:
        if v not in index:
            connect(v)
    return found


def heavy(edges, outside) -> set[str]:
    """Modules whose import (module-level imports, followed through the project) loads torch,
    mlflow or transformers."""
    out = {m for m, ext in outside.items() if ext & HEAVY}
    changed = True
    while changed:
        changed = False
        for m, deps in edges.items():
            if m not in out and any(t in out for t, (_, local) in deps.items() if not local):
                out.add(m)
                changed = True
    return out


def test_no_import_circle():
    edges, _ = graph()
    found = circles(edges)
    report = [f"{len(c)} modules: " + "; ".join(
        f"{a} -> " + ", ".join(f"{b}:{edges[a][b][0]}" for b in sorted(edges[a]) if b in c)
        for a in c) for c in found]
    assert not found, "import circles:\n" + "\n".join(report)


def test_function_local_imports_only_defer_heavy_dependencies():
    edges, outside = graph()
    loads = heavy(edges, outside)
    light = sorted(f"{m}:{line} imports {t}" for m, deps in edges.items()
                   for t, (line, local) in deps.items() if local and t not in loads)
    assert not light, ("function-local imports of project modules that load no torch, mlflow "
                       "or transformers (import them at the top):\n" + "\n".join(light))


if __name__ == "__main__":  # a report: python tests/test_imports.py
    e, o = graph()
    for c in circles(e):
        print(len(c), c)
        for a in c:
            print("  ", a, "->", sorted((b, e[a][b]) for b in e[a] if b in c))
    loads = heavy(e, o)
    for m, deps in sorted(e.items()):
        for t, (line, local) in sorted(deps.items()):
            if local and t not in loads:
                print(f"light local import {m}:{line} -> {t}")
