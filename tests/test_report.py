"""`batchocr report`: its figures against counts computed independently (pyarrow over
the Parquet, or by hand for a synthetic resumed output), the HTML page, the columns
it reads, and a million-row output."""

import base64
import collections
import datetime as dt
import json
import re
import shutil
import subprocess
import sys

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from batchocr import schema
from batchocr.report import COLUMNS, scan
from batchocr.table import read_pages
from batchocr.words import duration
from conftest import ROOT, SAMPLES, read_table, run_cli
from synthetic import resumed_output


def _report(out, *args):
    proc = run_cli("report", str(out), "--json", *args, check=True)
    return json.loads(proc.stdout)


def test_report_figures_equal_pyarrow_counts_on_the_real_run(rapidocr_run):
    out, _ = rapidocr_run
    got = _report(out, "--truth", str(SAMPLES / "truth"))
    table = read_table(out)
    assert got["rows"] == got["pages"] == table.num_rows == 10 and got["duplicates"] == 0
    assert got["documents"] == len(pc.unique(table["doc_id"])) == 5
    assert got["finish_reasons"] == {d["values"]: d["counts"] for d in pc.value_counts(table["finish_reason"]).to_pylist()}
    assert got["error_types"] == {}
    # text length per page
    lengths = pc.utf8_length(table["text"]).to_pylist()
    assert got["text_chars"]["count"] == len(lengths)
    assert got["text_chars"]["max"] == max(lengths) and got["text_chars"]["min"] == min(lengths)
    assert got["text_chars"]["mean"] == pytest.approx(sum(lengths) / len(lengths))
    assert sum(got["text_chars_histogram"]["counts"]) == len(lengths)
    assert got["output_tokens"] is None and got["prompt_tokens"] is None  # a CPU engine has no tokens
    # throughput: pages per minute of processed_at
    stamps = table["processed_at"].to_pylist()
    minutes = collections.Counter(s.replace(second=0, microsecond=0) for s in stamps)
    assert [(dt.datetime.fromisoformat(m["minute"]), m["pages"]) for m in got["per_minute"]] == sorted(minutes.items())
    span = (max(stamps) - min(stamps)).total_seconds()
    (record,) = [json.loads(p.read_text()) for p in (out / "_runs").glob("*.json")]
    run_s = (dt.datetime.fromisoformat(record["finished_at"]) - dt.datetime.fromisoformat(record["started_at"]))
    assert 0 < span <= run_s.total_seconds() and got["span_s"] == pytest.approx(span)  # inside the run, however slow
    assert got["pages_per_minute"] == pytest.approx(len(stamps) / (span / 60))  # over the real span, not a minute
    assert dt.datetime.fromisoformat(got["first_at"]) == min(stamps)
    # engine time by route: the model's pages apart from the text layer's (~0 ms)
    by_route = collections.defaultdict(list)
    for route, ms in zip(table["route"].to_pylist(), table["latency_ms"].to_pylist()):
        by_route[route].append(ms)
    assert set(got["latency_ms_by_route"]) == set(by_route) == {"model", "textlayer"}
    for route, values in by_route.items():
        d = got["latency_ms_by_route"][route]
        assert d["count"] == len(values) and d["mean"] == pytest.approx(sum(values) / len(values), rel=1e-5)
        assert d["max"] == pytest.approx(max(values), rel=1e-5)
    assert got["latency_ms_by_route"]["model"]["p50"] > 100 and got["latency_ms_by_route"]["textlayer"]["max"] < 100
    # the header: the run records and the engines and models of the rows
    assert [(r["run_id"], r["status"], r["pages"]) for r in got["runs"]] == [(record["run_id"], "done", 10)]
    (brief,) = got["runs"]  # and where its start went, as its record says
    assert brief["start"] == {k: record["timings"][k] for k in ("turn_wait_s", "engine_start_s", "first_page_s",
                                                                  "first_row_s")} and brief["start"]["first_row_s"] > 0
    models = collections.Counter(zip(table["engine"].to_pylist(), table["model"].to_pylist()))
    assert {(m["engine"], m["model"]): m["pages"] for m in got["models"]} == models
    # slowest documents: engine time summed per document
    sums = collections.defaultdict(float)
    for uri, ms in zip(table["source_uri"].to_pylist(), table["latency_ms"].to_pylist()):
        sums[uri] += ms
    assert [d["source_uri"] for d in got["slowest_documents"]] == sorted(sums, key=sums.get, reverse=True)
    for d in got["slowest_documents"]:
        assert d["latency_ms"] == pytest.approx(sums[d["source_uri"]], rel=1e-5)
    assert got["flagged_total"] == 0 and got["flagged_pages"] == []
    # CER: the same figures as `batchocr eval`
    proc = run_cli("eval", str(out), "--truth", str(SAMPLES / "truth"), check=True)
    errors, chars = map(int, re.search(r"overall: (\d+)/(\d+)", proc.stdout).groups())
    assert (got["cer"]["errors"], got["cer"]["chars"]) == (errors, chars) and got["cer"]["missing"] == []
    assert len(got["cer"]["pages"]) == 10 and got["cer"]["overall"] < 0.02


def test_report_table_in_the_terminal(rapidocr_run):
    out, _ = rapidocr_run
    text = run_cli("report", str(out), check=True).stdout
    assert re.search(r"^  documents\s+5$", text, re.M) and re.search(r"^  pages\s+10$", text, re.M)
    assert re.search(r"^  stop\s+10\s+100\.00%$", text, re.M)
    for doc in ("report.pdf", "scanned.pdf", "fax.tiff", "letter.jpg", "receipt.png"):
        assert re.search(rf"s\s+\d+ pages?\s+file://\S+/{re.escape(doc)}$", text, re.M), doc
    assert "CER" not in text  # only with --truth
    run_id = next((out / "_runs").glob("*.json")).stem
    assert re.search(rf"^  run        {run_id}  done, started \d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d UTC, 10 pages in the table$",
                     text, re.M), text
    assert re.search(r"^  engine     rapidocr \(rapidocr PP-OCR\S* .*\): 7 pages$", text, re.M)
    assert re.search(r"^             textlayer \(pymupdf-\S+\): 3 pages$", text, re.M)
    assert re.search(r"^  engine ms, model\s+mean\s+\d+\.\d.*\(7 pages\)$", text, re.M)
    assert re.search(r"^  engine ms, text layer\s+mean\s+0\.0.*\(3 pages\)$", text, re.M)
    assert re.search(r"s  1 page\s+file://\S+/letter\.jpg$", text, re.M)  # one page, one "page"
    assert not re.search(r"\b1 (pages|runs|documents|files|buckets|minutes|duplicates)\b", text), text
    # a terminal's width, or the HTML page's column: only a long URI makes a line longer
    assert max(len(line) for line in text.splitlines() if "://" not in line) <= 110
    # route auto: the born-digital report.pdf's 3 pages from their text layer
    assert re.search(r"^  textlayer\s+3\s+30\.00%$", text, re.M) and re.search(r"^  model\s+7\s+70\.00%$", text, re.M)
    # 7 model pages: too few to put a figure on what the 3 routed pages saved; what one cost, and on what
    assert re.search(r"^  CPU time saved\s+not estimated  \(7 rapidocr pages here, 20 needed to estimate 3 routed pages\)\n"
                     r"    basis: 7 rapidocr pages read \d{4}-\d\d-\d\d \d\d:\d\d to (\d{4}-\d\d-\d\d )?\d\d:\d\d UTC\n"
                     r"    [\d.]+ s a page: (their median engine time|the interval between their finishes \(their median "
                     r"engine time [\d.]+ s\))$", text, re.M), text  # the interval where the machine was busy


def test_report_estimates_the_engine_time_routing_saved(tmp_path):
    """Worked by hand: a concurrent engine's pages cost the interval at which they
    finished, a sequential one's their median latency (the smaller of the two); the
    estimate says what it rests on, and on fewer than 20 model pages gives no total."""
    from synthetic import row, write_part

    stamps = [10, 11, 11, 13] + [13 + k for k in range(1, 21)]  # 23 s for the 23 pages after the first stamp
    gpu = [row(f"az://s/scan{i}.pdf", 0, t, text="x", latency_ms=30_000, route="model", route_score=0.0)
           for i, t in enumerate(stamps)]
    layer = [row(f"az://s/born{i}.pdf", 0, 12, text="y", latency_ms=0, route="textlayer", route_score=1.0,
                 engine="textlayer") for i in range(3)]
    error = [row("az://s/bad.pdf", -1, 12, finish_reason="error", error_type="open_failed", page_count=None)]
    write_part(tmp_path / "gpu", "r-00000", gpu + layer + error)
    got = _report(tmp_path / "gpu")
    assert got["routes"] == {"model": 24, "textlayer": 3}
    saving = got["route_saving"]
    assert (saving["device"], saving["engine"], saving["routed_pages"], saving["model_pages"]) == ("GPU", "vllm", 3, 24)
    assert saving["finish_interval_s"] == pytest.approx(1.0) and saving["median_latency_s"] == pytest.approx(30.0)
    assert saving["basis"] == "finish interval" and saving["saved_s"] == pytest.approx(3.0)
    text = run_cli("report", str(tmp_path / "gpu"), check=True).stdout
    assert ("  GPU time saved                  3.0 s  (3 pages x 1.000 s, a vllm page here)\n"
            "    basis: 24 vllm pages read 2026-03-01 12:00 to 12:00 UTC\n"
            "    1.000 s a page: the interval between their finishes (their median engine time 30.000 s)\n") in text, text

    # A sequential engine's pages, four of them read while the machine was busy (50 s each
    # against 1 s): the median keeps to the usual page, where the mean would say 9.2 s.
    ms = [1000] * 20 + [50_000] * 4
    cpu = [row(f"az://s/scan{i}.pdf", 0, 10 + 2 * i + 3600, text="x", latency_ms=m, route="model", route_score=0.1,
               engine="rapidocr") for i, m in enumerate(ms)]  # one every 2 s, an hour after T0
    write_part(tmp_path / "cpu", "r-00000", cpu + layer)
    saving = _report(tmp_path / "cpu")["route_saving"]
    assert (saving["device"], saving["finish_interval_s"], saving["median_latency_s"]) == ("CPU", 2.0, 1.0)
    assert saving["basis"] == "median latency" and saving["saved_s"] == pytest.approx(3.0)
    assert (saving["measured_from"], saving["measured_to"]) == ("2026-03-01T13:00:10+00:00", "2026-03-01T13:00:56+00:00")
    text = run_cli("report", str(tmp_path / "cpu"), check=True).stdout
    assert ("  CPU time saved                  3.0 s  (3 pages x 1.000 s, a rapidocr page here)\n"
            "    basis: 24 rapidocr pages read 2026-03-01 13:00 to 13:00 UTC\n"
            "    1.000 s a page: their median engine time\n") in text, text

    # Seven model pages: what a page cost and on what, but no total for the routed pages.
    write_part(tmp_path / "few", "r-00000", cpu[:7] + layer)
    saving = _report(tmp_path / "few")["route_saving"]
    assert saving["model_pages"] == 7 and saving["saved_s"] is None and saving["seconds_per_model_page"] == 1.0
    text = run_cli("report", str(tmp_path / "few"), check=True).stdout
    assert ("  CPU time saved         not estimated  (7 rapidocr pages here, 20 needed to estimate 3 routed pages)\n"
            "    basis: 7 rapidocr pages read 2026-03-01 13:00 to 13:00 UTC\n"
            "    1.000 s a page: their median engine time\n") in text, text
    assert "time saved" in text and " s  (3 pages x" not in text

    write_part(tmp_path / "plain", "r-00000", gpu)  # nothing routed: no estimate
    got = _report(tmp_path / "plain")
    assert got["routes"] == {"model": 24} and got["route_saving"] is None


def test_engine_time_of_a_mostly_born_digital_run_is_the_models_not_zero(tmp_path):
    """9 pages from the text layer (0 ms) and 3 the model read: pooled, p50 and p90
    would read 0 ms; split by route, the model's pages keep their own."""
    from synthetic import row, write_part

    layer = [row(f"az://s/born{i}.pdf", 0, i, text="y", latency_ms=0, route="textlayer", engine="textlayer")
             for i in range(9)]
    model = [row(f"az://s/scan{i}.pdf", 0, 10 + i, text="x", latency_ms=ms, route="model")
             for i, ms in enumerate([2000, 3000, 4000])]
    unrendered = [row("az://s/bad.pdf", 0, 20, finish_reason="error", error_type="render_failed", latency_ms=None)]
    write_part(tmp_path, "r-00000", layer + model + unrendered)
    got = _report(tmp_path)["latency_ms_by_route"]
    assert (got["model"]["count"], got["model"]["p50"], got["model"]["p90"], got["model"]["mean"]) == (3, 3000, 4000, 3000)
    assert (got["textlayer"]["count"], got["textlayer"]["max"]) == (9, 0)
    text = run_cli("report", str(tmp_path), check=True).stdout
    assert re.search(r"^  engine ms, model\s+mean\s+3000\.0  p50\s+3000\.0  p90\s+4000\.0 .*\(3 pages\)$", text, re.M)
    # an output of the textlayer engine (no route column values): its pages are the text layer's
    write_part(tmp_path / "tl", "r-00000", [row("az://s/a.pdf", 0, 0, text="a", latency_ms=0, engine="textlayer")])
    assert list(_report(tmp_path / "tl")["latency_ms_by_route"]) == ["textlayer"]


def test_report_counts_the_pages_turned_upright_by_how_they_lay(tmp_path):
    """skew_angle's nearest quarter turn: a page that lay sideways or upside down (the vllm
    engine's turn, or rapidocr's with the page's skew on it) counts; upright, slightly skewed
    and unexamined pages do not."""
    from synthetic import row, write_part

    angles = [0.0, 90.0, -90.0, 180.0, 91.3, -88.6, 179.2, 1.4, -2.0, None]
    write_part(tmp_path, "r-00000", [row("az://s/a.pdf", i, i, text="a", page_count=len(angles), skew_angle=a)
                                     for i, a in enumerate(angles)])
    assert _report(tmp_path)["turned"] == {"90": 2, "-90": 2, "180": 2}
    text = run_cli("report", str(tmp_path), check=True).stdout
    assert re.search(r"turned upright[^\n]*\n(  -?[0-9]+ +2 +20\.00%\n){3}\n", text), text


def test_report_of_a_resumed_output_keeps_one_row_per_page(tmp_path):
    """Before compaction: duplicates, an older version of a document, a document
    row; VLM finish reasons and tokens. Expected figures worked out by hand."""
    resumed_output(tmp_path)
    got = _report(tmp_path)
    assert (got["rows"], got["duplicates"], got["documents"], got["pages"], got["document_errors"]) == (10, 3, 4, 6, 1)
    assert got["finish_reasons"] == {"stop": 3, "length": 1, "repetition": 1, "error": 1, "skipped": 1}
    assert got["error_types"] == {"open_failed": 1, "no_text_layer": 1}  # the redone page's error is gone
    assert [(m["minute"][11:16], m["pages"]) for m in got["per_minute"]] == [("12:00", 1), ("12:01", 2), ("12:02", 3)]
    assert got["pages_per_minute"] == pytest.approx(6 / (151 / 60))
    assert got["text_chars"]["count"] == 5 and got["text_chars"]["max"] == 11 and got["text_chars"]["mean"] == 6.2
    assert got["output_tokens"]["count"] == 3 and got["output_tokens"]["max"] == 8000
    assert got["output_tokens"]["p50"] == 4096 and got["prompt_tokens"]["mean"] == pytest.approx(2800 / 3)
    assert [(d["source_uri"], d["pages"], d["latency_ms"]) for d in got["slowest_documents"]] == [
        ("az://s/d.pdf", 2, 7001), ("az://s/a.pdf", 3, 6000), ("az://s/c.pdf", 1, 500)]
    assert got["flagged_total"] == 2
    assert sorted((p["source_uri"], p["page_index"], p["finish_reason"], p["output_tokens"])
                  for p in got["flagged_pages"]) == [("az://s/a.pdf", 2, "length", 4096),
                                                     ("az://s/c.pdf", 0, "repetition", 8000)]
    text = run_cli("report", str(tmp_path), check=True).stdout
    assert "10  (3 duplicates" in text and "length      page     2    4096 tokens  az://s/a.pdf" in text
    # after compaction: the same figures, nothing left to drop
    run_cli("compact", str(tmp_path), check=True)
    again = _report(tmp_path)
    assert again["rows"] == 7 and again["duplicates"] == 0
    assert {k: v for k, v in again.items() if k not in ("rows", "duplicates")} == \
        {k: v for k, v in got.items() if k not in ("rows", "duplicates")}


def test_report_reads_only_the_columns_it_needs(rapidocr_run):
    out, _ = rapidocr_run
    plan = scan(read_pages(str(out))).explain()
    assert f"PROJECT {len(COLUMNS) + 1}/{len(schema.PAGE_TABLE)} COLUMNS" in plan, plan
    assert "error_message" not in plan and "source_uri" not in plan


def test_report_html_is_one_self_contained_page_with_charts(rapidocr_run, tmp_path):
    out, _ = rapidocr_run
    page = tmp_path / "report.html"
    run_cli("report", str(out), "--truth", str(SAMPLES / "truth"), "--html", str(page), check=True)
    html = page.read_text()
    assert not re.search(r"(https?:)?//[\w.-]+\.\w+/", html), "no external URL"
    images = re.findall(r'<img alt="([^"]+)" src="data:image/png;base64,([^"]+)">', html)
    # every page finished `stop`: no chart of one bar (the summary says it in a line)
    assert [t for t, _ in images] == ["Throughput over time", "Routing", "Engine time per page, by route",
                                      "Cost: where the accelerator time went", "Text length per page",
                                      "Slowest documents", "CER per page"]
    for _, data in images:
        assert base64.b64decode(data).startswith(b"\x89PNG\r\n\x1a\n")
    assert "overall: " in html and "report.pdf" in html
    # the header: OUT, the run, its engines and models
    (record,) = [json.loads(p.read_text()) for p in (out / "_runs").glob("*.json")]
    facts = dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td></tr>", html))
    assert facts["OUT"] == str(out) and facts["run"] == f"{record['run_id']}: done, 10 pages"
    assert facts["engine"].startswith("rapidocr (rapidocr PP-OCR") and facts["engine"].endswith(": 7 pages")
    stamps = read_table(out)["processed_at"].to_pylist()
    span = (max(stamps) - min(stamps)).total_seconds()  # "14.2 s" quiet, "1 min 24 s" on a loaded machine
    assert facts["throughput"] == f"{len(stamps) / (span / 60):,.1f} pages a minute over {duration(span)}"
    # the summary wraps instead of running out of its box (docs/report-demo.png: 1280 px wide)
    assert "white-space:pre-wrap" in html and "img{max-width:100%" in html


def test_report_html_without_matplotlib_says_what_to_install_before_anything_else(rapidocr_run, tmp_path):
    out, _ = rapidocr_run
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "from batchocr.cli import main; main(sys.argv[1:])")
    proc = subprocess.run([sys.executable, "-c", code, "report", str(out), "--html", str(tmp_path / "r.html")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == "Error: charts need matplotlib: pip install 'batchocr[analysis]'\n"
    assert proc.stdout == "", "nothing printed before the check"
    assert not (tmp_path / "r.html").exists()
    # and without --html the text report needs no matplotlib
    proc = subprocess.run([sys.executable, "-c", code, "report", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "batchocr report: " in proc.stdout, proc.stderr


def test_report_html_that_cannot_be_written_is_one_line_and_leaves_the_old_page(rapidocr_run, tmp_path, monkeypatch):
    """A full disk while the page is written: a traceback before (OSError, exit 1), and the
    page left half-written. Now one line, and the page there before is as it was."""
    import errno
    import pathlib

    out, _ = rapidocr_run
    page = tmp_path / "report.html"
    page.write_text("the report of yesterday")
    real = pathlib.Path.write_text

    def full(self, text, *args, **kwargs):  # half the page, then the disk is full
        real(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    proc = run_cli("report", str(out), "--html", str(page))
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == f"Error: {page}: cannot write it (No space left on device)\n"
    assert "batchocr report: " in proc.stdout  # the text report stands
    monkeypatch.undo()
    assert page.read_text() == "the report of yesterday" and sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_eval_with_a_truth_file_that_is_not_utf8_names_it(rapidocr_run, tmp_path):
    out, _ = rapidocr_run
    truth = tmp_path / "truth"
    shutil.copytree(SAMPLES / "truth", truth)
    bad = truth / "report.pdf" / "0.txt"
    bad.write_bytes(b"\xff\xfe caf\xe9")
    for args in (["eval", str(out), "--truth", str(truth)], ["report", str(out), "--truth", str(truth)]):
        proc = run_cli(*args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith(f"Error: truth file {bad} is not UTF-8 text") and proc.stderr.count("\n") == 1


def test_report_of_a_folder_without_a_page_table_is_a_user_error(tmp_path):
    proc = run_cli("report", str(tmp_path))
    assert proc.returncode == 2 and proc.stderr.startswith("Error: no page table under")
    assert "Traceback" not in proc.stderr


def test_an_out_of_runs_that_found_no_document_reads_as_an_empty_table(tmp_path):
    """A CronJob's first runs over an empty container: `status` said done, 0 pages, while
    report, export and compact were exit 2, "no page table", and read_pages raised."""
    from batchocr import read_pages

    (tmp_path / "src").mkdir()
    out = tmp_path / "out"
    assert "nothing to do" in run_cli("run", str(tmp_path / "src"), str(out), "-q", check=True).stdout
    assert read_pages(str(out)).collect().shape == (0, len(schema.PAGE_TABLE))
    text = run_cli("report", str(out), check=True).stdout
    assert re.search(r"^  documents\s+0$", text, re.M) and re.search(r"^  pages\s+0$", text, re.M), text
    assert _report(out)["rows"] == 0
    proc = run_cli("export", str(out), str(tmp_path / "x"), "--format", "text", check=True)
    assert proc.stdout.startswith("exported 0 documents, 0 pages")
    assert run_cli("compact", str(out), check=True).stdout == f"nothing to compact: no page rows in {out} yet\n"
    proc = run_cli("eval", str(out), "--truth", str(SAMPLES / "truth"))  # every truth page missing
    assert proc.returncode == 1 and "truth pages have no row" in proc.stderr, proc.stderr
    for command in ("report", "compact"):  # a folder batchocr never wrote is still no OUT
        proc = run_cli(command, str(tmp_path / "src"))
        assert proc.returncode == 2 and proc.stderr.startswith("Error: no page table under"), proc.stderr


def test_report_over_a_million_rows(tmp_path):
    """bench/report_memory.py: a synthetic 1,000,000-row output, the report in a fresh
    process; its peak RSS is the figure in docs/history/BENCHMARKS.md."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "report_memory.py"), "--rows", "1000000",
                           "--keep", str(out), "--json"], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    got = result["summary"]
    reasons = pq.read_table(out / "pages", columns=["finish_reason", "doc_id"], partitioning=None)
    assert got["rows"] == got["pages"] == reasons.num_rows == 1_000_000
    assert got["documents"] == len(pc.unique(reasons["doc_id"]))
    assert got["finish_reasons"] == {d["values"]: d["counts"]
                                     for d in pc.value_counts(reasons["finish_reason"]).to_pylist()}
    assert sum(m["pages"] for m in got["per_minute"]) == 1_000_000 and len(got["per_minute"]) == 180
    assert result["peak_mb"] < 1500, f"peak RSS {result['peak_mb']:.0f} MB"


def test_report_charts_show_file_names_with_dollars_and_names_alike(rapidocr_run):
    """Bar labels come from file names: two `$` in one start matplotlib's mathtext (a parse
    error: report --html crashed), and two documents of one name in two folders are two bars."""
    import dataclasses

    from batchocr.charts import _png, figures
    from batchocr.report import load_report

    r = load_report(str(rapidocr_run[0]))
    docs = r.slowest_documents[:3]
    names = ["s/price_$5_to_$10.pdf", "a/same.pdf", "b/same.pdf"]
    r = dataclasses.replace(r, slowest_documents=[d | {"source_uri": f"file:///{n}"} for d, n in zip(docs, names)])
    fig = figures(r)["Slowest documents"]
    assert _png(fig)  # drawn: no mathtext error
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()][::-1] == [r"price_\$5_to_\$10.pdf", "same.pdf", "same.pdf (2)"]
    assert len(ax.patches) == 3


def test_a_run_whose_end_was_never_recorded_is_running_or_killed(rapidocr_run, tmp_path):
    """A SIGKILLed run (a spot node reclaimed) leaves its record as it wrote it at the start,
    `running`: the header said "running" for good. It says that no end was recorded, and
    when its last row came."""
    import shutil

    out, _ = rapidocr_run
    killed = tmp_path / "killed"
    shutil.copytree(out, killed)
    (path,) = (killed / "_runs").glob("*.json")
    record = json.loads(path.read_text())
    record = {k: v for k, v in record.items() if k not in ("finished_at", "summary")} | {"status": "running"}
    path.write_text(json.dumps(record))
    last = max(read_table(killed).column("processed_at").to_pylist()).strftime("%Y-%m-%d %H:%M:%S UTC")
    text = run_cli("report", str(killed), check=True).stdout
    state = f"running or killed (no end recorded; its last row {last})"
    assert re.search(rf"^  run        {record['run_id']}  {re.escape(state)}, started .*, 10 pages in the table$",
                     text, re.M), text
    page = tmp_path / "report.html"
    run_cli("report", str(killed), "--html", str(page), check=True)
    facts = dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td></tr>", page.read_text()))
    assert facts["run"] == f"{record['run_id']}: {state}, 10 pages"
