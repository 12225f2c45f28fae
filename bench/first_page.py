"""From an engine's build to the run's first page: with this checkout's code and another's
(`--baseline`), alternated in the same session.

A GPU engine's build is long (vLLM's: 25-55 s) and what follows it until the first page is
rendered is on the start's path: the render workers' fork server, its imports, the first
worker and its first document. Here the build is the textlayer engine's, made `--build-s`
long by a sleep (as a GPU build, it leaves the CPU to others), and each measurement is a fresh
process running `run_job` on samples/'s documents; from the run record's timings,
`after_build_s` = first_page_s - turn_wait_s - engine_start_s. Equal work: the same pages and
rows, checked.

    git worktree add /tmp/oldtree HEAD~1
    python bench/first_page.py --baseline /tmp/oldtree --repeats 7
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
from pathlib import Path

import twotrees

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import glob, json, os, sys, time
tree, src, out, build_s = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
import pyarrow.parquet as pq
from batchocr import engines
from batchocr.pipeline import run_job
from batchocr.spec import JobSpec

real = engines.create

def create(name, options):  # a build as long as a GPU engine's, the CPU left idle
    time.sleep(build_s)
    return real(name, options)

engines.create = create
summary = run_job(JobSpec(source=src, out=out, engine="textlayer"), progress=False)
(record,) = glob.glob(os.path.join(out, "_runs", "*.json"))
t = json.load(open(record))["timings"]
import batchocr
assert os.path.realpath(batchocr.__path__[0]) == os.path.realpath(os.path.join(tree, "batchocr")), batchocr.__path__
print(json.dumps({
    "first_page_s": t["first_page_s"], "engine_start_s": t["engine_start_s"],
    "after_build_s": round(t["first_page_s"] - t["turn_wait_s"] - t["engine_start_s"], 3),
    "pages": summary.pages, "rows": pq.read_table(os.path.join(out, "pages")).num_rows,
}))
"""


def measure(tree: str, src: Path, build_s: float) -> dict:
    with tempfile.TemporaryDirectory() as out:
        return twotrees.measure(CHILD, tree, str(src), str(Path(out) / "out"), str(build_s))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="another checkout's root: its batchocr is the baseline")
    ap.add_argument("--src", type=Path, default=ROOT / "samples" / "report.pdf")
    ap.add_argument("--build-s", type=float, default=5.0, help="how long the engine's build takes")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    trees = {"baseline": str(Path(args.baseline).resolve()), "current": str(ROOT)}
    runs = {name: [] for name in trees}
    for _ in range(args.repeats):  # alternated: the machine's drift falls on both alike
        for name, tree in trees.items():
            runs[name].append(measure(tree, args.src, args.build_s))
    work = {name: sorted({(r["pages"], r["rows"]) for r in rs}) for name, rs in runs.items()}
    keys = ("after_build_s", "first_page_s", "engine_start_s")
    result = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                   f"python {platform.python_version()}",
        "src": str(args.src), "build_s": args.build_s, "repeats": args.repeats,
        "work": work, "equal_work": len({tuple(w) for w in work.values()}) == 1 and len(work["current"]) == 1,
        "median": {name: {k: round(statistics.median(r[k] for r in rs), 3) for k in keys} for name, rs in runs.items()},
        "runs": runs,
    }
    m = result["median"]
    result["ratio_current/baseline"] = {k: round(m["current"][k] / m["baseline"][k], 3) for k in keys}
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
