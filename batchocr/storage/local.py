"""Local disk (a path, file://): fsspec's LocalFileSystem for reading and listing, and what
batchocr needs of a folder that several writers share (pods of a shard on one volume,
`batchocr compact` beside a run): atomic writes through staged temps, exclusive creation
with O_EXCL, staging folders that another writer may remove at any moment, temps a killed
writer left, symbolic links followed to what they name, a root spelled one way."""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import time
import uuid
from typing import Any, Callable, Mapping

import pyarrow as pa
import pyarrow.parquet as pq

from batchocr.storage.fsspecbackend import FsspecBackend

# A temp file this old (by its modification time) is a dead writer's (remove_stale_temps):
# a live one writes its file in seconds; generous for a stalled network disk and a clock
# that differs from the file server's.
STALE_TEMP_S = 3600.0

_ROOT_FDS: dict[str, int] = {}  # reader_path's descriptors, by root


class LocalBackend(FsspecBackend):
    """A folder on local disk (or a mounted volume: NFS, Azure Files)."""

    def __init__(self, url: str, options: Mapping[str, Any], document: bool = False):
        super().__init__(url, options, document)
        self.root = _normal_local(self.root)

    def exists(self, path: str) -> bool:
        return self.fs.exists(path)  # the file system's answer: no error is swallowed on local disk

    def known_file(self, path: str) -> bool:
        return os.path.isfile(path)

    def make_root(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        if not os.access(self.root, os.W_OK):
            raise PermissionError(errno.EACCES, "permission denied")

    def read_document(self, path: str, progress: Callable[[], None] | None, listed_size: int | None) -> bytes:
        return self.read(path)  # at disk speed: no download to show moving

    def read_parquet(self, path: str, columns: list[str]) -> pa.Table:
        return pq.read_table(self.reader_path(path), columns=columns)

    def reader_path(self, path: str) -> str:
        """A local file's path as pyarrow and polars take it: UTF-8. A root whose name is
        not (os.fsdecode's escapes of other bytes) is reached by a descriptor held open
        for the process (renamed or replaced since: opened again)."""
        try:
            path.encode()
            return path
        except UnicodeEncodeError:
            st = os.stat(self.root)
            fd = _ROOT_FDS.get(self.root)
            if fd is None or not os.path.samestat(os.fstat(fd), st):
                fd = _ROOT_FDS[self.root] = os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            return posixpath.join(f"/proc/self/fd/{fd}", self.relative(path))

    def write_atomic(self, path: str, data: bytes, staging: str | None) -> None:
        """A temp file, fsync, then rename (fsspec's own local transactions stage in /tmp,
        which is a copy, not a rename, across filesystems). The temp is a hidden name beside
        the target, or under the folder `staging` (same filesystem) for folders that
        readers list whole: polars reads every file of a folder, hidden ones too."""
        folder = posixpath.dirname(path)
        os.makedirs(folder, exist_ok=True)
        if staging is None:
            tmp = posixpath.join(folder, f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
        else:
            tmp = posixpath.join(staging, f"{_temp_prefix(self.relative(path))}{uuid.uuid4().hex[:8]}.tmp")
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
                _remove_if_empty(staging)

    def create(self, path: str, data: bytes) -> bool:
        """O_EXCL (not a link from a temp: SMB mounts such as Azure Files have none). A reader
        may meet the file empty. Its folder can go meanwhile: a compaction letting go of its
        claim removes OUT/_compact once it is empty (_in_folder makes it again)."""
        exclusive = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
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

    def remove_stale_temps(self, folder: str, staging: str | None) -> None:
        """Temps beside the files of `folder`, or under `staging` for them (see write_atomic).
        Other folders' temps are left to their own writers. A temp is stale once STALE_TEMP_S
        old: a younger one can be a live writer's (`batchocr compact`, another part process
        or pod on the shard), whose rename would fail without it."""
        where = folder if staging is None else staging
        prefix = "." if staging is None else _temp_prefix(self.relative(folder).rstrip("/") + "/")
        if not os.path.isdir(where):
            return
        before = time.time() - STALE_TEMP_S
        for name in os.listdir(where):
            if name.startswith(prefix) and name.endswith(".tmp"):
                path = os.path.join(where, name)
                with contextlib.suppress(FileNotFoundError):  # renamed or removed since listed
                    if os.stat(path).st_mtime < before:
                        os.unlink(path)
        if staging is not None:
            _remove_if_empty(where)

    def remove_empty_folder(self, path: str) -> None:
        _remove_if_empty(path)

    # walk: a symbolic link to a folder is walked as the folder (fsspec lists it as type
    # "other"), unless it leads back to a folder above it (a loop: its files are listed
    # already); `above` holds those folders' (st_dev, st_ino).

    def _enter(self, folder: str, above: frozenset) -> frozenset | None:
        try:
            st = os.stat(folder)
        except FileNotFoundError:
            return None
        if (st.st_dev, st.st_ino) in above:
            return None
        return above | {(st.st_dev, st.st_ino)}

    def _is_folder(self, entry: dict, name: str) -> bool:
        return entry.get("type") == "directory" or bool(entry.get("islink") and os.path.isdir(name))

    def _file_info(self, entry: dict, name: str) -> dict:
        return _followed(entry, name) if entry.get("islink") else entry


def _create(tmp: str, make_folder: bool):
    """Open a new temp file; its staging folder made first if asked (_in_folder)."""
    return _in_folder(tmp, lambda path: open(path, "wb")) if make_folder else open(tmp, "wb")


def _in_folder(path: str, opening: Callable[[str], Any]) -> Any:
    """opening(path) once path's folder is made. Another writer (another shard's pod on the
    same volume, another compaction) removes such a folder once it is empty
    (_remove_if_empty), possibly between our makedirs and our open: then again. makedirs
    itself can lose that race: its mkdir finds the folder there, and by the time it checks
    that it is a folder, another writer has removed it (FileExistsError, exist_ok or not,
    with three shards on one folder): then again too. What opening raises otherwise
    (FileExistsError of an exclusive create) is the caller's."""
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
    """A staging folder goes when its last temp does: no empty OUT/_tmp stays behind."""
    with contextlib.suppress(OSError):  # not empty (another writer's temp), or gone already
        os.rmdir(folder)


def _temp_prefix(rel: str) -> str:
    """A staged temp file's name starts with its target's path under the root, `/` spelt `__`."""
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
    would keep the link's etag and never be read again. A dangling link stays as listed (its
    row says so)."""
    try:
        st = os.stat(path)
    except OSError:
        return entry
    return {**entry, "size": st.st_size, "mtime": st.st_mtime}
