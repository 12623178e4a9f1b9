"""The packages import one way: zoomr (the library) < data_prep < eval < train < analysis; tests above all.

(A recipe may run the evaluator at its end, e.g. AbridgeKV's testbed arms through ``eval.arms``; the
evaluator never imports a recipe.)

Read with ``ast`` (every import, lazy ones inside functions included), so a violation fails here before
it can become an import circle. Issue 12, part 4.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("zoomr", "data_prep", "train", "eval", "analysis")
# what each package may import of the others (besides itself)
MAY_IMPORT = {
    "zoomr": set(),
    "data_prep": {"zoomr"},
    "eval": {"zoomr", "data_prep"},
    "train": {"zoomr", "data_prep", "eval"},
    "analysis": {"zoomr", "data_prep", "train", "eval"},
}
# Known violations in files another change is moving (the testbed unit, issue 12 part 1); remove as they go.
PENDING = {
    ("train/testbed_pretrain.py", "analysis"),
}


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import statement in ``path``, relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def sources(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts)


def upward_imports(package: str) -> list[str]:
    """``file:line imports module`` for each import of ``package`` that runs the wrong way (one per line)."""
    bad: dict[tuple[str, int], str] = {}
    for path in sources(package):
        rel = path.relative_to(ROOT).as_posix()
        for line, module in imported_modules(path):
            top = module.split(".")[0]
            upward = top == "tests" or (top in PACKAGES and top != package and top not in MAY_IMPORT[package])
            if upward and (rel, top) not in PENDING:
                bad.setdefault((rel, line), f"{rel}:{line} imports {module}")
    return sorted(bad.values())


@pytest.mark.parametrize("package", PACKAGES)
def test_no_upward_import(package):
    assert upward_imports(package) == []


def test_the_check_sees_lazy_and_relative_imports(tmp_path, monkeypatch):
    """The walk must catch an import hidden in a function and a relative one (else the test above is vacuous)."""
    pkg = tmp_path / "zoomr" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "m.py").write_text("def f():\n    from train.report import write_summary\nfrom . import other\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert upward_imports("zoomr") == ["zoomr/sub/m.py:2 imports train.report"]
    assert (3, "zoomr.sub.other") in imported_modules(pkg / "m.py")


def test_no_recipe_imports_another_recipe():
    """A recipe (train/<name>.py) imports the library, not another recipe's helpers."""
    bad = []
    for path in sources("train"):
        for line, module in imported_modules(path):
            parts = module.split(".")
            if parts[0] == "train" and len(parts) > 1 and parts[1] not in ("report", "__main__"):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert sorted(set(bad)) == []
