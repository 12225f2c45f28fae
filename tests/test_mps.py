"""engines.vllm.mps: an NVIDIA MPS daemon of the run's own for a shard's parts on one GPU. The
control program is a stand-in on PATH that keeps its arguments, its environment's MPS folders and
what it reads; the parts are real processes (tests/test_parts.py's stand-in vLLM)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from batchocr.engines.vllm import mps


@pytest.fixture(autouse=True)
def _own_tempdir(tmp_path, monkeypatch):
    """Each test's run folders in a temporary folder of its own: a start reaps the folders of killed
    runs it finds there (the machine's /tmp may hold some)."""
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))


def control(tmp_path: Path, start_rc: int = 0, server: str = "4242", late: int = 0) -> dict[str, str]:
    """PATH with an nvidia-cuda-mps-control that logs each call (its arguments, the pipe and log
    folders it was given and whether they exist, the command it read), exits `start_rc` on -d and
    lists `server` as its server from its (late + 1)th get_server_list on."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    log = tmp_path / "mps.log"
    script = bin_ / mps.CONTROL
    script.write_text(f"""#!/bin/sh
if [ "$1" = "-d" ]; then
  echo "start $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY $(test -d "$CUDA_MPS_PIPE_DIRECTORY" && echo made)" >> {log}
  [ {start_rc} -eq 0 ] || echo "An instance of this daemon is already running" >&2
  exit {start_rc}
fi
read -r line
echo "$line $CUDA_MPS_PIPE_DIRECTORY" >> {log}
if [ "$line" = "get_server_list" ]; then
  echo x >> {tmp_path / "lists"}
  [ "$(wc -l < {tmp_path / "lists"})" -gt {late} ] && echo "{server}"
fi
exit 0
""")
    script.chmod(0o755)
    return {"PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"}


def test_wanted_only_for_several_engines_and_where_no_daemon_serves_already(tmp_path):
    found = control(tmp_path)
    bare = {"PATH": str(tmp_path / "nowhere")}
    assert mps.wanted(None, 2, found) and mps.wanted(True, 3, found)
    assert not mps.wanted(None, 1, found)  # one engine: nothing to share the card with
    assert not mps.wanted(False, 2, found)
    assert not mps.wanted(None, 2, bare)  # no control program: unset asks for nothing
    assert mps.wanted(True, 2, bare)  # asked for: its start says why it cannot
    assert not mps.wanted(True, 2, found | {mps.PIPE: "/run/theirs"})  # someone's daemon serves


def test_the_daemon_runs_while_the_block_runs_and_quits_after(tmp_path):
    environ = control(tmp_path)
    said: list[str] = []
    with mps.daemon(environ, said.append) as started:
        assert started and not said
        pipe = environ[mps.PIPE]
        assert Path(pipe).is_dir() and Path(environ[mps.LOG]).is_dir()
    assert mps.PIPE not in environ and mps.LOG not in environ  # processes started later are not its clients
    assert not Path(pipe).parent.exists()  # its folder goes with it
    start, server, listed, quit_ = (tmp_path / "mps.log").read_text().splitlines()
    assert start == f"start {pipe} {Path(pipe).parent / 'log'} made"
    assert (server, listed) == (f"start_server -uid {os.getuid()} {pipe}", f"get_server_list {pipe}")
    assert quit_ == f"quit {pipe}"  # told to quit through its own pipe


@pytest.mark.parametrize("how", ["fails", "no server", "missing"])
def test_a_daemon_that_does_not_start_is_one_line_and_nothing_else(tmp_path, monkeypatch, how):
    monkeypatch.setattr(mps, "SERVER_S", 0.5)
    environ = {"fails": lambda: control(tmp_path, start_rc=3), "no server": lambda: control(tmp_path, server=""),
               "missing": lambda: {"PATH": str(tmp_path / "nowhere")}}[how]()
    said: list[str] = []
    with mps.daemon(environ, said.append) as started:
        assert not started and mps.PIPE not in environ
    assert len(said) == 1 and said[0].startswith("mps: no MPS daemon for the parts (")
    assert {"fails": "exit code 3: An instance of this daemon is already running",
            "no server": "its server did not start", "missing": f"no {mps.CONTROL} on PATH"}[how] in said[0]
    if how == "fails":
        assert len((tmp_path / "mps.log").read_text().splitlines()) == 1  # no quit for a daemon never started
    if how == "no server":  # the daemon that started is told to quit
        assert (tmp_path / "mps.log").read_text().splitlines()[-1].startswith("quit ")
    assert not list((tmp_path / "tmp").iterdir())  # its folder is gone


def test_a_server_listed_a_moment_after_its_start_is_waited_for(tmp_path):
    environ = control(tmp_path, late=2)
    with mps.daemon(environ, print) as started:
        assert started and mps.PIPE in environ
    assert (tmp_path / "lists").read_text().count("x") == 3  # asked until it was listed


def test_a_killed_run_s_daemon_is_told_to_quit_by_the_next_run(tmp_path):
    """SIGKILL skips the run's `finally`: its daemon lives on, its folder naming the run's process.
    The next run's start tells that daemon to quit through its pipe and removes its folder; a folder
    whose process lives, and one without an owner yet, are left alone."""
    environ = control(tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    folders = {}
    for name, owner in (("killed", gone.stdout.strip()), ("running", str(os.getpid())), ("new", None)):
        folders[name] = tmp_path / "tmp" / f"{mps.PREFIX}{name}"
        (folders[name] / "pipe").mkdir(parents=True)
        if owner is not None:
            (folders[name] / mps.OWNER).write_text(owner)
    with mps.daemon(environ, print) as started:
        assert started
        mine = Path(environ[mps.PIPE]).parent
        assert (mine / mps.OWNER).read_text() == str(os.getpid())
    log = (tmp_path / "mps.log").read_text().splitlines()
    assert log[0] == f"quit {folders['killed'] / 'pipe'}"  # before this run's daemon starts
    assert log[1].startswith("start ") and not folders["killed"].exists()
    assert folders["running"].exists() and folders["new"].exists()
    assert sum(line.startswith("quit ") for line in log) == 2  # the killed run's and this run's own


def test_a_killed_run_s_folder_goes_even_where_no_daemon_answers(tmp_path, monkeypatch):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / mps.CONTROL).write_text("#!/bin/sh\nexec sleep 30\n")  # a pipe nobody reads: the ask times out
    (bin_ / mps.CONTROL).chmod(0o755)
    monkeypatch.setattr(mps, "REAP_S", 0.3)
    stale = tmp_path / "tmp" / f"{mps.PREFIX}killed"
    stale.mkdir()
    (stale / mps.OWNER).write_text("999999999")  # above any pid_max: no such process
    mps._reap(str(bin_ / mps.CONTROL), {"PATH": os.environ["PATH"]})
    assert not stale.exists()
