"""No pod lists the whole container: a run of several shards without a plan says so (and how
to plan); `--inventory` over Azure's inventory destination (runs a day, `YYYY/MM/DD/HH-MM-SS/
<rule>/<rule>-manifest.json`) takes the newest Succeeded run; a job spec's `inventory:`
re-plans OUT from it before the shards run, once for all pods (a lock, a heartbeat, a
vanished holder's lock taken over), keeping every planned document on its shard."""

import json
import os
import subprocess
import sys
import threading
import types
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchocr import inventoryruns, read_pages, replan
from batchocr.errors import Interrupted
from batchocr.storage import Store
from azurite import azurite  # noqa: F401 - a fixture
from conftest import run_cli
from corpus import text_corpus

SHARDS = 3


def report_files(run: str, rule: str, rows: list[dict], status: str = "Succeeded") -> dict[str, bytes]:
    """An inventory run in Azure's layout: {path under the destination: bytes}, a Parquet
    report (Name `container/blob`, or a local root's path) and the manifest naming it."""
    table = pa.Table.from_pylist(rows, schema=pa.schema([("Name", pa.string()), ("Content-Length", pa.int64()),
                                                         ("Last-Modified", pa.float64())]))
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    report = f"{run}/{rule}/{rule}_1000000_0.parquet"
    manifest = {"destinationContainer": "inventory", "files": [{"blob": report, "size": sink.getvalue().size}],
                "ruleName": rule, "status": status, "summary": {"objectCount": len(rows)}, "version": "1.0"}
    return {report: sink.getvalue().to_pybytes(), f"{run}/{rule}/{rule}-manifest.json": json.dumps(manifest).encode()}


def local_rows(src) -> list[dict]:
    """A local SOURCE's files as Azure's report names blobs: the root's path, then the name."""
    return [{"Name": str(p), "Content-Length": p.stat().st_size, "Last-Modified": p.stat().st_mtime}
            for p in sorted(src.rglob("*")) if p.is_file()]


def write_local(dest, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)


def plan_of(out, shards: int = SHARDS) -> dict[str, int]:
    """uri -> shard of OUT's plan; a document on two shards fails here."""
    where: dict[str, int] = {}
    for i in range(shards):
        for uri in pl.read_parquet(out / "_plan" / f"shard-{i:05d}.parquet")["uri"]:
            assert uri not in where, f"{uri} on shards {where[uri]} and {i}"
            where[uri] = i
    return where


def test_a_run_of_several_shards_without_a_plan_warns_once(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=5, pages=1)
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", "--shard", "0/2", check=True)
    warnings = [line for line in proc.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, proc.stderr
    assert "every one of the 2 shards lists all of SOURCE" in warnings[0]
    assert "this one listed 5 documents" in warnings[0]
    assert f"batchocr plan {src} {out} --shards 2" in warnings[0] and "--inventory" in warnings[0]
    one = run_cli("run", str(src), str(tmp_path / "one"), "--engine", "textlayer", "-q", check=True)
    assert "warning" not in one.stderr  # one shard lists what it reads
    run_cli("plan", str(src), str(out), "--shards", "2", check=True)
    # Each shard of the plan runs without the warning. (Which documents shard 0's first run took
    # hangs on the hash of their paths, here under tmp_path: now and then all five, and the plan
    # keeps them there, leaving shard 1 nothing to do.)
    for shard in ("0/2", "1/2"):
        planned = run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", "--shard", shard, check=True)
        assert "warning" not in planned.stderr and ("done:" in planned.stdout or "nothing to do" in planned.stdout), (
            shard, planned.stdout, planned.stderr)
    assert pl.read_parquet(out / "pages" / "**" / "*.parquet")["doc_id"].n_unique() == 5


def test_the_newest_succeeded_run_on_azurite(azurite, tmp_path):  # noqa: F811 - the fixture
    """Two days of one rule (the older lists fewer blobs), a newer run not Succeeded: the
    destination folder plans from the second day, and says so; two rules: name one."""
    scans = azurite.container("scans")
    azurite.container("results")
    inv = azurite.container("inventory")
    sizes = {"a.pdf": 3000, "b.pdf": 2000, "c.png": 1000, "d.pdf": 500}
    for name, size in sizes.items():
        scans.upload_blob(name, os.urandom(size))
    rows = [{"Name": f"scans/{n}", "Content-Length": s, "Last-Modified": 1.7e9} for n, s in sizes.items()]
    days = [report_files("2026/12/04/01-00-00", "scans", rows[:2]),
            report_files("2026/12/05/01-00-00", "scans", rows[:3]),
            report_files("2026/12/06/01-00-00", "scans", rows, status="Running")]
    for files in days:
        for rel, data in files.items():
            inv.upload_blob(rel, data)
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    proc = run_cli("plan", "az://scans/", "az://results/nightly", "--shards", "2", "--inventory", "az://inventory/",
                   env=env, check=True)
    assert "inventory: az://inventory/2026/12/05/01-00-00/scans/scans-manifest.json (the newest Succeeded" \
           in proc.stdout, proc.stdout
    assert "planned 3 documents" in proc.stdout
    stamp = Store("az://results/nightly", azurite.options())
    assert replan.planned_from(stamp) == "az://inventory/2026/12/05/01-00-00/scans/scans-manifest.json"

    for rel, data in report_files("2026/12/05/02-00-00", "other", rows).items():
        inv.upload_blob(rel, data)
    proc = run_cli("plan", "az://scans/", "az://results/two", "--shards", "2", "--inventory", "az://inventory/",
                   env=env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "2 inventory rules (other, scans): name one rule's folder" in lines[0]
    proc = run_cli("plan", "az://scans/", "az://results/two", "--shards", "2", "--inventory",
                   "az://inventory/scans", env=env, check=True)
    assert "2026/12/05/01-00-00/scans/scans-manifest.json" in proc.stdout and "planned 3 documents" in proc.stdout


def test_runs_not_succeeded_are_passed_over_and_none_is_one_line(tmp_path):
    src = tmp_path / "src"
    text_corpus(src, documents=2, pages=1)
    write_local(tmp_path / "inv", report_files("2026/12/06/01-00-00", "scans", local_rows(src), status="Failed"))
    under_way = report_files("2026/12/07/01-00-00", "scans", local_rows(src))  # its manifest comes last
    write_local(tmp_path / "inv", {k: v for k, v in under_way.items() if not k.endswith("-manifest.json")})
    proc = run_cli("plan", str(src), str(tmp_path / "out"), "--shards", "2", "--inventory", str(tmp_path / "inv"))
    assert proc.returncode == 2 and "no inventory run of rule scans has status Succeeded" in proc.stderr
    assert "07/01-00-00/scans/scans-manifest.json: no manifest yet; 2026/12/06" in proc.stderr, proc.stderr
    assert "Failed" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    write_local(tmp_path / "inv", report_files("2026/12/05/01-00-00", "scans", local_rows(src)))
    proc = run_cli("plan", str(src), str(tmp_path / "out"), "--shards", "2", "--inventory", str(tmp_path / "inv"),
                   check=True)
    assert "inventory: file://" in proc.stdout and "2026/12/05/01-00-00/scans/scans-manifest.json" in proc.stdout


def _pods(job, shards: int) -> list[subprocess.Popen]:
    """An Indexed Job's pods, all at once (each its own process, racing for the re-plan)."""
    return [subprocess.Popen([sys.executable, "-m", "batchocr.cli", "run", "--job", str(job), "-q"],
                             env={**os.environ, "JOB_COMPLETION_INDEX": str(i), "BATCHOCR_SHARDS": str(shards)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(shards)]


def _night(job) -> str:
    """Every pod of a night run to its end; their stderr together."""
    pods = _pods(job, SHARDS)
    said = []
    for pod in pods:
        stdout, stderr = pod.communicate(timeout=600)
        assert pod.returncode == 0, stderr
        said.append(stderr)
    return "\n".join(said)


def test_nightly_replan_keeps_every_document_on_its_shard(tmp_path):
    """Two nights of a CronJob whose job spec names the inventory: the pods race, one re-plans
    from each night's newest manifest, the old documents stay on their shards, the new ones
    are placed, and after compaction every page has one row."""
    src, out, inv = tmp_path / "src", tmp_path / "out", tmp_path / "inv"
    text_corpus(src, documents=6, pages=2)
    write_local(inv, report_files("2026/12/04/01-00-00", "scans", local_rows(src)))
    job = tmp_path / "job.yaml"
    job.write_text(f"source: {src}\nout: {out}\nengine: textlayer\ninventory: {inv}\nrender: {{workers: 1}}\n")
    said = _night(job)
    assert said.count("batchocr: re-planning") == 1, said
    assert "warning" not in said  # no pod listed SOURCE
    first = plan_of(out)
    assert len(first) == 6

    text_corpus(src / "new", documents=5, pages=1)
    write_local(inv, report_files("2026/12/05/01-00-00", "scans", local_rows(src)))
    write_local(inv, report_files("2026/12/06/01-00-00", "scans", local_rows(src)[:2], status="Running"))
    said = _night(job)
    assert said.count("batchocr: re-planning") == 1 and "2026/12/05/01-00-00" in said, said
    second = plan_of(out)
    assert len(second) == 11 and all(second[uri] == shard for uri, shard in first.items())
    assert replan.planned_from(Store(str(out))).endswith("2026/12/05/01-00-00/scans/scans-manifest.json")
    assert not [p for p in (out / "_plan").iterdir() if p.name.startswith("replan-")]  # no lock left
    said = _night(job)  # nothing newer: no re-plan, nothing to do
    assert "re-planning" not in said and plan_of(out) == second
    run_cli("compact", str(out), check=True)
    pages = read_pages(str(out)).collect()
    assert pages.height == 6 * 2 + 5 and pages.select("doc_id", "page_index").n_unique() == pages.height
    assert "3/3 shards done" in run_cli("status", str(out), check=True).stdout


@pytest.fixture
def planned(tmp_path, monkeypatch):
    """An inventory and a counter of the plans made from it (threads as pods)."""
    src, inv = tmp_path / "src", tmp_path / "inv"
    text_corpus(src, documents=4, pages=1)
    write_local(inv, report_files("2026/12/05/01-00-00", "scans", local_rows(src)))
    made = []
    real = replan.plan_from_inventory

    def counted(*args, **kwargs):
        made.append(args[3])
        time.sleep(0.3)  # long enough for the other pods to meet the lock
        return real(*args, **kwargs)

    monkeypatch.setattr(replan, "plan_from_inventory", counted)
    monkeypatch.setattr(replan, "POLL_S", 0.05)
    return Store(str(src)), Store(str(tmp_path / "out")), str(inv), made


def _race(src, out, url, pods: int, options: dict | None = None) -> list[bool]:
    """replan() in `pods` threads let go at once: what each returned (an error is raised)."""
    start = threading.Barrier(pods)
    results: list = [None] * pods

    def pod(i: int) -> None:
        start.wait()
        try:
            results[i] = replan.replan(src, out, SHARDS, url, options, threading.Event(), lambda line: None)
        except Exception as exc:  # noqa: BLE001 - raised in the test's thread below
            results[i] = exc

    threads = [threading.Thread(target=pod, args=(i,)) for i in range(pods)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for result in results:
        if isinstance(result, Exception):
            raise result
    return results


def test_pods_racing_for_the_replan_plan_once(planned):
    src, out, url, made = planned
    results = _race(src, out, url, 4)
    assert sorted(results) == [False, False, False, True] and len(made) == 1
    assert made[0].endswith("2026/12/05/01-00-00/scans/scans-manifest.json")
    assert replan.planned_from(out) == made[0] and len(plan_of(Path(out.root))) == 4
    assert "_plan/plan.json" in out.find("_plan") and not [n for n in out.find("_plan") if "replan-" in n]


def test_a_vanished_holders_lock_is_taken_over_a_live_one_is_not(planned, monkeypatch):
    src, out, url, made = planned
    monkeypatch.setattr(replan, "STALE_S", 0.5)
    out.write_atomic("_plan/replan-000000.json", b'{"pid": 1, "beat": 7}')  # a pod gone: it never beats again
    assert replan.replan(src, out, SHARDS, url, None, threading.Event(), lambda line: None) is True
    assert len(made) == 1 and [n for n in out.find("_plan") if "replan-" in n] == []

    # A live holder (beating) is waited for, whatever STALE_S: its plan is the one used. The
    # waiter's clock is the test's: between two of its polls twice STALE_S pass and the holder
    # beats once, so only the beats keep the lock from being taken over (no thread, no sleep).
    made.clear()
    out.remove(replan.STAMP)
    out.write_atomic("_plan/replan-000003.json", b'{"beat": 0}')
    clock = [0.0]
    monkeypatch.setattr(replan, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))

    class Polls(threading.Event):
        beats = 0

        def wait(self, timeout=None):  # the waiter's poll: time passes, the holder beats, at last plans
            clock[0] += 2 * replan.STALE_S
            self.beats += 1
            if self.beats < 6:
                out.write_atomic("_plan/replan-000003.json", json.dumps({"beat": self.beats}).encode())
            else:
                replan.record(out, inventoryruns.newest_manifest(url))
                out.remove("_plan/replan-000003.json")
            return False

    polls = Polls()
    assert replan.replan(src, out, SHARDS, url, None, polls, lambda line: None) is False
    assert made == [] and polls.beats == 6


def test_pods_racing_on_azurite_plan_once(azurite, monkeypatch):  # noqa: F811 - the fixture
    """The lock on Azure: a create with If-None-Match, of which one pod's succeeds."""
    scans = azurite.container("scans")
    azurite.container("results")
    inv = azurite.container("inventory")
    rows = []
    for i in range(6):
        scans.upload_blob(f"doc{i}.pdf", os.urandom(500 + 300 * i))
        rows.append({"Name": f"scans/doc{i}.pdf", "Content-Length": 500 + 300 * i, "Last-Modified": 1.7e9})
    for rel, data in report_files("2026/12/05/01-00-00", "scans", rows).items():
        inv.upload_blob(rel, data)
    monkeypatch.setattr(replan, "POLL_S", 0.05)
    src, out = Store("az://scans/", azurite.options()), Store("az://results/azure-race", azurite.options())
    assert sorted(_race(src, out, "az://inventory/scans", 3, azurite.options())) == [False, False, True]
    assert replan.planned_from(out) == "az://inventory/2026/12/05/01-00-00/scans/scans-manifest.json"
    planned = [out.read_parquet(f"_plan/shard-{i:05d}.parquet", ["uri"]).column("uri").to_pylist() for i in range(SHARDS)]
    assert sorted(u for shard in planned for u in shard) == [f"az://scans/doc{i}.pdf" for i in range(6)]
    assert not [n for n in out.find("_plan") if "replan-" in n]


def test_the_newest_run_is_found_without_listing_the_older_ones(tmp_path, monkeypatch):
    """A destination of 60 daily runs: the dated folders are listed a level at a time, newest
    first, and only as far back as the rules are counted (RULES_LOOKED_AT runs)."""
    src = tmp_path / "src"
    text_corpus(src, documents=1, pages=1)
    for day in range(60):
        run = f"2026/{10 + day // 30:02d}/{1 + day % 30:02d}/01-00-00"
        write_local(tmp_path / "inv", report_files(run, "scans", local_rows(src), "Failed" if day == 59 else "Succeeded"))
    listed = []
    real = Store.subfolders
    monkeypatch.setattr(Store, "subfolders", lambda self, rel: listed.append(rel) or real(self, rel))
    monkeypatch.setattr(Store, "find", lambda self, rel, suffix="": pytest.fail(f"listed {rel!r} whole"))
    url = inventoryruns.newest_manifest(str(tmp_path / "inv"))
    assert url.endswith("2026/11/29/01-00-00/scans/scans-manifest.json")  # the newest, 11/30, failed
    runs = {rel for rel in listed if rel.count("/") == 3}  # a run's folder, listed for its rules
    assert len(runs) == inventoryruns.RULES_LOOKED_AT and "2026/10/01/01-00-00" not in runs


def test_sigterm_ends_a_wait_for_the_replan(planned):
    """A pod waiting for another's re-plan stops at its stop flag (exit 75: Kubernetes retries it)."""
    src, out, url, made = planned
    out.write_atomic("_plan/replan-000000.json", b'{"beat": 0}')  # held, fresh
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    with pytest.raises(Interrupted, match="waiting for the re-plan"):
        replan.replan(src, out, SHARDS, url, None, stop, lambda line: None)
    assert made == [] and Interrupted.exit_code == 75
