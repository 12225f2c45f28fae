"""Generated layout pages with ground truth, for reading order and deskew
(tests/test_readingorder.py, bench/accuracy.py). Nothing is downloaded: PyMuPDF's
Base-14 fonts lay the pages out, Pillow and OpenCV degrade their images.

A layout is a list of blocks placed on a Letter page; its truth is the text of
the blocks in reading order (columns left to right, each top to bottom; a table
row by row). A variant renders it to an image (200 dpi), optionally skews and
degrades it, and writes it as an image-only PDF or a PNG.

    python tests/layouts.py OUT [--set test|bench]    # write pages and OUT/truth
"""

from __future__ import annotations

import io
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pymupdf
from PIL import Image, ImageFilter

W, H = 612, 792  # Letter, points
MARGIN = 54
DPI = 200

SENTENCES = [
    "The pump housing is cast from stainless steel and rated for continuous duty at 80 degrees.",
    "Each unit is tested at the factory for leaks, noise and power draw before it is shipped.",
    "Flow rates up to 42 litres per minute are reached at a head of 12 metres.",
    "The motor runs on 230 volts and draws 1.8 amperes at full load.",
    "A thermal cut-out protects the windings when the inlet runs dry.",
    "Service intervals depend on the water quality; hard water needs yearly descaling.",
    "Spare seals, impellers and gaskets are kept in stock for ten years after the last delivery.",
    "Install the pump on a level base and leave 30 centimetres of free space around the fan cover.",
    "Connect the outlet with a flexible hose to keep vibration away from rigid pipework.",
    "The control board reports faults with a blinking code on the front panel.",
    "Our support team answers questions by phone from Monday to Friday.",
    "Orders placed before noon leave the warehouse on the same working day.",
    "Prices exclude delivery, which is charged by weight and destination.",
    "The warranty covers parts and labour for 36 months from the date of purchase.",
    "Customers in remote areas may collect their order from one of 14 depots.",
    "Noise stays below 52 decibels at one metre in every operating mode.",
    "The pressure switch can be set between 1.5 and 4 bar with a single screw.",
    "Older models can be upgraded with the new control board in about twenty minutes.",
    "Energy use fell by a fifth compared with the previous series of the same size.",
    "All wetted parts are approved for drinking water in the European Union.",
]

TABLE = [
    ["Part no.", "Description", "Qty", "Price"],
    ["AB-1042", "Impeller, brass", "2", "18.40"],
    ["AB-2210", "Shaft seal kit", "1", "12.95"],
    ["CD-0375", "Pressure switch", "1", "34.00"],
    ["EF-9001", "Flexible hose 1 m", "3", "7.25"],
]

BULLETS = ["Stainless steel body", "Quiet fan cover", "Dry-run protection", "Ten-year spare parts"]


@dataclass
class Page:
    doc: pymupdf.Document
    truth: list[str]  # blocks in reading order


def _paragraphs(rng: random.Random, count: int, sentences: int) -> list[str]:
    return [" ".join(rng.sample(SENTENCES, sentences)) for _ in range(count)]


def _textbox(page: pymupdf.Page, rect: pymupdf.Rect, text: str, size: float, font: str = "tiro",
             align: int = pymupdf.TEXT_ALIGN_JUSTIFY) -> float:
    """Text set in rect; returns the y below it. The text must fit (else the truth would lie)."""
    spare = page.insert_textbox(rect, text, fontsize=size, fontname=font, align=align, lineheight=1.25)
    if spare < 0:
        raise ValueError(f"text does not fit in {rect}: {text[:40]}...")
    return rect.y1 - spare


def _fit_height(text: str, width: float, size: float, font: str = "tiro") -> float:
    """The height a textbox of this width needs for text (found by trying)."""
    probe = pymupdf.open()
    page = probe.new_page(width=W, height=10 * H)
    spare = page.insert_textbox(pymupdf.Rect(0, 0, width, 10 * H), text, fontsize=size, fontname=font,
                                align=pymupdf.TEXT_ALIGN_JUSTIFY, lineheight=1.25)
    return 10 * H - spare + 2


def _title(page: pymupdf.Page, y: float, text: str, size: float = 18) -> float:
    return _textbox(page, pymupdf.Rect(MARGIN, y, W - MARGIN, y + size * 1.6), text, size, "hebo",
                    pymupdf.TEXT_ALIGN_CENTER) + size * 0.6


def _columns(page: pymupdf.Page, y: float, paragraphs: list[str], ncols: int, size: float,
             gutter: float = 20, heading: str | None = None, bullets: list[str] | None = None) -> tuple[float, list[str]]:
    """Paragraphs poured into ncols balanced columns from y; the y below and the truth blocks."""
    width = (W - 2 * MARGIN - (ncols - 1) * gutter) / ncols
    items = ([("h", heading)] if heading else []) + [("p", p) for p in paragraphs] \
        + ([("b", "- " + b) for b in bullets] if bullets else [])
    heights = [_fit_height(t, width, size, "hebo" if k == "h" else "tiro") + size * 0.5 for k, t in items]
    target = sum(heights) / ncols
    cols: list[list[int]] = [[]]
    acc = 0.0
    for i, h in enumerate(heights):
        if acc + h / 2 > target and len(cols) < ncols and cols[-1]:
            cols.append([])
            acc = 0.0
        cols[-1].append(i)
        acc += h
    bottom, truth = y, []
    for c, idx in enumerate(cols):
        x = MARGIN + c * (width + gutter)
        cy = y
        for i in idx:
            kind, text = items[i]
            rect = pymupdf.Rect(x, cy, x + width, cy + heights[i] + size)
            font = "hebo" if kind == "h" else "tiro"
            align = pymupdf.TEXT_ALIGN_LEFT if kind != "p" else pymupdf.TEXT_ALIGN_JUSTIFY
            cy = _textbox(page, rect, text, size, font, align) + size * 0.5
            truth.append(text)
        bottom = max(bottom, cy)
    return bottom + size * 0.5, truth


def _table(page: pymupdf.Page, y: float, rows: list[list[str]], x0: float, widths: list[float],
           size: float = 10) -> tuple[float, list[str]]:
    for r, row in enumerate(rows):
        x = x0
        for text, w in zip(row, widths):
            page.insert_text((x, y + size), text, fontsize=size, fontname="hebo" if r == 0 else "helv")
            x += w
        y += size * 1.7
    page.draw_line((x0, y - size * 0.6), (x0 + sum(widths), y - size * 0.6), width=0.5)
    return y + size, [" ".join(row) for row in rows]


def two_column(seed: int = 1) -> Page:
    rng = random.Random(seed)
    doc = pymupdf.open()
    page = doc.new_page(width=W, height=H)
    truth = []
    y = _title(page, MARGIN, "Series 40 Circulation Pumps")
    truth.append("Series 40 Circulation Pumps")
    line = "Product sheet for installers and service partners, edition 2024"
    y = _textbox(page, pymupdf.Rect(MARGIN, y, W - MARGIN, y + 16), line, 10, "helv", pymupdf.TEXT_ALIGN_CENTER) + 10
    truth.append(line)
    y, t = _columns(page, y, _paragraphs(rng, 4, 3), 2, 10, heading="Overview", bullets=BULLETS)
    truth += t
    y = _title(page, y, "Spare parts", 13)
    truth.append("Spare parts")
    y, t = _table(page, y, TABLE, MARGIN + 40, [90, 170, 60, 60])
    truth += t
    y, t = _columns(page, y + 4, _paragraphs(rng, 2, 2), 2, 10)
    truth += t
    return Page(doc, truth)


def three_column(seed: int = 2) -> Page:
    rng = random.Random(seed)
    doc = pymupdf.open()
    page = doc.new_page(width=W, height=H)
    truth = []
    y = _title(page, MARGIN, "Installation Notes")
    truth.append("Installation Notes")
    y, t = _columns(page, y, _paragraphs(rng, 5, 2), 3, 9, gutter=18, heading="Before you start")
    truth += t
    text = "Read every step before you begin: the steps below assume the supply is switched off."
    y = _textbox(page, pymupdf.Rect(MARGIN, y, W - MARGIN, y + 16), text, 10, "helv", pymupdf.TEXT_ALIGN_LEFT) + 10
    truth.append(text)
    y, t = _columns(page, y, _paragraphs(rng, 4, 2), 3, 9, gutter=18, bullets=BULLETS[:3])
    truth += t
    return Page(doc, truth)


def single_column(seed: int = 3) -> Page:
    rng = random.Random(seed)
    doc = pymupdf.open()
    page = doc.new_page(width=W, height=H)
    truth = []
    y = _title(page, MARGIN, "Service Report")
    truth.append("Service Report")
    for p in _paragraphs(rng, 3, 3):
        h = _fit_height(p, W - 2 * MARGIN, 11)
        y = _textbox(page, pymupdf.Rect(MARGIN, y, W - MARGIN, y + h + 11), p, 11) + 8
        truth.append(p)
    for b in BULLETS:
        text = "- " + b
        y = _textbox(page, pymupdf.Rect(MARGIN + 20, y, W - MARGIN, y + 18), text, 11, "tiro", pymupdf.TEXT_ALIGN_LEFT) + 2
        truth.append(text)
    y, t = _table(page, y + 12, TABLE, MARGIN, [90, 200, 60, 60], 11)
    truth += t
    return Page(doc, truth)


def aligned_breaks(seed: int = 4) -> Page:
    """A product sheet in two columns whose paragraph breaks line up: each pair of
    paragraphs side by side is set to the same height, so white bands cross both
    columns at the same heights; paragraphs open with an indented line, and a centred
    heading opens two of the right column's paragraphs (the rapidocr engine read such
    a sheet paragraph by paragraph, alternating, the heading inside the left column)."""
    rng = random.Random(seed)
    doc = pymupdf.open()
    page = doc.new_page(width=W, height=H)
    y = _title(page, MARGIN, "Series 60 Booster Sets")
    gutter, size, indent = 24, 10, "      "
    width = (W - 2 * MARGIN - gutter) / 2
    left, right = [], []
    headings = {1: "Technical data", 3: "Ordering"}
    for k in range(4):
        pair = [" ".join(rng.sample(SENTENCES, 2)) for _ in range(2)]
        head = headings.get(k)
        height = max(_fit_height(indent + t, width, size) for t in pair) + (size * 1.8 if head else 0)
        for c, text in enumerate(pair):
            x = MARGIN + c * (width + gutter)
            top = y
            if head and c == 1:
                _textbox(page, pymupdf.Rect(x, y, x + width, y + size * 2), head, size + 1, "hebo",
                         pymupdf.TEXT_ALIGN_CENTER)
                right.append(head)
                top = y + size * 1.8
            elif head:
                top = y + size * 1.8  # the left paragraph level with the right one: the bands line up
            _textbox(page, pymupdf.Rect(x, top, x + width, y + height + size), indent + text, size,
                     align=pymupdf.TEXT_ALIGN_LEFT)
            (left if c == 0 else right).append(text)
        y += height + size * 1.6
    return Page(doc, ["Series 60 Booster Sets"] + left + right)


def poster(tiles: int = 3) -> Page:
    """tiles x tiles single-column pages on one sheet: small text on a large page (a
    spread, a poster), which the rapidocr engine rescales up to read."""
    src = single_column()
    doc = pymupdf.open()
    sheet = doc.new_page(width=tiles * W, height=tiles * H)
    for row in range(tiles):
        for col in range(tiles):
            sheet.show_pdf_page(pymupdf.Rect(col * W, row * H, (col + 1) * W, (row + 1) * H), src.doc, 0)
    return Page(doc, src.truth * tiles * tiles)


def pixels(page: Page, megapixels: float) -> np.ndarray:
    """The page's first page rendered in RGB at the zoom that gives it `megapixels`."""
    rect = page.doc[0].rect
    zoom = (megapixels * 1e6 / (rect.width * rect.height)) ** 0.5  # dpi / 72
    pix = page.doc[0].get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), colorspace=pymupdf.csRGB, alpha=False)
    return np.frombuffer(pix.samples, np.uint8).reshape(pix.height, pix.width, 3)


LAYOUTS = {"two-column": two_column, "three-column": three_column, "single-column": single_column,
           "aligned-breaks": aligned_breaks}


@dataclass(frozen=True)
class Variant:
    name: str
    layout: str
    skew: float = 0.0  # degrees, counter-clockwise positive
    degrade: str = ""  # "", noise, blur, jpeg, fax
    form: str = "pdf"  # pdf (image-only) or png
    seed: int = 0
    dpi: int = DPI  # scanned at; a PNG not at DPI is written without a dpi (PyMuPDF then assumes 96)

    @property
    def category(self) -> str:
        if self.dpi != DPI:
            return "resolution"
        if self.skew:
            return "skewed"
        return "single-column" if self.layout == "single-column" else "multi-column"

    @property
    def file_name(self) -> str:
        return f"{self.name}.{self.form}"


# A handful of pages for the test (CPU time: rapidocr takes 1-2 s a page).
TEST_SET = [
    Variant("two-col-clean", "two-column"),
    Variant("three-col-jpeg", "three-column", degrade="jpeg", form="png"),
    Variant("two-col-skew+3", "two-column", skew=3.0, form="png"),
    Variant("three-col-skew-5-noise", "three-column", skew=-5.0, degrade="noise"),
    Variant("single-clean", "single-column", form="png"),
    Variant("single-skew-2-fax", "single-column", skew=-2.0, degrade="fax", form="png"),
]

# The larger set bench/accuracy.py scores.
BENCH_SET = TEST_SET + [
    # columns whose paragraph breaks line up (issue 22's product sheet)
    Variant("aligned-clean", "aligned-breaks"),
    Variant("aligned-noise", "aligned-breaks", degrade="noise", form="png", seed=3),
    Variant("aligned-jpeg", "aligned-breaks", degrade="jpeg"),
    Variant("aligned-skew-2-fax", "aligned-breaks", skew=-2.0, degrade="fax", form="png"),
    Variant("two-col-noise", "two-column", degrade="noise", form="png", seed=5),
    Variant("two-col-blur", "two-column", degrade="blur"),
    Variant("two-col-fax", "two-column", degrade="fax", form="png"),
    Variant("three-col-clean", "three-column", form="png"),
    Variant("three-col-blur", "three-column", degrade="blur"),
    Variant("two-col-skew-1", "two-column", skew=-1.0),
    Variant("two-col-skew+5-jpeg", "two-column", skew=5.0, degrade="jpeg"),
    Variant("two-col-skew-4-fax", "two-column", skew=-4.0, degrade="fax", form="png"),
    Variant("three-col-skew+1.5", "three-column", skew=1.5, form="png"),
    Variant("three-col-skew+4-blur", "three-column", skew=4.0, degrade="blur"),
    Variant("single-noise", "single-column", degrade="noise", seed=7),
    Variant("single-jpeg", "single-column", degrade="jpeg"),
    Variant("single-skew+1", "single-column", skew=1.0),
    Variant("single-skew-4-noise", "single-column", skew=-4.0, degrade="noise", form="png"),
    Variant("single-75dpi", "single-column", form="png", dpi=75),
    Variant("two-col-100dpi-jpeg", "two-column", degrade="jpeg", form="png", dpi=100),
    Variant("single-600dpi", "single-column", form="png", dpi=600),
]


def image(variant: Variant) -> Image.Image:
    """The variant's page as a grayscale image at its dpi (bilevel for fax)."""
    page = LAYOUTS[variant.layout]().doc[0]
    pix = page.get_pixmap(dpi=variant.dpi, colorspace=pymupdf.csGRAY, alpha=False)
    img = Image.frombytes("L", (pix.width, pix.height), pix.samples)
    if variant.skew:
        # a page photocopied crooked: the paper turns, the canvas stays the size of the sheet
        img = img.rotate(variant.skew, resample=Image.BICUBIC, expand=False, fillcolor=255)
    rng = np.random.default_rng(variant.seed)
    if variant.degrade == "noise":
        a = np.asarray(img, dtype=np.float32) + rng.normal(0, 28, (img.height, img.width))
        speck = rng.random((img.height, img.width)) < 0.002
        a[speck] = 0
        img = Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))
    elif variant.degrade == "blur":
        img = img.filter(ImageFilter.GaussianBlur(1.4))
    elif variant.degrade == "jpeg":
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=25)
        img = Image.open(io.BytesIO(buf.getvalue())).convert("L")
    elif variant.degrade == "fax":
        img = img.point(lambda v: 255 if v > 150 else 0).convert("1")
    return img


def write(variant: Variant, folder: Path) -> Path:
    img = image(variant)
    path = folder / variant.file_name
    if variant.form == "png":
        img.save(path, **({"dpi": (DPI, DPI)} if variant.dpi == DPI else {}))
        return path
    buf = io.BytesIO()
    img.save(buf, "PNG")
    doc = pymupdf.open()
    page = doc.new_page(width=W, height=H)
    page.insert_image(page.rect, stream=buf.getvalue())
    doc.save(path, deflate=True)
    return path


def truth(variant: Variant) -> str:
    return "\n\n".join(LAYOUTS[variant.layout]().truth)


def build(folder: Path, variants: list[Variant]) -> dict[str, Variant]:
    """Pages into folder, truth into folder/truth/<file>/0.txt (batchocr eval's layout)."""
    folder.mkdir(parents=True, exist_ok=True)
    made = {}
    for v in variants:
        write(v, folder)
        t = folder / "truth" / v.file_name
        t.mkdir(parents=True, exist_ok=True)
        (t / "0.txt").write_text(truth(v) + "\n")
        made[v.file_name] = v
    return made


if __name__ == "__main__":
    out = Path(sys.argv[1])
    which = BENCH_SET if "--set" in sys.argv and sys.argv[sys.argv.index("--set") + 1] == "bench" else TEST_SET
    build(out, which)
    print(f"{len(which)} pages in {out}")
