"""List the documents under a URL: DocRefs streamed in a stable order."""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import urllib.parse
from dataclasses import dataclass
from typing import Iterator

from batchocr.errors import ConfigError
from batchocr.storage import Store

EXTENSIONS = (".pdf", ".tif", ".tiff", ".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class DocRef:
    uri: str  # full URI with protocol, spelled by spell(): file:///data/a.pdf, az://scans/a.pdf
    size: int
    etag: str  # the store's ETag, or "<size>-<mtime>" where the store has none (local disk)
    mtime: float | None = None

    @property
    def doc_id(self) -> str:
        return doc_id(self.uri)

    @property
    def name(self) -> str:
        return posixpath.basename(self.uri)

    @property
    def filetype(self) -> str:
        return posixpath.splitext(self.uri)[1].lower().lstrip(".")


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


def is_document(path: str) -> bool:
    return path.lower().endswith(EXTENSIONS)


def list_documents(store: Store) -> Iterator[DocRef]:
    """Every document under the store's root (or the root itself, if it is a file)."""
    if not store.exists():
        raise ConfigError(f"SOURCE {store.url} does not exist")
    for path, info in store.walk_files():
        if not is_document(path):
            continue
        yield DocRef(
            uri=spell(store.uri(path)),
            size=int(info.get("size") or 0),
            etag=_etag(info),
            mtime=_mtime(info),
        )


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
