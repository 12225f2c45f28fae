"""Two checkouts' batchocr measured alike (bench/render_start.py, bench/first_page.py): each
measurement a fresh interpreter running a script with one tree's batchocr, alternated."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def measure(child: str, tree: str, *args: str, timeout: float = 900) -> dict:
    """`child` run by a fresh interpreter with `tree`'s batchocr (PYTHONPATH, not sys.path.insert:
    the render workers' fork server, a fresh interpreter too, must find the same tree), given
    `tree` and `args`; what its last line of stdout says (JSON)."""
    proc = subprocess.run([sys.executable, "-c", child, tree, *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": tree}, cwd=tree)
    if proc.returncode:
        raise SystemExit(f"{tree}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def report(result: dict, path=None) -> None:
    """`result`'s medians' ratios, current over baseline, added to it; printed without its runs,
    and written whole to `path` where given."""
    m = result["median"]
    result["ratio_current/baseline"] = {k: round(m["current"][k] / m["baseline"][k], 3) for k in m["current"]}
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    if path:
        path.write_text(json.dumps(result, indent=1))
