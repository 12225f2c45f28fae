"""Spot-safety and storage faults with az:// source and sink, on Azurite: SIGKILL at
random instants; connections reset by a proxy (the SDK's retry policy mends them);
an outage (the run stops, committed work intact, the rerun completes)."""

import json
import random
import signal
import subprocess
import sys
import time

import polars as pl
import pytest

from batchocr import read_pages
from azurite import azurite, connection_string  # noqa: F401 - azurite is a fixture
from batchocr.storage import Store
from chaos import KEY, assert_same_as_clean, finish, run_with_kills, start, table, write_job
from conftest import HANG_S
from corpus import text_corpus
from faultproxy import FaultProxy

SOURCE = "az://chaos/src"
# Fast retries for tests (production defaults: 6 retries, waiting 1 + 2**n s: 3, 5, 9 ... 65 s).
QUICK_RETRY = {"retry_backoff": "0.05", "retry_backoff_base": "0.3", "retry_jitter": "0.05"}


@pytest.fixture(scope="module")
def corpus(azurite, tmp_path_factory):
    """50 text PDFs of 6 pages in az://chaos/src, and the table of a clean run."""
    tmp = tmp_path_factory.mktemp("azure-chaos")
    local = tmp / "src"
    text_corpus(local, documents=50, pages=6)  # 300 pages
    azurite.container("chaos")
    azurite.upload("chaos", sorted(local.iterdir()), prefix="src/")
    done = finish(write_job(tmp, SOURCE, "az://chaos/clean", azurite.options()))
    assert done.returncode == 0, done.stderr
    clean = table("az://chaos/clean", azurite.options())
    assert clean.height == 300 and set(clean["finish_reason"]) == {"stop"}
    return tmp, clean


def test_sigkill_at_random_instants_on_azure_loses_and_duplicates_nothing(azurite, corpus):
    tmp, clean = corpus
    out = "az://chaos/killed"
    job = write_job(tmp, SOURCE, out, azurite.options())
    kills, _ = run_with_kills(job, signal.SIGKILL, 8, random.Random(20261130), window=(0.0, 1.5))
    assert kills >= 8
    assert_same_as_clean(out, clean, azurite.options())
    assert Store(out, azurite.options()).exists("_done/shard-00000.json")


def _parts(azurite, out: str) -> dict[str, bytes]:
    return azurite.blobs("chaos", f"{out}/pages/")


def test_connection_resets_are_retried_nothing_lost_no_duplicate_parts(azurite, corpus):
    """Under a quarter of the requests to Azurite the proxy resets the connection (RST)
    after a random number of bytes: in requests, in replies, after an upload landed
    but before its reply.
    One run, no resume: it completes, its table equals the clean run's row for row,
    and the parts in storage are exactly the parts the run committed."""
    tmp, clean = corpus
    proxy = FaultProxy(azurite.port, reset_share=0.25, seed=11)
    try:
        options = {"connection_string": connection_string(proxy.port), "retry_total": "10", **QUICK_RETRY}
        done = finish(write_job(tmp, SOURCE, "az://chaos/reset", options))
    finally:
        proxy.stop()
    print(f"fault proxy: {proxy.requests} requests on {proxy.connections} connections, {proxy.resets} reset")
    assert done.returncode == 0, done.stderr
    assert proxy.resets >= 10, (proxy.resets, proxy.connections)

    rows = table("az://chaos/reset", azurite.options())  # read back past the proxy
    assert rows.select(KEY).is_unique().all(), "a page was committed twice"
    assert rows.sort(KEY).select(*KEY, "text", "finish_reason").equals(
        clean.sort(KEY).select(*KEY, "text", "finish_reason"))
    (record,) = [json.loads(data) for data in azurite.blobs("chaos", "reset/_runs/").values()]
    assert record["status"] == "done"
    assert sorted(f"reset/{p}" for p in record["parts"]) == sorted(_parts(azurite, "reset"))
    assert set(rows["run_id"]) == {record["run_id"]}


def test_downloads_cut_mid_body_more_often_than_the_sdk_retries_are_read_again(azurite, tmp_path):
    """The proxy cuts the replies to GETs of one blob 2,000 bytes in (headers pass, the
    body breaks off): 7 times, more than the SDK's downloader reads a broken reply (3).
    Store.read_bytes and read_parquet (ranged reads through a file) get every byte under
    retry_total 6; a blob cut every time fails after the retries as one StorageError line."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from batchocr.errors import StorageError

    table_ = pa.table({"text": [f"line {i} " * 40 for i in range(400)]})
    pq.write_table(table_, tmp_path / "part.parquet", compression="none")
    blob = tmp_path / "scan.bin"
    blob.write_bytes(random.Random(3).randbytes(60_000))
    azurite.container("cut")
    azurite.upload("cut", [blob, tmp_path / "part.parquet"])
    cuts = {"left": 0, "done": 0}

    def cut_reply(request: bytes) -> int | None:
        if request.startswith(b"GET ") and b"comp=" not in request.split(b"\r\n", 1)[0] and cuts["left"]:
            cuts["left"] -= 1
            cuts["done"] += 1
            return 2_000
        return None

    proxy = FaultProxy(azurite.port, reset_share=0.0, cut_reply=cut_reply)
    try:
        store = Store("az://cut", {"connection_string": connection_string(proxy.port), "retry_total": "6",
                                   **QUICK_RETRY})
        cuts["left"] = 7
        assert store.read_bytes("scan.bin") == blob.read_bytes()
        assert cuts == {"left": 0, "done": 7}
        cuts["left"] = 7
        assert store.read_parquet("part.parquet", ["text"]).equals(table_)
        assert cuts == {"left": 0, "done": 14}

        cuts["left"] = 4  # in a process of its own, no logging set up (as the CLI): stderr stays quiet
        script = ("import sys; from batchocr.storage import Store; "
                  "print(len(Store('az://cut', {'connection_string': sys.argv[1], 'retry_total': '6', "
                  "'retry_backoff': '0.05', 'retry_backoff_base': '0.3'}).read_bytes('scan.bin')))")
        alone = subprocess.run([sys.executable, "-c", script, connection_string(proxy.port)],
                               capture_output=True, text=True, timeout=120)
        assert (alone.returncode, alone.stdout.strip(), cuts["left"]) == (0, "60000", 0), alone.stderr
        assert alone.stderr == "", alone.stderr  # not the SDK's bare "Incomplete download." a cut

        quick = Store("az://cut", {"connection_string": connection_string(proxy.port), "retry_total": "1",
                                   **QUICK_RETRY})
        cuts["left"] = 100
        with pytest.raises(StorageError) as raised:
            quick.read_bytes("scan.bin")
    finally:
        proxy.stop()
    assert cuts["done"] == 14 + 4 + 2 * 3, cuts  # then 2 downloads (1 retry) of the SDK's 3 reads each
    message = str(raised.value)
    assert "\n" not in message and "scan.bin: reading" in message and "after 1 retry " in message, message


def test_an_outage_stops_the_run_with_committed_work_intact(azurite, corpus):
    """Storage goes away mid-run for good: after the SDK's retries the run stops with
    one clear line and exit 1; every part committed before is still there, byte for
    byte; once storage is back, a rerun completes the table."""
    tmp, clean = corpus
    proxy = FaultProxy(azurite.port, reset_share=0.0)
    try:
        options = {"connection_string": connection_string(proxy.port), "retry_total": "3", **QUICK_RETRY}
        job = write_job(tmp, SOURCE, "az://chaos/outage", options, commit={"every_pages": 3, "every_seconds": 0.3})
        proc = start(job, ms_per_page=60)
        deadline = time.monotonic() + HANG_S
        while len(_parts(azurite, "outage")) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, "no parts committed"
            time.sleep(0.1)
        proxy.set_down(True)
        committed = _parts(azurite, "outage")
        stdout, stderr = proc.communicate(timeout=180)
        print(f"outage: {len(committed)} parts committed before; {proxy.resets} connections reset")
        assert proc.returncode == 1, stderr
        errors = [line for line in stderr.splitlines() if line.startswith("Error")]
        assert len(errors) == 1 and "Traceback" not in stderr, stderr
        assert "unreachable after 3 retries" in errors[0] and "rerun to resume" in errors[0], errors[0]
        after = _parts(azurite, "outage")
        assert {name: after.get(name) for name in committed} == committed, "committed parts changed"

        proxy.set_down(False)
        done = finish(job)
    finally:
        proxy.stop()
    assert done.returncode == 0, done.stderr
    # (equal to the clean table: the outage left no error rows behind either)
    assert_same_as_clean("az://chaos/outage", clean, azurite.options())


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("Error")]


def test_a_storage_stall_while_downloading_a_document_stops_the_run(azurite, tmp_path):
    """The proxy swallows every download of a document (no reply: the SDK waits out its
    read_timeout, then retries) for longer than render.timeout_s. That is SOURCE's storage,
    not the documents: the run stops with one line and exit 1, no `timeout` row is written
    (it would be final after two runs); once storage answers again, a rerun reads them all."""
    text_corpus(tmp_path / "src", documents=2, pages=2)
    azurite.container("stall")
    azurite.upload("stall", sorted((tmp_path / "src").iterdir()))
    stalling = {"on": True}

    def stall(request: bytes) -> bool:
        line = request.split(b"\r\n", 1)[0]
        return stalling["on"] and line.startswith(b"GET /devstoreaccount1/stall/") and b"?" not in line

    proxy = FaultProxy(azurite.port, reset_share=0.0, stall=stall)
    try:
        options = {"connection_string": connection_string(proxy.port), "read_timeout": "30", "retry_total": "3",
                   **QUICK_RETRY}
        job = write_job(tmp_path, "az://stall/", "az://stall-out/run", options,
                        render={"workers": 1, "timeout_s": 1.5})
        azurite.container("stall-out")
        stalled = finish(job, timeout=120)
        assert stalled.returncode == 1, stalled.stderr
        (error,) = _error_lines(stalled.stderr)
        assert "az://stall/doc0000" in error and "made no progress for 1.5 s" in error, error
        assert not azurite.blobs("stall-out", "run/pages/"), "a row was committed for a stalled download"
        stalling["on"] = False
        done = finish(job, timeout=120)
    finally:
        proxy.stop()
    assert done.returncode == 0, done.stderr
    rows = table("az://stall-out/run", azurite.options())
    assert rows.height == 4 and set(rows["finish_reason"]) == {"stop"}


def _azure_error(status: int, reason: str, code: str) -> bytes:
    body = f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>injected</Message></Error>'
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/xml\r\nx-ms-error-code: {code}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n{body}").encode()


def test_a_blob_that_cannot_be_read_is_its_row_a_container_gone_stops_the_run(azurite, tmp_path):
    """Reading documents, Azure's answers about one blob are that document's `unreadable`
    row, and the run goes on (the next run too): a blob in the Archive tier (Azurite's own
    409 BlobArchived), a blob deleted after the listing (404 BlobNotFound: injected). A
    container deleted mid-run (404 ContainerNotFound to every read) stops the run: exit 1,
    one line, no rows. So does a 403 on a read, even for one blob (exit 2): credentials that
    may list but not read answer it for every blob, which must not become a row each."""
    text_corpus(tmp_path / "src", documents=4, pages=2)
    azurite.container("perblob")
    azurite.upload("perblob", sorted((tmp_path / "src").iterdir()))
    azurite.client().get_blob_client("perblob", "doc00000.pdf").set_standard_blob_tier("Archive")
    azurite.container("perblob-out")
    answers = {b"/perblob/doc00002.pdf ": _azure_error(404, "Not Found", "BlobNotFound")}

    def answer(request: bytes) -> bytes | None:
        line = request.split(b"\r\n", 1)[0]
        if line.startswith(b"GET "):
            return next((reply for name, reply in answers.items() if name in line), None)
        return None

    proxy = FaultProxy(azurite.port, reset_share=0.0, answer=answer)
    try:
        options = {"connection_string": connection_string(proxy.port), **QUICK_RETRY}
        job = write_job(tmp_path, "az://perblob/", "az://perblob-out/run", options)
        first, again = finish(job, timeout=120), finish(job, timeout=120)
        answers = {b"/perblob/doc": _azure_error(404, "Not Found", "ContainerNotFound")}
        gone = finish(write_job(tmp_path, "az://perblob/", "az://perblob-out/gone", options), timeout=120)
        answers = {b"/perblob/doc00001.pdf ": _azure_error(403, "Forbidden", "AuthorizationPermissionMismatch")}
        refused = finish(write_job(tmp_path, "az://perblob/", "az://perblob-out/refused", options), timeout=120)
    finally:
        proxy.stop()
    assert (first.returncode, again.returncode) == (0, 0), first.stderr + again.stderr
    rows = read_pages("az://perblob-out/run", azurite.options()).collect()
    errors = {r["source_uri"]: (r["error_type"], r["error_message"])
              for r in rows.filter(pl.col("error_type").is_not_null()).to_dicts()}
    assert errors == {
        "az://perblob/doc00000.pdf": ("unreadable", "az://perblob/doc00000.pdf: the blob is in the Archive tier: "
                                                    "rehydrate it (set its tier to Hot or Cool) to read it"),
        "az://perblob/doc00002.pdf": ("unreadable", "az://perblob/doc00002.pdf: the blob was deleted after it "
                                                    "was listed"),
    }
    assert rows.filter(pl.col("source_uri").is_in(["az://perblob/doc00001.pdf", "az://perblob/doc00003.pdf"])
                       ).height == 4

    assert gone.returncode == 1, gone.stderr
    (error,) = _error_lines(gone.stderr)
    assert "the container 'perblob' no longer exists" in error and "Traceback" not in gone.stderr, error
    assert not azurite.blobs("perblob-out", "gone/pages/")

    assert refused.returncode == 2, refused.stderr
    (error,) = _error_lines(refused.stderr)
    assert "AuthorizationPermissionMismatch" in error and "Traceback" not in refused.stderr, error
