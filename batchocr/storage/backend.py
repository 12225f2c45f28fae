"""The storage backend contract, and the registry that picks a backend by a URL's protocol.

A Backend is the storage under one URL as a Store uses it: read (whole or a byte range),
atomic write, exclusive create, remove, walk, exists and explain (a fault as one line),
with size, open, folders and uri. An implementation fills in the core (the abstract
methods); the rest is built here from the core, and an implementation overrides a part
where it knows a better way (local disk reads a Parquet file by its path and stages its
temps; Azure explains its own faults). Store is written against this class alone.

Paths are the backend's own: the root included, no protocol (`uri` adds it). A missing
file is FileNotFoundError; anything else in `faults` is a storage fault, which Store turns
into one redacted line with `explain` (reading a SOURCE document, `document_fault` first).
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass
from typing import Any, BinaryIO, Callable, Iterator, Mapping

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from batchocr.errors import BatchocrError, ConfigError, StorageError, Unreadable

DOWNLOAD_CHUNK = 8 * 2**20  # a large document is downloaded in ranges of this many bytes (read_document)


class Backend(abc.ABC):
    """The storage under one URL: its root, and what Store does there."""

    # What the backend's operations raise for a storage fault (explain says what it means).
    faults: tuple[type[BaseException], ...] = (OSError,)
    # A listed size is the object's byte count: a read of another length is an object
    # rewritten since it was listed, not a server that sends a body of its own (http).
    exact_sizes: bool = False

    root: str  # the root's path (no protocol; no trailing `/` but the file system's root): the implementation's

    def __init__(self, url: str, options: Mapping[str, Any], document: bool = False) -> None:
        """`document`: the URL is one document to read, not a folder to list or write in."""
        self.url = url

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every secret string the backend holds (its credentials), for redaction."""
        return ()

    # The core: each backend fills these in.

    @abc.abstractmethod
    def read(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        """The file's bytes; those from start to end (exclusive) where given: a range read."""

    @abc.abstractmethod
    def size(self, path: str) -> int | None:
        """The file's size in bytes (None where the store does not say)."""

    @abc.abstractmethod
    def open(self, path: str) -> BinaryIO:
        """The file, to read ranges of with no read-ahead: pyarrow asks for a Parquet file's
        footer, then for the column chunks it needs; a default block would fetch the whole
        part, whose text is most of it."""

    @abc.abstractmethod
    def write_atomic(self, path: str, data: bytes, staging: str | None) -> None:
        """Write a whole file so that a reader sees all of it or nothing (an object store: one
        upload is one commit). `staging`: a folder (a path of this backend) for the temp
        file of a backend that stages one, for folders that readers list whole."""

    @abc.abstractmethod
    def create(self, path: str, data: bytes) -> bool:
        """Write a new file only if none is there (True; False if one is): of two writers, one wins."""

    @abc.abstractmethod
    def remove(self, path: str) -> None:
        """Delete a file; FileNotFoundError if there is none."""

    @abc.abstractmethod
    def walk(self, path: str) -> Iterator[tuple[str, dict]]:
        """(path, info) of every file under path (or of path itself, where it is a file), in
        name order, each folder's files before its subfolders; streamed: no more than a
        folder's listing (an object store: a page of names) is held at a time. Info holds
        `size`, and `mtime` or `last_modified`, and an `etag` where the store has one."""

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Whether there is a file or folder at path. A fault asking is raised, not False:
        "does not exist" is a different answer (exit 2) from "try again" (exit 1)."""

    @abc.abstractmethod
    def folders(self, path: str) -> list[str]:
        """Names of the folders right under path; FileNotFoundError if there is no path."""

    @abc.abstractmethod
    def uri(self, path: str) -> str:
        """A full URI (with protocol) for a path of this backend."""

    # Built from the core; an implementation overrides what it does better.

    def explain(self, exc: BaseException, where: str) -> BatchocrError:
        """A storage fault (one of `faults`) as one line saying what happened `where`."""
        return StorageError(f"{where}: {type(exc).__name__}: {exc}")

    def document_fault(self, exc: BaseException, where: str) -> Exception | None:
        """What a fault reading one SOURCE document means, where the backend can tell: Unreadable
        where it is that file's alone (its row), a BatchocrError where it stops the run whatever
        explain would say (Azure: the container is gone); None for the rest (explain)."""
        if isinstance(exc, FileNotFoundError):
            return Unreadable("the file was deleted after it was listed")
        return None

    def relative(self, path: str) -> str:
        """A path under the root as relative to it."""
        return path[len(self.root.rstrip("/") + "/"):]

    def read_document(self, path: str, progress: Callable[[], None] | None, listed_size: int | None) -> bytes:
        """A SOURCE document's bytes. With `progress`, one over DOWNLOAD_CHUNK is read a byte
        range at a time, progress() after each, so that a large one on a slow link is seen to
        move (the render pool stops a run whose download makes no progress for
        render.timeout_s); a server that ignores ranges answers the first with the whole file,
        which is then the document. One whose `listed_size` is no larger than a chunk is read
        at once, with no request for its size first."""
        if progress is None or (listed_size is not None and listed_size <= DOWNLOAD_CHUNK):
            return self.read(path)
        size = self.size(path)
        if size is None or size <= DOWNLOAD_CHUNK:
            return self.read(path)
        parts = []
        for start in range(0, size, DOWNLOAD_CHUNK):
            end = min(size, start + DOWNLOAD_CHUNK)
            part = self.read(path, start, end)
            progress()
            if len(part) != end - start:  # not the range asked for: a server that ignores Range
                # sends the whole file (http.server does); else the file changed: read it whole
                return part if start == 0 and len(part) == size else self.read(path)
            parts.append(part)
        return b"".join(parts)

    def read_parquet(self, path: str, columns: list[str]) -> pa.Table:
        """Some columns of a Parquet file, downloading only their bytes: the footer, then those
        column chunks (nearby ones coalesced: pre_buffer), through `open`. (fsspec.parquet's
        open_parquet_file does it in fewer requests but downloads the footer twice.)"""
        with self.open(path) as f:
            return pq.ParquetFile(f, pre_buffer=True).read(columns=columns)

    def parquet_metadata(self, path: str) -> pq.FileMetaData:
        """A Parquet file's footer."""
        with self.open(path) as f:
            return pq.read_metadata(f)

    def reader_path(self, path: str) -> str:
        """The path by which pyarrow and polars read a file of this backend."""
        return path

    def make_root(self) -> None:
        """Make the root a folder that takes files, where the store has folders (OSError if
        it cannot be one). Object stores have none: nothing to do."""

    def known_file(self, path: str) -> bool:
        """Whether path is one file, where that is known without a request to a server (local
        disk); False elsewhere: walk finds out, with no request of its own for it."""
        return False

    def remove_stale_temps(self, folder: str, staging: str | None) -> None:
        """Temp files a killed writer left for files under `folder` (see write_atomic). A
        backend that stages no temps (uploads) has none."""

    def remove_empty_folder(self, path: str) -> None:
        """Remove the folder at path if it is empty (no empty folder left in OUT); object
        stores have no folders."""

    def polars_options(self) -> tuple[dict[str, str] | None, Any]:
        """(storage_options, credential_provider) for polars to read this backend's files."""
        return None, None


@dataclass(frozen=True)
class Registered:
    """A backend class by name, imported only when a URL needs it, and the extra of
    batchocr that installs what it imports (None: the base install has it)."""

    target: str  # "module:Class"
    extra: str | None = None

    def load(self, url: str) -> type[Backend]:
        module, _, name = self.target.partition(":")
        try:
            return getattr(importlib.import_module(module), name)
        except ImportError as exc:
            if self.extra is None:
                raise
            raise ConfigError(f"{url} needs the {self.extra} extra ({exc.name} is missing): "
                              f"pip install 'batchocr[{self.extra}]'") from None


AZURE_PROTOCOLS = ("az", "abfs", "abfss")  # the first is how batchocr writes URIs
_LOCAL = Registered("batchocr.storage.local:LocalBackend")
_AZURE = Registered("batchocr.storage.azureblob:AzureBackend", extra="azure")
# Protocol -> backend; any other protocol is fsspec's (FSSPEC), as fsspec's own registry has it.
BACKENDS: dict[str, Registered] = {"file": _LOCAL, "local": _LOCAL} | {p: _AZURE for p in AZURE_PROTOCOLS}
FSSPEC = Registered("batchocr.storage.fsspecbackend:FsspecBackend")


def protocol(url: str) -> str:
    """A URL's protocol; "file" for a path. Not fsspec.core.url_to_fs: it reads `::` as a URL
    chain (simplecache::s3://...), and `::` is a legal character of a file name (a::b.pdf)."""
    return fsspec.core.split_protocol(url)[0] or "file"


def open_backend(url: str, options: Mapping[str, Any], document: bool = False) -> Backend:
    """The backend registered for the URL's protocol, opened on it."""
    return BACKENDS.get(protocol(url), FSSPEC).load(url)(url, options, document)
