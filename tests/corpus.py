"""Documents made on the fly for tests and benchmarks: text-layer PDFs (fast to
process with the textlayer engine) and every kind of bad input a container holds."""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

import pymupdf

WORDS = ("invoice total amount due paid account customer order number date shipment "
         "contract party agreement clause section schedule payment balance tax rate").split()


def page_text(seed: int, lines: int = 8) -> str:
    rnd = random.Random(seed)
    return "\n".join(" ".join(rnd.choice(WORDS) for _ in range(rnd.randint(4, 9))) + f" {seed}-{i}"
                     for i in range(lines))


def text_pdf(path: Path, pages: int, seed: int = 0, lines: int = 8) -> list[str]:
    """A born-digital PDF; returns each page's text."""
    doc = pymupdf.open()
    texts = []
    for i in range(pages):
        text = page_text(seed * 100_000 + i, lines)
        page = doc.new_page(width=612, height=400)
        page.insert_text((20, 30), text, fontsize=9)
        texts.append(text)
    doc.save(path, garbage=3, deflate=True)
    return texts


def text_corpus(folder: Path, documents: int, pages: int) -> dict[str, list[str]]:
    folder.mkdir(parents=True, exist_ok=True)
    return {f"doc{i:05d}.pdf": text_pdf(folder / f"doc{i:05d}.pdf", pages, seed=i) for i in range(documents)}


def _png(width: int, height: int, bit_depth: int = 8) -> bytes:
    """A valid grayscale PNG of a blank image: huge sizes stay small on disk. Deflated
    once for a block of rows, ended by a full flush (no reference reaches back past it,
    so the block's bytes hold wherever they are repeated), then repeated: deflating all
    1.25 GB of the 100,000-px square took 5 s of every bad_corpus()."""
    row = b"\x00" * ((width * bit_depth + 7) // 8 + 1)
    block_rows = max(1, min(height, (8 << 20) // len(row)))
    repeats, rest = divmod(height, block_rows)
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)  # raw deflate: the zlib header and checksum are ours
    block = comp.compress(row * block_rows) + comp.flush(zlib.Z_FULL_FLUSH)
    tail = comp.compress(row * rest) + comp.flush()
    adler = 1
    for _ in range(repeats):
        adler = zlib.adler32(row * block_rows, adler)
    adler = zlib.adler32(row * rest, adler)
    idat = b"\x78\xda" + block * repeats + tail + struct.pack(">I", adler)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, bit_depth, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def slow_pdf(path: Path, pages: int = 3, shapes: int = 100_000) -> None:
    """Pages of many filled triangles: seconds each to render at 200 dpi, a stand-in
    for a document that hangs the renderer. Pages share one content stream."""
    rnd = random.Random(0)
    ops = []
    for _ in range(shapes):
        x, y = rnd.uniform(0, 590), rnd.uniform(0, 830)
        ops.append(f"{rnd.random():.2f} {rnd.random():.2f} {rnd.random():.2f} rg "
                   f"{x:.1f} {y:.1f} m {x + 50:.1f} {y + 3:.1f} l {x + 5:.1f} {y + 60:.1f} l h f")
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((10, 10), " ")
    (xref,) = page.get_contents()
    doc.update_stream(xref, "\n".join(ops).encode())
    for _ in range(pages - 1):
        doc.fullcopy_page(0)
    doc.save(path, deflate=True)


def bad_corpus(folder: Path) -> dict[str, str]:
    """Every kind of bad input; returns {file name: what it is}."""
    folder.mkdir(parents=True, exist_ok=True)
    good = pymupdf.open()
    for i in range(3):
        good.new_page().insert_text((72, 72), page_text(i))
    sound = good.tobytes()
    rnd = random.Random(7)
    files = {
        "empty.pdf": (b"", "zero-byte file"),
        "notes.pdf": (b"meeting notes, not a PDF at all\n" * 20, "not a document"),
        "header-only.pdf": (b"%PDF-1.7\n", "corrupt PDF beyond repair"),
        "garbled.pdf": (sound[:600] + bytes(rnd.randrange(256) for _ in range(900)) + sound[1500:], "corrupt PDF (repairable)"),
        "truncated.pdf": (sound[: len(sound) // 2], "truncated PDF"),
        "random.png": (bytes(rnd.randrange(256) for _ in range(4000)), "not an image"),
        "huge.png": (_png(100_000, 100_000, 1), "image too large for MuPDF (FzErrorLimit)"),
        "bomb.png": (_png(20_000, 20_000, 8), "decompression bomb: 400 Mpx in a few hundred KB"),
    }
    for name, (data, _) in files.items():
        (folder / name).write_bytes(data)
    good.save(folder / "encrypted.pdf", encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw="secret", owner_pw="o")
    out = {name: what for name, (_, what) in files.items()}
    out["encrypted.pdf"] = "password-protected PDF"
    return out


def hang_pdf(path: Path, pages: int = 6, hang_at: tuple[int, ...] = (4,), depth: int = 48, seed: int = 0) -> list[str]:
    """A text-layer PDF whose pages in `hang_at` make MuPDF loop for good (render
    and text extraction alike): a chain of `depth` form XObjects, each drawing the
    next twice, is 2**depth draws. Returns each page's text."""
    doc = pymupdf.open()
    texts = []
    for i in range(pages):
        text = page_text(seed * 100_000 + i, 3)
        doc.new_page(width=612, height=400).insert_text((20, 30), text, fontsize=9)
        texts.append(text)
    prev = doc.get_new_xref()
    doc.update_object(prev, "<< /Type /XObject /Subtype /Form /BBox [0 0 10 10] >>")
    doc.update_stream(prev, b"0 0 1 1 re f")
    for _ in range(depth):
        x = doc.get_new_xref()
        doc.update_object(x, "<< /Type /XObject /Subtype /Form /BBox [0 0 10 10] "
                             f"/Resources << /XObject << /X {prev} 0 R >> >> >>")
        doc.update_stream(x, b"/X Do /X Do")
        prev = x
    for i in hang_at:
        page = doc[i]
        page.clean_contents()
        (contents,) = page.get_contents()
        doc.xref_set_key(page.xref, "Resources/XObject", f"<< /H {prev} 0 R >>")
        doc.update_stream(contents, doc.xref_stream(contents) + b"\nq /H Do Q")
    doc.save(path)
    return texts
