import os
import re
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
DOC_SUFFIXES = {".pdf", ".png", ".jpg", ".jpeg", ".tif", ".tiff"}
# How long a test waits for a run to reach a state it reaches in seconds on a quiet machine
# (a part committed, a worker started) before it calls it a hang: a guard, never a bound on
# speed; the suite runs beside other work (issue 52: load 6-14 on 2 cores).
HANG_S = 600


H100 = "NVIDIA H100 80GB HBM3, 81559"  # nvidia-smi --query-gpu=name,memory.total on the lent H100 (docs/history/GPU.md)


def nvidia_smi(tmp_path: Path, answer: str | None) -> dict[str, str]:
    """PATH with an nvidia-smi that prints `answer` (None: one that fails) and keeps its arguments."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    smi = bin_ / "nvidia-smi"
    body = f"echo '{answer}'" if answer is not None else "echo 'NVIDIA-SMI has failed' >&2; exit 9"
    smi.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path / 'smi-args'}\n{body}\n")
    smi.chmod(0o755)
    return {"PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"}


def sample_documents() -> list[Path]:
    return sorted(p for p in SAMPLES.iterdir() if p.suffix.lower() in DOC_SUFFIXES)


def count_pages(path: Path) -> int:
    """Page count by other means than PyMuPDF: Pillow's frames for images, the
    page objects of the PDF's bytes for PDFs."""
    if path.suffix.lower() == ".pdf":
        return len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", path.read_bytes()))
    with Image.open(path) as im:
        return getattr(im, "n_frames", 1)


def read_table(out: Path):
    assert list(out.glob("pages/shard-*/*.parquet")), f"no part files under {out}"
    return pq.read_table(out / "pages")


def run_cli(*args: str, env: dict | None = None, check: bool = False, subprocess: bool = False):
    """`batchocr ARGS`: in this process through click's CliRunner (a new interpreter
    for every call proves nothing more and costs a second or two each), or with
    `subprocess=True` as a new `python -m batchocr.cli`. Either way the result has
    returncode, stdout and stderr; a crash in-process puts its traceback on stderr,
    as the console script does."""
    if subprocess:
        import subprocess as sp

        proc = sp.run([sys.executable, "-m", "batchocr.cli", *args], capture_output=True, text=True,
                      env={**os.environ, **(env or {})}, timeout=600)
    else:
        proc = _invoke(args, env)
    if check and proc.returncode != 0:
        raise AssertionError(f"batchocr {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def _invoke(args, env):
    import subprocess as sp
    import traceback

    from click.testing import CliRunner

    from batchocr.cli import main

    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=True)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))
    return sp.CompletedProcess(["batchocr", *args], result.exit_code, result.stdout, stderr)


def _run_once(tmp_path_factory, worker_id: str, name: str, *args: str):
    """`batchocr run ARGS SAMPLES OUT`, once for the whole session: the first pytest-xdist
    worker to want it runs it under a lock in the folder the workers share (xdist's own
    recipe), the others read what it left (each worker made its own before: a second
    rapidocr run of the samples on the 2-core CI). Its OUT is read-only to the tests."""
    import fcntl
    import json
    import subprocess as sp

    if worker_id == "master":  # not under xdist (-n 0)
        out = tmp_path_factory.mktemp(name) / "out"
        return out, run_cli("run", str(SAMPLES), str(out), *args, check=True)
    shared = tmp_path_factory.getbasetemp().parent / name
    shared.mkdir(exist_ok=True)
    out, result = shared / "out", shared / "result.json"
    with open(shared / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not result.exists():
            proc = run_cli("run", str(SAMPLES), str(out), *args, check=True)
            result.write_text(json.dumps({"stdout": proc.stdout, "stderr": proc.stderr}))
    kept = json.loads(result.read_text())
    return out, sp.CompletedProcess(["batchocr", "run", *args], 0, kept["stdout"], kept["stderr"])


@pytest.fixture(autouse=True)
def _pixels_as_found(monkeypatch):
    """An engine with engines.vllm.pixel_bytes on (the unlimited-ocr preset's default) sets its
    switch in this process's environment and installs patches.pixels' processor half class-wide;
    one with sam_fold on sets patches.samattn's switch: each test leaves them as it found them.
    No MPS daemon of the machine's is named either (engines.vllm.mps leaves the parts to one)."""
    from batchocr.engines.vllm import mps
    from batchocr.engines.vllm.patches import pixels, samattn

    monkeypatch.delenv(pixels.ENV, raising=False)
    monkeypatch.delenv(samattn.ENV, raising=False)
    monkeypatch.delenv(mps.PIPE, raising=False)
    yield
    pixels.uninstall()


@pytest.fixture(scope="session")
def rapidocr_run(tmp_path_factory, worker_id):
    """One real rapidocr run over the samples, shared by the tests that read it."""
    return _run_once(tmp_path_factory, worker_id, "rapidocr", "--quiet")


@pytest.fixture(scope="session")
def textlayer_run(tmp_path_factory, worker_id):
    return _run_once(tmp_path_factory, worker_id, "textlayer", "--engine", "textlayer", "--quiet")




def _shares_a_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(d.scope == "module" for defs in info.name2fixturedefs.values() for d in defs)


def pytest_collection_modifyitems(config, items):
    """The suite runs on 3 pytest-xdist workers (pyproject's addopts: `-n 3 --dist
    loadscope`: a module's tests stay on one worker, so a module fixture (a corpus and
    its clean run, two OCR runs of a test set) is made once). The modules whose tests
    share such a fixture are the long ones: they go first, so that none of them starts
    last and runs alone."""
    heavy = {item.module.__name__ for item in items if _shares_a_module_fixture(item)}
    items.sort(key=lambda item: item.module.__name__ not in heavy)  # stable: collection order otherwise


_PREFETCH: list = []  # the background fetches (tools.prefetch), once a session


def _prefetch(nodeids) -> None:
    if _PREFETCH or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import tools

    modules = {Path(nodeid.split("::", 1)[0]).stem for nodeid in nodeids}
    _PREFETCH.extend(tools.prefetch(modules) or [None])


def pytest_collection_finish(session):
    """Without xdist: the outside tools the selected tests need start downloading now."""
    _prefetch(item.nodeid for item in session.items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """With xdist (the default): the controller starts them once a worker has collected."""
    _prefetch(ids)
