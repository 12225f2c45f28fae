"""List the documents under a URL: DocRefs streamed in a stable order."""

from __future__ import annotations

import hashlib
import posixpath
from dataclasses import dataclass
from typing import Iterator

from batchocr.errors import ConfigError
from batchocr.storage import Store

EXTENSIONS = (".pdf", ".tif", ".tiff", ".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class DocRef:
    uri: str  # full URI with protocol: file:///data/a.pdf, az://scans/a.pdf
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
            uri=store.uri(path),
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
