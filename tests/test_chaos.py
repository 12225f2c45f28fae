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

import polars as pl
import pytest

from batchocr.errors import EXIT_INTERRUPTED
from batchocr.sink import PartWriter
from batchocr.spec import CommitSpec
from batchocr.storage import STALE_TEMP_S, Store
from chaos import assert_same_as_clean, finish, run_with_kills, table, write_job
from conftest import HANG_S, SAMPLES, run_cli
from corpus import text_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chaos")
    src = tmp / "src"
    text_corpus(src, documents=50, pages=6)  # 300 pages
    clean = tmp / "clean"
    done = finish(write_job(tmp, src, clean))
    assert done.returncode == 0, done.stderr
    return tmp, src, table(clean)


def test_sigkill_at_random_instants_loses_and_duplicates_nothing(corpus):
    tmp, src, clean = corpus
    out = tmp / "killed"
    kills, _ = run_with_kills(write_job(tmp, src, out), signal.SIGKILL, 8, random.Random(20261129))
    assert kills >= 8
    assert_same_as_clean(out, clean)
    assert (out / "_done" / "shard-00000.json").exists()
    # A kill mid-write leaves its staged temp, which a run removes once it is surely a dead
    # writer's (STALE_TEMP_S old: a younger one may be compaction's, or another pod's).
    assert not [p for p in out.glob("**/*.tmp") if p.parent != out / "_tmp"], "temp files left behind"
    for leftover in out.glob("_tmp/*.tmp"):
        os.utime(leftover, (time.time() - STALE_TEMP_S - 1,) * 2)
    PartWriter(Store(str(out)), 0, "next-run", CommitSpec())
    assert not list(out.glob("**/*.tmp")), "stale temp files left behind"


def test_sigterm_commits_everything_finished_then_resumes(corpus):
    tmp, src, clean = corpus
    out = tmp / "terminated"
    kills, interrupted = run_with_kills(write_job(tmp, src, out), signal.SIGTERM, 6, random.Random(7))
    assert kills >= 6 and interrupted
    assert all("interrupted" in err and "rerun to resume" in err for err in interrupted)
    # Each interrupted run committed every page it had finished: its record's count
    # equals its rows in the table (nothing finished was left uncommitted).
    # (A SIGTERM during start-up stops the run before it has a record.)
    rows = table(out)
    run_ids = [m.group(1) for err in interrupted if (m := re.search(r"\(run (\S+)\)", err))]
    assert run_ids
    for run_id in run_ids:
        record = json.loads((out / "_runs" / f"{run_id}.json").read_text())
        assert record["status"] == "interrupted"
        assert rows.filter(pl.col("run_id") == run_id).height == record["counts"]["pages"]
    assert_same_as_clean(out, clean)


def test_sigterm_with_the_real_ocr_engine(rapidocr_run, tmp_path):
    """SIGTERM mid-run with rapidocr: exit 75 with finished pages committed; the
    rerun completes the rest and the result equals an uninterrupted run."""
    out = tmp_path / "out"
    job = tmp_path / "job.yaml"
    job.write_text(f"source: {SAMPLES}\nout: {out}\ncommit: {{every_pages: 1}}\nrender: {{workers: 1}}\n")
    proc = subprocess.Popen([sys.executable, "-m", "batchocr.cli", "run", "--job", str(job), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + HANG_S
    while not list(out.glob("pages/**/*.parquet")):
        assert proc.poll() is None and time.monotonic() < deadline, "no page committed"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == EXIT_INTERRUPTED
    assert "interrupted" in proc.stderr.read()
    partial = table(out)
    assert 1 <= partial.height < 10
    run_cli("run", "--job", str(job), "-q", check=True)
    reference, _ = rapidocr_run
    assert_same_as_clean(out, table(reference))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_before_run_is_reached_is_still_the_runs_exit_75(tmp_path, sig):
    """A SIGTERM in the command's first instants (the group's set-up, click's parsing: ~0.1-0.5
    s before `run` took the signal) killed the process (143; SIGINT: a KeyboardInterrupt
    traceback, exit 1), so a pod evicted as it started was counted as a failure. Sent here
    from inside that set-up."""
    text_corpus(tmp_path / "src", documents=1, pages=1)
    code = ("import os, signal, sys\n"
            # Python's own dispositions, whatever this test's process passes down (an xdist
            # worker's SIGINT can be ignored, and a child starting so keeps it ignored: status ended 0 in a fresh clone's suite)
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
            "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})\n"
            "import batchocr.renderworker as r\n"
            "setup = r.skip_pymupdf_extras\n"
            f"r.skip_pymupdf_extras = lambda: (os.kill(os.getpid(), {int(sig)}), setup())\n"
            "from batchocr.cli import entry\n"
            "entry(sys.argv[1:])\n")
    proc = subprocess.run([sys.executable, "-c", code, "run", str(tmp_path / "src"), str(tmp_path / "out"),
                           "--engine", "textlayer", "-q"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_INTERRUPTED, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr and "rerun to resume" in proc.stderr, proc.stderr
    # a command that is not a run keeps the default: Ctrl-C stops `status` at once
    proc = subprocess.run([sys.executable, "-c", code, "status", str(tmp_path / "src")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode in (-int(sig), 1), (proc.returncode, proc.stderr)
