"""What a whole `batchocr run` command costs on a small corpus, with this checkout's code and
another's (`--baseline`), alternated in the same session: the start (imports, the render
workers' fork server, the parts' interpreters with `--processes 2`) dominates it.

Each measurement is a fresh interpreter running the CLI's `run` in process (as the console
script does, without its final os._exit), timed from before batchocr is imported; its CPU is
its own and its children's (the fork server, stopped and reaped first; the parts), and whether
pandas was imported in it. The textlayer engine reads born-digital pages, so no OCR is
measured. Equal work: the same pages and rows, checked.

    git worktree add /tmp/base c3bd427            # before pyarrow's pandas probe was answered
    python bench/cli_start.py --baseline /tmp/base --repeats 5
    python bench/cli_start.py --baseline /tmp/base --repeats 5 --processes 2
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import twotrees

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import time
t0 = time.perf_counter()
import json, os, resource, sys
tree, src, out, processes = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
from batchocr.cli import main
main.main(args=["run", src, out, "--engine", "textlayer", "--processes", processes, "-q"], standalone_mode=False)
wall = time.perf_counter() - t0
try:  # the fork server lives as long as its process: stopped and reaped, its CPU is counted
    from multiprocessing import forkserver
    forkserver._forkserver._stop()
except Exception:
    pass
usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
pandas = "pandas" in sys.modules
import pyarrow.parquet as pq
rows = pq.read_table(os.path.join(out, "pages")).to_pylist()
import batchocr
assert os.path.realpath(batchocr.__path__[0]) == os.path.realpath(os.path.join(tree, "batchocr")), batchocr.__path__
print(json.dumps({
    "wall_s": wall, "cpu_s": sum(u.ru_utime + u.ru_stime for u in usage),
    "self_cpu_s": usage[0].ru_utime + usage[0].ru_stime, "children_cpu_s": usage[1].ru_utime + usage[1].ru_stime,
    "pandas_imported": pandas, "rows": len(rows), "text_rows": sum(r["error_type"] is None for r in rows),
}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="another checkout's root: its batchocr is the baseline")
    ap.add_argument("--documents", type=int, default=20)
    ap.add_argument("--pages", type=int, default=2)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from corpus import text_corpus

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        text_corpus(src, args.documents, args.pages)
        trees = {"baseline": str(Path(args.baseline).resolve()), "current": str(ROOT)}
        runs: dict[str, list] = {name: [] for name in trees}
        for i in range(args.repeats):  # alternated: the machine's drift falls on both alike
            for name, tree in trees.items():
                out = Path(tmp) / f"out-{name}-{i}"
                runs[name].append(twotrees.measure(CHILD, tree, str(src), str(out), str(args.processes)))
    work = {name: sorted({(r["rows"], r["text_rows"]) for r in rs}) for name, rs in runs.items()}
    result = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, python {platform.python_version()}",
        "corpus": {"documents": args.documents, "pages_each": args.pages, "pages": args.documents * args.pages,
                   "processes": args.processes, "repeats": args.repeats},
        "work": work, "equal_work": len({tuple(w) for w in work.values()}) == 1 and len(work["current"]) == 1,
        "pandas_imported": {name: sorted({r["pandas_imported"] for r in rs}) for name, rs in runs.items()},
        "median": {name: {k: round(statistics.median(r[k] for r in rs), 3)
                          for k in ("wall_s", "cpu_s", "self_cpu_s", "children_cpu_s")} for name, rs in runs.items()},
        "runs": runs,
    }
    twotrees.report(result, args.json)


if __name__ == "__main__":
    main()
