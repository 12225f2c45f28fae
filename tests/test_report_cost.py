"""Cost per million pages from a run's own accelerator record (text, JSON, HTML; the
flag and the job-spec key), and the throughput timeline readable for a 30-second run
and a three-day backfill."""

import datetime as dt
import json
import re
import shutil

import pyarrow.parquet as pq
import pytest

from batchocr.cost import visible_gpus
from batchocr.report import timeline
from conftest import SAMPLES, run_cli
from synthetic import T0, row, write_part


@pytest.fixture(scope="module")
def priced_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cost")
    src = tmp / "src"
    src.mkdir()
    for p in SAMPLES.glob("*.pdf"):
        shutil.copy(p, src / p.name)
    job = tmp / "job.yaml"
    job.write_text(f"source: {src}\nout: {tmp / 'out'}\nengine: textlayer\ngpu_hourly_usd: 1.25\n")
    run_cli("run", "--job", str(job), "--quiet", check=True)
    return tmp / "out"


def _expected(out, price):
    (record,) = [json.loads(p.read_text()) for p in (out / "_runs").glob("*.json")]
    acc = record["accelerator"]
    assert acc["kind"] == "cpu" and acc["count"] == 1  # a CPU engine: the machine
    assert acc["seconds"] == pytest.approx(record["counts"]["seconds"] * acc["count"], abs=1e-3)
    pages = pq.read_table(out / "pages").num_rows  # every row is a page here (no document errors)
    return acc["seconds"], pages, price * acc["seconds"] / 3600 / pages * 1e6


def test_report_prices_the_run_from_its_own_record(priced_run, tmp_path):
    seconds, pages, usd = _expected(priced_run, 3.5)
    got = json.loads(run_cli("report", str(priced_run), "--json", "--gpu-hourly-usd", "3.5", check=True).stdout)["cost"]
    assert got["accelerator_seconds"] == pytest.approx(seconds) and got["pages"] == pages
    assert got["usd_per_million_pages"] == pytest.approx(usd)
    assert got["pages_per_accelerator_hour"] == pytest.approx(pages / (seconds / 3600))
    assert got["price_from"] == "--gpu-hourly-usd"
    html = tmp_path / "r.html"
    proc = run_cli("report", str(priced_run), "--gpu-hourly-usd", "3.5", "--html", str(html), check=True)
    assert re.search(rf"\$ per million pages\s+{usd:,.2f}", proc.stdout), proc.stdout
    assert f"wrote {html.resolve()}" in proc.stderr  # where the page went
    assert f"{usd:,.2f}" in html.read_text()


def test_the_job_specs_price_is_used_when_no_flag_gives_one(priced_run):
    _, _, usd = _expected(priced_run, 1.25)
    got = json.loads(run_cli("report", str(priced_run), "--json", check=True).stdout)["cost"]
    assert got["gpu_hourly_usd"] == 1.25 and got["price_from"] == "job spec"
    assert got["usd_per_million_pages"] == pytest.approx(usd)


def test_gpus_are_counted_from_the_environment_without_nvml(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,3")
    assert visible_gpus() == {"kind": "gpu", "name": "GPU", "count": 3}


def test_the_timeline_fits_its_buckets_to_the_span(tmp_path):
    import polars as pl

    short = pl.Series([T0 + dt.timedelta(seconds=s) for s in (0, 0, 3, 29)])
    t = timeline(short)
    assert t["bucket_s"] == 1 and len(t["points"]) == 30  # a 30-second run: 1 s buckets, gaps as zero
    assert t["points"][0]["pages_per_minute"] == 120 and t["points"][1]["pages_per_minute"] == 0
    days = pl.Series([T0 + dt.timedelta(minutes=m) for m in range(0, 3 * 24 * 60, 7)])
    t = timeline(days)
    assert t["bucket_s"] == 3600 and len(t["points"]) == 72  # three days: hourly
    assert sum(p["pages_per_minute"] * 60 for p in t["points"]) == pytest.approx(days.len())
    # and the chart over it draws (its x-axis is the run's span, not years)
    write_part(tmp_path / "out", "x", [row("file:///s/a.pdf", 0, 0, text="a"), row("file:///s/a.pdf", 1, 3 * 86400)])
    html = tmp_path / "r.html"
    run_cli("report", str(tmp_path / "out"), "--html", str(html), check=True)
    assert "Throughput over time" in html.read_text()
