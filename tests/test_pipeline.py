"""The pipeline end to end on the committed samples, with the real engines."""

import json

import pyarrow as pa
import pytest

from batchocr import read_pages, schema
from batchocr.evaluate import evaluate
from batchocr.sources import doc_id
from conftest import SAMPLES, count_pages, read_table, sample_documents

SCANNED = {"scanned.pdf", "receipt.png", "letter.jpg", "fax.tiff"}


def _pages_by_doc(table: pa.Table) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for uri, index in zip(table["source_uri"].to_pylist(), table["page_index"].to_pylist()):
        out.setdefault(uri.rsplit("/", 1)[-1], []).append(index)
    return out


@pytest.mark.parametrize("run", ["rapidocr_run", "textlayer_run"])
def test_one_row_per_page_of_every_document(run, request):
    out, _ = request.getfixturevalue(run)
    table = read_table(out)
    by_doc = _pages_by_doc(table)
    expected = {p.name: count_pages(p) for p in sample_documents()}
    assert {name: sorted(pages) for name, pages in by_doc.items()} == {
        name: list(range(n)) for name, n in expected.items()
    }
    assert table.num_rows == sum(expected.values())


def test_page_table_schema_is_the_contract(rapidocr_run):
    out, _ = rapidocr_run
    table = read_table(out)
    assert table.schema.remove_metadata() == schema.PAGE_TABLE
    rows = table.to_pylist()
    for row in rows:
        assert row["doc_id"] == doc_id(row["source_uri"])
        assert row["source_uri"].startswith("file://")
        assert row["shard"] == 0 and row["run_id"]
        assert row["width"] > 100 and row["height"] > 100
        assert row["finish_reason"] == "stop" and row["error_type"] is None
        # route auto: the born-digital report's pages come from their text layer, the scans from the model
        if row["source_uri"].endswith("/report.pdf"):
            assert (row["route"], row["engine"], row["latency_ms"]) == ("textlayer", "textlayer", 0)
            assert row["model"].startswith("pymupdf") and row["route_score"] >= 0.5
        else:
            assert (row["route"], row["engine"]) == ("model", "rapidocr") and row["model"].startswith("rapidocr")
            assert row["latency_ms"] > 0 and row["route_score"] < 0.5


def test_rapidocr_reads_the_scans_within_2_percent_cer(rapidocr_run):
    out, _ = rapidocr_run
    pages = read_pages(str(out)).collect()
    result = evaluate(pages, SAMPLES / "truth")
    scanned = result.pages.filter(result.pages["document"].is_in(sorted(SCANNED)))
    assert scanned.height == 7
    cer = scanned["errors"].sum() / scanned["chars"].sum()
    assert cer <= 0.02, scanned
    assert not result.missing


def test_textlayer_reads_born_digital_pages_and_skips_scans(textlayer_run):
    out, _ = textlayer_run
    pages = read_pages(str(out)).collect()
    result = evaluate(pages, SAMPLES / "truth")
    report = result.pages.filter(result.pages["document"] == "report.pdf")
    assert report.height == 3 and report["errors"].sum() == 0
    skipped = pages.filter(pages["finish_reason"] == "skipped")
    assert sorted({u.rsplit("/", 1)[-1] for u in skipped["source_uri"]}) == sorted(SCANNED)
    assert set(skipped["error_type"]) == {"no_text_layer"}
    assert all("--engine rapidocr" in m for m in skipped["error_message"])
    assert skipped["text"].null_count() == skipped.height


def test_run_record_and_done_marker(rapidocr_run):
    out, proc = rapidocr_run
    (record_path,) = (out / "_runs").glob("*.json")
    record = json.loads(record_path.read_text())
    assert record["status"] == "done"
    assert record["engine"] == "rapidocr"
    assert record["engine_params"]["orient"] is True
    # The numbers used, not the spec's 0 for "one per CPU" (which "spec" keeps, as it was given).
    from batchocr.cpus import available_cpus
    from batchocr.spec import RenderSpec

    assert record["engine_params"]["threads"] == available_cpus() > 0
    assert record["render"]["workers"] == RenderSpec().worker_count > 0 and record["spec"]["render"]["workers"] == 0
    assert (out / "pages").is_dir() and not (out / "_tmp").exists()  # no empty staging folder left
    assert record["counts"]["pages"] == 10 and record["counts"]["documents"] == 5
    # Where the run's start went: no part, so no turn; the engine's build (rapidocr's models
    # load), then the first pages to the engine and the first row (a text-layer row can come
    # before any page reaches the engine), all inside the run's seconds.
    t = record["timings"]
    assert t["turn_wait_s"] == 0 and 0 < t["engine_start_s"] < min(t["first_page_s"], t["first_row_s"])
    assert t["engine_start_s"] <= t["engine_built_s"] <= min(t["first_page_s"], t["first_row_s"])  # one clock
    assert max(t["first_page_s"], t["first_row_s"]) < record["counts"]["seconds"]
    assert {"batchocr", "pymupdf", "pyarrow", "python"} <= set(record["versions"])
    assert record["run_id"] in proc.stdout
    done = json.loads((out / "_done" / "shard-00000.json").read_text())
    assert done["last_run"]["run_id"] == record["run_id"] and done["run_ids"] == [record["run_id"]]
    assert (done["documents"], done["pages"], done["error_pages"]) == (5, 10, 0)
    # The one-line summary: documents, pages, errors, pages/s, output path.
    assert "5 documents, 10 pages (0 errors, 3 from the text layer)" in proc.stdout
    assert "pages/s" in proc.stdout and str(out) in proc.stdout


def test_rerun_does_nothing_and_says_so(textlayer_run, tmp_path):
    from conftest import run_cli

    out, _ = textlayer_run
    before = sorted(out.glob("pages/**/*.parquet"))
    proc = run_cli("run", str(SAMPLES), str(out), "--engine", "textlayer", "--quiet", check=True)
    assert "nothing to do" in proc.stdout and "5 documents already done" in proc.stdout
    assert sorted(out.glob("pages/**/*.parquet")) == before
