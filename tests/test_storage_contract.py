"""The storage backend contract (batchocr/storage/backend.py), one suite for every backend:
local disk, fsspec's memory filesystem, and Azure Blob on Azurite. A Store on each must
read, read a range, write atomically, create exclusively, remove, walk, list folders and
tell what exists alike, and pick its backend from the registry by the URL's protocol."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from azurite import azurite  # noqa: F401 - a fixture
from batchocr.errors import ConfigError
from batchocr.sink import to_parquet
from batchocr.storage import Store
from batchocr.storage.backend import BACKENDS, FSSPEC, Backend, Registered, open_backend


@pytest.fixture(params=["local", "memory", "azure"])
def store(request, tmp_path) -> Store:
    if request.param == "local":
        return Store(str(tmp_path / "root"))
    if request.param == "memory":
        return Store(f"memory://contract-{uuid.uuid4().hex[:8]}")
    azurite = request.getfixturevalue("azurite")
    name = f"contract-{uuid.uuid4().hex[:8]}"
    azurite.container(name)
    return Store(f"az://{name}/root", azurite.options())


def test_the_registry_picks_each_backend_by_protocol(tmp_path):
    assert type(open_backend(str(tmp_path), {})).__name__ == "LocalBackend"
    assert type(open_backend(f"file://{tmp_path}", {})).__name__ == "LocalBackend"
    assert type(open_backend("memory://x", {})).__name__ == "FsspecBackend"
    assert {BACKENDS[p].extra for p in ("az", "abfs", "abfss")} == {"azure"}
    assert FSSPEC.extra is None
    assert all(issubclass(entry.load("x"), Backend) for entry in {*BACKENDS.values(), FSSPEC})


def test_a_backend_whose_extra_is_missing_says_which_to_install():
    missing = Registered("batchocr_no_such_module:Backend", extra="azure")
    with pytest.raises(ConfigError, match=r"az://c needs the azure extra \(batchocr_no_such_module is missing\): "
                                          r"pip install 'batchocr\[azure\]'"):
        missing.load("az://c")


def test_read_range_read_and_atomic_write(store):
    data = bytes(range(256)) * 4
    store.write_atomic("a/b.bin", data, staging="_tmp")
    assert store.read_bytes("a/b.bin") == data
    assert store._backend.read(store.path("a/b.bin"), 10, 20) == data[10:20]
    assert store._backend.size(store.path("a/b.bin")) == len(data)
    store.write_atomic("a/b.bin", b"again")
    assert store.read_bytes("a/b.bin") == b"again"
    assert [store._backend.relative(p) for p, _ in store.walk_files()] == ["a/b.bin"]  # no temp left


def test_exclusive_create_lets_one_writer_win(store):
    assert store.create("_compact/x.json", b"first")
    assert not store.create("_compact/x.json", b"second")
    assert store.read_bytes("_compact/x.json") == b"first"


def test_remove_and_exists(store):
    store.write_atomic("gone.json", b"{}")
    assert store.exists("gone.json")
    store.remove("gone.json")
    assert not store.exists("gone.json")
    store.remove("gone.json")  # already gone: fine
    with pytest.raises(FileNotFoundError):
        store.read_bytes("gone.json")


def test_walk_find_and_subfolders(store):
    for rel in ("b/2.pdf", "a/1.pdf", "a/z/3.pdf", "top.pdf"):
        store.write_atomic(rel, rel.encode())
    listed = [(store._backend.relative(p), info["size"]) for p, info in store.walk_files()]
    assert sorted(listed) == [("a/1.pdf", 7), ("a/z/3.pdf", 9), ("b/2.pdf", 7), ("top.pdf", 7)]
    assert store.find("a", suffix=".pdf") == ["a/1.pdf", "a/z/3.pdf"]
    assert store.find("none") == []
    assert store.subfolders("") == ["a", "b"]
    assert store.subfolders("none") == []


def test_parquet_columns_and_footer(store):
    table = pa.table({"doc_id": ["a", "b"], "text": ["x" * 1000, "y"]})
    store.write_atomic("pages/part.parquet", to_parquet(table))
    assert store.read_parquet("pages/part.parquet", ["doc_id"]).column("doc_id").to_pylist() == ["a", "b"]
    assert store.read_parquet_metadata("pages/part.parquet").num_rows == 2
