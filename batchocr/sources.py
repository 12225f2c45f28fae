"""List the documents under a URL: DocRefs streamed in a stable order."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
import re
import sys
import urllib.parse
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from batchocr import layout
from batchocr.errors import ConfigError
from batchocr.storage import Store, public_url

EXTENSIONS = (".pdf", ".tif", ".tiff", ".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class DocRef:
    uri: str  # full URI with protocol, spelled by spell(): file:///data/a.pdf, az://scans/a.pdf
    size: int
    etag: str  # the store's ETag, or "<size>-<mtime>" where the store has none (local disk)
    mtime: float | None = None
    # Where it is read, where that is not `uri`: a signed URL (storage.public_url), whose
    # signature stays out of every row, record and message. Never written anywhere.
    location: str | None = field(default=None, repr=False, compare=False)

    @property
    def doc_id(self) -> str:
        return doc_id(self.uri)

    @property
    def name(self) -> str:
        return posixpath.basename(_path(self.uri))

    @property
    def filetype(self) -> str:
        return posixpath.splitext(_path(self.uri))[1].lower().lstrip(".")


# What spell() writes as %XX: the escape itself, control characters, and (as
# surrogate escapes, see os.fsdecode) bytes that are not UTF-8.
_ESCAPED = re.compile(r"[%\x00-\x1f\x7f\udc80-\udcff]")


def spell(name: str) -> str:
    """A URI or path as listed (os.fsdecode's str: bytes that are not UTF-8 are
    surrogate escapes) as valid UTF-8 text, losslessly: `%`, control characters
    and bytes that are not UTF-8 become %XX (`b-\\xff.pdf` is `b-%FF.pdf`, `50%.pdf`
    is `50%25.pdf`); every other character stays as it is (`::`, `#`, spaces,
    any Unicode). native() turns it back."""
    return _ESCAPED.sub(lambda m: "".join(f"%{b:02X}" for b in os.fsencode(m.group())), name)


def native(uri: str) -> str:
    """The name spell() was given: %XX back to its byte (non-UTF-8 bytes as
    surrogate escapes, as os.fsdecode gives them)."""
    return os.fsdecode(urllib.parse.unquote_to_bytes(uri)) if "%" in uri else uri


def doc_id(uri: str) -> str:
    """A stable id for a document: the first 16 hex digits of SHA-256 of its URI."""
    return hashlib.sha256(uri.encode()).hexdigest()[:16]


def _path(uri: str) -> str:
    """What names the file: an http(s) URL's path (its query is not part of the name:
    `a.pdf?sv=...&sig=...` is a PDF), any other URI or path as it is."""
    return urllib.parse.urlsplit(uri).path if uri[:8].lower().startswith(("http://", "https://")) else uri


def is_document(path: str) -> bool:
    return _path(path).lower().endswith(EXTENSIONS)


def not_a_document(store: Store) -> ConfigError:
    return ConfigError(f"SOURCE {public_url(store.url)} is a file batchocr does not read: "
                       f"expected a folder or a {', '.join(e.lstrip('.') for e in EXTENSIONS)} file")


def check_stores(source: Store, out: Store, say: bool = True) -> None:
    """SOURCE exists (a single file: one batchocr reads) and OUT can be written, in one line
    each (exit 2) if not: before anything is listed, the engine built or OUT written (run,
    plan). Not when the listing reaches a file SOURCE: after the engine's build and OUT's first
    files (its settings, a run record), which would then hold OUT to that run's settings.

    An OUT inside SOURCE (or SOURCE itself) is listed with it: allowed, with one line on stderr
    (`say`), since none of OUT's files is a document (layout.SUFFIXES); refused (exit 2) if one
    could be, before OUT is made."""
    if not source.exists():
        raise ConfigError(f"SOURCE {source.url} does not exist")
    if source.is_known_file() and not is_document(source.root):
        raise not_a_document(source)
    inside = not source.is_known_file() and _within(out, source)
    if inside:
        read = [s for s in layout.SUFFIXES if is_document(f"x{s}")]
        if read:
            raise ConfigError(f"OUT {out.url} is inside SOURCE {source.url}: its {', '.join(read)} files would be "
                              "read as documents; give an OUT outside SOURCE")
    out.check_writable_root("OUT")
    if inside and say:
        where = "is SOURCE itself" if _within(source, out) else f"is inside SOURCE {source.url}"
        print(f"batchocr: OUT {out.url} {where}: allowed, since none of OUT's files "
              f"({', '.join(f'*{s}' for s in layout.SUFFIXES)}) is a document, but every listing of SOURCE "
              "walks them too", file=sys.stderr)


def _within(inner: Store, outer: Store) -> bool:
    """inner's root is outer's or under it: as URIs, and on local disk as real paths (a
    symbolic link, `..`, a second spelling of one folder)."""
    a, b = inner.canonical.rstrip("/"), outer.canonical.rstrip("/")
    if a.startswith("file://") and b.startswith("file://"):
        a, b = os.path.realpath(inner.root).rstrip("/"), os.path.realpath(outer.root).rstrip("/")
    return a == b or a.startswith(f"{b}/")


def list_documents(store: Store) -> Iterator[DocRef]:
    """Every document under the store's root (or the root itself, if it is a file: then it
    must be a document)."""
    if not store.exists():
        raise ConfigError(f"SOURCE {store.url} does not exist")
    for path, info in store.walk_files():
        if not is_document(path):
            if path == store.root:
                raise not_a_document(store)
            continue
        uri = store.uri(path)
        public = public_url(uri)
        yield DocRef(
            uri=spell(public),
            size=int(info.get("size") or 0),
            etag=_etag(info),
            mtime=_mtime(info),
            location=None if public == uri else spell(uri),
        )


def located(documents: Iterable[DocRef], source: Store) -> Iterator[DocRef]:
    """Documents read back from a plan (which holds no signature), each with its location
    again: the SOURCE itself where SOURCE is a signed URL of one document."""
    url, public = spell(source.uri(source.root)), spell(source.canonical)
    for doc in documents:
        yield dataclasses.replace(doc, location=url) if url != public and doc.uri == public else doc


def _mtime(info: dict) -> float | None:
    value = info.get("mtime") or info.get("last_modified") or info.get("LastModified")
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        return value.timestamp()
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _etag(info: dict) -> str:
    for key in ("etag", "ETag", "e_tag"):
        if info.get(key):
            return str(info[key]).strip('"')
    mtime = _mtime(info)
    return f"{int(info.get('size') or 0)}-{int(mtime * 1e6) if mtime else 0}"
