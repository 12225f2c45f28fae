"""What starting render workers costs: a run's CPU and wall time, on one corpus, with this
checkout's code and another's (`--baseline`), alternated in the same session.

The corpus is small documents (each run starts its workers once) and documents with a page
that hangs MuPDF (each hang: the worker is killed at `render.timeout_s` and a fresh one takes
the rest of the document), read by the textlayer engine, so that what is measured is the
render workers, not OCR. Each measurement is a fresh process running `run_job` in process;
its CPU is its own and its children's (the workers, or the fork server and the workers it
reaped), all reaped before it is read. Equal work: the same pages, the same rows and error
rows, checked.

    git worktree add /tmp/oldtree 014bbbb          # spawned workers (before the fork server)
    python bench/render_start.py --baseline /tmp/oldtree --repeats 5
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
import json, os, resource, shutil, sys, time
tree, src, out, workers, timeout = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
import dataclasses
import pyarrow.parquet as pq
from batchocr.pipeline import run_job
from batchocr.spec import JobSpec

spec = JobSpec(source=src, out=out, engine="textlayer")
spec = dataclasses.replace(spec, render=dataclasses.replace(spec.render, workers=workers, timeout_s=timeout))
t0 = time.perf_counter()
summary = run_job(spec, progress=False)
wall = time.perf_counter() - t0
try:  # the fork server lives as long as its process: stopped and reaped, its CPU is counted
    from multiprocessing import forkserver
    forkserver._forkserver._stop()
except Exception:
    pass
rows = pq.read_table(os.path.join(out, "pages")).to_pylist()
usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
import batchocr
assert os.path.realpath(batchocr.__path__[0]) == os.path.realpath(os.path.join(tree, "batchocr")), batchocr.__path__
print(json.dumps({
    "wall_s": wall, "cpu_s": sum(u.ru_utime + u.ru_stime for u in usage),
    "children_cpu_s": usage[1].ru_utime + usage[1].ru_stime,
    "pages": summary.pages, "rows": len(rows),
    "error_rows": sum(r["error_type"] is not None for r in rows),
}))
"""


def corpus(root: Path, documents: int, pages: int, hangs: int) -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    from corpus import hang_pdf, text_corpus

    text_corpus(root, documents, pages)
    for i in range(hangs):
        hang_pdf(root / f"hang{i:03d}.pdf", pages=3, hang_at=(1,), seed=100 + i)
    return documents * pages + 3 * hangs


def measure(tree: str, src: Path, workers: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as out:
        return twotrees.measure(CHILD, tree, str(src), str(Path(out) / "out"), str(workers), str(timeout))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="another checkout's root: its batchocr is the baseline")
    ap.add_argument("--documents", type=int, default=20)
    ap.add_argument("--pages", type=int, default=2)
    ap.add_argument("--hangs", type=int, default=4, help="documents with a page that hangs MuPDF")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1.0, help="render.timeout_s")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        pages = corpus(src, args.documents, args.pages, args.hangs)
        trees = {"baseline": str(Path(args.baseline).resolve()), "current": str(ROOT)}
        runs = {name: [] for name in trees}
        for _ in range(args.repeats):  # alternated: the machine's drift falls on both alike
            for name, tree in trees.items():
                runs[name].append(measure(tree, src, args.workers, args.timeout))
    work = {name: sorted({(r["pages"], r["rows"], r["error_rows"]) for r in rs}) for name, rs in runs.items()}
    result = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, python {platform.python_version()}",
        "corpus": {"documents": args.documents, "pages_each": args.pages, "hang_documents": args.hangs,
                   "pages": pages, "workers": args.workers, "timeout_s": args.timeout},
        "work": work, "equal_work": len({tuple(w) for w in work.values()}) == 1 and len(work["current"]) == 1,
        "median": {name: {k: round(statistics.median(r[k] for r in rs), 3) for k in ("wall_s", "cpu_s", "children_cpu_s")}
                   for name, rs in runs.items()},
        "runs": runs,
    }
    twotrees.report(result, args.json)


if __name__ == "__main__":
    main()
