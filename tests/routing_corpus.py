"""Documents whose text layers range from exact to worthless, made on the fly with
PyMuPDF and Pillow (no downloads), with each page's expected route and true text:
for the router's tests and bench/route.py.

Every page's text is English prose from a fixed vocabulary, so a text layer that
is right reads as dictionary words and one that is wrong does not.
"""

from __future__ import annotations

import io
import random
import re
from dataclasses import dataclass
from pathlib import Path

import pymupdf
from PIL import Image, ImageFilter

# Plain English words (all in the router's word list), for prose that a text layer
# either spells right or does not.
VOCABULARY = ("the invoice shows the total amount due for the order placed by our customer last month "
              "please pay the balance within thirty days of the date on this letter and quote the number "
              "above when you write to us about the shipment or the contract between the parties each "
              "section of the agreement states the rate of tax and the schedule of payment for every "
              "account held with the company").split()
PAGE = (0, 0, 595, 842)  # A4 in points
FONT_SIZE = 12


@dataclass(frozen=True)
class Page:
    route: str  # what the router must decide: textlayer | model
    truth: str  # the text a reader sees on the page
    what: str


def prose(seed: int, lines: int = 14) -> str:
    rnd = random.Random(seed)
    return "\n".join(" ".join(rnd.choice(VOCABULARY) for _ in range(rnd.randint(7, 10))) for _ in range(lines))


def _text_page(doc: pymupdf.Document, text: str, **kw) -> pymupdf.Page:
    page = doc.new_page(width=PAGE[2], height=PAGE[3])
    page.insert_text((60, 80), text, fontsize=FONT_SIZE, lineheight=1.6, **kw)
    return page


def _scan_image(text: str, seed: int, dpi: int = 150, fmt: str = "JPEG") -> bytes:
    """The page as a scanner would give it: rendered, grey, slightly blurred, noisy."""
    src = pymupdf.open()
    _text_page(src, text)
    pix = src[0].get_pixmap(dpi=dpi, colorspace=pymupdf.csGRAY)
    img = Image.frombytes("L", (pix.width, pix.height), pix.samples).filter(ImageFilter.GaussianBlur(0.6))
    rnd = random.Random(seed)
    noise = Image.effect_noise(img.size, 18)
    img = Image.blend(img, noise, 0.08).rotate(rnd.uniform(-0.4, 0.4), fillcolor=255)
    out = io.BytesIO()
    img.save(out, fmt, quality=85)
    return out.getvalue()


def _scan_page(doc: pymupdf.Document, text: str, seed: int) -> pymupdf.Page:
    page = doc.new_page(width=PAGE[2], height=PAGE[3])
    page.insert_image(page.rect, stream=_scan_image(text, seed))
    return page


def _bad_ocr(text: str, seed: int, rate: float = 0.3) -> str:
    """What a poor OCR makes of text: a share of the letters replaced by look-alikes and junk."""
    rnd = random.Random(seed)
    junk = "1l|!0oOcerni;:,."
    return "".join(rnd.choice(junk) if c.isalpha() and rnd.random() < rate else c for c in text)


def _composite_font_page(doc: pymupdf.Document, text: str) -> tuple[pymupdf.Page, int]:
    """A page in an embedded composite (Type0, Identity-H) font with a ToUnicode
    map, as PDF producers write them; returns the page and the font's xref."""
    page = doc.new_page(width=PAGE[2], height=PAGE[3])
    page.insert_font(fontname="F1", fontbuffer=pymupdf.Font("cjk").buffer)
    page.insert_text((60, 80), text, fontname="F1", fontsize=FONT_SIZE, lineheight=1.6)
    (xref,) = [f[0] for f in page.get_fonts() if f[4] == "F1"]
    return page, xref


def _garble_tounicode(doc: pymupdf.Document, font_xref: int, seed: int) -> None:
    """Rewrite the font's ToUnicode CMap so that every letter maps to another letter
    (a permutation): the page looks right, extraction yields the wrong characters."""
    cmap_xref = int(doc.xref_get_key(font_xref, "ToUnicode")[1].split()[0])
    cmap = doc.xref_stream(cmap_xref).decode()
    letters = "abcdefghijklmnopqrstuvwxyz"
    rnd = random.Random(seed)
    shuffled = list(letters)
    rnd.shuffle(shuffled)
    wrong = dict(zip(letters, shuffled)) | dict(zip(letters.upper(), "".join(shuffled).upper()))
    # MuPDF writes one range <first> <last> <unicode> per run; turn the printable
    # ASCII run into one bfchar per code, letters permuted.
    m = re.search(r"<([0-9a-f]{4})> <([0-9a-f]{4})> <0020>", cmap)
    first, last = int(m.group(1), 16), int(m.group(2), 16)
    chars = [f"<{code:04x}> <{ord(wrong.get(chr(0x20 + code - first), chr(0x20 + code - first))):04x}>"
             for code in range(first, last + 1)]
    cmap = cmap.replace(m.group(0), "", 1)
    cmap = re.sub(r"(\d+) beginbfrange", lambda g: f"{int(g.group(1)) - 1} beginbfrange", cmap, count=1)
    cmap = cmap.replace("endcmap", f"{len(chars)} beginbfchar\n" + "\n".join(chars) + "\nendbfchar\nendcmap")
    doc.update_stream(cmap_xref, cmap.encode())


def build(folder: Path) -> dict[str, list[Page]]:
    """Writes the corpus into folder; returns {file name: its pages, in order}."""
    folder.mkdir(parents=True, exist_ok=True)
    docs: dict[str, list[Page]] = {}

    def save(name: str, doc: pymupdf.Document, pages: list[Page]) -> None:
        doc.save(folder / name, garbage=3, deflate=True)
        docs[name] = pages

    doc = pymupdf.open()
    texts = [prose(1), prose(2)]
    for t in texts:
        _text_page(doc, t)
    save("born-digital.pdf", doc, [Page("textlayer", t, "born-digital") for t in texts])

    doc = pymupdf.open()
    _scan_page(doc, prose(3), 3)
    save("scan.pdf", doc, [Page("model", prose(3), "image-only scan")])

    doc = pymupdf.open()
    _, xref = _composite_font_page(doc, prose(4))
    _garble_tounicode(doc, xref, 4)
    save("garbled.pdf", doc, [Page("model", prose(4), "embedded font with a wrong ToUnicode map")])

    doc = pymupdf.open()
    _, xref = _composite_font_page(doc, prose(5))
    doc.xref_set_key(xref, "ToUnicode", "null")
    save("unmapped.pdf", doc, [Page("model", prose(5), "composite font without a Unicode map")])

    doc = pymupdf.open()
    page = _scan_page(doc, prose(6), 6)
    page.insert_text((60, 80), _bad_ocr(prose(6), 6), fontsize=FONT_SIZE, lineheight=1.6, render_mode=3)
    save("hidden-ocr.pdf", doc, [Page("model", prose(6), "scan under an invisible OCR layer of bad quality")])

    doc = pymupdf.open()
    page = _text_page(doc, prose(7))  # text first, then a scan of other text over the whole page
    page.insert_image(page.rect, stream=_scan_image(prose(8), 8))
    save("under-image.pdf", doc, [Page("model", prose(8), "text layer covered by a full-page image")])

    doc = pymupdf.open()
    page = doc.new_page(width=PAGE[2], height=PAGE[3])
    page.insert_text((60, 60), "Figure 1", fontsize=FONT_SIZE)
    page.insert_image(pymupdf.Rect(40, 80, 555, 800), stream=_scan_image(prose(9), 9))
    save("picture.pdf", doc, [Page("model", "Figure 1\n" + prose(9), "text only inside an image, one caption")])

    # One document whose pages differ: born-digital, scan, born-digital with a logo,
    # scan with a bad hidden OCR layer.
    doc = pymupdf.open()
    _text_page(doc, prose(10))
    _scan_page(doc, prose(11), 11)
    page = _text_page(doc, prose(12))
    logo = Image.new("L", (120, 60), 90)
    buf = io.BytesIO()
    logo.save(buf, "PNG")
    page.insert_image(pymupdf.Rect(470, 20, 560, 65), stream=buf.getvalue())
    page = _scan_page(doc, prose(13), 13)
    page.insert_text((60, 80), _bad_ocr(prose(13), 13), fontsize=FONT_SIZE, lineheight=1.6, render_mode=3)
    save("mixed.pdf", doc, [
        Page("textlayer", prose(10), "born-digital"),
        Page("model", prose(11), "image-only scan"),
        Page("textlayer", prose(12), "born-digital with a small logo"),
        Page("model", prose(13), "scan under a bad hidden OCR layer"),
    ])
    return docs


def write_truth(docs: dict[str, list[Page]], truth: Path) -> None:
    """truth/<file name>/<page index>.txt, the layout `batchocr eval` reads."""
    for name, pages in docs.items():
        (truth / name).mkdir(parents=True, exist_ok=True)
        for i, p in enumerate(pages):
            (truth / name / f"{i}.txt").write_text(p.truth + "\n")


def mixed_corpus(folder: Path, documents: int) -> dict[str, list[Page]]:
    """Half born-digital: `documents` PDFs of 4 pages each, born-digital, scan,
    born-digital, and a page whose text layer must not be trusted (in turn: a scan
    under a bad hidden OCR layer, a font with a wrong ToUnicode map, text under a
    full-page scan). Every page's prose is different. For bench/route.py."""
    return dict(mixed_document(folder, d) for d in range(documents))


def mixed_document(folder: Path, d: int) -> tuple[str, list[Page]]:
    """Document `d` of mixed_corpus, written into `folder`: (its file name, its pages).
    It depends on `d` alone, so documents can be built in parallel."""
    folder.mkdir(parents=True, exist_ok=True)
    seed = 1000 + 10 * d
    doc = pymupdf.open()
    pages = []
    _text_page(doc, prose(seed))
    pages.append(Page("textlayer", prose(seed), "born-digital"))
    _scan_page(doc, prose(seed + 1), seed + 1)
    pages.append(Page("model", prose(seed + 1), "image-only scan"))
    _text_page(doc, prose(seed + 2))
    pages.append(Page("textlayer", prose(seed + 2), "born-digital"))
    trap = d % 3
    if trap == 0:
        page = _scan_page(doc, prose(seed + 3), seed + 3)
        page.insert_text((60, 80), _bad_ocr(prose(seed + 3), seed), fontsize=FONT_SIZE, lineheight=1.6,
                         render_mode=3)
        pages.append(Page("model", prose(seed + 3), "scan under a bad hidden OCR layer"))
    elif trap == 1:
        _, xref = _composite_font_page(doc, prose(seed + 3))
        _garble_tounicode(doc, xref, seed)
        pages.append(Page("model", prose(seed + 3), "embedded font with a wrong ToUnicode map"))
    else:
        page = _text_page(doc, prose(seed + 4))
        page.insert_image(page.rect, stream=_scan_image(prose(seed + 3), seed + 3))
        pages.append(Page("model", prose(seed + 3), "text layer covered by a full-page image"))
    name = f"mixed-{d:03d}.pdf"
    doc.save(folder / name, garbage=3, deflate=True)
    return name, pages
