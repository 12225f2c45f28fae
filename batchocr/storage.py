"""The one storage seam: every read and write of SOURCE and OUT goes through a Store.

A Store is a folder on any fsspec filesystem. Azure Blob (az://, abfs://) has its
own backend next to this file (batchocr/azureblob.py: credentials, retry policy,
streamed listing, error messages); everything else goes through fsspec as is.
Storage faults leave a Store as one-line BatchocrErrors with no secret in them.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import re
import time
import urllib.parse
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator, Mapping

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from batchocr import layout
from batchocr.errors import BatchocrError, ConfigError, NotBatchocrs, StorageError, Unreadable

AZURE_PROTOCOLS = ("az", "abfs", "abfss")
_JSON_KINDS = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true or false",
               type(None): "null"}
# Variables whose values are secrets wherever they appear (see redact).
SECRET_VARIABLES = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN",
                    "AZURE_CLIENT_SECRET")
# A temp file this old (by its modification time) is a dead writer's (Store.remove_stale_temps):
# a live one writes its file in seconds; generous for a stalled network disk and a clock
# that differs from the file server's.
STALE_TEMP_S = 3600.0
_SECRET_FIELDS = re.compile(
    r"(?i)\b(AccountKey|SharedAccessSignature|sig|signature|account_key|sas_token|connection_string|client_secret)"
    r"(['\"]?\s*[=:]\s*['\"]?)([^;&\s'\",]+)")  # quoted too: account_key: 'SECRET, {"sig": "SECRET"}

_URL_PASSWORD = re.compile(r"(://[^/@\s:]*:)[^/@\s]+@")  # https://user:PASSWORD@host


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """text with every secret (and every key=value that names one) replaced by ***."""
    for secret in sorted({s for s in secrets if s and len(s) >= 8}, key=len, reverse=True):
        for form in (secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)):
            text = text.replace(form, "***")
    text = _URL_PASSWORD.sub(r"\1***@", text)
    return _SECRET_FIELDS.sub(lambda m: f"{m.group(1)}{m.group(2)}***", text)


# A signed URL's query is its credential: an Azure SAS (sig=, with sv=, se=, sp=, ...), S3's
# and GCS's presigned URLs (X-Amz-Signature, X-Goog-Signature).
_SIGNATURES = ("sig", "signature", "x-amz-signature", "x-goog-signature")

READ_THREADS = 16  # small files (run records, done-markers, part footers) read at once from an object store
DOWNLOAD_CHUNK = 8 * 2**20  # a large document is downloaded in ranges of this many bytes (read_document)


def each(fn, items: list) -> list:
    """[fn(item) for item in items], READ_THREADS at a time (requests to a store), in order."""
    if len(items) < 2:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(READ_THREADS, len(items))) as pool:
        return list(pool.map(fn, items))


def public_url(url: str) -> str:
    """An http(s) URL without its credentials: a signed URL's query (it names no document: the
    path does, and a new signature must not make a new document) and the password of
    `user:password@`. Any other URL, or one with neither, is returned as it is."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        return url
    signed = any(k.lower() in _SIGNATURES for k, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    if not signed and parts.password is None:
        return url
    userinfo, at, host = parts.netloc.rpartition("@")
    netloc = f"{userinfo.partition(':')[0]}@{host}" if at else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "" if signed else parts.query, parts.fragment))


def _reason(exc: BaseException) -> str:
    """What an OS-level error says without the URL it failed on: its errno's text, else its class."""
    inner = getattr(exc, "os_error", None) or exc  # aiohttp's ClientConnectorError wraps the OSError
    return getattr(inner, "strerror", None) or type(inner).__name__


def environment_secrets(env: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    return tuple(env[k] for k in SECRET_VARIABLES if env.get(k))


def _create(tmp: str, make_folder: bool):
    """Open a new temp file; its staging folder made first if asked (_in_folder)."""
    return _in_folder(tmp, lambda path: open(path, "wb")) if make_folder else open(tmp, "wb")


def _in_folder(path: str, opening: Callable[[str], Any]) -> Any:
    """opening(path) once path's folder is made. Another writer (another shard's pod on the
    same volume, another compaction) removes such a folder once it is empty
    (_remove_if_empty), possibly between our makedirs and our open: then again. makedirs
    itself can lose that race: its mkdir finds the folder there, and by the time it checks
    that it is a folder, another writer has removed it (FileExistsError, exist_ok or not:
    seen in CI with three shards on one folder): then again too. What opening raises
    otherwise (FileExistsError of an exclusive create) is the caller's."""
    for attempt in range(5):
        try:
            os.makedirs(posixpath.dirname(path), exist_ok=True)
        except FileExistsError:
            if attempt == 4:
                raise
            continue
        try:
            return opening(path)
        except FileNotFoundError:
            if attempt == 4:
                raise
    raise AssertionError("unreachable")


def _remove_if_empty(folder: str) -> None:
    """The staging folder goes when its last temp does: no empty OUT/_tmp stays behind."""
    with contextlib.suppress(OSError):  # not empty (another writer's temp), or gone already
        os.rmdir(folder)


def _temp_prefix(rel: str) -> str:
    """A staged temp file's name starts with its target's path, `/` spelt `__`."""
    return rel.replace("/", "__") + ("" if rel.endswith("/") else ".")


def _normal_local(root: str) -> str:
    """A local root spelled one way, whatever way it was given (`d//x/`, `./d/x`, `d/../d/x`):
    a document's URI, and so its doc_id and whether a rerun finds it done, comes from the
    root, and `"$BASE/"` in a CronJob's script must not make every document new (with three
    rows per page after three spellings). `..` is collapsed only where that names the same
    folder (it does not, past a symbolic link: `a/link/..` is the link target's parent)."""
    normal = posixpath.normpath(root)
    if normal == root:
        return root
    try:
        return normal if os.path.samefile(root, normal) else root
    except OSError:  # not there (yet): OUT before its first run; nothing to compare, only `//` and `.`
        return normal if ".." not in root.split("/") else root


def _followed(entry: dict, path: str) -> dict:
    """A symbolic link to a file as its target: fsspec gives the target's size but the link's
    own mtime, which never changes, so a target rewritten at the same size (a fixed-size TIFF)
    kept the link's etag and was never read again. A dangling link stays as listed (its row
    says so)."""
    try:
        st = os.stat(path)
    except OSError:
        return entry
    return {**entry, "size": st.st_size, "mtime": st.st_mtime}


class _Fsspec:
    """Any filesystem fsspec knows, as it is: local disk, memory://, ..."""

    faults: tuple[type[BaseException], ...] = (OSError,)
    secrets: tuple[str, ...] = ()

    def __init__(self, url: str, options: Mapping[str, Any]):
        # Not fsspec.core.url_to_fs: it reads `::` as a URL chain (simplecache::s3://...),
        # and `::` is a legal character of a file name (a::b.pdf). batchocr reads each
        # file once: it has no use for chains.
        protocol = fsspec.core.split_protocol(url)[0] or "file"
        try:
            cls = fsspec.get_filesystem_class(protocol)
            self.fs = cls(**cls._get_kwargs_from_urls(url) | dict(options))
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"cannot open {url}: {exc}") from None
        self.root = cls._strip_protocol(url).rstrip("/") or "/"
        if isinstance(self.fs, LocalFileSystem):
            self.root = _normal_local(self.root)

    def walk(self, root: str) -> Iterator[tuple[str, dict]]:
        if self.fs.isfile(root):
            yield root, self.fs.info(root)
            return
        yield from self._walk_folder(root, frozenset())

    def _walk_folder(self, folder: str, above: frozenset[tuple[int, int]]) -> Iterator[tuple[str, dict]]:
        """Files in name order, each folder's files before its subfolders. Not
        fs.walk: it drops a folder it cannot list, as if it were empty (and
        fsspec 2026.9 does not pass on_error="raise" down to subfolders).
        On local disk a symbolic link to a folder is walked as the folder (fsspec
        lists it as type "other"), unless it leads back to a folder above it:
        `above` holds their (st_dev, st_ino)."""
        if isinstance(self.fs, LocalFileSystem):
            try:
                st = os.stat(folder)
            except FileNotFoundError:
                return
            if (st.st_dev, st.st_ino) in above:
                return  # a loop: its files are listed already
            above |= {(st.st_dev, st.st_ino)}
        try:
            entries = self.fs.ls(folder, detail=True)
        except FileNotFoundError:
            return  # none (the caller checks the root), or deleted since its parent was listed
        entries.sort(key=lambda e: e["name"])
        folders = []
        for entry in entries:
            name = entry["name"].rstrip("/")
            if entry.get("type") == "directory" or (entry.get("islink") and self._is_local_folder(name)):
                if name != folder:
                    folders.append(name)
            elif entry.get("islink") and isinstance(self.fs, LocalFileSystem):
                yield name, _followed(entry, name)
            else:
                yield name, entry
        for sub in folders:
            yield from self._walk_folder(sub, above)

    def exists(self, path: str) -> bool:
        """fsspec's exists answers False for any error (HTTPFileSystem's for a refused
        connection, a 5xx, a timeout: "SOURCE does not exist", exit 2, where a retry may
        help): where it says no, info() tells a missing file from the error it swallowed."""
        if self.fs.exists(path):
            return True
        if isinstance(self.fs, LocalFileSystem):
            return False
        try:
            self.fs.info(path)
        except FileNotFoundError as exc:
            cause = exc.__cause__  # HTTPFileSystem.info: FileNotFoundError from whatever failed
            status = getattr(cause, "status", None)
            if cause is None or isinstance(cause, FileNotFoundError) or status in (404, 410):
                return False
            # its status, not str(cause): an aiohttp error's text holds the URL, a signed one's signature
            why = f"HTTP {status} {getattr(cause, 'message', '')}".rstrip() if status else f"{type(cause).__name__}"
            if status in (401, 403):  # a signature expired or wrong: retrying cannot help
                raise ConfigError(f"access denied ({why})") from None
            raise ConnectionError(f"{why}: {_reason(cause)}" if not status else why) from None
        return True

    def _is_local_folder(self, path: str) -> bool:
        return isinstance(self.fs, LocalFileSystem) and os.path.isdir(path)

    def document_fault(self, exc: BaseException, where: str) -> Exception | None:
        """A fault reading one SOURCE document that is that file's alone (Unreadable), else None."""
        if isinstance(exc, FileNotFoundError):
            return Unreadable("the file was deleted after it was listed")
        return None

    def explain(self, exc: BaseException, where: str) -> BatchocrError:
        if where.endswith(": writing") and getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS):
            # Retrying cannot make a read-only or forbidden OUT writable.
            return ConfigError(f"{where}: {exc.strerror}: OUT must be writable")
        if isinstance(exc, NotADirectoryError):  # OUT (or SOURCE) given as a file's path: retrying cannot help
            return ConfigError(f"{where}: a file stands where a folder should be ({exc.strerror}): "
                               "give the folder's path")
        return StorageError(f"{where}: {type(exc).__name__}: {exc}")

    def polars_options(self) -> tuple[dict[str, str] | None, Any]:
        return None, None


_ROOT_FDS: dict[str, int] = {}  # Store.local_path's descriptors, by root


class Store:
    """A folder on any fsspec filesystem: a local path, az://container/prefix, memory://..."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None, document: bool = False):
        """`document`: the URL is one SOURCE document to read, not a folder batchocr lists or
        writes in (a name adlfs could not write under may still be read)."""
        self.url = url
        options = dict(storage_options or {})
        if fsspec.core.split_protocol(url)[0] in AZURE_PROTOCOLS:
            try:
                from batchocr.azureblob import AzureBackend
            except ImportError as exc:
                raise ConfigError(f"{url} needs the azure extra ({exc.name} is missing): "
                                  "pip install 'batchocr[azure]'") from None
            self._backend = AzureBackend(url, options, document)
        else:
            self._backend = _Fsspec(url, options)
        self.fs, self.root = self._backend.fs, self._backend.root

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    @property
    def canonical(self) -> str:
        """The root as a full URI: the same folder spelled two ways compares equal (and a
        signed URL's signature is no part of it: public_url)."""
        return public_url(self.uri(self.root))

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts) if parts else self.root

    def _path(self, rel: str) -> str:
        return self.path(rel) if rel else self.root

    def uri(self, path: str) -> str:
        """A full URI (with protocol) for a path of this filesystem."""
        return self.fs.unstrip_protocol(path)

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
        if not self.is_local:
            self.exists()
            return
        try:
            os.makedirs(self.root, exist_ok=True)
            if not os.access(self.root, os.W_OK):
                raise PermissionError(errno.EACCES, "permission denied")
        except OSError as exc:  # under /proc, under a file, read-only, not ours
            raise ConfigError(f"{what} {self.url}: cannot write there ({exc.strerror or exc}): "
                              f"{what} must be a writable folder") from None

    def exists(self, rel: str = "") -> bool:
        with self._faults("checking it exists", rel):
            return self._backend.exists(self._path(rel))

    def read_bytes(self, rel: str = "") -> bytes:
        with self._faults("reading", rel):
            return self.fs.cat_file(self._path(rel))

    def read_document(self, rel: str = "", progress: Callable[[], None] | None = None,
                      listed_size: int | None = None) -> bytes:
        """read_bytes of one SOURCE document: a fault of that file alone (deleted since it
        was listed; on Azure also archived, or refused for that blob) is Unreadable.
        `progress`, where given, is called as the bytes come: a document over DOWNLOAD_CHUNK
        is read a byte range at a time, so that a large one on a slow link is seen to move
        (the render pool stops a run whose download makes no progress for render.timeout_s:
        read whole, a 1 GB scan at 3 MB/s stopped every run that reached it); a server that
        ignores ranges answers the first with the whole file, which is then the document.
        `listed_size`, the size the listing gave: one no larger than a chunk is read at once,
        with no request for its size first."""
        path = self._path(rel)
        with self._faults("reading", rel, document=True):
            small = listed_size is not None and listed_size <= DOWNLOAD_CHUNK
            if progress is None or small or self.is_local:
                return self.fs.cat_file(path)
            size = self.fs.size(path)
            if size is None or size <= DOWNLOAD_CHUNK:
                return self.fs.cat_file(path)
            parts = []
            for start in range(0, size, DOWNLOAD_CHUNK):
                end = min(size, start + DOWNLOAD_CHUNK)
                part = self.fs.cat_file(path, start=start, end=end)
                progress()
                if len(part) != end - start:  # not the range asked for: a server that ignores Range
                    # sends the whole file (http.server does); else the file changed: read it whole
                    return part if start == 0 and len(part) == size else self.fs.cat_file(path)
                parts.append(part)
            return b"".join(parts)

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
        """Some columns of a Parquet file, downloading only their bytes: pyarrow reads
        the file's tail (its footer), then those column chunks (nearby ones coalesced:
        pre_buffer), through a file opened without read-ahead. An object store's
        default block would fetch the whole part, whose text is most of it.
        (fsspec.parquet.open_parquet_file does it in fewer requests but downloads the
        footer twice.)"""
        with self._faults("reading", rel):
            if self.is_local:
                return pq.read_table(self.local_path(rel), columns=columns)
            with self.fs.open(self.path(rel), "rb", cache_type="none") as f:
                return pq.ParquetFile(f, pre_buffer=True).read(columns=columns)

    def local_path(self, rel: str) -> str:
        """A local file's path as pyarrow and polars take it: UTF-8. A root whose name is
        not (os.fsdecode's escapes of other bytes) is reached by a descriptor held open
        for the process (renamed or replaced since: opened again)."""
        path = self.path(rel)
        try:
            path.encode()
            return path
        except UnicodeEncodeError:
            st = os.stat(self.root)
            fd = _ROOT_FDS.get(self.root)
            if fd is None or not os.path.samestat(os.fstat(fd), st):
                fd = _ROOT_FDS[self.root] = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            return posixpath.join(f"/proc/self/fd/{fd}", rel)

    def find(self, rel: str, suffix: str = "") -> list[str]:
        """Paths (relative to the root) of files under rel, sorted; [] if there is no rel."""
        prefix = self.root.rstrip("/") + "/"
        return sorted(p[len(prefix):] for p, _ in self._walk(self.path(rel), rel) if p.endswith(suffix))

    def subfolders(self, rel: str) -> list[str]:
        """Names of the folders right under rel."""
        with self._faults("listing", rel):
            try:
                entries = self.fs.ls(self.path(rel), detail=True)
            except FileNotFoundError:
                return []
        return sorted(posixpath.basename(e["name"].rstrip("/")) for e in entries if e.get("type") == "directory")

    def write_atomic(self, rel: str, data: bytes, staging: str | None = None) -> str:
        """Write a whole file so that a reader sees all of it or nothing.

        Local disk: a temp file, fsync, then rename (fsspec's own local
        transactions stage in /tmp, which is a copy, not a rename, across
        filesystems). The temp is a hidden name beside the target, or under the
        folder `staging` (relative to the root, same filesystem) for folders that
        readers list whole: polars reads every file of a folder, hidden ones too.
        Object stores: one upload is one commit (a retried upload rewrites the
        same name with the same bytes).
        """
        path = self.path(rel)
        with self._faults("writing", rel):
            if self.is_local:
                folder = posixpath.dirname(path)
                os.makedirs(folder, exist_ok=True)
                if staging is None:
                    tmp = posixpath.join(folder, f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
                else:
                    tmp = self.path(staging, f"{_temp_prefix(rel)}{uuid.uuid4().hex[:8]}.tmp")
                try:
                    with _create(tmp, staging is not None) as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, path)
                except BaseException:
                    # A full disk: the half-written temp would keep it full.
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
                    raise
                finally:
                    if staging is not None:
                        _remove_if_empty(self.path(staging))
            else:
                self.fs.pipe_file(path, data)
        return path

    def create(self, rel: str, data: bytes) -> bool:
        """Write a new file only if none is there (True; False if one is): of two writers one
        wins (O_EXCL on local disk, If-None-Match on Azure). A local reader may meet it empty."""
        path = self.path(rel)
        with self._faults("writing", rel):
            if self.is_local:
                # Its folder can go meanwhile: a compaction releasing its claim removes OUT/_compact
                # once it is empty (_in_folder makes it again).
                exclusive = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
                try:  # (not a link from a temp: SMB mounts such as Azure Files have none)
                    fd = _in_folder(path, lambda p: os.open(p, exclusive, 0o644))
                except FileExistsError:
                    return False
                try:
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                except BaseException:
                    # A full disk: an empty file would stand for a writer that is not there
                    # (a compaction's claim, read as one being written, held for ever).
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                    raise
                return True
            if isinstance(self._backend, _Fsspec):  # no conditional write in general: close enough
                if self.fs.exists(path):
                    return False
                self.fs.pipe_file(path, data)
                return True
            try:
                self.fs.pipe_file(path, data, overwrite=False)
            except FileExistsError:
                return False
            return True

    def write_json(self, rel: str, obj: Any) -> str:
        return self.write_atomic(rel, (json.dumps(obj, indent=2, default=str) + "\n").encode())

    def remove(self, rel: str) -> None:
        """Delete a file; one already gone is fine (a retried delete finds it gone)."""
        with self._faults("deleting", rel):
            try:
                self.fs.rm_file(self.path(rel))
            except FileNotFoundError:
                pass

    def remove_stale_temps(self, rel: str, staging: str | None = None) -> None:
        """Temp files a killed writer left for files under rel (local disk only:
        uploads leave none), beside them or under `staging` (see write_atomic).
        Other folders' temps are left to their own writers. A temp is stale once
        STALE_TEMP_S old: a younger one can be a live writer's (`batchocr compact`,
        another part process or pod on the shard), whose rename would fail without it."""
        if not self.is_local:
            return
        folder = self.path(rel if staging is None else staging)
        prefix = "." if staging is None else _temp_prefix(rel.rstrip("/") + "/")
        if os.path.isdir(folder):
            before = time.time() - STALE_TEMP_S
            for name in os.listdir(folder):
                if name.startswith(prefix) and name.endswith(".tmp"):
                    path = os.path.join(folder, name)
                    with contextlib.suppress(FileNotFoundError):  # renamed or removed since listed
                        if os.stat(path).st_mtime < before:
                            os.unlink(path)
            if staging is not None:
                _remove_if_empty(folder)

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
