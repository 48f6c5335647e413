"""The shape issue 8 asked for, kept: no function in hpcdp/ or train/ longer than 60 lines,
distenv reads every launcher through its one table, no import cycle in hpcdp/, and train/
imports the hpcdp modules docs/architecture.md names (issue 47, item 4)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from hpcdp import PROJECT_ROOT

LIMIT = 60


def _functions(package: str):
    for path in sorted((PROJECT_ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(PROJECT_ROOT), node


def test_no_function_is_longer_than_60_lines() -> None:
    long = [f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for package in ("hpcdp", "train") for path, node in _functions(package)
            if node.end_lineno - node.lineno + 1 > LIMIT]
    assert not long, "split these functions: " + "; ".join(long)


def test_distenv_has_one_builder_for_every_launcher() -> None:
    names = {node.name for path, node in _functions("hpcdp") if path == Path("hpcdp/distenv.py")}
    assert not [n for n in names if n.startswith("_from_") and n != "_from_launcher"]


def _hpcdp_imports() -> dict[str, set[str]]:
    """hpcdp's modules -> the hpcdp modules each imports (at the top or inside a function),
    a package's submodules counted as the package: importing hpcdp.harvest.read runs
    hpcdp/harvest/__init__.py first."""
    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    graph: dict[str, set[str]] = {}
    for path in (PROJECT_ROOT / "hpcdp").rglob("*.py"):
        here = unit(".".join(path.relative_to(PROJECT_ROOT).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            graph.setdefault(here, set()).update(
                unit(n) for n in names if n.startswith("hpcdp.") and unit(n) != here)
    return graph


def test_no_two_hpcdp_modules_import_each_other() -> None:
    """issue 36, item 13: tracking imported harvest's run discovery while harvest imported
    tracking's export. A cycle between modules (directly or through others) is found here."""
    graph = _hpcdp_imports()
    assert graph["hpcdp.harvest"] and graph["hpcdp.cli"]  # the walk saw the imports

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            module = todo.pop()
            if module == goal:
                return True
            if module not in seen:
                seen.add(module)
                todo.extend(graph.get(module, ()))
        return False

    cycles = sorted(f"{a} <-> {b}" for a, deps in graph.items() for b in deps if reaches(b, a))
    assert not cycles, cycles


def _imported_hpcdp_units(package: str) -> set[str]:
    """The hpcdp modules (hpcdp.X, a package counted once) that `package`'s files import."""
    found = set()
    for path in (PROJECT_ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [f"{node.module}.{a.name}" for a in node.names] \
                    if node.module == "hpcdp" else [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            found.update(n.split(".")[1] for n in names if n.startswith("hpcdp."))
    return found


def test_train_imports_the_hpcdp_modules_the_architecture_names() -> None:
    documented = set(re.findall(r"^\| `(\w+)` \|", (PROJECT_ROOT / "docs" / "architecture.md")
                                .read_text(), re.MULTILINE))
    imported = _imported_hpcdp_units("train")
    assert "config" in imported  # the walk saw the imports
    assert imported == documented, (
        f"train/ imports, undocumented: {sorted(imported - documented)}; documented, not "
        f"imported: {sorted(documented - imported)} (docs/architecture.md's table)")
