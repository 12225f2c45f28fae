"""The Indexed Job, locally: N pods (processes) run `batchocr run --job` with
JOB_COMPLETION_INDEX=0..N-1 and BATCHOCR_SHARDS=N over one corpus, as Kubernetes starts
them; some are killed at random (SIGKILL: the node vanished; SIGTERM: an eviction
notice) and replaced, as Kubernetes replaces them. The union of their outputs must be
the corpus, every page once after compaction, every shard marked done."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import polars as pl

from batchocr import read_pages
from batchocr.compact import compact
from batchocr.errors import EXIT_INTERRUPTED
from batchocr.sharding import shard_of
from batchocr.sources import list_documents
from batchocr.storage import Store
from conftest import ROOT, run_cli
from corpus import text_corpus

DRIVER = ROOT / "tests" / "pod_driver.py"
SHARDS = 3
MS_PER_PAGE = 40


def _pod(job, index: int) -> subprocess.Popen:
    env = {**os.environ, "JOB_COMPLETION_INDEX": str(index), "BATCHOCR_SHARDS": str(SHARDS)}
    return subprocess.Popen([sys.executable, str(DRIVER), str(job), str(MS_PER_PAGE)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_indexed_job_pods_killed_and_replaced_cover_the_corpus_once(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    texts = text_corpus(src, documents=48, pages=5)  # 240 pages
    job = tmp_path / "job.yaml"
    job.write_text(f"source: {src}\nout: {out}\nengine: textlayer\n"
                   "render: {workers: 1, batch_pages: 2}\ncommit: {every_pages: 5, every_seconds: 0.3}\n")

    rnd = random.Random(20261129)
    pods = {i: _pod(job, i) for i in range(SHARDS)}
    done: set[int] = set()
    kills = {signal.SIGKILL: 0, signal.SIGTERM: 0}
    deadline = time.monotonic() + 300
    while len(done) < SHARDS:
        assert time.monotonic() < deadline, "the pods did not finish"
        time.sleep(rnd.uniform(0.4, 1.2))
        for i, pod in pods.items():
            if i not in done and pod.poll() is not None:
                assert pod.returncode == 0, f"shard {i} exited {pod.returncode}:\n{pod.stderr.read()}"
                done.add(i)
        running = [i for i in pods if i not in done]
        if running and sum(kills.values()) < 8:
            i = rnd.choice(running)
            sig = rnd.choice([signal.SIGKILL, signal.SIGTERM])
            os.killpg(pods[i].pid, sig)
            code = pods[i].wait(timeout=60)
            if code == 0:  # it finished just before the signal
                done.add(i)
                continue
            # SIGTERM: batchocr commits and exits 75 (-15 only if it landed before the
            # handler was installed, at interpreter start-up).
            allowed = {-signal.SIGKILL} if sig == signal.SIGKILL else {EXIT_INTERRUPTED, -signal.SIGTERM}
            assert code in allowed, f"shard {i} got {sig!r}, exited {code}:\n{pods[i].stderr.read()}"
            kills[sig] += 1
            pods[i] = _pod(job, i)  # the Job's replacement pod for this index
    assert kills[signal.SIGKILL] >= 2 and kills[signal.SIGTERM] >= 2, kills

    # Every shard is done, and says so with the right shard count.
    for i in range(SHARDS):
        marker = json.loads((out / "_done" / f"shard-{i:05d}.json").read_text())
        assert marker["shard"] == i and marker["shards"] == SHARDS

    # The union of the pods' outputs is the corpus: every page, each in its own shard.
    uris = {d.uri: d.doc_id for d in list_documents(Store(str(src)))}
    expected = {(uris[d.uri], p): texts[d.name][p] for d in list_documents(Store(str(src))) for p in range(5)}
    rows = read_pages(str(out)).select("doc_id", "source_uri", "page_index", "text", "shard").collect()
    assert set(zip(rows["doc_id"], rows["page_index"])) == set(expected)
    for uri, shard in set(zip(rows["source_uri"], rows["shard"])):
        assert shard == shard_of(uri, SHARDS)

    # After compaction, each page exactly once, with its text.
    compact(Store(str(out)))
    rows = read_pages(str(out)).select("doc_id", "page_index", "text").collect()
    assert rows.height == len(expected) == 240
    assert rows.select("doc_id", "page_index").is_unique().all()
    for doc, page, text in rows.iter_rows():
        assert text.split() == expected[(doc, page)].split()
    assert pl.Series(rows["doc_id"]).n_unique() == 48


def test_a_pod_starting_as_another_pod_removes_its_done_marker_goes_on(tmp_path):
    """The nightly CronJob's pods start together, and a pod whose shard has new documents removes
    its done-marker (it is not done). One starting meanwhile lists OUT/_done (the shard count of
    OUT's output), then reads each marker: one removed in between was a FileNotFoundError (a
    traceback, exit 1, before the engine loaded; `batchocr status` alike). A marker gone since the
    listing is one less marker."""
    from batchocr.status import output_shard_counts, status

    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=4, pages=1)
    for i in range(2):
        run_cli("run", str(src), str(out), "--engine", "textlayer", "--shard", f"{i}/2", "-q", check=True)
    marker = out / "_done" / "shard-00000.json"
    kept = marker.read_bytes()
    store = Store(str(out))
    real_find = store.find

    def find(rel, suffix=""):  # OUT/_done listed: then shard 0's pod finds new work and removes its marker
        found = real_find(rel, suffix)
        if rel == "_done":
            marker.unlink(missing_ok=True)
        return found

    store.find = find
    assert output_shard_counts(store) == {2}
    marker.write_bytes(kept)
    assert [s.shard for s in status(store)] == [0, 1]
