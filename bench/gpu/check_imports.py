"""Every `from batchocr... import NAME` of a bench script resolves in that script's own tree.

A bench script (throughput.py) puts its checkout's root first on sys.path and imports batchocr
there; this does the same without running it, so that a tree whose modules moved (or a copy of an
older commit, suite.sh's `.old/`) fails on the device's start, in seconds, and not after an engine
has loaded. Prints the batchocr it found; exit 1 naming what did not resolve.

    python bench/gpu/check_imports.py bench/gpu/throughput.py [more scripts of the same tree]
    (cd .old && python ../bench/gpu/check_imports.py bench/gpu/throughput.py)   # the old tree's
"""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path


def batchocr_imports(script: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from batchocr... import name` in the script, at any depth."""
    found = []
    for node in ast.walk(ast.parse(script.read_text(), str(script))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "batchocr":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.split(".")[0] == "batchocr"]
    return found


def main() -> int:
    scripts = [Path(p).resolve() for p in sys.argv[1:]]
    if not scripts:
        print(__doc__)
        return 2
    root = scripts[0].parents[2]  # bench/gpu/NAME.py: as throughput.py finds its tree
    sys.path[:0] = [str(root), str(root / "bench" / "gpu"), str(root / "tests")]
    import batchocr

    print(f"batchocr from {Path(batchocr.__file__).parent}")
    if Path(batchocr.__file__).resolve().parents[1] != root:
        print(f"not the scripts' tree ({root}): another batchocr comes first on sys.path")
        return 1
    missing = []
    for script in scripts:
        for module, name in batchocr_imports(script):
            try:
                got = importlib.import_module(module)
                if name and not hasattr(got, name):
                    importlib.import_module(f"{module}.{name}")  # a submodule: from pkg import mod
            except ImportError as exc:
                missing.append(f"{script.name}: from {module} import {name}: {exc}")
    for line in missing:
        print(line)
    print(f"{len(scripts)} script(s): " + ("every batchocr import resolves" if not missing else "imports missing"))
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
