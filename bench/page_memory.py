"""Peak memory of the rapidocr engine on one large page, by page size and `memory_mb` budget.

Each measurement is a fresh process: the engine is loaded and warmed on a small
page, the page is put in a one-page Arrow batch (as a render worker sends it),
freed memory is handed back (malloc_trim), the kernel's peak-RSS mark is reset
(/proc/self/clear_refs), and the batch goes through the engine's run(). Reported:
the peak RSS growth over the loaded engine holding the batch (VmHWM after minus
VmRSS before), the detector's input pixels (the ONNX input tensor of each pass),
the share of the page's words found (multisets of words, order aside) and the
seconds. Pages (tests/layouts.py) are rendered at the zoom that gives their size:
`letter` a single-column Letter page, `poster` nine of them on one sheet (small
text on a large page: the engine rescales it up and detects it again).

    python bench/page_memory.py --baseline /tmp/oldtree   # + the code of another checkout, its defaults
    python bench/page_memory.py --kinds poster --pages 40 --budgets 600,768,1024,1280,1536,2048,huge
    python bench/page_memory.py --detector 1,2,4,8       # the detector alone: bytes per input pixel

A budget of `huge` (100000 MB) is the engine without a memory bound (its pixel
rules before memory_mb). `--detector` fits the detector's own peak growth against
its input pixels (the figure behind batchocr.engines.rapidocr.BYTES_PER_DETECTOR_PIXEL).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import ctypes, json, sys, threading, time
from collections import Counter
sys.path.insert(0, sys.argv[1])
import numpy as np
import layouts
from batchocr import schema
from batchocr.engines import rapidocr as R

mode, mpx, budget, kind = sys.argv[2], float(sys.argv[3]), sys.argv[4], sys.argv[5]

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

page = layouts.poster() if kind == "poster" else layouts.single_column()
opts = {} if budget == "default" else {"memory_mb": 100000 if budget == "huge" else int(budget)}
engine = R.create(opts)
engine.recognise(layouts.pixels(layouts.single_column(), 0.3).copy())  # models loaded, sessions warm
det = engine._ocr._load_det_model()
shapes = []
class Watch:  # the detector's ONNX session: the tensors it is given
    def __init__(self, s): self.s = s
    def __call__(self, x):
        shapes.append(x.shape)
        return self.s(x)
    def __getattr__(self, k): return getattr(self.s, k)
det.session = Watch(det.session)
img = layouts.pixels(page, mpx)
if mode == "detector":  # the detector alone, on an image it does not resize (sides multiples of 32)
    h, w = (s // 32 * 32 for s in img.shape[:2])
    img = np.ascontiguousarray(img[:h, :w, ::-1])
else:  # the page as the pipeline hands it over: one page in an Arrow batch
    batch = schema.batch(schema.PAGES, [{"doc_id": "d", "page_index": 0, "width": img.shape[1],
                                         "height": img.shape[0], "image": img.tobytes()}])
    del img
ctypes.CDLL("libc.so.6").malloc_trim(0)  # what the warm-up freed goes back: the growth is this page's
before = status("VmRSS")
open("/proc/self/clear_refs", "w").write("5")  # resets the peak (VmHWM) to now
start = time.perf_counter()
if mode == "detector":
    det(img)
    text = ""
else:
    (out,) = list(engine.run(iter([batch]), threading.Event()))
    text = out.column("text")[0].as_py() or ""
seconds = time.perf_counter() - start
truth = Counter(" ".join(page.truth).split())
found = Counter(text.split())
print(json.dumps({"engine_mb": before / 2**20, "growth": status("VmHWM") - before,
                  "detector_pixels": [s[2] * s[3] for s in shapes], "seconds": seconds,
                  "word_recall": sum((truth & found).values()) / sum(truth.values())}))
"""


def measure(mode: str, mpx: float, budget: str, kind: str = "letter", tree: Path = ROOT) -> dict:
    # cwd: the checkout whose batchocr is imported (python -c puts it first on sys.path)
    proc = subprocess.run([sys.executable, "-c", CHILD, str(ROOT / "tests"), mode, str(mpx), budget, kind],
                          capture_output=True, text=True, cwd=tree)
    if proc.returncode:
        sys.exit(f"measurement {mode} {mpx} Mpx {budget} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", default="2,10,40", help="page sizes, megapixels")
    ap.add_argument("--budgets", default="huge,default,768", help="memory_mb values (huge, default or MB)")
    ap.add_argument("--kinds", default="letter,poster",
                    help="letter: a Letter page; poster: nine on one sheet (small text: rescaled up)")
    ap.add_argument("--baseline", type=Path, help="another checkout (e.g. a git worktree of main before "
                    "memory_mb): each page measured with its code too, default options")
    ap.add_argument("--detector", help="detector input sizes, megapixels: fit bytes per detector pixel instead")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    print(f"# {platform.platform()}, {platform.processor() or platform.machine()}, python {platform.python_version()}")
    if args.detector:
        print(f"{'detector px':>12} {'peak growth MB':>15} {'bytes/px':>9} {'seconds':>8}", flush=True)
        for mpx in (float(s) for s in args.detector.split(",")):
            r = measure("detector", mpx, "default", "letter")
            px = r["detector_pixels"][-1]
            rows.append(r)
            print(f"{px:>12,} {r['growth'] / 2**20:>15.1f} {r['growth'] / px:>9.1f} {r['seconds']:>8.1f}", flush=True)
        import numpy as np

        x = np.array([r["detector_pixels"][-1] for r in rows], float)
        y = np.array([r["growth"] for r in rows], float)
        slope, icept = np.polyfit(x, y, 1)
        print(f"fit: {slope:.1f} bytes per detector pixel + {icept / 2**20:.1f} MB")
    else:
        print(f"{'page':>6} {'Mpx':>4} {'code':>8} {'memory_mb':>9} {'engine MB':>9} {'peak growth MB':>14} "
              f"{'detector Mpx (each pass)':>24} {'words found':>11} {'seconds':>8}", flush=True)
        runs = [("this", b, ROOT) for b in args.budgets.split(",")]
        if args.baseline:
            runs.insert(0, ("baseline", "default", args.baseline))
        for kind in args.kinds.split(","):
            for mpx in (float(s) for s in args.pages.split(",")):
                for code, budget, tree in runs:
                    r = measure("page", mpx, budget, kind, tree)
                    r.update(kind=kind, page_mpx=mpx, budget=budget, code=code)
                    rows.append(r)
                    passes = ", ".join(f"{p / 1e6:.1f}" for p in r["detector_pixels"])
                    print(f"{kind:>6} {mpx:>4g} {code:>8} {budget:>9} {r['engine_mb']:>9.0f} "
                          f"{r['growth'] / 2**20:>14.1f} {passes:>24} {r['word_recall']:>11.3f} {r['seconds']:>8.1f}",
                          flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
