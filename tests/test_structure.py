"""The package's shape stays readable: no import circle, no module over 500 lines, no function
over 60, no lab notes in the code, and README names every module."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "batchocr"
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its own name)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Which of the package's modules each module imports, at any depth of its code (a
    function's import too). An import of a module's own ancestor package is left out: Python
    imports it before the module in any case. `from a import b` is an import of a.b where a.b
    is a module, else of a."""
    modules = _modules(package)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # a name inside a module: the module
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_of_batchocr_imports_itself_round_a_circle():
    assert circles(import_graph()) == []


def test_the_circle_check_finds_a_circle(tmp_path):
    """The check above can fail: a package with a function-level import closing a circle."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "b.py").write_text("def f():\n    from pkg import c\n")
    (package / "c.py").write_text("from . import a\nfrom pkg import __version__\n")
    graph = import_graph(package)
    assert graph["pkg.c"] == {"pkg.a"}  # the ancestor package pkg is left out
    assert circles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]


def test_no_module_over_500_lines_and_no_function_over_60():
    long_modules, long_functions = [], []
    for name, path in _modules().items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append((name, len(text.splitlines())))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long_functions.append((f"{name}.{node.name}", lines))
    assert long_modules == [] and long_functions == []


def test_the_code_speaks_of_the_code_not_of_its_measurements():
    """Leases, cards and the GPU lab notes belong in docs/, not in batchocr/."""
    words = re.compile(r"lease|H200|H100|docs/GPU", re.I)
    found = [f"{path.relative_to(ROOT)}:{i}" for path in _modules().values()
             for i, line in enumerate(path.read_text().splitlines(), 1) if words.search(line)]
    assert found == []


def test_readme_names_every_module():
    readme = (ROOT / "README.md").read_text()
    named = set(re.findall(r"`(batchocr/[\w/]+\.py)`", readme))
    missing = [str(p.relative_to(ROOT)) for p in _modules().values() if str(p.relative_to(ROOT)) not in named]
    assert missing == []
