"""The render workers' fork server (batchocr/renderserver.py): workers are its forks, it
imports what they need once, it goes with its run and leaves nothing behind; where it could
not import this process's batchocr, the workers still read every page. (That no worker or
server outlives a kill -9 of its run: tests/test_hostile.py.)"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from chaos import descendants, fork_servers, render_workers, running, start, still_running_after, wait_until_running, \
    write_job
from conftest import HANG_S, ROOT, SAMPLES, run_cli
from corpus import text_corpus

RUN = """
import json, sys
sys.path.insert(0, sys.argv[1])
import batchocr
from batchocr import renderpool
from batchocr.pipeline import run_job
from batchocr.spec import JobSpec
summary = run_job(JobSpec(source=sys.argv[2], out=sys.argv[3], engine="textlayer"), progress=False)
print(json.dumps({"batchocr": batchocr.__path__[0], "preload": renderpool._preload(), "pages": summary.pages,
                  "errors": summary.error_pages}))
"""


def _run(tree, out, env=None):
    proc = subprocess.run([sys.executable, "-c", RUN, str(tree), str(SAMPLES / "report.pdf"), str(out)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def test_workers_are_forks_of_a_server_that_imported_batchocr(tmp_path):
    r = _run(ROOT, tmp_path / "out")
    assert r["preload"] == ["batchocr.renderserver"] and (r["pages"], r["errors"]) == (3, 0)


BUILD = """
import json, os, sys
from multiprocessing import forkserver
from batchocr import engines
from batchocr.pipeline import run_job
from batchocr.spec import JobSpec
seen, real = [], engines.create

def create(name, options):  # the server's state as the engine's build begins
    pid = forkserver._forkserver._forkserver_pid
    seen.append(pid is not None and os.waitpid(pid, os.WNOHANG)[0] == 0)
    return real(name, options)

engines.create = create
summary = run_job(JobSpec(source=sys.argv[1], out=sys.argv[2], engine="textlayer"), progress=False)
print(json.dumps({"server_up_at_build": seen, "pages": summary.pages, "errors": summary.error_pages}))
"""


def test_the_fork_server_starts_before_the_engine_builds(tmp_path):
    """The server's imports (1-2 s) ran after the engine's build, between it and the first page
    (vLLM's 28 s of build, then 3-3.5 s to the first page on an H100): they run beside it."""
    proc = subprocess.run([sys.executable, "-c", BUILD, str(SAMPLES / "report.pdf"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.splitlines()[-1])
    assert r == {"server_up_at_build": [True], "pages": 3, "errors": 0}


FORKED = """
import os, sys, time
from multiprocessing import forkserver
from batchocr import renderpool
renderpool.prestart()
child = os.fork()  # as vLLM starts its engine core
if child == 0:
    time.sleep(float(sys.argv[1]))
    os._exit(0)
print(forkserver._forkserver._forkserver_pid, child, flush=True)
os._exit(0)  # as kill -9 would end it: nothing closed by hand
"""


def test_a_process_forked_after_the_server_started_does_not_keep_it_alive(tmp_path):
    """Started before the build, the server's pipe was inherited by vLLM's engine core (a fork of
    the run): killed, the run would leave the server (and any worker, which dies with it) up for
    as long as the engine core lived. A fork lets go of its copy."""
    proc = subprocess.Popen([sys.executable, "-c", FORKED, str(HANG_S)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # not to the pipe's end: the fork holds it
    assert proc.wait(timeout=120) == 0 and line
    server, child = (int(x) for x in line.split())
    try:
        assert running(child)
        assert not still_running_after({server}, 30)
        assert running(child)  # the server ended while the fork still lived
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_batchocr_the_server_would_not_find_still_reads_every_page(tmp_path):
    """Python 3.11's forkserver starts with a fresh interpreter's sys.path, not the run's
    (CPython gh-117378): a batchocr on a path inserted by hand is another than the server's.
    Preloaded, the server's batchocr (the installed one: another version) ran the workers: they
    died before their first page (exit 1, "render workers die before they start")."""
    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "batchocr", copy / "batchocr", ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PYTHONPATH": ""}  # the installed batchocr is what a fresh interpreter finds
    r = _run(copy, tmp_path / "out", env)
    assert r["batchocr"] == str(copy / "batchocr") and r["preload"] == []
    assert (r["pages"], r["errors"]) == (3, 0)


def test_a_run_leaves_no_temp_folder(tmp_path):
    """The console script ends with os._exit, which skips multiprocessing's exit handler: each
    run left its temp folder (/tmp/pymp-*, the server's socket) behind."""
    tmp = tempfile.mkdtemp(prefix="t", dir="/tmp")  # short: the server's socket path fits AF_UNIX's 108 bytes
    try:
        proc = run_cli("run", str(SAMPLES / "report.pdf"), str(tmp_path / "out"), "--engine", "textlayer", "-q",
                       env={"TMPDIR": tmp}, subprocess=True)
        assert proc.returncode == 0, proc.stderr
        assert "fork server could not start" not in proc.stderr
        assert os.listdir(tmp) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_temp_folder_too_deep_for_the_servers_socket_falls_back_to_spawned_workers(tmp_path):
    """AF_UNIX takes paths of at most 108 bytes: under a long TMPDIR the fork server could not
    bind its socket, and the run ended in a traceback (OSError: AF_UNIX path too long)."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    proc = run_cli("run", str(SAMPLES / "report.pdf"), str(tmp_path / "out"), "--engine", "textlayer", "-q",
                   env={"TMPDIR": str(deep)}, subprocess=True)
    assert proc.returncode == 0, proc.stderr
    assert "the fork server could not start (OSError: AF_UNIX path too long); spawning each worker" in proc.stderr
    assert "Traceback" not in proc.stderr and os.listdir(deep) == []


def test_a_killed_run_leaves_no_worker_and_no_temp_folder(tmp_path):
    """kill -9 of a run whose worker hangs on a page: the server ends (the run's end of its
    pipe closed), its worker with it, and the server removes the run's temp folder, which the
    killed run could not (it was left behind)."""
    import signal
    import time

    from corpus import hang_pdf

    src = tmp_path / "src"
    src.mkdir()
    hang_pdf(src / "hang.pdf", pages=3, hang_at=(0,))
    tmp = tempfile.mkdtemp(prefix="t", dir="/tmp")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "batchocr.cli", "run", str(src), str(tmp_path / "out"),
                                 "--engine", "textlayer", "-q"], env={**os.environ, "TMPDIR": tmp},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + HANG_S
        while not render_workers(proc.pid):  # a worker, the server's child, is up
            assert time.monotonic() < deadline and proc.poll() is None, "no render worker started"
            time.sleep(0.05)
        time.sleep(0.5)  # on the page that hangs
        everyone = descendants(proc.pid)
        assert os.listdir(tmp)  # the run's temp folder, with the server's socket
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert not still_running_after(everyone, 10)
        deadline = time.monotonic() + HANG_S
        while os.listdir(tmp) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.listdir(tmp) == []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)



def test_sigterm_to_the_workers_and_their_server_is_the_run_s_to_handle(tmp_path):
    """SIGTERM sent to a run's whole process group (tini -g, kill -TERM -PGID) reaches its render
    workers and their fork server too, and killed them: a worker mid-document cost its page a
    renderer_crashed row, and a worker asked of a server dying of it failed the run (EOFError,
    click's "Aborted!", exit 1: once in the chaos test under load). The run handles SIGTERM
    (commit, exit 75); they ignore it: sent to them alone it changes nothing, the run reads
    every page with the workers it started."""
    src = tmp_path / "src"
    text_corpus(src, documents=12, pages=6)
    job = write_job(tmp_path, src, tmp_path / "out")
    proc = start(job)  # the engine slowed to 80 ms a page: the workers live through the signal
    assert wait_until_running(job, proc, 0)
    servers = fork_servers(proc.pid)
    workers = render_workers(proc.pid)
    assert len(servers) == 1 and workers
    for pid in servers + workers:
        os.kill(pid, signal.SIGTERM)
    time.sleep(1)
    assert all(running(pid) for pid in servers + workers)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "out" / "_runs").glob("*.json")]
    assert record["timings"]["render_workers_replaced"] == 0 and record["counts"]["pages"] == 72, record
    assert record["counts"]["error_pages"] == 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_to_the_group_as_the_fork_server_starts_is_one_line(tmp_path, sig):
    """Ctrl-C (SIGINT to the whole group) the moment the render workers' fork server exists,
    while it imports: the run exited 75 as it should, but with a KeyboardInterrupt traceback
    from the server's imports and a warning that the fork server could not start (16 lines
    of stderr). The run holds both signals while it starts the server, which ignores them
    before it imports anything."""
    src = tmp_path / "src"
    text_corpus(src, documents=20, pages=5)
    proc = subprocess.Popen([sys.executable, "-m", "batchocr.cli", "run", str(src), str(tmp_path / "out"),
                             "--engine", "textlayer", "-q"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + HANG_S
    while not fork_servers(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    assert proc.poll() is None, proc.communicate()
    os.killpg(proc.pid, sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err
    assert len(err.strip().splitlines()) == 1 and "interrupted" in err, err


def test_a_server_that_dies_while_a_worker_is_asked_of_it_leaves_spawned_workers(monkeypatch, caplog):
    """multiprocessing's forkserver reads the new worker's pid from the server's socket: a server
    that dies meanwhile (killed) raises EOFError, which ended the run ("Aborted!", exit 1). Like
    a server that cannot start (OSError), it leaves spawned workers, the same pages."""
    from batchocr import renderpool
    from batchocr.render import RenderTask
    from batchocr.schema import Needs
    from batchocr.sources import list_documents
    from batchocr.spec import RenderSpec
    from batchocr.storage import Store

    real, asked = renderpool._Worker, []

    def worker(ctx, *args):
        asked.append(ctx.get_start_method())
        if ctx.get_start_method() == "forkserver":
            raise EOFError  # forkserver.read_signed: the server closed its end before the pid came
        return real(ctx, *args)

    monkeypatch.setattr(renderpool, "_Worker", worker)
    (receipt,) = list_documents(Store(str(SAMPLES / "receipt.png")))
    with caplog.at_level("WARNING", logger="batchocr.renderpool"):
        with renderpool.RenderPool(RenderSpec(workers=1, timeout_s=120), Needs(image=True)) as pool:
            rows = [r for batch in pool.run([RenderTask(receipt)]) for r in batch.to_pylist()]
    assert asked == ["forkserver", "spawn"] and [r["error_type"] for r in rows] == [None]
    assert "fork server could not start (EOFError" in caplog.text
