"""Peak memory of a run over 2,000 documents against one over 200 (goal: within 1.2x).

Each run is a fresh process (textlayer engine, so the run is quick; the stages that
hold state, listing, render pool, resume keys, part writer, are the same for
every engine). Reported: the run process's peak RSS and the largest render
worker's peak RSS, from getrusage (the workers are the fork server's children: the
server, stopped and reaped first, counts theirs).

    python bench/memory.py [--small 200] [--large 2000] [--pages 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

CHILD = """
import json, resource, sys
from batchocr.pipeline import run_job
from batchocr.spec import load_job
summary = run_job(load_job(None, source=sys.argv[1], out=sys.argv[2], engine="textlayer",
                           **{"commit.every_pages": 200}), progress=False)
try:  # the render workers are the fork server's children: the server reaped, theirs is counted
    from multiprocessing import forkserver
    forkserver._forkserver._stop()
except Exception:
    pass
print(json.dumps({"pages": summary.pages, "documents": summary.documents, "seconds": summary.seconds,
                  "self_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "worker_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def measure(documents: int, pages: int, tmp: Path) -> dict:
    from corpus import text_corpus

    src = tmp / f"src{documents}"
    text_corpus(src, documents, pages)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(src), str(tmp / f"out{documents}")],
                          capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=200)
    ap.add_argument("--large", type=int, default=2000)
    ap.add_argument("--pages", type=int, default=2, help="pages per document")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        small = measure(args.small, args.pages, Path(tmp))
        large = measure(args.large, args.pages, Path(tmp))
    ratio_self = large["self_kb"] / small["self_kb"]
    ratio_worker = large["worker_kb"] / small["worker_kb"]
    print(f"{'documents':>9} {'pages':>6} {'seconds':>8} {'run MB':>7} {'worker MB':>9}")
    for r in (small, large):
        print(f"{r['documents']:>9} {r['pages']:>6} {r['seconds']:>8.1f} {r['self_kb'] / 1024:>7.1f} {r['worker_kb'] / 1024:>9.1f}")
    print(f"peak RSS {args.large} vs {args.small} documents: run process {ratio_self:.3f}x, "
          f"largest render worker {ratio_worker:.3f}x (goal <= 1.2x)")
    if args.json:
        args.json.write_text(json.dumps({"small": small, "large": large, "ratio_run": ratio_self,
                                         "ratio_worker": ratio_worker, "python": platform.python_version(),
                                         "machine": platform.machine()}, indent=2))


if __name__ == "__main__":
    main()
