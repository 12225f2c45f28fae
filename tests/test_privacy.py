"""A run over private documents makes no outbound connection."""

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
        [strace, "-f", "-qq", "-e", "trace=connect,sendto,sendmsg,sendmmsg", "-o", str(trace),
         sys.executable, "-m", "batchocr.cli", "run", str(SAMPLES), str(tmp_path / "out"), "-q"],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    calls = [line for line in trace.read_text().splitlines() if "AF_INET" in line or "htons(53)" in line]
    outbound = [line for line in calls if not LOOPBACK.search(line)]
    assert outbound == []
    assert "events" not in trace.read_text()
