"""A run over private documents makes no outbound connection, and writes no credential."""

import os
import re
import subprocess
import sys

import pytest

import tools
from conftest import SAMPLES

LOOPBACK = re.compile(r'inet_addr\("127\.|inet_pton\(AF_INET6, "::1"')


def test_onnxruntime_telemetry_is_off_before_it_loads(tmp_path):
    """PyMuPDF 2 imports onnxruntime itself; the switch must already be set then, in
    every process (render workers included)."""
    hook = tmp_path / "sitecustomize.py"
    log = tmp_path / "imports.log"
    hook.write_text(
        "import os, sys\n"
        "def _hook(event, args):\n"
        "    if event == 'import' and args[0] == 'onnxruntime':\n"
        f"        with open({str(log)!r}, 'a') as f:\n"
        "            f.write(f\"{os.getpid()} {os.environ.get('ORT_DISABLE_TELEMETRY')}\\n\")\n"
        "sys.addaudithook(_hook)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{os.environ.get('PYTHONPATH', '')}"}
    env.pop("ORT_DISABLE_TELEMETRY", None)
    proc = subprocess.run([sys.executable, "-m", "batchocr.cli", "run", str(SAMPLES / "receipt.png"),
                           str(tmp_path / "out"), "-q"], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = log.read_text().split()
    pids, values = lines[0::2], lines[1::2]
    # Only the engine's process loads it: render workers keep PyMuPDF's extras out.
    assert len(set(pids)) == 1
    assert set(values) == {"1"}


def test_vllm_engines_start_with_their_usage_reports_off(tmp_path):
    """vLLM sends its usage (GPU, model architecture, settings) to stats.vllm.ai from every
    engine unless VLLM_NO_USAGE_STATS, VLLM_DO_NOT_TRACK or DO_NOT_TRACK is set: every engine
    of a run, in each part's process, starts with them set, though the user's environment has
    none (the stand-in notes what its engines saw)."""
    import json

    import fake_vllm

    builds = tmp_path / "builds.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("VLLM_NO_USAGE_STATS", "VLLM_DO_NOT_TRACK", "DO_NOT_TRACK")}
    env |= {"PYTHONPATH": fake_vllm.pythonpath(tmp_path / "shim"), "BATCHOCR_FAKE_BUILDS": str(builds)}
    proc = subprocess.run([sys.executable, "-m", "batchocr.cli", "run", str(SAMPLES), str(tmp_path / "out"),
                           "--engine", "vllm", "--model", "fake-model", "--route", "model", "--processes", "2", "-q"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    seen = [json.loads(line) for line in builds.read_text().splitlines() if '"t0"' in line]
    assert len(seen) == 2 and {(b["no_usage_stats"], b["do_not_track"]) for b in seen} == {("1", "1")}


def test_a_run_makes_no_network_connection(tmp_path):
    """strace every process of a real rapidocr run: no connect() or DNS query leaves
    the machine (this caught onnxruntime's telemetry)."""
    try:
        strace = tools.strace()
    except tools.Unavailable as e:
        pytest.skip(str(e))
    trace = tmp_path / "trace"
    env = {k: v for k, v in os.environ.items() if k != "ORT_DISABLE_TELEMETRY"}
    proc = subprocess.run(
        # --seccomp-bpf: the traced processes stop at the traced calls only, not at every call
        [strace, "-f", "--seccomp-bpf", "-qq", "-e", "trace=connect,sendto,sendmsg,sendmmsg", "-o", str(trace),
         sys.executable, "-m", "batchocr.cli", "run", str(SAMPLES), str(tmp_path / "out"), "-q"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    calls = [line for line in trace.read_text().splitlines() if "AF_INET" in line or "htons(53)" in line]
    outbound = [line for line in calls if not LOOPBACK.search(line)]
    assert outbound == []
    assert "events" not in trace.read_text()


@pytest.fixture
def http_samples():
    """SAMPLES over HTTP on a loopback port, each file only to a signed request (a `sig=` in
    its query, as a blob store wants a SAS)."""
    import functools
    import http.server
    import threading

    class Signed(http.server.SimpleHTTPRequestHandler):
        def send_head(self):
            if self.path.startswith("/status/"):  # /status/503/...: that answer, whatever the signature
                self.send_error(int(self.path.split("/")[2]), "as asked")
                return None
            if "sig=" not in self.path.partition("?")[2]:
                self.send_error(403, "no signature")
                return None
            return super().send_head()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Signed, directory=str(SAMPLES)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_signed_source_url_writes_no_signature_and_keeps_its_identity(http_samples, tmp_path):
    """A SAS URL as SOURCE: its query is a credential. No file under OUT holds it (run
    record, plan, rows), source_uri is the URL without it, and a new signature is the same
    document (nothing to do). The query is no part of the file name either: `.pdf?sv=...`
    is a PDF."""
    from batchocr.sources import doc_id
    from conftest import read_table, run_cli

    out = tmp_path / "out"
    uri = f"{http_samples}/report.pdf"
    for sig in ("TOPSECRETSIG1", "TOPSECRETSIG2"):
        proc = run_cli("run", f"{uri}?sv=2024-11-04&se=2030-01-01&sp=r&sig={sig}", str(out),
                       "--engine", "textlayer", "-q", check=True)
        assert ("done: 1 document, 3 pages (0 errors" if sig.endswith("1") else "nothing to do") in proc.stdout, proc.stdout
    run_cli("plan", f"{uri}?sv=1&sig=TOPSECRETSIG3", str(tmp_path / "planned"), "--shards", "1", check=True)
    run_cli("run", f"{uri}?sv=1&sig=TOPSECRETSIG3", str(tmp_path / "planned"), "--engine", "textlayer", "-q",
            check=True)  # read with the signature the plan does not hold
    for folder in (out, tmp_path / "planned"):
        rows = read_table(folder).to_pylist()
        assert sorted((r["source_uri"], r["doc_id"], r["page_index"], r["error_type"]) for r in rows) == [
            (uri, doc_id(uri), i, None) for i in range(3)]
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert b"TOPSECRET" not in path.read_bytes(), path


def test_an_http_source_that_cannot_be_reached_is_exit_1_not_missing(http_samples, tmp_path):
    """fsspec's HTTP exists() answers False for any error: a refused connection or a 503 was
    "SOURCE ... does not exist", exit 2 (retrying cannot help), where a retry may. The line
    names neither the signature nor the whole aiohttp message (it holds the URL)."""
    import socket

    from conftest import run_cli

    with socket.socket() as sock:  # a loopback port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    cases = [
        (f"{closed}/report.pdf?sv=1&sig=TOPSECRETSIG", 1, f"Error: {closed}/report.pdf: checking it exists: "
                                                          "ConnectionError: ClientConnectorError: Connect call failed"),
        (f"{http_samples}/status/503/docs/?sig=TOPSECRETSIG", 1,
         f"Error: {http_samples}/status/503/docs: checking it exists: ConnectionError: HTTP 503 as asked"),
        (f"{http_samples}/report.pdf", 2,  # unsigned: the server's 403
         f"Error: {http_samples}/report.pdf: checking it exists: access denied (HTTP 403 no signature)"),
        (f"{http_samples}/nothere.pdf?sig=TOPSECRETSIG", 2, "Error: SOURCE "),
    ]
    for source, code, line in cases:
        proc = run_cli("run", source, str(tmp_path / "out"), "--engine", "textlayer", "-q")
        assert proc.returncode == code and proc.stderr.startswith(line), (source, proc.returncode, proc.stderr)
        assert len(proc.stderr.splitlines()) == 1 and "TOPSECRET" not in proc.stderr, proc.stderr
    assert proc.stderr.rstrip().endswith("does not exist"), proc.stderr  # a 404 is a missing SOURCE still


def test_a_large_document_from_a_server_that_ignores_ranges_is_read_whole(tmp_path):
    """A document over DOWNLOAD_CHUNK is read a byte range at a time; Python's http.server
    ignores Range and answers each with the whole file: the first answer is the document,
    not the first of several copies joined."""
    import functools
    import http.server
    import threading

    from batchocr.storage import DOWNLOAD_CHUNK, Store

    data = os.urandom(DOWNLOAD_CHUNK * 2 + 12345)
    (tmp_path / "big.pdf").write_bytes(data)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        calls = []
        store = Store(f"http://127.0.0.1:{server.server_address[1]}/big.pdf")
        assert store.read_document(progress=lambda: calls.append(1)) == data and calls == [1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_single_file_source_that_is_no_document_is_refused(tmp_path):
    from conftest import run_cli

    (tmp_path / "README.md").write_text("not a scan")
    proc = run_cli("run", str(tmp_path / "README.md"), str(tmp_path / "out"), "--engine", "textlayer", "-q")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == (f"Error: SOURCE {tmp_path / 'README.md'} is a file batchocr does not read: expected a "
                           f"folder or a pdf, tif, tiff, png, jpg, jpeg file\n")
    # Refused before anything is written to OUT: its settings and a run record held OUT to
    # this run's engine, and the next run with another was exit 2 over an OUT of no pages.
    assert not (tmp_path / "out").exists()
    (tmp_path / "a.pdf").write_bytes((SAMPLES / "report.pdf").read_bytes())
    proc = run_cli("run", str(tmp_path / "a.pdf"), str(tmp_path / "out"), "--engine", "rapidocr", "--route",
                   "textlayer", "-q")
    assert proc.returncode == 0, proc.stderr
