"""Spot-safety: runs killed at random instants, then resumed, end up with exactly the
table of a clean run after compaction; SIGTERM commits everything finished."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from batchocr import read_pages
from batchocr.compact import compact
from batchocr.errors import EXIT_INTERRUPTED
from batchocr.storage import Store
from conftest import ROOT, SAMPLES, run_cli
from corpus import text_corpus

DRIVER = ROOT / "tests" / "chaos_driver.py"
MS_PER_PAGE = 25


def _job(tmp: Path, src: Path, out: Path) -> Path:
    job = tmp / f"job-{out.name}.yaml"
    job.write_text(
        f"source: {src}\nout: {out}\nengine: textlayer\n"
        "render: {workers: 2, batch_pages: 2}\ncommit: {every_pages: 7, every_seconds: 0.3}\n"
    )
    return job


def _start(job: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(DRIVER), str(job), str(MS_PER_PAGE)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _table(out: Path) -> pl.DataFrame:
    return read_pages(str(out)).select("doc_id", "page_index", "text", "finish_reason", "run_id").collect()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chaos")
    src = tmp / "src"
    text_corpus(src, documents=50, pages=6)  # 300 pages
    clean = tmp / "clean"
    proc = _start(_job(tmp, src, clean))
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    return tmp, src, _table(clean)


def _run_with_kills(tmp, src, out, sig, kills_wanted, rnd):
    job = _job(tmp, src, out)
    kills, attempts, interrupted_runs = 0, 0, []
    while kills < kills_wanted:
        attempts += 1
        assert attempts < kills_wanted * 4, "the run kept finishing before the kill"
        proc = _start(job)
        time.sleep(rnd.uniform(0.3, 2.5))
        if proc.poll() is not None:  # finished before the kill: the shard is done
            assert proc.returncode == 0, proc.stderr.read()
            break
        os.killpg(proc.pid, sig)
        code = proc.wait(timeout=60)
        kills += 1
        if sig == signal.SIGTERM:
            assert code in (0, EXIT_INTERRUPTED), proc.stderr.read()
            if code == EXIT_INTERRUPTED:
                interrupted_runs.append(proc.stderr.read())
    proc = _start(job)  # left to finish
    assert proc.wait(timeout=300) == 0, proc.stderr.read()
    return kills, interrupted_runs


def _assert_same_as_clean(out: Path, clean: pl.DataFrame):
    before = _table(out)
    compact(Store(str(out)))
    after = _table(out)
    assert after.select("doc_id", "page_index").is_unique().all(), "duplicates after compaction"
    key = ["doc_id", "page_index"]
    assert after.sort(key).select(*key, "text", "finish_reason").equals(
        clean.sort(key).select(*key, "text", "finish_reason")
    )
    assert set(before.select(*key).unique().rows()) == set(after.select(*key).rows())


def test_sigkill_at_random_instants_loses_and_duplicates_nothing(corpus):
    tmp, src, clean = corpus
    out = tmp / "killed"
    kills, _ = _run_with_kills(tmp, src, out, signal.SIGKILL, 20, random.Random(20261129))
    assert kills >= 20
    _assert_same_as_clean(out, clean)
    assert (out / "_done" / "shard=00000.json").exists()
    assert not list(out.glob("pages/**/.*.tmp")), "temp files left behind"


def test_sigterm_commits_everything_finished_then_resumes(corpus):
    tmp, src, clean = corpus
    out = tmp / "terminated"
    kills, interrupted = _run_with_kills(tmp, src, out, signal.SIGTERM, 10, random.Random(7))
    assert kills >= 10 and interrupted
    assert all("interrupted" in err and "rerun to resume" in err for err in interrupted)
    # Each interrupted run committed every page it had finished: its record's count
    # equals its rows in the table (nothing finished was left uncommitted).
    # (A SIGTERM during start-up stops the run before it has a record.)
    table = _table(out)
    run_ids = [m.group(1) for err in interrupted if (m := re.search(r"\(run (\S+)\)", err))]
    assert run_ids
    for run_id in run_ids:
        record = json.loads((out / "_runs" / f"{run_id}.json").read_text())
        assert record["status"] == "interrupted"
        assert table.filter(pl.col("run_id") == run_id).height == record["counts"]["pages"]
    _assert_same_as_clean(out, clean)


def test_sigterm_with_the_real_ocr_engine(rapidocr_run, tmp_path):
    """SIGTERM mid-run with rapidocr: exit 75 with finished pages committed; the
    rerun completes the rest and the result equals an uninterrupted run."""
    out = tmp_path / "out"
    job = tmp_path / "job.yaml"
    job.write_text(f"source: {SAMPLES}\nout: {out}\ncommit: {{every_pages: 1}}\nrender: {{workers: 1}}\n")
    proc = subprocess.Popen([sys.executable, "-m", "batchocr.cli", "run", "--job", str(job), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(out.glob("pages/**/*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == EXIT_INTERRUPTED
    assert "interrupted" in proc.stderr.read()
    partial = _table(out)
    assert 1 <= partial.height < 10
    run_cli("run", "--job", str(job), "-q", check=True)
    reference, _ = rapidocr_run
    clean = _table(reference)
    _assert_same_as_clean(out, clean)
