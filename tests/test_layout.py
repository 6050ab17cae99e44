"""House rules of the code's layout: no function over 100 lines, only :mod:`rankexp.tracking`
imports MLflow, and that package is small and reached through ``rankexp.tracking`` itself."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rankexp", "analysis", "hydra_plugins")
MAX_FUNCTION_LINES = 100


def _sources():
    for pkg in PACKAGES:
        yield from sorted((ROOT / pkg).rglob("*.py"))


def long_functions(limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name (n lines)`` of every function (methods and nested ones included) whose
    ``def`` … last line spans more than ``limit`` lines."""
    out = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    return out


def mlflow_importers() -> list[str]:
    """Modules outside ``rankexp/tracking/`` with an ``import mlflow…`` anywhere in them."""
    out = []
    for path in _sources():
        rel = path.relative_to(ROOT)
        if rel.parts[:2] == ("rankexp", "tracking"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            if any(n == "mlflow" or n.startswith("mlflow.") for n in names):
                out.append(f"{rel}:{node.lineno}")
    return out


def test_no_function_is_over_100_lines():
    assert long_functions() == []
    # the check can fail: some function in the tree is longer than a few lines
    assert long_functions(limit=20)


def test_only_the_tracking_package_imports_mlflow():
    assert mlflow_importers() == []
    tracking_dir = ROOT / "rankexp" / "tracking"
    assert any("import mlflow" in p.read_text() for p in tracking_dir.glob("*.py"))


def test_the_tracking_package_is_small_and_reexports_its_modules():
    """``rankexp/tracking/`` stays within 1,000 lines, and ``tracking.X`` is the object its
    module defines for every name the module lists."""
    from rankexp import tracking
    from rankexp.tracking import core, read

    files = sorted((ROOT / "rankexp" / "tracking").glob("*.py"))
    assert sum(len(p.read_text().splitlines()) for p in files) <= 1000
    for module in (core, read):
        assert module.__all__ and all(getattr(tracking, n) is getattr(module, n) for n in module.__all__)
