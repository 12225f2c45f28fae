"""Which way up: the rapidocr engine's page vote (batchocr/deskew.py: quarter_turns) on real
pages turned four ways, and what the vote costs.

Pages: the first and the middle page of every PDF in the Debian documentation packages that
tests/tools.py fetches (tests/realset.py's set and the reading-order tests' files), and six
real scans and photos among OCRmyPDF's test resources (SCANS: linn.png as cardinal.pdf's
upright page, a typewritten page, a page of Huckleberry Finn, two printouts of Wikipedia
articles scanned, a Kodak scan), rendered at 150 dpi. Each is turned 0, 90,
180 and 270 degrees counter-clockwise (np.rot90); the vote must give the turns back. For each
it prints the tall boxes' share of the boxes' length and the voting length read upside down
and upright (the vote's two sides), and per turn the smallest margin (the right side's share
less the wrong side's) and the smallest lead of the right side over the classified length
(what deskew.FLIP_MARGIN bounds for a flip). Cost: the classifier's CPU-s a page against the whole page's read
(the engine's recognise) on the upright pages.

    python bench/orientation.py                      # needs the files: run tests/test_realset.py once
    python bench/orientation.py --json docs/orientation-2026-12-07.json
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pymupdf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from batchocr import deskew  # noqa: E402
from batchocr.engines import rapidocr  # noqa: E402


# OCRmyPDF 17.13.0's test resources that are real scans or photos of text (its README.rst)
SCANS = ["cardinal.pdf", "typewriter.png", "c03-29.pdf", "epson.pdf", "masks.pdf", "kcs.pdf"]


def pages() -> list[tuple[str, pymupdf.Page]]:
    from tools import CARDINAL, pypi_sdist_member

    out = []
    for f in sorted(glob.glob(str(ROOT / ".tools/debian/*/usr/**/*.pdf*"), recursive=True)):
        data = gzip.open(f).read() if f.endswith(".gz") else Path(f).read_bytes()
        doc = pymupdf.open(stream=data, filetype="pdf")
        out += [(f"{Path(f).name}:{p}", doc[p]) for p in sorted({0, len(doc) // 2})]
    project, version, _ = CARDINAL
    for name in SCANS:
        out.append((f"ocrmypdf {name}:0", pymupdf.open(pypi_sdist_member(project, version, f"tests/resources/{name}"))[0]))
    return out


def shares(quads, votes, crops) -> tuple[float, float, float]:
    """(tall boxes' share of the boxes' length, the voting lines' length read upside down, upright)."""
    q = np.asarray(quads, dtype=np.float64).reshape(-1, 4, 2)
    w, h = np.hypot(*(q[:, 1] - q[:, 0]).T), np.hypot(*(q[:, 3] - q[:, 0]).T)
    tall, wide = h[h >= deskew.CROP_TURNED * w].sum(), w[w >= deskew.CROP_TURNED * h].sum()
    length = np.array([c.shape[1] for c in crops], dtype=np.float64)
    voting = sorted(range(len(crops)), key=lambda i: -crops[i].shape[1])[:deskew.ORIENT_LINES]
    total = length[voting].sum()  # the voting lines' length: the shares are of it
    down = sum(length[i] for i, v in enumerate(votes) if v is True) / total
    up = sum(length[i] for i, v in enumerate(votes) if v is False) / total
    return float(tall / max(tall + wide, 1e-9)), float(down), float(up)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    engine = rapidocr.create({"threads": 1})
    rows, wrong, margin, relative = [], [], {k: 1.0 for k in range(4)}, {k: 1.0 for k in range(4)}
    vote_cpu, read_cpu = [], []
    for name, page in pages():
        pix = page.get_pixmap(dpi=150, colorspace=pymupdf.csRGB, alpha=False)
        upright = np.frombuffer(pix.samples, np.uint8).reshape(pix.height, pix.width, 3)
        cells = []
        for k in range(4):
            rgb = np.ascontiguousarray(np.rot90(upright, k))
            try:
                _, crops, det = engine._detect(engine._shrunk(rgb))
            except Exception as exc:  # noqa: BLE001 - nothing detected: no vote to check
                cells.append({"turned": 90 * k, "error": type(exc).__name__})
                continue
            start = time.process_time()
            votes = engine._upside_down(crops)
            turns = deskew.quarter_turns(det.boxes, votes)
            vote_cpu.append(time.process_time() - start)
            tall, down, up = shares(det.boxes, votes, crops)
            right = (4 - k) % 4
            margin[k] = min(margin[k], (down - up) if k in (1, 2) else (up - down))
            # the rule's own measure: the lead of the right side over the classified length
            relative[k] = min(relative[k], ((down - up) if k in (1, 2) else (up - down)) / max(down + up, 1e-9))
            if turns != right:
                wrong.append((name, 90 * k, turns))
            cells.append({"turned": 90 * k, "boxes": len(det.boxes), "tall": round(tall, 3),
                          "upside_down": round(down, 3), "upright": round(up, 3), "turns": turns, "right": right})
        print(f"{name[:34]:34s}", " | ".join(f"{c['turned']:3d}: tall {c.get('tall', 0):.2f} down "
                                             f"{c.get('upside_down', 0):.2f} up {c.get('upright', 0):.2f}"
                                             for c in cells), flush=True)
        rows.append({"page": name, "turned": cells})
        if len(read_cpu) < 4 and name.startswith(("refcard-a4", "ocrmypdf cardinal", "libtasn1", "zoo.pdf")):
            start = time.process_time()
            engine.recognise(upright)
            read_cpu.append(time.process_time() - start)
    decided = sum(1 for r in rows for c in r["turned"] if "turns" in c)
    summary = {
        "date": time.strftime("%Y-%m-%d"), "machine": platform.processor() or platform.machine(),
        "pages": len(rows), "decisions": decided, "wrong": wrong,
        "smallest_margin_by_turn": {90 * k: round(v, 3) for k, v in margin.items()},
        "smallest_lead_of_the_classified_length_by_turn": {90 * k: round(v, 3) for k, v in relative.items()},
        "flip_margin": deskew.FLIP_MARGIN,
        "vote_cpu_s_median": round(float(np.median(vote_cpu)), 4),
        "read_cpu_s_median": round(float(np.median(read_cpu)), 2) if read_cpu else None,
        "threads": 1, "dpi": 150, "lines_voting": deskew.ORIENT_LINES,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({**summary, "rows": rows}, indent=1) + "\n")
    engine.close()


if __name__ == "__main__":
    main()
