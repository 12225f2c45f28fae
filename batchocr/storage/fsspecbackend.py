"""Any filesystem fsspec knows, as it is (memory://, http(s)://, s3://, ...): the backend of
every protocol the registry names no other for, and the base of local disk's and Azure's."""

from __future__ import annotations

import errno
import posixpath
from typing import Any, BinaryIO, Iterator, Mapping

import fsspec

from batchocr.errors import BatchocrError, ConfigError
from batchocr.storage.backend import Backend, protocol


class FsspecBackend(Backend):
    """The contract's core on an fsspec filesystem, `fs`."""

    def __init__(self, url: str, options: Mapping[str, Any], document: bool = False):
        super().__init__(url, options, document)
        try:
            cls = fsspec.get_filesystem_class(protocol(url))
            self.fs = cls(**cls._get_kwargs_from_urls(url) | dict(options))
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"cannot open {url}: {exc}") from None
        self.root = cls._strip_protocol(url).rstrip("/") or "/"

    def read(self, path: str, start: int | None = None, end: int | None = None) -> bytes:
        return self.fs.cat_file(path, start=start, end=end)

    def size(self, path: str) -> int | None:
        return self.fs.size(path)

    def open(self, path: str) -> BinaryIO:
        return self.fs.open(path, "rb", cache_type="none")

    def write_atomic(self, path: str, data: bytes, staging: str | None) -> None:
        self.fs.pipe_file(path, data)  # one upload is one commit; a retried one rewrites the same bytes

    def create(self, path: str, data: bytes) -> bool:
        if self.fs.exists(path):  # no conditional write in general: close enough
            return False
        self.fs.pipe_file(path, data)
        return True

    def remove(self, path: str) -> None:
        self.fs.rm_file(path)

    def folders(self, path: str) -> list[str]:
        return [posixpath.basename(e["name"].rstrip("/")) for e in self.fs.ls(path, detail=True)
                if e.get("type") == "directory"]

    def uri(self, path: str) -> str:
        return self.fs.unstrip_protocol(path)

    def walk(self, path: str) -> Iterator[tuple[str, dict]]:
        if self.fs.isfile(path):
            yield path, self.fs.info(path)
            return
        yield from self._walk_folder(path, frozenset())

    def _walk_folder(self, folder: str, above: frozenset) -> Iterator[tuple[str, dict]]:
        """Files in name order, each folder's files before its subfolders. Not fs.walk: it
        drops a folder it cannot list, as if it were empty (and fsspec 2026.9 does not pass
        on_error="raise" down to subfolders). `above`: what _enter keeps of the folders above
        this one."""
        above = self._enter(folder, above)
        if above is None:
            return
        try:
            entries = self.fs.ls(folder, detail=True)
        except FileNotFoundError:
            return  # none (the caller checks the root), or deleted since its parent was listed
        entries.sort(key=lambda e: e["name"])
        folders = []
        for entry in entries:
            name = entry["name"].rstrip("/")
            if self._is_folder(entry, name):
                if name != folder:
                    folders.append(name)
            else:
                yield name, self._file_info(entry, name)
        for sub in folders:
            yield from self._walk_folder(sub, above)

    def _enter(self, folder: str, above: frozenset) -> frozenset | None:
        """What walking `folder` passes down to its subfolders; None: not to be walked."""
        return above

    def _is_folder(self, entry: dict, name: str) -> bool:
        return entry.get("type") == "directory"

    def _file_info(self, entry: dict, name: str) -> dict:
        return entry

    def exists(self, path: str) -> bool:
        """fsspec's exists answers False for any error (HTTPFileSystem's for a refused
        connection, a 5xx, a timeout: "SOURCE does not exist", exit 2, where a retry may
        help): where it says no, info() tells a missing file from the error it swallowed."""
        if self.fs.exists(path):
            return True
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

    def explain(self, exc: BaseException, where: str) -> BatchocrError:
        if where.endswith(": writing") and getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM, errno.EROFS):
            # Retrying cannot make a read-only or forbidden OUT writable.
            return ConfigError(f"{where}: {exc.strerror}: OUT must be writable")
        if isinstance(exc, NotADirectoryError):  # OUT (or SOURCE) given as a file's path: retrying cannot help
            return ConfigError(f"{where}: a file stands where a folder should be ({exc.strerror}): "
                               "give the folder's path")
        return super().explain(exc, where)


def _reason(exc: BaseException) -> str:
    """What an OS-level error says without the URL it failed on: its errno's text, else its class."""
    inner = getattr(exc, "os_error", None) or exc  # aiohttp's ClientConnectorError wraps the OSError
    return getattr(inner, "strerror", None) or type(inner).__name__
