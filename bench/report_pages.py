"""The HTML report of a run, as a person sees it: a page of 1,280 px screenshot by
headless chromium (Debian's `chromium` package), for the demo and for a run of
500+ pages. The PNGs in docs/report/ come from here.

    python bench/report_pages.py demo OUT_DIR            # the README's demo (samples/, rapidocr)
    python bench/report_pages.py mixed OUT_DIR [--born N] [--mixed M]

`mixed`: N born-digital PDFs of 1-8 pages (English prose, a real text layer: route
auto takes it) and M mixed documents of tests/routing_corpus.py (per 4 pages: 2
born-digital, a scan, a page whose layer must not be trusted: rapidocr reads those),
all made on the fly; by default 110 + 10, about 540 pages of which 20 are read by
rapidocr on the CPU (a couple of minutes on 2 cores). Each mode runs `batchocr run`
and `batchocr report --html` as a user would, then screenshots the page into
OUT_DIR/report.png (width 1280, cropped to its content, 256 colours).
"""

from __future__ import annotations

import argparse
import random
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # routing_corpus: the router's own test documents


def corpus(folder: Path, born: int, mixed: int, seed: int = 7) -> int:
    """`born` PDFs of 1-8 born-digital pages and `mixed` documents of routing_corpus,
    spread evenly through the listing (doc-NNNN.pdf), as scans come in a real backfill;
    returns the pages written."""
    import pymupdf
    from routing_corpus import FONT_SIZE, PAGE, mixed_document, prose

    rnd, pages = random.Random(seed), 0
    every = (born + mixed) / max(mixed, 1)
    mixed_at = {round(i * every + every / 2) for i in range(mixed)}
    for d in range(born + mixed):
        if d in mixed_at:
            name, made = mixed_document(folder / "tmp", d)
            (folder / "tmp" / name).rename(folder / f"doc-{d:04d}.pdf")
            pages += len(made)
            continue
        doc = pymupdf.open()
        for i in range(rnd.randint(1, 8)):
            page = doc.new_page(width=PAGE[2], height=PAGE[3])
            page.insert_text((60, 80), prose(seed * 100_000 + d * 100 + i, lines=rnd.randint(4, 40)),
                             fontsize=FONT_SIZE, lineheight=1.6)
            pages += 1
        doc.save(folder / f"doc-{d:04d}.pdf")
    (folder / "tmp").rmdir()
    return pages


def screenshot(page: Path, png: Path, width: int = 1280) -> None:
    """page as chromium draws it at `width` px, cropped below its content, 256 colours."""
    from PIL import Image, ImageChops

    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("needs chromium: apt-get install chromium")
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},9000", f"--screenshot={png}", page.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    with Image.open(png) as im:
        im = im.convert("RGB")
        box = ImageChops.difference(im, Image.new("RGB", im.size, "white")).getbbox()
        im = im.crop((0, 0, width, min(im.height, box[3] + 24)))
        im.quantize(256).save(png, optimize=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["demo", "mixed"])
    ap.add_argument("dest", type=Path)
    ap.add_argument("--born", type=int, default=110)
    ap.add_argument("--mixed", type=int, default=10)
    ap.add_argument("--report-only", action="store_true", help="DEST/out is there: only the report and its PNG")
    args = ap.parse_args()
    dest = args.dest
    out, truth = dest / "out", []
    if args.mode == "demo":
        source = ROOT / "samples"
        truth = ["--truth", str(ROOT / "samples" / "truth")]
    elif not args.report_only:
        source = dest / "scans"
        source.mkdir(parents=True, exist_ok=True)
        pages = corpus(source, args.born, args.mixed)
        print(f"{args.born + args.mixed} documents, {pages} pages -> {source}", flush=True)
    batchocr = [sys.executable, "-m", "batchocr.cli"]
    if not args.report_only:
        subprocess.run([*batchocr, "run", str(source), str(out), "--quiet"], check=True)
    subprocess.run([*batchocr, "report", str(out), *truth, "--html", str(dest / "report.html")], check=True,
                   stdout=(dest / "report.txt").open("w"))
    screenshot(dest / "report.html", dest / "report.png")
    print(f"-> {dest / 'report.png'}")


if __name__ == "__main__":
    main()
