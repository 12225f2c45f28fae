"""A document → its pages as images, in Arrow record batches. Runs inside a render
worker process (PyMuPDF is not thread-safe). Bad input becomes error rows, never
an exception: one bad document must not stop the shard."""

from __future__ import annotations

import errno
import math
import os
import re
import stat
import struct
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import pyarrow as pa
import pymupdf

from batchocr import schema, upright
from batchocr.schema import Needs
from batchocr.engines.textlayer import page_text
from batchocr.layertext import DocumentText
from batchocr.errors import BatchocrError, Unreadable
from batchocr.renderprogress import READING, UNKNOWN
from batchocr.router import route_page, unmapped_warning
from batchocr.sources import DocRef, native
from batchocr.spec import RenderSpec
from batchocr.storage import Store


@dataclass(frozen=True)
class RenderTask:
    doc: DocRef
    # Pages already committed by an earlier run: not rendered again (resume).
    skip: frozenset[int] = frozenset()
    # Pages (-1: the document) whose committed row is a first timeout or crash:
    # rendered again once; failing again, their row is final (attempts 2).
    retry: frozenset[int] = frozenset()


def no_progress(index: int, count: int) -> None:
    pass


def doc_error(doc: DocRef, error_type: str, message: str, page_count: int | None = None) -> dict:
    return {
        "doc_id": doc.doc_id,
        "source_uri": doc.uri,
        "source_etag": doc.etag,
        "source_size": doc.size,
        "page_index": -1,
        "page_count": page_count,
        "error_type": error_type,
        "error_message": message,
    }


def page_error(doc: DocRef, page_index: int, page_count: int, error_type: str, message: str) -> dict:
    return doc_error(doc, error_type, message, page_count) | {"page_index": page_index}


def open_document(doc: DocRef, storage_options: Mapping[str, Any], progress: Callable[[int, int], None] = no_progress,
                  ) -> tuple[pymupdf.Document, list[tuple[int, int]]]:
    """The document, and the width and height of each of its pages that its header gives
    (a TIFF's, see tiff_sizes; else none). progress(READING, UNKNOWN) before a download from
    SOURCE, (UNKNOWN, UNKNOWN) after it: the download is the storage's time, not the render
    timeout's (see renderpool)."""
    uri = native(doc.location or doc.uri)
    if uri.startswith("file://"):
        return _open_local(uri[len("file://"):], doc)
    store = Store(uri, storage_options, document=True)
    progress(READING, UNKNOWN)
    data = store.read_document(progress=lambda: progress(READING, UNKNOWN),  # each chunk: it moves
                               listed_size=doc.size or None)
    progress(UNKNOWN, UNKNOWN)
    if doc.size and len(data) != doc.size and store.exact_sizes:  # a blob's size is its bytes; an http body's need not be
        raise Unreadable(_changed(doc.size, len(data)))
    if not data:
        raise EmptyFile()
    return pymupdf.open(stream=data, filetype=doc.filetype), tiff_sizes(lambda at, n: data[at:at + n])


def _changed(listed: int, now: int) -> str:
    """A document rewritten between its listing (or plan) and its read: its row would hold the
    new content under the listed etag and size. Its `unreadable` row is superseded by the next
    run, which lists the new version (with a plan: the next `batchocr plan`)."""
    return (f"the file changed after it was listed ({listed} bytes listed, {now} now): a later run reads "
            "the new version once it is listed")


class EmptyFile(Exception):
    pass


def _open_local(path: str, doc: DocRef) -> tuple[pymupdf.Document, list[tuple[int, int]]]:
    """Opened by its bytes (any name the file system allows) and checked to be a
    regular file first: O_NONBLOCK, since opening a FIFO would wait for a writer."""
    try:
        fd = os.open(os.fsencode(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        if os.path.islink(path):
            raise Unreadable(f"a symbolic link to a file that does not exist ({os.readlink(path)})") from None
        raise Unreadable("the file was deleted after it was listed") from None
    except PermissionError:
        raise Unreadable("permission denied: this process may not read the file") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Unreadable("a loop of symbolic links") from None
        raise Unreadable(f"cannot open the file: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable(f"not a regular file but {_kind(st.st_mode)}")
        if doc.size and st.st_size != doc.size:
            raise Unreadable(_changed(doc.size, st.st_size))
        if st.st_size == 0:
            raise EmptyFile()
        # MuPDF opens its own descriptor of the same file by this name; the path
        # itself may not be valid UTF-8.
        return (pymupdf.open(f"/proc/self/fd/{fd}", filetype=doc.filetype),
                tiff_sizes(lambda at, n: os.pread(fd, n, at)))
    finally:
        os.close(fd)


def tiff_sizes(read: Callable[[int, int], bytes]) -> list[tuple[int, int]]:
    """The width and height of each image of a TIFF (its pages, in the order MuPDF counts
    them: the chain of image directories), from the directories alone; [] for a file that
    is not a TIFF (MuPDF reads no BigTIFF). MuPDF decodes a TIFF's image whole as its page
    loads (a 40 KB fax of 25000x25000 pixels: 0.9 GB), before the page's images can be
    checked; a PNG's or a JPEG's page holds its image undecoded. read(offset, n): the bytes."""
    head = read(0, 8)
    order = {b"II*\0": "<", b"MM\0*": ">"}.get(head[:4])
    if order is None or len(head) < 8:
        return []
    (at,) = struct.unpack(order + "I", head[4:])
    sizes: list[tuple[int, int]] = []
    seen: set[int] = set()
    while at and at not in seen:  # a loop of directories ends where it closes
        seen.add(at)
        (n,) = struct.unpack(order + "H", read(at, 2).ljust(2, b"\0"))
        table = read(at + 2, n * 12 + 4)
        if len(table) < n * 12 + 4:
            break
        found = {}
        for i in range(n):
            tag, kind, _, value = struct.unpack_from(order + "HHI4s", table, i * 12)
            if tag in (256, 257) and kind in (3, 4):  # ImageWidth, ImageLength: SHORT or LONG
                found[tag] = struct.unpack_from(order + ("H" if kind == 3 else "I"), value)[0]
        sizes.append((found.get(256, 0), found.get(257, 0)))
        (at,) = struct.unpack_from(order + "I", table, n * 12)
    return sizes


def _undecodable(pdoc: pymupdf.Document) -> Exception | None:
    """Why an image file of one image cannot be decoded (not an image, truncated),
    else None. MuPDF opens an image file lazily: such a file opens and fails when its
    page loads. An image too large is left to its page's row (too_large)."""
    if pdoc.is_pdf or pdoc.page_count != 1:
        return None
    try:
        pdoc.load_page(0)
    except Exception as exc:  # noqa: BLE001 - FzErrorFormat, FzErrorLibrary: not RuntimeErrors
        return exc if _error_kind(exc, "open_failed") == "open_failed" else None
    return None


def _cannot_open(doc: DocRef, exc: Exception) -> str:
    # A local file is opened as /proc/self/fd/N (_open_local): MuPDF's message names that.
    reason = re.sub(r"/proc/self/fd/\d+", lambda _: doc.uri, str(exc))
    return f"{doc.uri}: cannot open as {doc.filetype}: {type(exc).__name__}: {reason}"


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return f"a file of mode {mode:o}"


def render_document(
    task: RenderTask, spec: RenderSpec, needs: Needs, storage_options: Mapping[str, Any],
    progress: Callable[[int, int], None] = no_progress,
) -> Iterator[pa.RecordBatch]:
    """Yields batches of at most spec.batch_pages rows; the first row of a document
    that cannot be opened is its only row (page_index -1). progress(index, count)
    is called before each page is rendered, and with index == count after the last:
    if the process hangs or dies, the pool knows which page did it."""
    doc = task.doc
    pymupdf.TOOLS.mupdf_warnings(reset=True)
    try:
        pdoc, sizes = open_document(doc, storage_options, progress)
    except BatchocrError:  # storage failed for good, not this document: the run stops (see renderpool)
        raise
    except EmptyFile:
        yield schema.batch(schema.PAGES, [doc_error(doc, "empty_file", f"{doc.uri}: the file is empty (0 bytes)")])
        return
    except Unreadable as exc:
        yield schema.batch(schema.PAGES, [doc_error(doc, "unreadable", f"{doc.uri}: {exc}")])
        return
    except Exception as exc:  # noqa: BLE001 - any failure to open is this document's error row
        kind = _error_kind(exc, "open_failed")
        yield schema.batch(schema.PAGES, [doc_error(doc, kind, _cannot_open(doc, exc))])
        return
    # MuPDF silently repairs truncated and corrupt files; what it reported goes in
    # each page's `warning` (pages of a repaired file may come out blank).
    repaired = _warnings() if getattr(pdoc, "is_repaired", False) else ""
    with pdoc:
        count, error = _pages(pdoc, doc, _too_large(sizes[0], spec) if sizes else None)
        if error is not None:
            yield schema.batch(schema.PAGES, [error])
            return
        rows: list[dict] = []
        document, early = None, ""
        if pdoc.is_pdf and (needs.text_layer or needs.route) and len(task.skip) < count:
            early = _warnings()  # what MuPDF said opening it, before any page: the first page's, as it was
            document = DocumentText(pdoc, task.skip, lambda index: progress(index, count))
        for index in range(count):
            if index in task.skip:
                continue
            progress(index, count)
            notes = [repaired, early, _said(document.warnings.pop(index, "")) if document else ""]
            early = ""
            size = sizes[index] if index < len(sizes) else None
            row = _render_page(pdoc, doc, index, count, spec, needs, notes, size, document)
            notes.append(_warnings())
            mupdf = "; ".join(dict.fromkeys(w for w in notes if w))
            warning = "; ".join(filter(None, [row.get("warning"), mupdf and f"MuPDF: {mupdf}"]))[:1000]
            if warning:
                row["warning"] = warning
            rows.append(row)
            if len(rows) >= spec.batch_pages:
                yield schema.batch(schema.PAGES, rows)
                rows = []
        progress(count, count)
        if rows:
            yield schema.batch(schema.PAGES, rows)


def _pages(pdoc: pymupdf.Document, doc: DocRef, first_too_large: ImageTooLarge | None) -> tuple[int, dict | None]:
    """The document's page count, or 0 and its one error row. A first page whose header
    says it is too large is not loaded: its page's row says so."""
    try:
        if pdoc.needs_pass:
            return 0, doc_error(doc, "encrypted", f"{doc.uri}: the document is password-protected")
        count = pdoc.page_count
        if count == 0:
            return 0, doc_error(doc, "no_pages", f"{doc.uri}: the document has no pages", 0)
        undecodable = None if first_too_large else _undecodable(pdoc)
    # MuPDF reads the page tree when it first counts the pages: a /Count it cannot
    # believe (7 over one page, -1) raises "Invalid number of pages": uncaught, a traceback
    # that kills the worker (a renderer_crashed row, tried again on every rerun).
    except Exception as exc:  # noqa: BLE001 - any failure here is this document's error row
        return 0, doc_error(doc, _error_kind(exc, "open_failed"), _cannot_open(doc, exc))
    if undecodable is not None:
        return 0, doc_error(doc, "open_failed", _cannot_open(doc, undecodable))
    return count, None


def _render_page(pdoc: pymupdf.Document, doc: DocRef, index: int, count: int, spec: RenderSpec, needs: Needs,
                 notes: list[str], size: tuple[int, int] | None = None, document: DocumentText | None = None) -> dict:
    """The page's row; what MuPDF reported about the file so far is appended to notes
    (the router's scoring drains its own messages: they are not the file's). size: the
    page's image's width and height from the file's header, checked before the page loads."""
    try:
        if size is not None and (too_large := _too_large(size, spec)):
            raise too_large
        page = pdoc[index]
        matrix, dpi = page_scale(page, pdoc.is_pdf, spec)
        row = {
            "doc_id": doc.doc_id,
            "source_uri": doc.uri,
            "source_etag": doc.etag,
            "source_size": doc.size,
            "page_index": index,
            "page_count": count,
            "dpi": dpi,
        }
        if needs.text_layer:
            row["text_layer"] = page_text(page, document) if pdoc.is_pdf else ""
        if needs.route:  # a page routed to its text layer is not rendered
            notes.append(_warnings())
            row |= route_page(page, pdoc.is_pdf, needs.route, document)
        if glyphs := unmapped_warning(row.get("text_layer") or ""):  # the page's text is its layer's
            row["warning"] = glyphs
        drawn = needs.image and row.get("route") != "textlayer"
        if drawn or not pdoc.is_pdf:  # a PDF page's text layer is read without decoding its images
            _check_images(page, spec)
        if drawn:
            # clip to the exact target size: MuPDF may round a pixel up
            target = pymupdf.IRect(0, 0, round(page.rect.width * matrix.a), round(page.rect.height * matrix.d))
            pix = page.get_pixmap(matrix=matrix, colorspace=pymupdf.csRGB, alpha=False, clip=page.rect)
            if (pix.width, pix.height) != (target.width, target.height):
                pix = _fit(pix, target)
            row |= {"width": pix.width, "height": pix.height, "image": pix.samples}
            if needs.upright:
                row |= _upright(pix, needs.upright)
        else:
            row |= {"width": round(page.rect.width * matrix.a), "height": round(page.rect.height * matrix.d)}
        return row
    except ImportError as exc:  # the installation, not the page: every page would fail alike
        raise BatchocrError(f"render workers cannot import {exc.name or exc}: the installation is incomplete "
                            f"(pip install batchocr again)") from None
    except Exception as exc:  # noqa: BLE001 - FzErrorLimit and friends are not RuntimeErrors
        kind = _error_kind(exc, "render_failed")
        return page_error(doc, index, count, kind, f"{doc.uri}: page {index}: {type(exc).__name__}: {exc}")


def _upright(pix: pymupdf.Pixmap, model: str) -> dict:
    """The page's image turned upright where it lies sideways or upside down (batchocr.upright's
    `model`), and the angle it lay at."""
    turns = upright.quarter_turns(pix, model)
    row = {"skew_angle": upright.quarter_angle(turns)}
    if turns:
        row["image"], row["width"], row["height"] = upright.turned(pix.samples, pix.width, pix.height, turns)
    return row


def _fit(pix: pymupdf.Pixmap, target: pymupdf.IRect) -> pymupdf.Pixmap:
    """Crop or pad (white) a pixmap to exactly target's size."""
    out = pymupdf.Pixmap(pymupdf.csRGB, target, False)
    out.clear_with(255)
    pix.set_origin(0, 0)
    out.copy(pix, target & pix.irect)
    return out


class ImageTooLarge(Exception):
    pass


def _check_images(page: pymupdf.Page, spec: RenderSpec) -> None:
    """A decompression bomb (a tiny file claiming a 30000x30000 image: 1.9 GB of RAM
    to decode) is refused from its header, before MuPDF decodes it."""
    for info in page.get_image_info():
        if too_large := _too_large((info["width"], info["height"]), spec):
            raise too_large


def _too_large(size: tuple[int, int], spec: RenderSpec) -> ImageTooLarge | None:
    width, height = size
    pixels = width * height
    if pixels > spec.max_image_pixels:
        return ImageTooLarge(f"an image of {width}x{height} = {pixels / 1e6:.0f} Mpx is above "
                             f"render.max_image_pixels ({spec.max_image_pixels / 1e6:.0f} Mpx)")
    return None


def _error_kind(exc: Exception, default: str) -> str:
    # pymupdf.mupdf.FzErrorLimit ("image dimensions might overflow") is not a RuntimeError.
    return "too_large" if isinstance(exc, ImageTooLarge) or "Limit" in type(exc).__name__ else default


def _warnings() -> str:
    return _said(pymupdf.TOOLS.mupdf_warnings(reset=True))


def _said(text: str) -> str:
    """MuPDF's messages on one line, each once."""
    return " / ".join(dict.fromkeys(line for line in text.splitlines() if line))


def page_scale(page: pymupdf.Page, is_pdf: bool, spec: RenderSpec) -> tuple[pymupdf.Matrix, float]:
    """The matrix from page points to pixels, and the resulting dpi, for one page.

    PDF pages render at spec.dpi. Image files keep their own pixels: their page is
    sized in points from the image's own resolution, so zoom = pixels / points,
    the points of the image's own width as it lies on the page (an EXIF orientation
    of 5-8 turns the image: its width is then the page's height).
    Then max_side and max_pixels scale down, never up; size_multiple rounds both
    sides down to a multiple (a VLM's patch grid: its processor then has nothing
    to resize). No side is scaled to nothing: at least one pixel (one multiple).
    """
    rect = page.rect
    if is_pdf:
        zoom = spec.dpi / 72
    else:
        info = page.get_image_info()
        drawn_w = math.hypot(*info[0]["transform"][:2]) if info else 0.0  # the image's width in points
        zoom = info[0]["width"] / drawn_w if drawn_w else 1.0
    w, h = rect.width * zoom, rect.height * zoom
    shrink = 1.0
    if spec.max_side and max(w, h) > spec.max_side:
        shrink = spec.max_side / max(w, h)
    if w * h * shrink * shrink > spec.max_pixels:
        shrink = math.sqrt(spec.max_pixels / (w * h))
    zoom *= shrink
    zx = zy = zoom
    m = spec.size_multiple or 1
    if m > 1 and rect.width and rect.height:
        zx = max(m, math.floor(rect.width * zoom / m) * m) / rect.width
        zy = max(m, math.floor(rect.height * zoom / m) * m) / rect.height
    elif rect.width and rect.height:  # a side scaled under half a pixel is one pixel, not none
        zx, zy = max(zoom, 1 / rect.width), max(zoom, 1 / rect.height)
    return pymupdf.Matrix(zx, zy), round(zoom * 72, 2)
