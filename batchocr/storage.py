"""The one storage seam: every read and write of SOURCE and OUT goes through fsspec here."""

from __future__ import annotations

import json
import os
import posixpath
import uuid
from typing import Any, Iterator, Mapping

import fsspec
from fsspec.implementations.local import LocalFileSystem

from batchocr.errors import ConfigError


class Store:
    """A folder on any fsspec filesystem: a local path, az://container/prefix, memory://..."""

    def __init__(self, url: str, storage_options: Mapping[str, Any] | None = None):
        self.url = url
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        except (ImportError, ValueError) as exc:
            raise ConfigError(f"cannot open {url}: {exc}") from None
        self.root = self.root.rstrip("/") or "/"

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    @property
    def canonical(self) -> str:
        """The root as a full URI: the same folder spelled two ways compares equal."""
        return self.uri(self.root)

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts) if parts else self.root

    def uri(self, path: str) -> str:
        """A full URI (with protocol) for a path of this filesystem."""
        return self.fs.unstrip_protocol(path)

    def exists(self, rel: str = "") -> bool:
        return self.fs.exists(self.path(rel) if rel else self.root)

    def read_bytes(self, rel: str) -> bytes:
        return self.fs.cat_file(self.path(rel))

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_bytes(rel))

    def find(self, rel: str, suffix: str = "") -> list[str]:
        """Paths (relative to the root) of files under rel, sorted."""
        base = self.path(rel)
        if not self.fs.exists(base):
            return []
        found = self.fs.find(base)
        prefix = self.root.rstrip("/") + "/"
        return sorted(p[len(prefix):] for p in found if p.endswith(suffix))

    def write_atomic(self, rel: str, data: bytes) -> str:
        """Write a whole file so that a reader sees all of it or nothing.

        Local disk: a temp name in the same folder, fsync, then rename (fsspec's own
        local transactions stage in /tmp, which is a copy, not a rename, across
        filesystems). Object stores: one upload is one commit.
        """
        path = self.path(rel)
        if self.is_local:
            folder = posixpath.dirname(path)
            os.makedirs(folder, exist_ok=True)
            tmp = posixpath.join(folder, f".{posixpath.basename(path)}.{uuid.uuid4().hex[:8]}.tmp")
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        else:
            self.fs.pipe_file(path, data)
        return path

    def write_json(self, rel: str, obj: Any) -> str:
        return self.write_atomic(rel, (json.dumps(obj, indent=2, default=str) + "\n").encode())

    def remove_stale_temps(self, rel: str) -> None:
        """Temp files left by a killed writer (local disk only: uploads leave none)."""
        if not self.is_local:
            return
        folder = self.path(rel)
        if os.path.isdir(folder):
            for name in os.listdir(folder):
                if name.startswith(".") and name.endswith(".tmp"):
                    os.unlink(os.path.join(folder, name))

    def walk_files(self) -> Iterator[tuple[str, dict]]:
        """(path, info) of every file under the root, folder by folder, in sorted order.

        Streams: one folder listing is held at a time, never the whole container.
        """
        if self.fs.isfile(self.root):
            yield self.root, self.fs.info(self.root)
            return
        for folder, dirs, files in self.fs.walk(self.root, detail=True):
            # Top-down walk recurses into `dirs` in its order after this yield: sort it.
            ordered = sorted(dirs.items())
            dirs.clear()
            dirs.update(ordered)
            for name in sorted(files):
                yield files[name].get("name", posixpath.join(folder, name)), files[name]
