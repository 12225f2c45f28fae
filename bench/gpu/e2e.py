"""`batchocr run --engine vllm` for real on one GPU, then a SIGTERM mid-run and the resume.

    python bench/gpu/e2e.py --models /tmp/models --work /tmp/e2e --json $OUT/e2e.json

Needs vLLM (see bench/gpu/README.md) and the model folders of make_models.py. Runs:
1. the Qwen2.5-VL-7B layout (random weights) over --pages A4 pages: one row per
   page, token counts filled;
2. the Qwen2-VL-2B layout over the same pages, SIGTERM once some parts are
   committed: exit 75; the rerun completes: no page missing, none twice;
3. (issue 21) the Unlimited-OCR layout over the same pages, vLLM's engine-core process killed
   with SIGKILL once some parts are committed: the run stops within seconds with one line,
   exit 1, its record `failed`; the committed pages stay; the rerun completes the shard,
   every page once.
4. the Unlimited-OCR layout in two parts under the run's own MPS daemon (`processes: 2`,
   engines.vllm.mps unset: on where nvidia-cuda-mps-control is on PATH), the run's own process
   killed with SIGKILL once some parts are committed: its parts and their engine cores die with
   it and free the GPU (batchocr.engines.vllm.reaper);
   the daemon, which SIGKILL gave no chance to quit, is left; the rerun tells it to quit
   (batchocr.engines.vllm.mps._reap), completes the shard, every page once, and leaves no daemon.

    python bench/gpu/e2e.py --skip full,sigterm --json $OUT/kill.json   # 3. alone
    python bench/gpu/e2e.py --skip full,sigterm,kill --json $OUT/mpskill.json   # 4. alone
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))


def a4_corpus(folder: Path, documents: int, pages: int) -> int:
    return a4_documents(folder, [pages] * documents)


def a4_documents(folder: Path, counts: list[int]) -> int:
    """Born-digital A4 documents, doc0000.pdf on, of counts[d] pages each (40 lines of 10 pt)."""
    import pymupdf
    from corpus import page_text

    folder.mkdir(parents=True, exist_ok=True)
    for d, pages in enumerate(counts):
        doc = pymupdf.open()
        for p in range(pages):
            page = doc.new_page(width=595, height=842)
            page.insert_textbox(pymupdf.Rect(50, 50, 545, 800), page_text(d * 1000 + p, lines=40), fontsize=10)
        doc.save(folder / f"doc{d:04d}.pdf")
    return sum(counts)


def job(path: Path, src: Path, out: Path, model: Path, max_tokens: int, every_pages: int,
        preset: str = "qwen2.5-vl", extra: str = "    max_model_len: 4096\n") -> Path:
    path.write_text(
        f"source: {src}\nout: {out}\nengine: vllm\nroute: model\n"  # born-digital pages: the model reads them all
        f"engines:\n  vllm:\n    model: {model}\n    preset: {preset}\n    load_format: dummy\n"
        f"    ignore_eos: true\n    max_tokens: {max_tokens}\n{extra}"
        f"    gpu_memory_utilization: 0.85\n"
        f"render: {{workers: 6}}\ncommit: {{every_pages: {every_pages}, every_seconds: 20}}\n"
    )
    return path


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "batchocr.cli", "run", *args, "--quiet"]


def check(out: Path, pages: int, max_tokens: int) -> dict:
    table = pq.read_table(out / "pages", partitioning=None)
    keys = list(zip(table["doc_id"].to_pylist(), table["page_index"].to_pylist()))
    tokens = table["output_tokens"].to_pylist()
    prompts = table["prompt_tokens"].to_pylist()
    return {
        "rows": table.num_rows, "pages": pages, "unique_keys": len(set(keys)),
        "finish_reasons": sorted(set(table["finish_reason"].to_pylist())),
        "output_tokens_all_max": all(t == max_tokens for t in tokens),
        "prompt_tokens_min": min(p for p in prompts if p is not None) if any(prompts) else None,
        "text_rows": sum(t is not None and len(t) > 0 for t in table["text"].to_pylist()),
        "first_error": next((m for m in table["error_message"].to_pylist() if m), None),
        "ok": table.num_rows == pages == len(set(keys)) and all(t == max_tokens for t in tokens),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", type=Path, default=Path("/tmp/models"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/e2e"))
    ap.add_argument("--documents", type=int, default=64)
    ap.add_argument("--pages-per-doc", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--skip", default="", help="comma list of steps to skip: full,sigterm,kill,mpskill")
    args = ap.parse_args()
    report: dict = {}
    src = args.work / "src"
    pages = a4_corpus(src, args.documents, args.pages_per_doc)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}

    def save():
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))

    if "full" not in args.skip:
        out = args.work / "out7b"
        spec = job(args.work / "job7b.yaml", src, out, args.models / "qwen2.5-vl-7b", args.max_tokens, 128)
        t0 = time.monotonic()
        proc = subprocess.run(cli("--job", str(spec)), capture_output=True, text=True, env=env, timeout=560)
        report["full_7b"] = {"command": f"batchocr run --job {spec} --quiet", "exit": proc.returncode,
                             "wall_s": round(time.monotonic() - t0, 1), "stdout": proc.stdout[-2000:],
                             "stderr_tail": proc.stderr[-3000:]}
        if proc.returncode == 0:
            report["full_7b"]["check"] = check(out, pages, args.max_tokens)
            (record,) = [json.loads(p.read_text()) for p in (out / "_runs").glob("*.json")]
            report["full_7b"]["record"] = {k: record[k] for k in ("counts", "timings", "pages_per_s", "render")}
        print(json.dumps(report["full_7b"].get("check"), indent=1), proc.stdout, flush=True)
        save()

    if "sigterm" not in args.skip:
        out = args.work / "out2b"
        spec = job(args.work / "job2b.yaml", src, out, args.models / "qwen2-vl-2b", args.max_tokens, 32)
        proc, parts_before = start_until_parts(spec, out, env, poll=0.5)
        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
        first = {"exit": proc.returncode, "seconds_to_exit_after_sigterm": round(time.monotonic() - t_term, 1),
                 "parts_when_signalled": parts_before, "stderr_tail": stderr[-1500:]}
        committed = pq.read_table(out / "pages", partitioning=None).num_rows
        first["rows_committed"] = committed
        m = re.search(r"\(run (\S+)\)", stderr)
        if m:
            record = json.loads((out / "_runs" / f"{m.group(1)}.json").read_text())
            first["record_status"], first["record_pages"] = record["status"], record["counts"]["pages"]
        again = rerun(spec, env)
        report["sigterm_2b"] = {"first": first, "rerun": again, "check": check(out, pages, args.max_tokens)}
        print(json.dumps(report["sigterm_2b"]["check"], indent=1), json.dumps(first, indent=1), again["stdout"], flush=True)
        save()

    if "kill" not in args.skip:
        report["engine_kill_uocr"] = engine_kill(args, src, pages, env)
        print(json.dumps(report["engine_kill_uocr"], indent=1), flush=True)
        save()

    if "mpskill" not in args.skip:
        report["run_kill_mps_uocr"] = run_kill_mps(args, src, pages, env)
        print(json.dumps(report["run_kill_mps_uocr"], indent=1), flush=True)
        save()


def start_until_parts(spec: Path, out: Path, env: dict, poll: float, parts: int = 2) -> tuple[subprocess.Popen, int]:
    """`batchocr run --job spec` started, once `parts` parts are committed under out (or it
    ended, or 300 s passed): the process and the parts there then."""
    proc = subprocess.Popen(cli("--job", str(spec)), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 300
    while len(list(out.glob("pages/**/*.parquet"))) < parts and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(poll)
    return proc, len(list(out.glob("pages/**/*.parquet")))


def rerun(spec: Path, env: dict) -> dict:
    """The same run again, to completion: its exit, output tails and time."""
    t0 = time.monotonic()
    proc = subprocess.run(cli("--job", str(spec)), capture_output=True, text=True, env=env, timeout=400)
    return {"exit": proc.returncode, "stdout": proc.stdout[-1000:], "wall_s": round(time.monotonic() - t0, 1),
            "stderr_tail": proc.stderr[-1500:]}


def engine_core_pids(pid: int) -> list[int]:
    """vLLM's engine-core processes under a run (their title is VLLM::EngineCore)."""
    import psutil

    found = []
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.Error:
            pass
    return found


def engine_kill(args, src: Path, pages: int, env: dict) -> dict:
    out = args.work / "outkill"
    extra = '    engine_args: {attention_config: {backend: TRITON_ATTN}}\n'  # R-SWA: the kit's backend
    spec = job(args.work / "jobkill.yaml", src, out, args.models / "unlimited-ocr", args.max_tokens, 32,
               preset="unlimited-ocr", extra=extra)
    proc, parts = start_until_parts(spec, out, env, poll=0.2)
    cores = engine_core_pids(proc.pid) if proc.poll() is None else []
    t_kill = time.monotonic()
    for pid in cores:
        os.kill(pid, signal.SIGKILL)
    try:
        stdout, stderr = proc.communicate(timeout=120)
        hung = False
    except subprocess.TimeoutExpired:  # the failure this step looks for: kill it, say so
        proc.kill()
        stdout, stderr = proc.communicate()
        hung = True
    first = {"engine_core_pids": cores, "parts_when_killed": parts, "exit": proc.returncode, "hung": hung,
             "seconds_to_exit_after_kill": round(time.monotonic() - t_kill, 2),
             "stderr_lines_after_kill": [l for l in stderr.splitlines() if l.startswith(("batchocr", "Error"))][-3:],
             "stderr_tail": stderr[-1500:]}
    first["rows_committed"] = pq.read_table(out / "pages", partitioning=None).num_rows
    records = [json.loads(p.read_text()) for p in (out / "_runs").glob("*.json")]
    first["record_status"] = [r["status"] for r in records]
    return {"command": f"batchocr run --job {spec} --quiet; SIGKILL the engine core; the same again",
            "first": first, "rerun": rerun(spec, env), "check": check(out, pages, args.max_tokens)}


def mps_processes() -> list[dict]:
    """The machine's running MPS control daemons and servers: pid, name, and the pipe folder each
    serves. A daemon that has quit may stay a zombie (PID 1 of a container may never reap what it
    inherits): not one of them."""
    import psutil
    from chaos import running

    found = []
    for proc in psutil.process_iter(["pid", "name"]):
        if proc.info["name"] and proc.info["name"].startswith("nvidia-cuda-mps") and running(proc.info["pid"]):
            try:
                pipe = proc.environ().get("CUDA_MPS_PIPE_DIRECTORY")
            except psutil.Error:
                pipe = None
            found.append({"pid": proc.info["pid"], "name": proc.info["name"], "pipe": pipe})
    return found


def gpu_apps() -> list[str]:
    """nvidia-smi's compute processes (pid, name, memory), one line each."""
    done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=30)
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def run_folders() -> list[str]:
    """The MPS daemons' run folders (batchocr/engines/vllm/mps.py) in this machine's temporary folder."""
    import tempfile

    from batchocr.engines.vllm import mps

    return sorted(str(p) for p in Path(tempfile.gettempdir()).glob(mps.PREFIX + "*"))


def run_kill_mps(args, src: Path, pages: int, env: dict) -> dict:
    """Step 4: the run's own process killed with SIGKILL, its parts under the run's MPS daemon."""
    import psutil
    from chaos import still_running_after

    out = args.work / "outmps"
    extra = '    engine_args: {attention_config: {backend: TRITON_ATTN}}\n'  # R-SWA: the kit's backend
    spec = job(args.work / "jobmps.yaml", src, out, args.models / "unlimited-ocr", args.max_tokens, 32,
               preset="unlimited-ocr", extra=extra)
    spec.write_text(spec.read_text().replace("    gpu_memory_utilization: 0.85\n", "") + "processes: 2\n")
    before = {"mps": mps_processes(), "folders": run_folders()}
    proc, parts = start_until_parts(spec, out, env, poll=0.2)
    family = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)] if proc.poll() is None else []
    first = {"parts_when_killed": parts, "exited_before_kill": proc.poll(), "descendants": len(family),
             "mps_while_running": mps_processes(), "folders_while_running": run_folders(),
             "gpu_apps_while_running": gpu_apps()}
    t_kill = time.monotonic()
    proc.kill()  # the run's own process only: its parts and their engine cores must follow on their own
    proc.wait(timeout=60)  # not communicate(): an orphan holding the run's pipes would keep it waiting
    proc.stdout.close()
    proc.stderr.close()
    left = still_running_after(set(family), 120)
    first.update({"exit": proc.returncode, "descendants_alive_after": len(left),
                  "seconds_until_descendants_gone": round(time.monotonic() - t_kill, 1),
                  "mps_after_kill": mps_processes(), "folders_after_kill": run_folders(),
                  "gpu_apps_after_kill": gpu_apps()})
    first["rows_committed"] = pq.read_table(out / "pages", partitioning=None).num_rows
    again = rerun(spec, env)
    # The rerun's own daemon, told to quit as the run ends, exits a moment after it answers: a
    # sample at once can find it mid-exit, so up to 10 s for what is running then to go.
    at_the_end = {p["pid"] for p in mps_processes()}
    again["mps_at_the_end"] = len(at_the_end)
    still_running_after(at_the_end, 10)
    again.update({"mps_after": mps_processes(), "folders_after": run_folders(), "gpu_apps_after": gpu_apps()})
    killed_daemons = {p["pid"] for p in first["mps_after_kill"]}
    verdict = {
        "killed_mid_run": first["exited_before_kill"] is None and first["rows_committed"] < pages,
        "parts_followed_the_run": first["descendants"] > 0 and first["descendants_alive_after"] == 0,
        "daemon_ran_during_the_run": any(p["pipe"] for p in first["mps_while_running"]),
        "daemon_left_by_the_kill": bool(first["mps_after_kill"]),
        "rerun_reaped_it": not (killed_daemons & {p["pid"] for p in again["mps_after"]}),
        "no_daemon_or_folder_after_the_rerun": not again["mps_after"] and not again["folders_after"],
    }
    return {"command": f"batchocr run --job {spec} --quiet; SIGKILL the run's process; the same again",
            "before": before, "first": first, "rerun": again, "verdict": verdict,
            "check": check(out, pages, args.max_tokens)}


if __name__ == "__main__":
    main()
