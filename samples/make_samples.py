#!/usr/bin/env python3
"""Generate the batchocr sample corpus (deterministic, offline).

Writes into the folder this script lives in (or ``--out DIR``):

  report.pdf     3-page born-digital PDF with a real text layer
  scanned.pdf    2-page image-only PDF (no text layer), 200 dpi grayscale scans
  receipt.png    1-page grayscale scan of a shop receipt, 200 dpi
  letter.jpg     1-page grayscale scan of a letter, 150 dpi, JPEG quality 88
  fax.tiff       3-frame bilevel (1-bit, CCITT group 4) TIFF, 200 dpi, A6 pages
  truth/<file name>/<page index>.txt   exact text of each page, one visual
                                       line per text line, reading order

Only PyMuPDF's built-in Base-14 fonts are used ("helv", "tiro", "cour"),
so no font files are needed.  All randomness (noise, rotation angles) comes
from fixed seeds, so re-running produces byte-identical files with the same
versions of PyMuPDF / Pillow / NumPy / zlib / libjpeg.

Usage:
  python samples/make_samples.py            # regenerate in samples/
  python samples/make_samples.py --out DIR  # regenerate elsewhere
  python samples/make_samples.py --verify   # regenerate, then check text
                                            # layer + OCR CER (needs rapidocr)
"""

from __future__ import annotations

import argparse
import io
import os
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import pymupdf
from PIL import Image, ImageFilter

# ---------------------------------------------------------------------------
# Page texts.  Every string is one visual line.  ASCII only.
# ---------------------------------------------------------------------------

REPORT_PAGES = [
    [
        "Quarterly Operations Report - Northwind Logistics",
        "Prepared on 14 March 2024 for the board meeting of 21 March 2024.",
        "",
        "This report summarises the operating results of the fourth quarter of",
        "2023. Revenue for the quarter reached $4,812,300, an increase of 6.4%",
        "over the same quarter of 2022. Shipping volume grew to 128,450 parcels,",
        "while the average delivery time fell from 2.9 days to 2.6 days.",
        "",
        "The new sorting hub in Leeds opened on 2 October 2023 and handled",
        "31,200 parcels in its first month. Staff costs for the hub were",
        "$212,750, slightly below the budget of $225,000 approved in June.",
        "",
        "Customer complaints dropped to 412 cases, or 0.32% of all deliveries.",
        "Most complaints concerned late evening deliveries in rural areas.",
        "The support team resolved 97% of cases within 48 hours.",
    ],
    [
        "Section 2: Costs and Fleet",
        "",
        "Fuel remained the largest variable cost. The fleet used 1,843,000",
        "litres of diesel in the quarter at an average price of $1.47 per litre,",
        "for a total of $2,709,210. Eleven electric vans were added on",
        "15 November 2023, bringing the electric share of the fleet to 18%.",
        "",
        "Maintenance spending was $386,900, up from $341,200 a year earlier,",
        "mainly because of tyre replacements before the winter season.",
        "Two vehicles were retired after more than 400,000 km of service.",
        "",
        "Insurance premiums for 2024 were renewed on 1 January 2024 at",
        "$518,000 per year, a rise of 3.1% that is in line with the market.",
        "The board is asked to note these figures; no decision is required.",
    ],
    [
        "Section 3: Outlook for 2024",
        "",
        "Management expects revenue of $19.6 million for the full year 2024,",
        "assuming parcel volume grows by 5% and prices stay flat. The target",
        "for average delivery time is 2.4 days by the end of the year.",
        "",
        "Planned investments include a second electric charging depot in",
        "Bristol at an estimated cost of $1,150,000, to be completed by",
        "30 September 2024, and an upgrade of the route planning software",
        "for $96,500. Both items are included in the approved capital plan.",
        "",
        "Risks include higher energy prices, driver shortages and the new",
        "emission rules that take effect on 1 July 2024. The next report",
        "will be presented on 18 July 2024.",
        "",
        "Page 3 of 3",
    ],
]

SCANNED_PAGES = [
    [
        "MINUTES OF THE HOUSING COMMITTEE",
        "Meeting held on 9 May 2023 at 7:30 pm",
        "",
        "Present: J. Carter (chair), M. Okafor,",
        "L. Brennan, S. Patel and R. Holm.",
        "",
        "1. The minutes of 11 April 2023 were",
        "approved without changes.",
        "2. The treasurer reported a balance of",
        "$18,420.75 on the maintenance account.",
        "3. Roof repairs at 42 Elm Street were",
        "quoted at $6,300 by two contractors.",
        "The committee agreed to accept the",
        "lower quote of $5,980 from Ridge Ltd.",
    ],
    [
        "4. Garden and parking",
        "",
        "The shared garden will be cleaned on",
        "Saturday 3 June 2023 from 10 am to 2 pm.",
        "Residents may reserve one of the 24",
        "parking spaces for $35 per month.",
        "",
        "5. Any other business",
        "",
        "Ms. Brennan asked for better lighting",
        "near the back entrance. The chair will",
        "request a price before the next meeting.",
        "",
        "The meeting closed at 9:05 pm. Next",
        "meeting: 13 June 2023, same location.",
    ],
]

# Receipt lines: Courier (monospace), amounts right-aligned with spaces.
RECEIPT_WIDTH = 32
_RECEIPT_ITEMS = [
    ("Whole milk 1L", "1.29"),
    ("Rye bread", "3.45"),
    ("Free range eggs x12", "4.80"),
    ("Cheddar 400g", "5.60"),
    ("Apples 1.2kg", "2.94"),
    ("Ground coffee 250g", "6.75"),
    ("Dish soap", "2.10"),
]


def _receipt_lines() -> list[str]:
    def row(label: str, amount: str) -> str:
        gap = RECEIPT_WIDTH - len(label) - len(amount)
        assert gap >= 2, label
        return label + " " * gap + amount

    subtotal = sum(float(a) for _, a in _RECEIPT_ITEMS)
    assert abs(subtotal - 26.93) < 1e-9, subtotal
    lines = [
        "GREENLEAF MARKET",
        "118 Harbour Road, Portsmouth",
        "Tel 023 9284 1177",
        "",
        "Date 2024-02-17   Time 16:42",
        "Receipt no. 004718",
        "",
    ]
    lines += [row(lab, amt) for lab, amt in _RECEIPT_ITEMS]
    lines += [
        "",
        row("TOTAL", "26.93"),
        row("Card payment", "26.93"),
        "",
        "Thank you for shopping with us",
    ]
    return lines


RECEIPT_LINES = _receipt_lines()

LETTER_LINES = [
    "Harper & Finch Accountants",
    "27 Castle Street, York YO1 9RT",
    "",
    "12 January 2024",
    "",
    "Dear Mr. Lindqvist,",
    "",
    "Thank you for sending the documents for your 2023 tax return.",
    "We have checked the invoices and receipts and found a total",
    "income of $64,215 and deductible expenses of $9,870.",
    "",
    "Please sign the enclosed form and return it before 31 January",
    "2024. Our fee for this year is $450, payable within 30 days.",
    "If you have any questions, call us on 01904 552 310.",
    "",
    "Yours sincerely,",
    "Emma Harper",
]

FAX_PAGES = [
    [
        "FAX - Page 1 of 3",
        "To: Dr. A. Novak, Riverside Clinic",
        "From: Central Lab Services",
        "Date: 5 March 2024",
        "",
        "Re: Sample results for order 77215",
        "",
        "Please find the results of the",
        "blood tests taken on 1 March 2024.",
        "All values are within normal range",
        "unless marked otherwise.",
    ],
    [
        "FAX - Page 2 of 3",
        "",
        "Glucose        5.2 mmol/L",
        "Cholesterol    4.9 mmol/L",
        "Sodium         139 mmol/L",
        "Potassium      4.1 mmol/L",
        "Creatinine     88 umol/L",
        "Haemoglobin    141 g/L",
        "",
        "Tests checked by: K. Lewis",
    ],
    [
        "FAX - Page 3 of 3",
        "",
        "Invoice 2024-0311",
        "Lab fee for order 77215: $126.00",
        "Payment due by 4 April 2024.",
        "",
        "Questions: call 0161 496 0832",
        "between 8 am and 5 pm.",
        "",
        "This fax is confidential.",
    ],
]

# ---------------------------------------------------------------------------
# Page geometry (points) and rendering parameters.
# ---------------------------------------------------------------------------

A4 = pymupdf.paper_rect("a4")          # 595 x 842 pt
A5 = pymupdf.paper_rect("a5")          # 420 x 595 pt
A6 = pymupdf.paper_rect("a6")          # 297 x 420 pt
LETTER = pymupdf.paper_rect("letter")  # 612 x 792 pt
RECEIPT = pymupdf.Rect(0, 0, 240, 432)  # ~3.33 x 6 in


def write_text_page(page: pymupdf.Page, lines, *, fontname, fontsize,
                    left, top, leading):
    """Write ``lines`` top-down starting at baseline ``top``, one per line."""
    right_limit = page.rect.width - left * 0.5
    y = top
    for line in lines:
        if line:
            width = pymupdf.get_text_length(line, fontname=fontname,
                                            fontsize=fontsize)
            assert left + width <= right_limit, (line, width)
            rc = page.insert_text((left, y), line, fontname=fontname,
                                  fontsize=fontsize, color=(0, 0, 0))
            assert rc >= 0
        y += leading
    assert y - leading <= page.rect.height - top * 0.5, "text runs off page"


def render_clean(rect, lines, dpi, **style) -> np.ndarray:
    """Render ``lines`` onto a page of ``rect`` and return 8-bit gray pixels."""
    doc = pymupdf.open()
    page = doc.new_page(width=rect.width, height=rect.height)
    write_text_page(page, lines, **style)
    pix = page.get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY, alpha=False)
    arr = np.frombuffer(pix.samples, dtype=np.uint8).reshape(pix.height,
                                                             pix.width)
    doc.close()
    return arr.copy()


def scanify(gray: np.ndarray, seed: int, *, angle: float, blur: float,
            noise: float, paper: int = 246, ink: int = 28,
            white: float | None = None) -> Image.Image:
    """Make clean rendered text look mildly scanned.

    paper/ink tone mapping, tiny rotation, very light blur, gaussian noise,
    then a scanner-style white point (levels >= ``white`` become 255) so the
    blank paper compresses well while strokes keep their noisy edges.
    """
    if white is None:
        white = paper - 3.0 - 2.3 * noise   # ~99% of paper pixels -> 255
    rng = np.random.default_rng(seed)
    f = gray.astype(np.float32) / 255.0            # 1 = white, 0 = black
    f = ink + (paper - ink) * f                    # toner / paper tones
    # Slightly uneven illumination: smooth horizontal gradient (+-3 levels).
    h, w = f.shape
    f += np.linspace(-3.0, 3.0, w, dtype=np.float32)[None, :]
    img = Image.fromarray(np.clip(f, 0, 255).astype(np.uint8), mode="L")
    if angle:
        img = img.rotate(angle, resample=Image.BICUBIC, expand=False,
                         fillcolor=paper)
    if blur:
        img = img.filter(ImageFilter.GaussianBlur(blur))
    f = np.asarray(img, dtype=np.float32)
    f += rng.normal(0.0, noise, size=f.shape).astype(np.float32)
    f *= 255.0 / white
    return Image.fromarray(np.clip(np.rint(f), 0, 255).astype(np.uint8),
                           mode="L")


def bilevel_fax(gray: np.ndarray, seed: int, *, angle: float) -> Image.Image:
    """Fax-like 1-bit page: slight rotation, threshold, a few speckles."""
    rng = np.random.default_rng(seed)
    img = Image.fromarray(gray, mode="L")
    if angle:
        img = img.rotate(angle, resample=Image.BICUBIC, expand=False,
                         fillcolor=255)
    f = np.asarray(img, dtype=np.float32)
    f += rng.normal(0.0, 10.0, size=f.shape).astype(np.float32)
    bw = f >= 150                                   # True = white
    # Sparse isolated black speckles (about 1 in 20,000 pixels).
    speck = rng.random(bw.shape) < 5e-5
    bw[speck] = False
    return Image.fromarray(bw.astype(np.uint8) * 255, mode="L").convert(
        "1", dither=Image.Dither.NONE)


# ---------------------------------------------------------------------------
# Writers
# ---------------------------------------------------------------------------

def _save_pdf(doc: pymupdf.Document, path: Path):
    doc.set_metadata({"producer": "batchocr make_samples.py",
                      "creator": "batchocr make_samples.py",
                      "creationDate": "D:20240101000000Z",
                      "modDate": "D:20240101000000Z"})
    doc.save(str(path), garbage=4, deflate=True, no_new_id=True,
             reproducible=True)
    doc.close()


def make_report(out: Path) -> list[list[str]]:
    doc = pymupdf.open()
    for lines in REPORT_PAGES:
        page = doc.new_page(width=A4.width, height=A4.height)
        write_text_page(page, lines, fontname="helv", fontsize=11,
                        left=72, top=90, leading=17)
    _save_pdf(doc, out / "report.pdf")
    return REPORT_PAGES


def make_scanned(out: Path) -> list[list[str]]:
    dpi = 200
    doc = pymupdf.open()
    for i, lines in enumerate(SCANNED_PAGES):
        gray = render_clean(A5, lines, dpi, fontname="tiro", fontsize=12,
                            left=56, top=80, leading=20)
        img = scanify(gray, seed=1000 + i, angle=(0.25, -0.2)[i], blur=0.6,
                      noise=7.0)
        # Scanners usually store pages in PDFs as JPEG (DCTDecode).
        buf = io.BytesIO()
        img.save(buf, format="JPEG", quality=85, dpi=(dpi, dpi),
                 optimize=True)
        page = doc.new_page(width=A5.width, height=A5.height)
        page.insert_image(page.rect, stream=buf.getvalue())
    _save_pdf(doc, out / "scanned.pdf")
    return SCANNED_PAGES


def make_receipt(out: Path) -> list[list[str]]:
    dpi = 200
    gray = render_clean(RECEIPT, RECEIPT_LINES, dpi, fontname="cour",
                        fontsize=10.5, left=18, top=40, leading=15)
    img = scanify(gray, seed=2000, angle=-0.3, blur=0.5, noise=6.0,
                  paper=240, ink=40)
    img.save(out / "receipt.png", format="PNG", optimize=True, dpi=(dpi, dpi))
    return [RECEIPT_LINES]


def make_letter(out: Path) -> list[list[str]]:
    dpi = 150
    gray = render_clean(LETTER, LETTER_LINES, dpi, fontname="tiro",
                        fontsize=13, left=72, top=96, leading=22)
    img = scanify(gray, seed=3000, angle=0.15, blur=0.5, noise=6.0)
    img.save(out / "letter.jpg", format="JPEG", quality=88, dpi=(dpi, dpi),
             optimize=True)
    return [LETTER_LINES]


def make_fax(out: Path) -> list[list[str]]:
    dpi = 200
    frames = []
    for i, lines in enumerate(FAX_PAGES):
        gray = render_clean(A6, lines, dpi, fontname="cour", fontsize=11,
                            left=24, top=48, leading=17)
        frames.append(bilevel_fax(gray, seed=4000 + i,
                                  angle=(0.2, -0.25, 0.1)[i]))
    frames[0].save(out / "fax.tiff", format="TIFF", save_all=True,
                   append_images=frames[1:], compression="group4",
                   dpi=(dpi, dpi))
    return FAX_PAGES


def write_truth(out: Path, name: str, pages: list[list[str]]):
    d = out / "truth" / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for i, lines in enumerate(pages):
        # Drop blank lines (they are layout only) and trailing spaces.
        text = "\n".join(l.rstrip() for l in lines if l.strip()) + "\n"
        (d / f"{i}.txt").write_text(text, encoding="utf-8", newline="\n")


MAKERS = {
    "report.pdf": make_report,
    "scanned.pdf": make_scanned,
    "receipt.png": make_receipt,
    "letter.jpg": make_letter,
    "fax.tiff": make_fax,
}


def generate(out: Path):
    out.mkdir(parents=True, exist_ok=True)
    for name, maker in MAKERS.items():
        pages = maker(out)
        write_truth(out, name, pages)
        print(f"wrote {name} ({len(pages)} page(s))")


# ---------------------------------------------------------------------------
# Verification (optional; needs rapidocr + onnxruntime)
# ---------------------------------------------------------------------------

def norm(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def page_pixels(doc: pymupdf.Document, page: pymupdf.Page) -> np.ndarray:
    """RGB pixels as the project's tests render them.

    PDFs: 200 dpi.  Image files: native pixel size (MuPDF sizes an image page
    as pixels * 72 / image_dpi points, so a plain get_pixmap() would render it
    at 72/dpi of its real size; scale back up to the stored pixels).
    """
    if doc.is_pdf:
        pix = page.get_pixmap(dpi=200)
    else:
        info = page.get_image_info()[0]
        zoom = info["width"] / page.rect.width
        pix = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom))
        assert (pix.width, pix.height) == (info["width"], info["height"])
    return np.frombuffer(pix.samples, dtype=np.uint8).reshape(
        pix.height, pix.width, pix.n)[:, :, :3].copy()


def verify(out: Path) -> bool:
    os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
    import time
    from rapidfuzz.distance import Levenshtein
    from rapidocr import RapidOCR

    eng = RapidOCR(params={"Global.use_cls": False,
                           "Global.log_level": "warning"})
    ok = True
    total_err = total_len = 0
    rows = []
    for name in MAKERS:
        doc = pymupdf.open(out / name)
        tdir = out / "truth" / name
        n_truth = len(list(tdir.glob("*.txt")))
        if doc.page_count != n_truth:
            print(f"FAIL {name}: {doc.page_count} pages, {n_truth} truths")
            ok = False
        for i, page in enumerate(doc):
            truth = norm((tdir / f"{i}.txt").read_text(encoding="utf-8"))
            layer = norm(page.get_text())
            if name == "report.pdf":
                good = layer == truth
                ok &= good
                rows.append((name, i, "text layer",
                             "exact" if good else "MISMATCH", ""))
                continue
            if layer:
                print(f"FAIL {name} page {i}: unexpected text layer")
                ok = False
            rgb = page_pixels(doc, page)
            t0 = time.perf_counter()
            r = eng(rgb)
            dt = time.perf_counter() - t0
            ocr = norm("\n".join(r.txts or ()))
            err = Levenshtein.distance(ocr, truth)
            cer = err / len(truth)
            total_err += err
            total_len += len(truth)
            good = cer <= 0.015
            ok &= good
            rows.append((name, i, f"{rgb.shape[1]}x{rgb.shape[0]}",
                         f"{err}/{len(truth)} = {cer:.2%}", f"{dt:.1f}s"))
            if err:
                print(f"--- {name} page {i} ocr:\n{ocr}\n--- truth:\n{truth}")
    print("\n| file | page | pixels | errors/chars = CER | OCR time |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(str(c) for c in r) + " |")
    if total_len:
        print(f"\noverall OCR CER: {total_err}/{total_len} = "
              f"{total_err / total_len:.2%}")
    print("OK" if ok else "FAILED")
    return ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path,
                    default=Path(__file__).resolve().parent,
                    help="output folder (default: the folder of this script)")
    ap.add_argument("--verify", action="store_true",
                    help="after generating, check text layer and OCR CER")
    ap.add_argument("--verify-only", action="store_true",
                    help="only run the checks on an existing corpus")
    args = ap.parse_args(argv)
    if not args.verify_only:
        generate(args.out)
    if args.verify or args.verify_only:
        return 0 if verify(args.out) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
