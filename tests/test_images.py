"""Image files as documents: their own pixels, the way they are meant to be seen."""

from __future__ import annotations

import struct

import numpy as np
import pymupdf
import pytest
from PIL import Image, ImageDraw, ImageFont, ImageOps

from batchocr import schema
from batchocr.render import RenderTask, render_document, tiff_sizes
from batchocr.schema import Needs
from batchocr.sources import DocRef
from batchocr.spec import RenderSpec
from conftest import ROOT

TEXT = ["Invoice 4711 total 1234.56", "due by 2026-12-31"]
# EXIF orientation -> how the camera stored an upright picture (the inverse of what a viewer does)
STORED = {1: None, 2: Image.Transpose.FLIP_LEFT_RIGHT, 3: Image.Transpose.ROTATE_180,
          4: Image.Transpose.FLIP_TOP_BOTTOM, 5: Image.Transpose.TRANSPOSE, 6: Image.Transpose.ROTATE_90,
          7: Image.Transpose.TRANSVERSE, 8: Image.Transpose.ROTATE_270}


def _doc(path) -> DocRef:
    return DocRef(uri=f"file://{path}", size=path.stat().st_size, etag="x")


def _rows(path, spec=RenderSpec()) -> list[dict]:
    return [row for batch in render_document(RenderTask(_doc(path)), spec, Needs(image=True), {})
            for row in batch.to_pylist()]


def _pixels(row: dict) -> np.ndarray:
    return np.frombuffer(row["image"], np.uint8).reshape(row["height"], row["width"], 3)


@pytest.fixture(scope="module")
def oriented(tmp_path_factory):
    """An upright 1200x160 picture of two lines of text, and a JPEG of it for each EXIF
    orientation (1-8), stored as a camera stores it: turned or mirrored, the tag
    telling viewers how to show it upright."""
    folder = tmp_path_factory.mktemp("exif")
    upright = Image.new("L", (1200, 160), 255)
    draw = ImageDraw.Draw(upright)
    for i, line in enumerate(TEXT):
        draw.text((30, 20 + i * 60), line, fill=0, font=ImageFont.load_default(size=28))
    files = {}
    for orientation, turn in STORED.items():
        stored = upright.transpose(turn) if turn is not None else upright
        exif = stored.getexif()
        exif[0x0112] = orientation
        files[orientation] = folder / f"exif{orientation}.jpg"
        stored.save(files[orientation], quality=95, dpi=(150, 150), exif=exif.tobytes())
        with Image.open(files[orientation]) as im:  # the viewer's picture is the upright one
            assert ImageOps.exif_transpose(im).size == upright.size
    return np.asarray(upright), files


def test_an_exif_oriented_image_keeps_its_own_pixels_upright(oriented):
    """Orientations 5-8 (phone photos: 6 and 8) turn the picture; it used to be
    scaled by its stored width over the turned page's width: this 1200x160 strip
    came out 160x21 (56x fewer pixels), a portrait one enlarged."""
    upright, files = oriented
    for orientation, path in files.items():
        (row,) = _rows(path)
        assert (row["height"], row["width"]) == upright.shape, f"orientation {orientation}"
        assert row["dpi"] == 150.0, f"orientation {orientation}"
        gray = _pixels(row)[:, :, 0].astype(int)
        off = np.abs(gray - upright).mean()  # JPEG's losses only
        assert off < 1, f"orientation {orientation}: not upright"
        for turned in (gray[::-1, ::-1], gray[::-1], gray[:, ::-1]):  # what the check tells apart
            assert np.abs(turned - upright).mean() > 5


@pytest.fixture(scope="module")
def rapidocr():
    from batchocr.engines.rapidocr import RapidOCREngine, RapidOCROptions

    engine = RapidOCREngine(RapidOCROptions(threads=1))
    yield engine
    engine.close()


def test_an_exif_oriented_image_reads_upright_with_rapidocr(oriented, rapidocr):
    """At the wrong scale (160x21) rapidocr read nothing."""
    _, files = oriented
    for orientation in (6, 8):  # a phone held one way or the other
        (row,) = _rows(files[orientation])
        text, _ = rapidocr.recognise(_pixels(row))
        assert text.split() == " ".join(TEXT).split(), f"orientation {orientation}: {text!r}"


def test_a_page_too_narrow_for_rapidocr_is_an_error_row_saying_so(oriented, tmp_path, rapidocr):
    """rapidocr shrinks the longest side to 2000 px: a 30000x3 page's shorter side
    rounds to 0 and it raised ResizeImgError with no message at all."""
    pages = []
    for name, size in [("wide.png", (30000, 3)), ("tall.png", (2, 40000))]:
        Image.new("L", size, 255).save(tmp_path / name)
        pages += _rows(tmp_path / name)
    pages += _rows(oriented[1][1])
    pages = [p | {"page_index": i} for i, p in enumerate(pages)]
    rows = [r for batch in rapidocr.run(iter([schema.batch(schema.PAGES, pages)])) for r in batch.to_pylist()]
    assert [(r["page_index"], r["error_type"]) for r in rows] == [(0, "engine_error"), (1, "engine_error"), (2, None)]
    for row, size in zip(rows, ["30000x3", "2x40000"]):
        assert row["error_message"].startswith(f"page {row['page_index']}: the page ({size} px) is too narrow "
                                               "for rapidocr"), row["error_message"]
    assert rows[2]["text"].split() == " ".join(TEXT).split()  # and the next page is read


def test_an_image_file_that_cannot_be_decoded_is_one_open_failed_row(tmp_path):
    """MuPDF opens an image file lazily: these opened, then failed on page 0 as
    render_failed page rows; and the message named /proc/self/fd/N, not the file."""
    png = tmp_path / "sound.png"
    Image.new("L", (300, 200), 255).save(png)
    files = {"text.png": b"just some text", "head.png": png.read_bytes()[:30],
             "soi.jpg": b"\xff\xd8" + b"garbage" * 50, "text.pdf": b"not a pdf at all"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        (row,) = _rows(tmp_path / name)
        assert (row["page_index"], row["page_count"], row["error_type"]) == (-1, None, "open_failed"), row
        assert row["error_message"].startswith(f"file://{tmp_path}/{name}: cannot open as "), row
        assert "/proc/" not in row["error_message"], row
    (row,) = _rows(png)  # a sound one is a page
    assert (row["page_index"], row["width"], row["height"], row["error_type"]) == (0, 300, 200, None)


def test_the_exif_orientation_of_a_jpeg_is_applied_and_readme_says_which_formats(oriented, tmp_path):
    """MuPDF applies the EXIF orientation of a JPEG only: a PNG's (its eXIf chunk) or a TIFF's
    (its Orientation tag) is not, while README said image files were turned upright. Should
    MuPDF begin to apply them, README's sentence is to change with this test."""
    upright, files = oriented
    stored = Image.fromarray(upright).transpose(STORED[6])  # a phone's portrait
    exif = stored.getexif()
    exif[0x0112] = 6
    for name in ("exif6.png", "exif6.tif"):
        stored.save(tmp_path / name, exif=exif.tobytes())
        with Image.open(tmp_path / name) as im:  # the tag is there, for any viewer that reads it
            assert im.getexif()[0x0112] == 6
    shape = {name: (row["height"], row["width"]) for name, path in
             [("jpeg", files[6]), ("png", tmp_path / "exif6.png"), ("tiff", tmp_path / "exif6.tif")]
             for (row,) in [_rows(path)]}
    assert shape == {"jpeg": upright.shape, "png": upright.shape[::-1], "tiff": upright.shape[::-1]}
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert ("image files keep their own pixels, a JPEG turned upright by its EXIF orientation, as a phone's photos "
            "need; a PNG's or a TIFF's orientation tag is not applied: MuPDF reads it from JPEGs only") in readme


def test_a_tiff_page_too_large_is_refused_from_its_header_before_it_is_decoded(tmp_path, monkeypatch):
    """MuPDF decodes a TIFF's image whole as its page loads (a PNG's or a JPEG's page holds
    it undecoded): a 40 KB fax of 25000x25000 pixels took 0.9 GB in the render worker before
    render.max_image_pixels refused it from the loaded page, a single-page one in the check
    for an undecodable image file. Each page's size is now read from the TIFF's directories,
    and a page above the limit is refused without being loaded; the other pages are read."""
    small = Image.new("1", (600, 200), 1)
    ImageDraw.Draw(small).text((20, 60), "Invoice 4711", fill=0, font=ImageFont.load_default(size=40))
    bomb = Image.new("1", (25_000, 25_000), 1)
    small.save(tmp_path / "pages.tif", save_all=True, append_images=[bomb, small], compression="group4")
    bomb.save(tmp_path / "bomb.tif", compression="group4")
    assert (tmp_path / "pages.tif").stat().st_size < 100_000
    loaded = []
    load_page = pymupdf.Document.load_page
    monkeypatch.setattr(pymupdf.Document, "load_page",
                        lambda self, i=0: loaded.append(i) or load_page(self, i))
    rows = _rows(tmp_path / "pages.tif")
    assert [(r["page_index"], r["page_count"], r["error_type"], r["width"]) for r in rows] == \
        [(0, 3, None, 600), (1, 3, "too_large", None), (2, 3, None, 600)]
    assert "an image of 25000x25000 = 625 Mpx is above render.max_image_pixels" in rows[1]["error_message"]
    assert 1 not in loaded, "the page too large was loaded: its image was decoded"
    loaded.clear()
    assert [(r["page_index"], r["error_type"]) for r in _rows(tmp_path / "bomb.tif")] == [(0, "too_large")]
    assert loaded == []
    # as big-endian directories ("MM") give them, and a file that is not a TIFF gives none
    data = (b"MM\0*" + struct.pack(">I", 8) + struct.pack(">H", 2) + struct.pack(">HHIHH", 256, 3, 1, 70, 0)
            + struct.pack(">HHII", 257, 4, 1, 90_000) + struct.pack(">I", 0))
    assert tiff_sizes(lambda at, n: data[at:at + n]) == [(70, 90_000)]
    png = (tmp_path / "x.png")
    small.save(png)
    assert tiff_sizes(lambda at, n: png.read_bytes()[at:at + n]) == []


def test_a_side_scaled_under_a_pixel_is_one_pixel_and_rapidocr_reads_the_page(tmp_path, rapidocr):
    """--max-side (or a low --dpi) scaled a strip's shorter side under half a pixel: the page
    rendered to 1000x0 pixels, rapidocr failed on it with a bare ZeroDivisionError, and nine
    such strips (`batchocr run DIR OUT --max-side 1000`) stopped the run, exit 1, as "engine
    rapidocr failed on every page alike". A side is now at least one pixel: rapidocr reads
    such a page (nothing on it), or says it is too narrow, as it does without --max-side."""
    white = pymupdf.Pixmap(pymupdf.csGRAY, pymupdf.IRect(0, 0, 20_000, 1), False)
    white.clear_with(255)  # a new Pixmap's samples are whatever its memory held: once, rapidocr read "." there
    white.save(tmp_path / "strip.png")
    strip = pymupdf.open()
    strip.new_page(width=14_400, height=1)
    strip.save(tmp_path / "strip.pdf")
    pages = []
    for name, spec in [("strip.png", RenderSpec(max_side=1000)), ("strip.pdf", RenderSpec(max_side=1000)),
                       ("strip.pdf", RenderSpec(dpi=20))]:
        (row,) = _rows(tmp_path / name, spec)
        assert row["error_type"] is None and min(row["width"], row["height"]) == 1, (name, spec, row)
        assert len(row["image"]) == row["width"] * row["height"] * 3
        pages.append(row | {"page_index": len(pages)})
    rows = [r for batch in rapidocr.run(iter([schema.batch(schema.PAGES, pages)])) for r in batch.to_pylist()]
    assert [(r["error_type"], r["text"]) for r in rows[:2]] == [(None, ""), (None, "")], rows
    assert rows[2]["error_message"].startswith("page 2: the page (4000x1 px) is too narrow for rapidocr"), rows[2]
