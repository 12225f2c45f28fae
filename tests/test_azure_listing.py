"""Listing an Azure container streams, one listing page at a time: with a small page
size the test sees every request the listing makes to Azurite while it reads the
documents one by one. A listing that gathered the container first would have made
all its requests before the first document came out. (bench/azure_listing.py
measures the memory of this over 20,000 blobs; docs/history/BENCHMARKS.md has the figures.)"""

import sys

import pytest

from azurite import azurite  # noqa: F401 - a fixture
from batchocr.storage import azureblob
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
