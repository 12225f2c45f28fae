"""Resume and `status` read only the key columns of each part file: on Azurite (through a
loopback proxy that counts the bytes the server sends) they download a small share of an
OUT whose part files are mostly page text."""

from azurite import azurite, connection_string  # noqa: F401 - azurite is a fixture
from batchocr.sink import committed_keys, to_parquet
from batchocr.status import status
from batchocr.storage import Store
from faultproxy import FaultProxy
from synthetic import long_text_parts


def test_resume_and_status_read_the_key_columns_not_the_text(azurite):
    azurite.container("keys")
    parts = long_text_parts(documents=100, pages=10, parts=4, chars=4000)  # parts of 250 pages, 4 M characters
    store = Store("az://keys/out", azurite.options())
    sizes = []
    for n, table in enumerate(parts):
        data = to_parquet(table)
        sizes.append(len(data))
        store.write_atomic(f"pages/shard-00000/part-r-{n:05d}.parquet", data)
    proxy = FaultProxy(azurite.port, reset_share=0.0)
    try:
        counted = Store("az://keys/out", {"connection_string": connection_string(proxy.port)})
        keys = committed_keys(counted, 0)
        resume_bytes = proxy.bytes_to_client
        (shard,) = status(counted)
        status_bytes = proxy.bytes_to_client - resume_bytes
    finally:
        proxy.stop()
    expected = {(r["doc_id"], r["page_index"]) for t in parts for r in t.select(["doc_id", "page_index"]).to_pylist()}
    assert set(zip(keys["doc_id"].to_pylist(), keys["page_index"].to_pylist())) == expected
    assert (shard.state, shard.pages, shard.documents) == ("partial", 1000, 100)
    total = sum(sizes)
    assert total > 1_500_000
    # The listing, each footer (pyarrow reads the last 64 kB first) and the small key columns.
    assert resume_bytes < total / 5, (resume_bytes, total)
    assert status_bytes < total / 5, (status_bytes, total)
