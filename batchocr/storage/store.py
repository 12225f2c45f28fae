"""Store: a folder on a storage backend, as SOURCE and OUT are read and written. Paths are
relative to the root; what a fault means becomes one redacted line (BatchocrError)."""

from __future__ import annotations

import contextlib
import json
import posixpath
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from batchocr import layout
from batchocr.errors import BatchocrError, ConfigError, NotBatchocrs
from batchocr.storage.backend import open_backend
from batchocr.storage.redaction import environment_secrets, public_url, redact

READ_THREADS = 16  # small files (run records, done-markers, part footers) read at once from an object store
_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true or false",
               type(None): "null"}


def each(fn, items: list) -> list:
    """[fn(item) for item in items], READ_THREADS at a time (requests to a store), in order."""
    if len(items) < 2:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(items))) as pool:
        return list(pool.map(fn, items))


class Store:
    """A folder on any storage batchocr knows: a local path, az://container/prefix, memory://,
    https://... Its backend (batchocr.storage.backend's registry, by the URL's protocol) does
    the storage's part; the Store names what failed where, and never reaches past it."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, document: bool = False):
        """`document`: the URL is one SOURCE document to read, not a folder batchocr lists or
        writes in (a name adlfs could not write under may still be read)."""
        self.url = url
        self._backend = open_backend(url, dict(storage_options or {}), document)
        self.root = self._backend.root

    @property
    def canonical(self) -> str:
        """The root as a full URI: the same folder spelled two ways compares equal (and a
        signed URL's signature is no part of it: public_url)."""
        return public_url(self.uri(self.root))

    @property
    def exact_sizes(self) -> bool:
        """A listed size is the file's byte count: a read of another length is a file that
        changed since it was listed (an http server's body need not match its listing)."""
        return self._backend.exact_sizes

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts) if parts else self.root

    def _path(self, rel: str) -> str:
        return self.path(rel) if rel else self.root

    def uri(self, path: str) -> str:
        """A full URI (with protocol) for a path of this store."""
        return self._backend.uri(path)

    def reader_uri(self, rel: str) -> str:
        """The URI by which pyarrow and polars read the file rel (a local name that is not
        UTF-8 is read through a descriptor of the root: LocalBackend.reader_path)."""
        return self.uri(self._backend.reader_path(self.path(rel)))

    @contextlib.contextmanager
    def _faults(self, doing: str, rel: str = "", document: bool = False) -> Iterator[None]:
        """A storage fault the client's own retries did not mend becomes one redacted
        line (ConfigError when the user can fix it, else StorageError). A missing file
        stays FileNotFoundError: what it means is the caller's business. Reading a
        `document`, what is wrong with that file alone is Unreadable (its row's message),
        and a missing file is one of those or the store's fault (a container deleted)."""
        where = f"{public_url(self.url).rstrip('/')}{'/' + rel if rel else ''}: {doing}"
        try:
            yield
        except ConfigError as exc:  # the backend's own (an http 403): where it was
            raise ConfigError(f"{where}: {exc}") from None
        except BatchocrError:
            raise
        except (FileNotFoundError, *self._backend.faults) as exc:
            if isinstance(exc, FileNotFoundError) and not document:
                raise
            err = (self._backend.document_fault(exc, where) if document else None) or self._backend.explain(exc, where)
            raise type(err)(redact(str(err), self._backend.secrets + environment_secrets())) from None

    def check_writable_root(self, what: str) -> None:
        """Before a run: the root can be a folder that takes files (local disk: made
        now; object stores have no folders, and their credentials and container are
        checked by `exists`). One ConfigError line otherwise: retrying cannot help."""
        try:
            self._backend.make_root()
        except OSError as exc:  # under /proc, under a file, read-only, not ours
            raise ConfigError(f"{what} {self.url}: cannot write there ({exc.strerror or exc}): "
                              f"{what} must be a writable folder") from None
        self.exists()

    def exists(self, rel: str = "") -> bool:
        with self._faults("checking it exists", rel):
            return self._backend.exists(self._path(rel))

    def is_known_file(self) -> bool:
        """The root is one file, not a folder, where that is known without a request to a
        server (local disk); elsewhere False, and the listing tells (Backend.known_file)."""
        return self._backend.known_file(self.root)

    def read_bytes(self, rel: str = "") -> bytes:
        with self._faults("reading", rel):
            return self._backend.read(self._path(rel))

    def read_document(self, rel: str = "", progress: Callable[[], None] | None = None,
                      listed_size: int | None = None) -> bytes:
        """read_bytes of one SOURCE document: a fault of that file alone (deleted since it
        was listed; on Azure also archived, or refused for that blob) is Unreadable.
        `progress`, where given, is called as the bytes come, and `listed_size` is the size
        the listing gave (Backend.read_document)."""
        with self._faults("reading", rel, document=True):
            return self._backend.read_document(self._path(rel), progress, listed_size)

    def read_json(self, rel: str) -> dict[str, Any]:
        """One of OUT's JSON files (run records, done-markers, the plan, _producer.json):
        every one is an object. One that is not (damaged, or not batchocr's) is a fault of
        OUT, named, with what moving it out costs: StorageError, as for a part file that is
        not Parquet (batchocr.sink), not a traceback."""
        raw = self.read_bytes(rel)
        try:
            value = json.loads(raw)
        except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
            detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        else:
            if isinstance(value, dict):
                return value
            detail = f"JSON {_JSON_KINDS.get(type(value), type(value).__name__)}, not an object"
        raise self.not_batchocrs(rel, detail) from None

    def not_batchocrs(self, rel: str, detail: str) -> NotBatchocrs:
        """One of OUT's state files (JSON, the plan's Parquet) that cannot be read as batchocr
        writes it: named, what was found, and what moving it out costs."""
        return NotBatchocrs(f"{public_url(self.url).rstrip('/')}/{rel}: not readable as batchocr writes it "
                            f"({detail}); {layout.if_moved_out(rel)}")

    def read_jsons(self, rel: str) -> list[Any]:
        """Every JSON file under rel (e.g. OUT's run records), in name order; [] if none."""
        return self.read_each_json(self.find(rel, suffix=".json"))

    def read_each_json(self, rels: list[str]) -> list[Any]:
        """read_json of each of `rels`, in their order, READ_THREADS at a time: an object store
        answers each in milliseconds, one after the other, and a CronJob's OUT holds a run
        record a run and a shard (thousands: `report` and every run's start read them). One gone
        since it was listed is left out: a done-marker that a run finding new work for its shard
        removes (the other shards' pods, starting with it, read OUT's markers)."""
        def read(rel: str) -> dict[str, Any] | None:
            try:
                return self.read_json(rel)
            except FileNotFoundError:
                return None

        return [value for value in each(read, rels) if value is not None]

    def read_parquet(self, rel: str, columns: list[str]) -> pa.Table:
        """Some columns of a Parquet file, downloading only their bytes (Backend.read_parquet)."""
        with self._faults("reading", rel):
            return self._backend.read_parquet(self.path(rel), columns)

    def read_parquet_metadata(self, rel: str) -> pq.FileMetaData:
        """A Parquet file's footer. What fails is raised as it is: the caller tells a file that
        is not Parquet (pyarrow's error, or an OSError) from one gone (FileNotFoundError)."""
        return self._backend.parquet_metadata(self.path(rel))

    def find(self, rel: str, suffix: str = "") -> list[str]:
        """Paths (relative to the root) of files under rel, sorted; [] if there is no rel."""
        return sorted(self._backend.relative(p) for p, _ in self._walk(self.path(rel), rel) if p.endswith(suffix))

    def subfolders(self, rel: str) -> list[str]:
        """Names of the folders right under rel."""
        with self._faults("listing", rel):
            try:
                return sorted(self._backend.folders(self.path(rel)))
            except FileNotFoundError:
                return []

    def write_atomic(self, rel: str, data: bytes, staging: str | None = None) -> str:
        """Write a whole file so that a reader sees all of it or nothing (Backend.write_atomic).
        `staging`: a folder (relative to the root) for the temp file of a backend that stages
        one (local disk), for folders that readers list whole."""
        path = self.path(rel)
        with self._faults("writing", rel):
            self._backend.write_atomic(path, data, None if staging is None else self.path(staging))
        return path

    def create(self, rel: str, data: bytes) -> bool:
        """Write a new file only if none is there (True; False if one is): of two writers one
        wins (O_EXCL on local disk, If-None-Match on Azure). A local reader may meet it empty."""
        with self._faults("writing", rel):
            return self._backend.create(self.path(rel), data)

    def write_json(self, rel: str, obj: Any) -> str:
        return self.write_atomic(rel, (json.dumps(obj, indent=2, default=str) + "\n").encode())

    def remove(self, rel: str) -> None:
        """Delete a file; one already gone is fine (a retried delete finds it gone)."""
        with self._faults("deleting", rel):
            try:
                self._backend.remove(self.path(rel))
            except FileNotFoundError:
                pass

    def remove_empty_folder(self, rel: str) -> None:
        """Remove the folder rel if it is empty (where the store has folders)."""
        self._backend.remove_empty_folder(self.path(rel))

    def remove_stale_temps(self, rel: str, staging: str | None = None) -> None:
        """Temp files a killed writer left for files under rel, beside them or under `staging`
        (see write_atomic); other folders' temps are left to their own writers."""
        self._backend.remove_stale_temps(self.path(rel), None if staging is None else self.path(staging))

    def walk_files(self) -> Iterator[tuple[str, dict]]:
        """(path, info) of every file under the root, in a stable sorted order.

        Streams: one folder listing (object stores: one page of names) is held at a
        time, never the whole container.
        """
        return self._walk(self.root, "")

    def _walk(self, path: str, rel: str) -> Iterator[tuple[str, dict]]:
        items = iter(self._backend.walk(path))
        while True:
            with self._faults("listing", rel):
                item = next(items, None)
            if item is None:
                return
            yield item

    def polars_options(self) -> tuple[dict[str, str] | None, Any]:
        """(storage_options, credential_provider) for polars to read this store's files."""
        return self._backend.polars_options()
