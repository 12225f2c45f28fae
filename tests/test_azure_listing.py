"""Listing an Azure container streams, one listing page at a time: with a small page
size the test sees every request the listing makes to Azurite while it reads the
documents one by one. A listing that gathered the container first would have made
all its requests before the first document came out. (bench/azure_listing.py
measures the memory of this over 20,000 blobs; docs/history/BENCHMARKS.md has the figures.)

A root with virtual folders is listed a level at a time, each folder's blobs by a listing of
its own, several at once: the same (path, info) sequence as the flat listing, with at most
LIST_AHEAD + 1 folder listings in flight and at most two pages fetched ahead in each."""

import asyncio
import sys
from collections import Counter

import pytest
from azure.core.exceptions import HttpResponseError
from fsspec.asyn import sync

from azurite import azurite  # noqa: F401 - a fixture
from batchocr.storage import azureblob
from batchocr.errors import StorageError
from batchocr.sources import list_documents
from batchocr.storage import Store
from conftest import ROOT, SAMPLES

sys.path.insert(0, str(ROOT / "bench"))
from azure_listing import upload  # noqa: E402

PAGE = 7
BLOBS = 10 * PAGE + 3  # eleven pages, the last one short


@pytest.fixture
def counted_pages(monkeypatch):
    """Every listing page fetched from Azurite, as its number of blobs, in order."""
    fetched: list[int] = []
    real = azureblob._list_page

    async def counting(*args, **kwargs):
        items, token = await real(*args, **kwargs)
        fetched.append(len(items))
        return items, token

    monkeypatch.setattr(azureblob, "LIST_PAGE", PAGE)
    monkeypatch.setattr(azureblob, "_list_page", counting)
    return fetched


def test_listing_holds_one_page_at_a_time(azurite, counted_pages):
    azurite.container("listing")
    upload(azurite.connection_string, "listing", "big", BLOBS)
    upload(azurite.connection_string, "listing", "other", 3)  # beside the prefix: not listed
    documents = list_documents(Store("az://listing/big", azurite.options()))

    names = []
    for n, doc in enumerate(documents, start=1):
        names.append(doc.name)
        # The n-th document came out of page ceil(n / PAGE), and no page after it was asked for.
        assert len(counted_pages) == -(-n // PAGE), (n, counted_pages)
        assert sum(counted_pages) - n < PAGE
    assert names == [f"doc{i:06d}.pdf" for i in range(BLOBS)]  # all of them, in name order
    assert counted_pages == [PAGE] * 10 + [3]


@pytest.mark.parametrize("source", ["az://shadow/docs/", "az://shadow/docs"])
def test_a_folder_is_listed_as_one_even_beside_a_blob_of_its_name(azurite, source):
    """A 0-byte blob `docs` (a folder marker some tools write) beside docs/x.pdf: SOURCE
    az://shadow/docs/ (and az://shadow/docs: blobs are under it) is the folder, not that blob."""
    cc = azurite.container("shadow")
    cc.upload_blob("docs", b"")
    for name in ("docs/x.pdf", "docs/y.pdf", "docsz.pdf"):
        cc.upload_blob(name, (SAMPLES / "report.pdf").read_bytes())
    assert [doc.uri for doc in list_documents(Store(source, azurite.options()))] == [
        "az://shadow/docs/x.pdf", "az://shadow/docs/y.pdf"]


def test_a_single_blob_is_still_a_single_file_source(azurite):
    cc = azurite.container("single")
    cc.upload_blob("a.pdf", (SAMPLES / "report.pdf").read_bytes())
    assert [doc.uri for doc in list_documents(Store("az://single/a.pdf", azurite.options()))] == ["az://single/a.pdf"]


TREE = ["a.pdf", "a/x.pdf", "a/y/z.pdf", "a0.pdf", "b.pdf", "deep/1/2/3.pdf", "empty/", "m/", "m/n.pdf",
        *(f"top/f{i:02d}/doc{j}.pdf" for i in range(12) for j in range(i % 5)), "top/f05/", "top/f07/sub/",
        "top/z.pdf", "z.pdf"]


def flat_listing(backend, root: str) -> list:
    """The flat listing of root, page by page: what walk yielded before it listed by folders."""
    container, _, name = root.partition("/")
    items, token = [], None
    while True:
        page, token = sync(backend.fs.loop, azureblob._list_page, backend.fs.service_client, container,
                           f"{name}/" if name else "", token)
        items += page
        if not token:
            return items


@pytest.fixture(scope="module")
def tree(azurite):
    cc = azurite.container("tree")
    for name in TREE:
        cc.upload_blob(name, b"" if name.endswith("/") else b"%PDF-1.4 tiny")
    return azurite


@pytest.mark.parametrize("url", ["az://tree/", "az://tree", "az://tree/top", "az://tree/a/", "az://tree/deep",
                                 "az://tree/empty/", "az://tree/m"])
@pytest.mark.parametrize("page", [3, 1000])
def test_folders_list_as_the_flat_listing(tree, monkeypatch, url, page):
    """Top-level blobs among folders, nested folders, folder markers, a folder of markers alone,
    a chain of single folders; pages that end inside a folder's listing and inside the level's."""
    monkeypatch.setattr(azureblob, "LIST_PAGE", page)
    backend = azureblob.AzureBackend(url, tree.options())
    walked = list(backend.walk(backend.root))
    assert walked == flat_listing(backend, backend.root)
    if url == "az://tree/":
        blobs = [name for name in TREE if not name.endswith("/")]
        assert [path for path, _ in walked] == [f"tree/{name}" for name in sorted(blobs)]
        assert [path for path, _ in walked][:4] == ["tree/a.pdf", "tree/a/x.pdf", "tree/a/y/z.pdf", "tree/a0.pdf"]
        assert all(info["size"] == len(b"%PDF-1.4 tiny") for _, info in walked)


def test_a_blob_beside_folders_of_markers_alone_is_a_single_file_source(azurite):
    """A blob `docs` and a folder marker `docs/sub/` (no blob under docs/): az://c/docs is the blob."""
    cc = azurite.container("markers")
    cc.upload_blob("docs", b"%PDF-1.4 tiny")
    cc.upload_blob("docs/sub/", b"")
    backend = azureblob.AzureBackend("az://markers/docs", azurite.options())
    assert [path for path, _ in backend.walk(backend.root)] == ["markers/docs"]


@pytest.fixture
def folders(azurite):
    """20 folders of 2 blobs at the top of a container."""
    cc = azurite.container("folders")
    for i in range(20):
        for j in range(2):
            cc.upload_blob(f"f{i:02d}/doc{j}.pdf", b"%PDF-1.4 tiny")
    return azurite


def test_folders_are_listed_at_once(folders, monkeypatch):
    """Every folder listing waits until LIST_AHEAD + 1 are in flight (the one being read and
    those ahead of it), so a listing that fetched folders one by one would never get there:
    each would wait out the guard's 60 s and the most in flight would be 1."""
    in_flight, most = 0, 0
    gathered: list[asyncio.Event] = []  # made on the listing's event loop
    real = azureblob._list_page

    async def counting(client, container, prefix, token, delimiter=None):
        nonlocal in_flight, most
        if delimiter:
            return await real(client, container, prefix, token, delimiter)
        gathered[:] = gathered or [asyncio.Event()]
        in_flight += 1
        most = max(most, in_flight)
        if in_flight == azureblob.LIST_AHEAD + 1:
            gathered[0].set()
        try:
            await asyncio.wait_for(gathered[0].wait(), 60)
        except TimeoutError:
            pass
        try:
            return await real(client, container, prefix, token)
        finally:
            in_flight -= 1

    monkeypatch.setattr(azureblob, "LIST_PAGE", 10)  # the level's 20 folders in two pages
    monkeypatch.setattr(azureblob, "_list_page", counting)
    names = [doc.uri.removeprefix("az://folders/") for doc in list_documents(Store("az://folders/", folders.options()))]
    assert names == [f"f{i:02d}/doc{j}.pdf" for i in range(20) for j in range(2)]
    assert most == azureblob.LIST_AHEAD + 1


def test_a_folder_ahead_holds_at_most_two_pages(azurite, monkeypatch):
    """Folders of five pages each: while one is read, a folder after it has asked for at most
    two pages (one waiting, one being fetched), never its whole listing."""
    cc = azurite.container("pages")
    for i in range(4):
        for j in range(10):
            cc.upload_blob(f"f{i}/doc{j}.pdf", b"%PDF-1.4 tiny")
    asked: Counter = Counter()  # flat listing requests by folder
    real = azureblob._list_page

    async def counting(client, container, prefix, token, delimiter=None):
        if not delimiter:
            asked[prefix] += 1
        return await real(client, container, prefix, token, delimiter)

    monkeypatch.setattr(azureblob, "LIST_PAGE", 2)
    monkeypatch.setattr(azureblob, "_list_page", counting)
    names = []
    for doc in list_documents(Store("az://pages", azurite.options())):
        names.append(doc.uri.removeprefix("az://pages/"))
        reading = int(names[-1][1])
        assert all(asked[f"f{i}/"] <= 2 for i in range(reading + 1, 4)), (doc.name, asked)
    assert names == [f"f{i}/doc{j}.pdf" for i in range(4) for j in range(10)]
    assert asked == {f"f{i}/": 5 for i in range(4)}


def test_a_folder_listing_error_comes_in_its_place(folders, monkeypatch):
    """A folder ahead whose listing fails: the folders before it are yielded whole, then the
    run's storage error, as the flat listing would have raised there."""
    real = azureblob._list_page

    async def failing(client, container, prefix, token, delimiter=None):
        if prefix == "f03/":
            raise HttpResponseError(message="listing broke off")
        return await real(client, container, prefix, token, delimiter)

    monkeypatch.setattr(azureblob, "_list_page", failing)
    names = []
    with pytest.raises(StorageError, match="Azure Blob storage unreachable"):
        for doc in list_documents(Store("az://folders", folders.options())):
            names.append(doc.uri.removeprefix("az://folders/"))
    assert names == [f"f{i:02d}/doc{j}.pdf" for i in range(3) for j in range(2)]


def test_a_listing_stopped_early_stops_the_folders_ahead(folders, monkeypatch):
    """A reader that stops after one document: every folder listing started is stopped."""
    started, stopped = [], []
    real_init, real_stop = azureblob._FolderListing.__init__, azureblob._FolderListing.stop

    def init(self, *args):
        started.append(self)
        real_init(self, *args)

    def stop(self):
        stopped.append(self)
        real_stop(self)

    monkeypatch.setattr(azureblob._FolderListing, "__init__", init)
    monkeypatch.setattr(azureblob._FolderListing, "stop", stop)
    backend = azureblob.AzureBackend("az://folders/", folders.options())
    walk = backend.walk(backend.root)
    assert next(walk)[0] == "folders/f00/doc0.pdf"
    walk.close()
    assert len(started) == azureblob.LIST_AHEAD + 1
    assert set(map(id, stopped)) == set(map(id, started))
    assert all(listing.task.cancelled() or listing.task.done() for listing in started)
