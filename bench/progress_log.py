"""A run's progress as a pod's log gets it (stderr a file, not a terminal): generated
text PDFs read by the textlayer engine slowed down to --seconds-per-page, so that the
run lasts minutes and its 30-s lines can be seen. Writes the run's stderr to --log.

    python bench/progress_log.py [--documents 30] [--pages 10] [--seconds-per-page 0.4] [--log FILE]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--documents", type=int, default=30)
    ap.add_argument("--pages", type=int, default=10)
    ap.add_argument("--seconds-per-page", type=float, default=0.4)
    ap.add_argument("--log", default="docs/progress-log.txt")
    args = ap.parse_args()

    from corpus import text_corpus
    from test_progress import SlowTextLayer

    from batchocr.pipeline import run_job
    from batchocr.spec import load_job

    with tempfile.TemporaryDirectory() as tmp, open(args.log, "w") as log:
        text_corpus(Path(tmp) / "src", documents=args.documents, pages=args.pages)
        spec = load_job(None, source=f"{tmp}/src", out=f"{tmp}/out", engine="textlayer", route="model")
        sys.stderr = log  # as a pod's: not a terminal
        try:
            summary = run_job(spec, progress=True, engine=SlowTextLayer(args.seconds_per_page))
        finally:
            sys.stderr = sys.__stderr__
    print(summary.line())
    print(f"{args.log}: {len(Path(args.log).read_text().splitlines())} lines over {summary.seconds:.0f} s")


if __name__ == "__main__":
    main()
