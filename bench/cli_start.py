"""What a whole `batchocr run` command costs on a small corpus, with this checkout's code and
another's (`--baseline`), alternated in the same session: the start (imports, the render
workers' fork server, the parts' interpreters with `--processes 2`) dominates it.

Each measurement is a fresh interpreter running the CLI's `run` in process (as the console
script does, without its final os._exit), timed from before batchocr is imported; its CPU is
its own and its children's (the fork server, stopped and reaped first; the parts), and whether
pandas was imported in it. The textlayer engine reads born-digital pages, so no OCR is
measured unless `--engine rapidocr` (then over `--source`, e.g. samples/). `--burners N` runs N
CPU-bound processes beside both trees' runs throughout, as on a loaded machine. Equal work: the
same pages and rows, checked.

    git worktree add /tmp/base c3bd427            # before pyarrow's pandas probe was answered
    python bench/cli_start.py --baseline /tmp/base --repeats 5
    python bench/cli_start.py --baseline /tmp/base --repeats 5 --processes 2
    python bench/cli_start.py --baseline /tmp/base --engine rapidocr --source samples --burners 2
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import twotrees

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import time
t0 = time.perf_counter()
import json, os, resource, sys
tree, src, out, processes, engine = sys.argv[1:6]
from batchocr.cli import main
main.main(args=["run", src, out, "--engine", engine, "--processes", processes, "-q"], standalone_mode=False)
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
    ap.add_argument("--engine", default="textlayer", help="the run's engine [textlayer]")
    ap.add_argument("--source", type=Path, help="a folder to read instead of the generated born-digital corpus")
    ap.add_argument("--burners", type=int, default=0, help="CPU-bound processes running beside both trees [0]")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT / "tests"))
    from corpus import text_corpus

    with tempfile.TemporaryDirectory() as tmp, burning(args.burners):
        if args.source:
            src = args.source.resolve()
        else:
            src = Path(tmp) / "src"
            text_corpus(src, args.documents, args.pages)
        trees = {"baseline": str(Path(args.baseline).resolve()), "current": str(ROOT)}
        runs: dict[str, list] = {name: [] for name in trees}
        for i in range(args.repeats):  # alternated: the machine's drift falls on both alike
            for name, tree in trees.items():
                out = Path(tmp) / f"out-{name}-{i}"
                runs[name].append(twotrees.measure(CHILD, tree, str(src), str(out), str(args.processes),
                                                   args.engine))
    work = {name: sorted({(r["rows"], r["text_rows"]) for r in rs}) for name, rs in runs.items()}
    result = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, python {platform.python_version()}",
        "corpus": ({"source": str(args.source)} if args.source else
                   {"documents": args.documents, "pages_each": args.pages, "pages": args.documents * args.pages})
        | {"engine": args.engine, "processes": args.processes, "repeats": args.repeats, "burners": args.burners},
        "work": work, "equal_work": len({tuple(w) for w in work.values()}) == 1 and len(work["current"]) == 1,
        "pandas_imported": {name: sorted({r["pandas_imported"] for r in rs}) for name, rs in runs.items()},
        "median": {name: {k: round(statistics.median(r[k] for r in rs), 3)
                          for k in ("wall_s", "cpu_s", "self_cpu_s", "children_cpu_s")} for name, rs in runs.items()},
        "runs": runs,
    }
    twotrees.report(result, args.json)


@contextlib.contextmanager
def burning(n: int):
    """n CPU-bound processes for the block's length."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for b in burners:
            b.kill()
            b.wait()


if __name__ == "__main__":
    main()
