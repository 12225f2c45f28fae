"""A shard as several processes side by side (`--processes N`, batchocr/parts.py): every
page one row, the engines built one after the other with 1/N of the GPU each, SIGTERM
and a dead part handled as a run alone handles them. The parts are real processes; the
vLLM stand-in (tests/fake_vllm.py) reaches them as a `vllm` package on their path."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import fake_vllm
import numpy as np
import pyarrow.parquet as pq
import pytest

from batchocr.parts import shares
from batchocr.sources import DocRef
from chaos import running, still_running_after
from conftest import H100, HANG_S, SAMPLES, count_pages, nvidia_smi, read_table, sample_documents

TOTAL = sum(count_pages(p) for p in sample_documents())


def test_shares_balance_bytes_and_keep_the_listing_order():
    docs = [DocRef(f"file:///d/{i}.pdf", size, f"e{i}") for i, size in enumerate([900, 100, 100, 500, 400, 50])]
    a, b = shares(docs, 2)
    assert sorted(d.uri for d in a + b) == sorted(d.uri for d in docs)  # each document once
    assert {sum(d.size for d in a), sum(d.size for d in b)} == {1000, 1050}
    for share in (a, b):
        assert [docs.index(d) for d in share] == sorted(docs.index(d) for d in share)
    assert len(shares(docs[:1], 3)) == 1  # no empty part: one document, one process


def test_each_engine_takes_its_share_of_the_machine():
    from batchocr import engines
    from batchocr.cpus import available_cpus

    assert engines.shared("vllm", {"model": "m", "gpu_memory_utilization": 0.8}, 2)["gpu_memory_utilization"] == 0.4
    assert engines.shared("rapidocr", {}, 2)["threads"] == max(1, available_cpus() // 2)
    assert engines.shared("rapidocr", {"threads": 8}, 4)["threads"] == 2
    assert engines.shared("textlayer", {}, 2) == {}


def _stand_in(tmp_path: Path) -> dict:
    """The environment under which a spawned process imports the vLLM stand-in as `vllm`."""
    return {"PYTHONPATH": fake_vllm.pythonpath(tmp_path / "shim")}


def _cli(*args: str, env: dict, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "batchocr.cli", *args], env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _rows(out: Path) -> list[dict]:
    return read_table(out).to_pylist()


def test_two_parts_give_every_page_one_row_and_the_text_of_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    for out, n in ((one, "1"), (two, "2")):
        proc = _cli("run", str(SAMPLES), str(out), "--engine", "textlayer", "--processes", n, env={})
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    # Each part drew its progress. tqdm's default lock is a multiprocessing RLock (a named semaphore)
    # that a part ending in os._exit left to the resource tracker, which warned of leaked semaphores
    # after every such run (batchocr.progress.Bar holds a thread lock).
    assert "part 2/2" in err and "leaked" not in err and "resource_tracker" not in err, err
    rows = _rows(two)
    keys = Counter((r["doc_id"], r["page_index"]) for r in rows)
    assert len(rows) == TOTAL and set(keys.values()) == {1}
    assert {k: r["text"] for r in _rows(one) for k in [(r["doc_id"], r["page_index"])]} == \
           {k: r["text"] for r in rows for k in [(r["doc_id"], r["page_index"])]}
    records = [json.loads(p.read_text()) for p in (two / "_runs").glob("*.json")]
    assert len(records) == 2 and {r["status"] for r in records} == {"done"}
    assert {r["run_id"] for r in records} == {r["run_id"] for r in rows}  # each part wrote its own pages
    assert [r["accelerator"]["count"] for r in records] == [0.5, 0.5]  # the machine counted once
    marker = json.loads((two / "_done" / "shard-00000.json").read_text())
    assert marker["pages"] == TOTAL and marker["documents"] == len(sample_documents())
    assert sorted(marker["run_ids"]) == sorted(r["run_id"] for r in records)
    # A rerun over a done shard starts no part (no engine loads); one over a shard with a
    # part file lost deals only its documents: the work is dealt, not the listing.
    again = _cli("run", str(SAMPLES), str(two), "--engine", "textlayer", "--processes", "2", "-q", env={})
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0 and out.startswith("batchocr: shard 0/1: nothing to do (5 documents already done)")
    assert len(list((two / "_runs").glob("*.json"))) == 2
    lost = sorted((two / "pages").glob("**/*.parquet"))[0]
    gone = {r["doc_id"] for r in pq.read_table(lost).to_pylist()}
    lost.unlink()
    again = _cli("run", str(SAMPLES), str(two), "--engine", "textlayer", "--processes", "2", "-q", env={})
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    new = [json.loads(p.read_text()) for p in (two / "_runs").glob("*.json")]
    later = [r for r in new if r["run_id"] not in {r["run_id"] for r in records}]
    assert sum(r["counts"]["documents"] for r in later) == len(gone) and len(later) == min(2, len(gone))
    assert {r["accelerator"]["count"] for r in later} == {1 / len(later)}  # one part alone holds the machine
    rows = _rows(two)
    assert len(rows) == TOTAL and len({(r["doc_id"], r["page_index"]) for r in rows}) == TOTAL


def _builds(path: Path) -> list[dict]:
    """The stand-in's engine builds (BATCHOCR_FAKE_BUILDS), in the order they started."""
    return sorted((b for b in map(json.loads, path.read_text().splitlines()) if "t0" in b), key=lambda b: b["t0"])


def _imports(path: Path) -> dict[int, dict]:
    """When each process imported the stand-in's `vllm`, by pid."""
    return {b["pid"]: b for b in map(json.loads, path.read_text().splitlines()) if "import_t0" in b}


def _releases(path: Path) -> list[dict]:
    """When each of the stand-in's engines gave its GPU memory back (its engine core's shutdown)."""
    return [b for b in map(json.loads, path.read_text().splitlines()) if "released" in b]


def _two_vllm_parts(tmp_path: Path, **env: str) -> tuple[Path, str]:
    """`batchocr run --processes 2` over the samples on the stand-in, its engines' builds noted in
    tmp_path/builds.jsonl (BATCHOCR_FAKE_* settings in `env`): OUT, and the command's stdout."""
    env = _stand_in(tmp_path) | {"BATCHOCR_FAKE_BUILDS": str(tmp_path / "builds.jsonl")} | env
    out = tmp_path / "out"
    proc = _cli("run", str(SAMPLES), str(out), "--engine", "vllm", "--model", "fake-model", "--route", "model",
                "--processes", "2", "-q", env=env)
    stdout, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return out, stdout


def test_vllm_parts_build_their_engines_one_after_the_other_with_half_the_memory_each(tmp_path):
    # A build of 1.5 s: the second part's checks of OUT before its wait (up to ~0.5 s on a loaded
    # machine) end well inside the first's build, so its wait is long enough to see
    out, stdout = _two_vllm_parts(tmp_path, BATCHOCR_FAKE_BUILD_S="1.5")
    builds = _builds(tmp_path / "builds.jsonl")
    assert len(builds) == 2 and builds[0]["pid"] != builds[1]["pid"]
    assert builds[1]["t0"] >= builds[0]["t1"], builds  # the second waits for the first: no overlap
    assert [b["gpu_memory_utilization"] for b in builds] == [0.45, 0.45]  # 0.9 shared
    # The run records say where each part's start went: the first waited for nothing; the second
    # waited its turn until the first's build ended (the stand-in's takes 1.5 s here), from when its own
    # run started (its process's start-up overlaps the first's build, more or less as the machine
    # is loaded), then built its own.
    records = [json.loads(r.read_text()) for r in (out / "_runs").glob("*.json")]

    def waits(first: dict, second: dict) -> bool:
        # the second's wait ends with the first's build: at most from its start to then (its own
        # checks of OUT come first, longer on a loaded machine), and a wait of its own where the
        # first's build still had a while to go
        started = dt.datetime.fromisoformat(second["started_at"]).timestamp()
        until_built, waited = max(0.0, builds[0]["t1"] - started), second["timings"]["turn_wait_s"]
        return (first["timings"]["turn_wait_s"] < 0.2 and waited <= until_built + 0.25
                and (until_built < 1.0 or waited > 0.1))

    first, second = records if waits(*records) else records[::-1]
    assert waits(first, second), [(r["started_at"], r["timings"]) for r in records]
    first, second = first["timings"], second["timings"]
    assert min(first["engine_start_s"], second["engine_start_s"]) >= 1.5
    assert second["first_row_s"] > second["turn_wait_s"] + second["engine_start_s"]
    rows = _rows(out)
    assert len(rows) == TOTAL and len({(r["doc_id"], r["page_index"]) for r in rows}) == TOTAL
    assert {r["engine"] for r in rows} == {"vllm"} and all(r["output_tokens"] > 0 for r in rows)
    assert stdout.startswith(f"batchocr: done: {len(sample_documents())} documents, {TOTAL} pages") and "(runs " in stdout


def test_a_part_done_before_the_next_has_built_keeps_its_engine_until_then(tmp_path):
    """vLLM measures the GPU's free memory while it builds, and fails its start when the memory
    grows meanwhile (another engine's memory given back: "Error in memory profiling"). A part
    whose pages are done while a later part still builds keeps its engine until that build ends.
    Here the first part's few pages take well under the second's 3-s build."""
    out, _ = _two_vllm_parts(tmp_path, BATCHOCR_FAKE_BUILD_S="3")
    builds, releases = _builds(tmp_path / "builds.jsonl"), _releases(tmp_path / "builds.jsonl")
    assert len(builds) == 2 and sorted(r["pid"] for r in releases) == sorted(b["pid"] for b in builds)
    first, second = builds
    released = next(r["released"] for r in releases if r["pid"] == first["pid"])
    assert released >= second["t1"], (first, second, released)  # not while the second measured
    rows = _rows(out)
    assert len(rows) == TOTAL and len({(r["doc_id"], r["page_index"]) for r in rows}) == TOTAL


def test_a_part_waiting_for_its_turn_makes_its_engines_imports_meanwhile(tmp_path):
    """vLLM's imports (torch's among them) take tens of seconds a process: the second part makes
    them while the first builds, so its own build, once its turn comes, starts without them."""
    out, _ = _two_vllm_parts(tmp_path, BATCHOCR_FAKE_BUILD_S="3", BATCHOCR_FAKE_IMPORT_S="1")
    first, second = _builds(tmp_path / "builds.jsonl")
    imports = _imports(tmp_path / "builds.jsonl")
    assert imports[second["pid"]]["import_t1"] <= first["t1"], (imports, first)  # while the first built
    # The first part, which waits for nothing, imports as it builds; the second's build is 1 s shorter
    records = sorted((json.loads(r.read_text())["timings"] for r in (out / "_runs").glob("*.json")),
                     key=lambda t: t["turn_wait_s"])
    assert len(records) == 2 and records[1]["turn_wait_s"] > 1
    assert records[1]["engine_start_s"] < records[0]["engine_start_s"] - 0.5, records


def _wait_for_parts(out: Path, deadline_s: float = HANG_S) -> None:
    """Until both parts have committed a page (a part file's name holds its run id)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if len({p.name.rsplit("-", 1)[0] for p in out.glob("pages/**/*.parquet")}) >= 2:
            return
        time.sleep(0.05)
    raise AssertionError("not both parts committed a page")


def _copies(tmp_path: Path, n: int = 3) -> tuple[Path, int]:
    """The samples n times over, under other names: documents enough for two parts to be busy."""
    src = tmp_path / "src"
    src.mkdir()
    for k in range(n):
        for doc in sample_documents():
            (src / f"{k}-{doc.name}").write_bytes(doc.read_bytes())
    return src, n * TOTAL


def _part_pids(parent: int) -> list[int]:
    import psutil

    return [c.pid for c in psutil.Process(parent).children() if "spawn_main" in " ".join(c.cmdline())
            and "resource_tracker" not in " ".join(c.cmdline())]


def test_the_parts_die_with_the_run(tmp_path):
    """kill -9 of the run's process: its parts go too (none writes on to meet a rerun's)."""
    import psutil

    env = _stand_in(tmp_path) | {"BATCHOCR_FAKE_STEP_S": "0.5"}  # a run of minutes: only a kill ends it soon
    src, _ = _copies(tmp_path)
    out = tmp_path / "out"
    log = open(tmp_path / "run.log", "w")  # a file, as a pod's log is (not a pipe someone reads)
    proc = subprocess.Popen([sys.executable, "-m", "batchocr.cli", "run", str(src), str(out), "--engine", "vllm",
                             "--model", "fake-model", "--route", "model", "--processes", "2", "-q"],
                            env={**os.environ, **env}, stdout=log, stderr=log)
    deadline = time.monotonic() + HANG_S
    while len(_part_pids(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    parts = [psutil.Process(p) for p in _part_pids(proc.pid)]
    assert len(parts) == 2
    time.sleep(2)  # both at work
    proc.kill()
    proc.wait(timeout=60)
    log.close()
    # A part still importing when the run dies (a loaded machine: -n 4 once) ends when it gets to
    # die_with_parent; one at work, at once. Minutes of fake steps are left either way.
    gone, alive = psutil.wait_procs(parts, timeout=30)
    for p in alive:
        p.kill()
    assert not alive, [p.pid for p in alive]


@pytest.mark.parametrize("processes", [1, 2])
def test_a_run_killed_takes_its_engine_cores_with_it(tmp_path, processes):
    """kill -9 of the run's process: vLLM's engine cores, children of the process that built
    each engine (the run's, or each part's), end too rather than hold the GPU's memory for the
    rerun to find taken (seen on an H100: docs/history/GPU.md, session 49)."""
    cores = tmp_path / "cores"
    env = _stand_in(tmp_path) | {"BATCHOCR_FAKE_STEP_S": "0.5", "BATCHOCR_FAKE_CORE_PROCESS": str(cores)}
    src, _ = _copies(tmp_path)
    log = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "batchocr.cli", "run", str(src), str(tmp_path / "out"),
                             "--engine", "vllm", "--model", "fake-model", "--route", "model",
                             "--processes", str(processes), "-q"], env={**os.environ, **env}, stdout=log, stderr=log)
    deadline = time.monotonic() + HANG_S
    while (not cores.exists() or len(cores.read_text().split()) < processes) and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = [int(p) for p in cores.read_text().split()]
    assert len(pids) == processes and all(running(p) for p in pids)
    time.sleep(1)  # at work
    proc.kill()
    proc.wait(timeout=60)
    log.close()
    alive = still_running_after(set(pids), 30)
    for p in alive:
        os.kill(p, signal.SIGKILL)
    assert not alive, "an engine core outlived its run"


def test_vllm_parts_with_the_kv_size_given_build_their_engines_at_once(tmp_path):
    """kv_cache_gib set: vLLM measures no free memory, so the parts need not take turns; each
    engine gets half the KV (and of gpu_memory_utilization, which vLLM still checks at start)."""
    env = _stand_in(tmp_path) | {"BATCHOCR_FAKE_BUILDS": str(tmp_path / "builds.jsonl")}
    job = tmp_path / "job.yaml"
    job.write_text("engines:\n  vllm:\n    kv_cache_gib: 20\n")
    out = tmp_path / "out"
    proc = _cli("run", str(SAMPLES), str(out), "--engine", "vllm", "--model", "fake-model", "--route", "model",
                "--job", str(job), "--processes", "2", "-q", env=env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    builds = _builds(tmp_path / "builds.jsonl")
    assert len(builds) == 2 and builds[0]["pid"] != builds[1]["pid"]
    # Neither part waited for the other's build (its run record's turn_wait_s; the turns test's
    # second part waits ~0.5 s). Whether the builds overlap in time depends on how soon the machine
    # starts the second process: on a loaded 2-core CI machine it once came 10 ms after the first's
    # build had ended, so their spans are not what is checked.
    records = [json.loads(r.read_text()) for r in (out / "_runs").glob("*.json")]
    assert len(records) == 2 and all(r["timings"]["turn_wait_s"] < 0.2 for r in records), \
        [r["timings"] for r in records]
    assert [b["kv_cache_memory_bytes"] for b in builds] == [10 * 2**30] * 2
    assert [b["gpu_memory_utilization"] for b in builds] == [0.45, 0.45]
    rows = _rows(out)
    assert len(rows) == TOTAL and len({(r["doc_id"], r["page_index"]) for r in rows}) == TOTAL


def test_unlimited_ocr_parts_on_a_known_card_build_at_once_with_equal_kv_under_one_mps_daemon(tmp_path):
    """No kv_cache_gib in the job: on a card nvidia-smi names, Unlimited-OCR's parts each get the
    KV their share leaves (engines.vllm.shared, the preset's non_kv_gib), the same for each, and
    so build at once, as with kv_cache_gib given. With nvidia-cuda-mps-control on PATH, both
    parts' engines are clients of the run's own MPS daemon (engines.vllm.mps), started before
    them and told to quit after."""
    from batchocr.engines.vllm.presets import get_preset
    from test_mps import control

    (tmp_path / "tmp").mkdir()  # the run's MPS folder, and no other run's to reap (engines.vllm.mps)
    env = (_stand_in(tmp_path) | nvidia_smi(tmp_path, H100) | control(tmp_path)
           | {"BATCHOCR_FAKE_BUILDS": str(tmp_path / "builds.jsonl"), "TMPDIR": str(tmp_path / "tmp")})
    out = tmp_path / "out"
    proc = _cli("run", str(SAMPLES), str(out), "--engine", "vllm", "--model", "fake-model", "--preset",
                "unlimited-ocr", "--route", "model", "--processes", "2", "-q", env=env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    builds = _builds(tmp_path / "builds.jsonl")
    share = builds[0]["gpu_memory_utilization"]
    kv = round(share * 81559 / 1024 - get_preset("unlimited-ocr").non_kv_gib, 2)
    assert [b["kv_cache_memory_bytes"] for b in builds] == [int(kv * 2**30)] * 2
    calls = (tmp_path / "mps.log").read_text().splitlines()
    pipe = calls[0].split()[1]
    assert calls[0].startswith("start ") and calls[-1] == f"quit {pipe}", calls
    assert [b["mps_pipe"] for b in builds] == [pipe] * 2 and not Path(pipe).exists()
    assert "mps:" not in err
    records = [json.loads(r.read_text()) for r in (out / "_runs").glob("*.json")]
    assert len(records) == 2 and all(r["timings"]["turn_wait_s"] < 0.2 for r in records), \
        [r["timings"] for r in records]
    rows = _rows(out)
    assert len(rows) == TOTAL and len({(r["doc_id"], r["page_index"]) for r in rows}) == TOTAL


def test_a_part_holding_refusals_waits_for_the_others_verdict_or_their_end():
    """systemic.Parts in one process (threads for parts): a part that ended holding a refused
    page waits until another part reads a page (its row is the page's own) or every other part
    is judged, by its own end or by the parent having its result (a part that died)."""
    import multiprocessing as mp
    import threading

    from batchocr.engines import systemic

    def part(array, index):
        held = systemic.Held("engine x refused every request alike ({n} pages, none taken)")
        held.parts = systemic.Parts(array, index)
        return held

    ctx = mp.get_context("spawn")
    # another part reads a page after this one ended: its row is released then, not before
    array = systemic.Parts.new_array(ctx, 2)
    a, b = part(array, 0), part(array, 1)
    assert a.failed_on([{"page": 1}], "refused: too long (3000 tokens)") == []
    got = []
    waiting = threading.Thread(target=lambda: got.append(a.ended()))
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive() and not got  # waits on part 2
    assert b.taken() == []
    waiting.join(5)
    assert got == [[{"page": 1}]]
    # the other part died (the parent has its result): a lone refused page is its row
    array = systemic.Parts.new_array(ctx, 2)
    a = part(array, 0)
    a.failed_on([{"page": 1}], "refused")
    threading.Timer(0.2, systemic.Parts.finished, (array, 1)).start()
    assert a.ended() == [{"page": 1}]
    # every part ended holding refusals alike, none read anywhere: each stops, naming them all
    array = systemic.Parts.new_array(ctx, 2)
    a, b = part(array, 0), part(array, 1)
    a.failed_on([{"page": 1}], "refused")
    b.failed_on([{"page": 2}, {"page": 3}], "refused")
    errors = []

    def end(held):
        try:
            held.ended()
        except Exception as exc:  # noqa: BLE001 - the verdict
            errors.append(str(exc))

    threads = [threading.Thread(target=end, args=(h,)) for h in (a, b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert len(errors) == 2 and all("alike (3 pages, none taken): refused" in e for e in errors)


def test_an_engine_refusing_every_page_stops_every_part_none_commits_a_row(tmp_path):
    """Refusals alike are judged over the shard's parts: the part dealt one page (letter.jpg,
    the largest, alone) used to commit that page's `rejected` row, final, while the other part
    found the engine refusing everything and stopped the run; the rerun then skipped the page."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("letter.jpg", "receipt.png", "fax.tiff"):  # dealt 1 and 2 by bytes
        shutil.copy(SAMPLES / name, src / name)
    pages = sum(count_pages(p) for p in src.iterdir())
    env = _stand_in(tmp_path) | {"BATCHOCR_FAKE_REFUSE": "this model takes no images"}
    out = tmp_path / "out"
    args = ("run", str(src), str(out), "--engine", "vllm", "--model", "fake-model", "--route", "model",
            "--processes", "2", "-q")
    proc = _cli(*args, env=env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    assert f"refused every request alike ({pages} pages, none taken): ValueError: this model takes no images" \
        in err.strip().splitlines()[-1], err
    assert not list(out.glob("pages/**/*.parquet"))  # no part wrote a row
    env.pop("BATCHOCR_FAKE_REFUSE")
    proc = _cli(*args, env=env)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    rows = _rows(out)
    assert len(rows) == pages and len({(r["doc_id"], r["page_index"]) for r in rows}) == pages
    assert not [r for r in rows if r["error_type"]]


def test_a_part_dealt_only_pages_too_big_for_the_model_writes_their_rows_while_the_other_reads(tmp_path):
    """The other way round: the part dealt the two pages vLLM refuses (too many tokens for
    max_model_len) judged them alone, found every page it had refused, and stopped a run whose
    other part read its page well. Judged over the parts they are the pages' own rows."""
    from PIL import Image

    src = tmp_path / "src"
    src.mkdir()
    # bytes deal them: the noisy small page (the most bytes) to one part, the two large plain
    # ones (a few hundred bytes each) to the other
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (280, 280, 3), np.uint8)).save(src / "small.png")
    for name in ("large-a.png", "large-b.png"):
        Image.new("RGB", (1120, 1120), (250, 250, 250)).save(src / name)
    job = tmp_path / "job.yaml"
    job.write_text("engines:\n  vllm:\n    max_model_len: 1000\n")  # the stand-in: (w // 28) * (h // 28) + 20
    out = tmp_path / "out"
    proc = _cli("run", str(src), str(out), "--engine", "vllm", "--model", "fake-model", "--route", "model",
                "--job", str(job), "--processes", "2", "-q", env=_stand_in(tmp_path))
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    rows = {Path(r["source_uri"]).name: r for r in _rows(out)}
    assert sorted(rows) == ["large-a.png", "large-b.png", "small.png"]
    assert rows["small.png"]["error_type"] is None and rows["small.png"]["text"]
    for name in ("large-a.png", "large-b.png"):
        assert rows[name]["error_type"] == "rejected" and "longer than the maximum model length" in \
            rows[name]["error_message"]


@pytest.mark.parametrize("how", ["sigterm", "sigkill_one_part"])
def test_a_stopped_or_broken_part_ends_the_run_in_one_line_and_the_rerun_completes_once(tmp_path, how):
    """SIGTERM to the parent (an eviction: Kubernetes signals the container's first process)
    reaches every part: each commits what finished, exit 75. A part killed outright (out of
    memory) stops the others: exit 1, one line. Either way the rerun completes every page once."""
    # Two sequences at a time, 0.1 s a step: a part takes ~6 s, so one that starts late (a
    # loaded machine) still finds the other at work when both have committed a page.
    env = _stand_in(tmp_path) | {"BATCHOCR_FAKE_STEP_S": "0.1"}
    src, total = _copies(tmp_path)
    out, job = tmp_path / "out", tmp_path / "job.yaml"
    job.write_text("commit:\n  every_pages: 1\nengines:\n  vllm:\n    max_num_seqs: 2\n")
    args = ("run", str(src), str(out), "--engine", "vllm", "--model", "fake-model", "--route", "model",
            "--job", str(job), "--processes", "2", "-q")
    proc = _cli(*args, env=env)
    _wait_for_parts(out)
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    else:
        os.kill(_part_pids(proc.pid)[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    lines = err.strip().splitlines()
    if how == "sigterm":
        assert proc.returncode == 75, err
        assert lines[-1].startswith("Error: batchocr: interrupted after") and "2 parts" in lines[-1], err
        records = [json.loads(p.read_text()) for p in (out / "_runs").glob("*.json")]
        assert sorted(r["status"] for r in records) == ["interrupted", "interrupted"]
    else:
        assert proc.returncode == 1, err
        assert lines == [lines[-1]] and "its process died (exit code -9)" in lines[-1], err
    assert "Traceback" not in err
    kept = _rows(out)
    assert 0 < len(kept) < total and not (out / "_done").exists()
    assert max(Counter((r["doc_id"], r["page_index"]) for r in kept).values()) == 1
    rerun = _cli(*args, env=env)
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    rows = _rows(out)
    assert len(rows) == total and len({(r["doc_id"], r["page_index"]) for r in rows}) == total
    assert json.loads((out / "_done" / "shard-00000.json").read_text())["pages"] == total


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_parts_start_is_exit_75_in_one_line(tmp_path, sig):
    """SIGTERM to the run's process the moment its parts exist (an eviction in a pod's first
    seconds, with jobs/aks-vllm.yaml's two processes), or SIGINT to the whole group (Ctrl-C):
    the parts, still starting (interpreter, imports), stop as they would later, exit 75, one
    line. They died of the signal before (exit 1, 'its process died (exit code -15)'), which
    the Job's podFailurePolicy counts against the shard's retries."""
    from corpus import text_corpus

    src = tmp_path / "src"
    text_corpus(src, documents=6, pages=3)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "batchocr.cli", "run", str(src), str(out), "--engine",
                             "textlayer", "--processes", "2", "-q"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + HANG_S
    while len(_part_pids(proc.pid)) < 2 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.005)
    assert len(_part_pids(proc.pid)) == 2, proc.communicate()
    if sig == signal.SIGTERM:
        proc.send_signal(sig)  # the run's own process only, as the kubelet signals a container's first
    else:
        os.killpg(proc.pid, sig)  # the terminal's Ctrl-C: every process of the group
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    assert len(err.strip().splitlines()) == 1 and "interrupted" in err and "Traceback" not in err, err
    rerun = subprocess.run([sys.executable, "-m", "batchocr.cli", "run", str(src), str(out), "--engine",
                            "textlayer", "--processes", "2", "-q"], capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert len({(r["doc_id"], r["page_index"]) for r in _rows(out)}) == len(_rows(out)) == 18


def test_processes_out_of_range_is_exit_2_naming_the_key(tmp_path):
    from conftest import run_cli

    proc = run_cli("run", str(SAMPLES), str(tmp_path / "out"), "--processes", "0")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "Error: configuration: processes: got 0, expected greater than or equal to 1 or 'auto'"], proc.stderr
    spec = tmp_path / "job.yaml"
    spec.write_text(f"source: {SAMPLES}\nout: {tmp_path / 'out'}\nprocesses: all\n")
    proc = run_cli("run", "--job", str(spec))
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        f"Error: {spec}: processes: got 'all', expected a valid integer or 'auto'"], proc.stderr
    proc = run_cli("run", str(SAMPLES), str(tmp_path / "out"), "--processes", "two")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "Error: Invalid value for '--processes': got 'two', expected a number of processes or auto "
        "(see batchocr run --help)"], proc.stderr


def test_an_out_whose_parts_found_no_document_yet_reads_as_an_empty_table(tmp_path):
    """The production job spec (jobs/aks-vllm.yaml: processes auto, 2 on its 80 GB cards) in a CronJob's first runs over
    an empty container: the parts load no engine, so OUT had only its done-markers, no
    _producer.json; status said every shard done, while compact, report and export were exit 2,
    'no page table under OUT', where a run of one process reads as a table of no rows (README)."""
    from conftest import run_cli

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    for i in range(2):
        proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "--processes", "2", "-q",
                       env={"JOB_COMPLETION_INDEX": str(i), "BATCHOCR_SHARDS": "2"}, check=True)
        assert "nothing to do" in proc.stdout
    assert "2/2 shards done" in run_cli("status", str(out), check=True).stdout
    assert run_cli("compact", str(out), check=True).stdout == f"nothing to compact: no page rows in {out} yet\n"
    assert "documents" in run_cli("report", str(out), check=True).stdout
    proc = run_cli("export", str(out), str(tmp_path / "x"), "--format", "text", check=True)
    assert proc.stdout.startswith("exported 0 documents, 0 pages")


def test_a_vllm_run_of_one_process_with_nothing_new_builds_no_engine(tmp_path):
    """A CronJob's quiet night on `processes: 1`: the shard is listed first and no model is
    loaded (70-200 s of GPU) when every document is done; a new document loads it again."""
    builds = tmp_path / "builds.jsonl"
    env = _stand_in(tmp_path) | {"BATCHOCR_FAKE_BUILDS": str(builds)}
    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    for name in ("letter.jpg", "receipt.png"):  # a page each
        shutil.copy(SAMPLES / name, src / name)
    args = ("run", str(src), str(out), "--engine", "vllm", "--model", "fake-model", "--route", "model", "-q")

    def run() -> str:
        proc = _cli(*args, env=env)
        stdout, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        return stdout

    run()
    assert len(_builds(builds)) == 1 and len(_rows(out)) == 2
    (out / "_done" / "shard-00000.json").unlink()  # the marker rewritten by the quiet run, from the table
    quiet = run()
    assert quiet.startswith("batchocr: shard 0/1: nothing to do (2 documents already done)"), quiet
    assert len(_builds(builds)) == 1  # no engine built
    assert json.loads((out / "_done" / "shard-00000.json").read_text())["pages"] == 2
    assert len(list((out / "_runs").glob("*.json"))) == 1
    shutil.copy(SAMPLES / "letter.jpg", src / "new.jpg")
    assert run().startswith("batchocr: done: 1 document, 1 page")
    assert len(_builds(builds)) == 2 and len(_rows(out)) == 3
