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


def test_the_run_is_priced_run_by_run(priced_run):
    got = json.loads(run_cli("report", str(priced_run), "--json", "--gpu-hourly-usd", "3.5", check=True).stdout)
    (run,) = got["cost"]["per_run"]
    assert run["pages"] == got["pages"] == got["cost"]["pages"]
    assert run["accelerator_seconds"] == got["cost"]["accelerator_seconds"]
    assert run["usd_per_million_pages"] == pytest.approx(got["cost"]["usd_per_million_pages"])
    (brief,) = got["runs"]
    assert brief["run_id"] == run["run_id"] and brief["started_at"] < brief["first_row_at"] <= brief["last_row_at"]


@pytest.mark.parametrize("pages, seconds, bucket_s", [
    (10, 14, 15),  # the demo: 15 s buckets, not 1 s (a commit of 4 rows read 240 a minute, then 0)
    (655, 480, 10),  # 655 pages in 8 minutes
    (600, 3 * 86400, 2 * 3600),  # three days, few pages: 2 h (a bar of 1 h would hold 8)
    (1_000_000, 3 * 86400, 3600),  # a million pages in three days: hourly
    (1_000_000, 10 * 86400, 3 * 3600),  # ten days: 3 h, at most 100 bars
])
def test_the_timeline_follows_the_runs_length(pages, seconds, bucket_s):
    import polars as pl

    step = pl.duration(microseconds=pl.int_range(pages) * int(seconds * 1e6) // (pages - 1))
    stamps = pl.select(at=pl.lit(T0) + step)["at"]
    t = timeline(stamps)
    assert t["bucket_s"] == bucket_s
    assert len(t["points"]) <= 101 and sum(p["pages"] for p in t["points"]) == pages
    assert pages / len(t["points"]) >= 5, "a bar holds a handful of pages at least"
    at = [dt.datetime.fromisoformat(p["at"]) for p in t["points"]]
    assert all(b - a == dt.timedelta(seconds=bucket_s) for a, b in zip(at, at[1:])), "empty buckets kept"
    done = t["done"]
    assert len(done) <= 402 and done[-1]["pages"] == pages
    assert all(a["pages"] < b["pages"] and a["at"] < b["at"] for a, b in zip(done, done[1:]))


def _axes(out):
    """Each chart of OUT's report, by title: its axes."""
    from batchocr.charts import figures
    from batchocr.report import load_report

    return {title: fig.axes for title, fig in figures(load_report(str(out))).items()}


@pytest.mark.parametrize("pages, seconds, unit", [(10, 14, "15 s"), (1000, 5400, "minute"), (1000, 3 * 86400, "hour")])
def test_the_throughput_chart_is_labelled_in_the_unit_it_shows_over_the_runs_span(tmp_path, pages, seconds, unit):
    write_part(tmp_path, "x", [row(f"file:///s/d{i // 4}.pdf", i % 4, seconds * i / (pages - 1), text="a",
                                   page_count=4) for i in range(pages)])
    done, rate = _axes(tmp_path)["Throughput over time"]
    assert rate.get_ylabel() == f"pages per {unit}" and done.get_ylabel() == "pages done"
    lo, hi = rate.get_xlim()  # matplotlib date numbers, in days: the run's span, not years
    assert seconds / 86400 <= hi - lo <= seconds / 86400 * 1.5 + 30 / 86400
    for ax in (done, rate):
        ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
        assert ticks and all(float(t).is_integer() for t in ticks), ticks  # counts: whole pages
    import matplotlib.dates as mdates

    assert isinstance(rate.xaxis.get_major_formatter(), mdates.ConciseDateFormatter)
    assert rate.yaxis.get_major_formatter()(1_000_000, 0) == "1,000,000"  # no 1e6 above the axis


def test_charts_of_counts_have_integer_ticks_and_more_than_one_bar(tmp_path):
    from synthetic import resumed_output

    resumed_output(tmp_path / "mixed")  # five finish reasons, two error types
    axes = _axes(tmp_path / "mixed")
    for title in ("Pages by finish_reason", "Errors by error_type"):
        (ax,) = axes[title]
        assert len(ax.patches) > 1
        assert all(float(t).is_integer() for t in ax.get_xticks())
    (hist,) = axes["Text length per page"]
    assert all(float(t).is_integer() for t in hist.get_yticks())  # 5 pages: no half-page ticks
    # one finish reason, one error type: no chart of a single bar
    write_part(tmp_path / "plain", "x", [row("file:///s/a.pdf", i, i, text="a" * i, page_count=3) for i in range(3)])
    axes = _axes(tmp_path / "plain")
    assert "Pages by finish_reason" not in axes and "Errors by error_type" not in axes
    assert "Routing" not in axes and "Cost: where the accelerator time went" not in axes  # no routes, no records
    write_part(tmp_path / "one-route", "x", [row("file:///s/a.pdf", i, i, text="a", page_count=3, route="model")
                                             for i in range(3)])
    assert "Routing" not in _axes(tmp_path / "one-route")  # every page to the model: one bar


def test_a_backfill_of_many_runs_reads_in_brief(tmp_path):
    """50 runs (pods, retries): the header names the first three and counts the rest,
    the HTML header gives the first and the last, the cost chart sums them in one bar."""
    runs = [f"20260301T12{i:02d}00Z-{i:06x}" for i in range(50)]
    (tmp_path / "_runs").mkdir(parents=True)
    rows = []
    for i, run in enumerate(runs):
        start = T0 + dt.timedelta(minutes=i)
        (tmp_path / "_runs" / f"{run}.json").write_text(json.dumps({
            "run_id": run, "status": "done" if i else "interrupted", "engine": "vllm", "model": "m",
            "started_at": start.isoformat(), "finished_at": (start + dt.timedelta(seconds=50)).isoformat(),
            "accelerator": {"kind": "gpu", "name": "H200", "count": 2, "seconds": 100.0},
            "spec": {"shard": {"index": i, "count": 50}}}))
        rows += [row(f"az://s/d{i}.pdf", p, i * 60 + 10 + p, text="x", run_id=run, page_count=20, shard=i)
                 for p in range(20)]
    write_part(tmp_path, "x", rows)
    got = json.loads(run_cli("report", str(tmp_path), "--json", "--gpu-hourly-usd", "2", check=True).stdout)
    assert len(got["runs"]) == 50 and {r["pages"] for r in got["runs"]} == {20}
    assert got["runs"][3]["shard"] == "3/50" and got["runs"][0]["status"] == "interrupted"
    assert got["cost"]["accelerator_seconds"] == 5000 and len(got["cost"]["per_run"]) == 50
    assert got["cost"]["usd_per_million_pages"] == pytest.approx(2 * 5000 / 3600 / 1000 * 1e6)
    text = run_cli("report", str(tmp_path), check=True).stdout
    assert "\n  runs       50 runs: 49 done, 1 interrupted\n" in text
    assert f"\n             {runs[2]}  done, started 2026-03-01 12:02:00 UTC, 20 pages in the table, shard 2/50\n" in text
    assert "\n             ... and 47 more runs (--json lists them all)\n" in text
    (cost,) = _axes(tmp_path)["Cost: where the accelerator time went"]
    assert [t.get_text() for t in cost.get_yticklabels()] == ["all 50 runs"]
    # the three phases of one bar: 10 s before the first row, 19 s reading, 21 s after, x2 GPUs, x50 runs
    assert [round(p.get_width()) for p in cost.patches] == [round(v * 2 * 50 / 60) for v in (10, 19, 21)]
