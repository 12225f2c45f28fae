"""CPU benchmark: batchocr (rapidocr engine) against rapidocr called directly, and
the engine's page geometry (reading order, deskew, rescale) against the engine
without it.

    python bench/cpu.py [--copies K] [--repeat R] [--threads N] [--workers W] [--json FILE]

In one process run (a noisy machine makes only ratios within one run mean much):

* corpus: the committed samples (samples/*.pdf|png|jpg|tiff: 10 pages, 7 scanned,
  3 born-digital) copied K times under distinct names into a temp folder, so
  every copy is a distinct document;
* "raw": every page rendered once in-process with batchocr.render.render_document
  (the run's RenderSpec), the pixels kept, then ONLY the calls to a warmed-up
  rapidocr.RapidOCR (the engine's parameters, RGB -> BGR like the engine; warmed
  with one untimed call per distinct page size) are timed: the best a direct
  caller could do, render and model load excluded;
* "batchocr": batchocr.pipeline.run_job over the same corpus into a fresh OUT,
  wall time end to end: engine construction (model load, first-call warm-up),
  render worker spawn, rendering, OCR, Parquet commits, run record; the engine
  with reading_order, deskew and rescale off (the rapidocr steps alone);
* "layout": the same run with the engine's defaults (reading order, deskew and
  rescale on);
* the three alternate (raw, batchocr, layout, raw, ...) --repeat times; the
  figures are the medians of the per-round ratios batchocr pages/s / raw
  pages/s and layout pages/s / batchocr pages/s (goal >= 0.9x for both);
* correctness: batchocr wrote one row per rendered page, and its text equals
  join_lines() of the raw rapidocr output for every (doc, page) after whitespace
  normalisation.

Heavy imports stay inside functions: render workers are spawned, and a spawned
child re-imports this file as __mp_main__.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
SAMPLE_TYPES = (".pdf", ".png", ".jpg", ".tiff")


class CpuMeter:
    """CPU seconds used on the whole machine by processes other than this one and its
    reaped children (render workers are joined, so they count as ours), and steal
    time, over one measurement: a shared, noisy machine shows up here."""

    def __init__(self):
        self.start = self._read()

    @staticmethod
    def _read() -> tuple[float, float, float]:
        try:
            fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        except (OSError, ValueError):
            return (0.0, 0.0, 0.0)
        tick = os.sysconf("SC_CLK_TCK")
        user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return (user + nice + system + irq + softirq) / tick, steal / tick, own

    def stop(self) -> dict:
        end = self._read()
        busy, steal, own = (b - a for a, b in zip(self.start, end))
        return {"own_cpu_s": round(own, 2), "other_cpu_s": round(max(0.0, busy - own), 2), "steal_s": round(steal, 2)}


def wait_quiet(max_wait_s: float, share: float = 0.10, window_s: float = 2.0) -> float:
    """Wait (up to max_wait_s) until other processes use less than `share` of the
    machine's CPUs over a window; the seconds waited."""
    start = time.monotonic()
    cpus = os.cpu_count() or 1
    while time.monotonic() - start < max_wait_s:
        meter = CpuMeter()
        time.sleep(window_s)
        if meter.stop()["other_cpu_s"] < share * cpus * window_s:
            break
    return time.monotonic() - start


def disturbed(run: dict, share: float = 0.10) -> bool:
    """Other processes used >= share of the machine's CPUs during either half of a pair."""
    cpus = os.cpu_count() or 1
    return any(run[k]["cpu"]["other_cpu_s"] >= share * cpus * run[k]["seconds"] for k in ("raw", "batchocr", "layout"))


def build_corpus(folder: Path, copies: int) -> list[Path]:
    """The committed samples, `copies` times, as c000-report.pdf, c001-report.pdf, ..."""
    samples = sorted(p for p in SAMPLES.iterdir() if p.suffix.lower() in SAMPLE_TYPES)
    if not samples:
        raise SystemExit(f"no samples in {SAMPLES}")
    folder.mkdir(parents=True)
    made = []
    for c in range(copies):
        for p in samples:
            dest = folder / f"c{c:03d}-{p.name}"
            shutil.copyfile(p, dest)
            made.append(dest)
    return made


def render_corpus(corpus: Path, render_spec) -> list[dict]:
    """Every page of the corpus as {doc_id, name, page_index, rgb}: rendered in-process,
    exactly as a render worker would (same function, same spec)."""
    import numpy as np

    from batchocr.render import RenderTask, render_document
    from batchocr.schema import Needs
    from batchocr.sources import list_documents
    from batchocr.storage import Store

    pages = []
    for doc in list_documents(Store(str(corpus))):
        for batch in render_document(RenderTask(doc), render_spec, Needs(image=True), {}):
            for row in batch.to_pylist():
                if row["error_type"] is not None:
                    raise SystemExit(f"render failed: {doc.uri}: {row['error_message']}")
                rgb = np.frombuffer(row["image"], dtype=np.uint8).reshape(row["height"], row["width"], 3)
                pages.append({"doc_id": row["doc_id"], "name": doc.name, "page_index": row["page_index"], "rgb": rgb})
    return pages


def make_rapidocr(threads: int):
    """rapidocr with the engine's parameters (batchocr/engines/rapidocr.py)."""
    from rapidocr import RapidOCR

    return RapidOCR(
        params={
            "Global.use_cls": False,
            "Global.text_score": 0.5,
            "Global.log_level": "warning",
            "EngineConfig.onnxruntime.intra_op_num_threads": threads,
            "EngineConfig.onnxruntime.inter_op_num_threads": 1,
        }
    )


def run_raw(ocr, pages: list[dict]) -> tuple[float, dict]:
    """Seconds spent in rapidocr calls only (BGR conversion included, like the engine),
    and the engine-joined text of each (doc_id, page_index)."""
    import numpy as np

    from batchocr.engines.rapidocr import join_lines

    texts, results = {}, []
    start = time.perf_counter()
    for p in pages:
        results.append(ocr(np.ascontiguousarray(p["rgb"][:, :, ::-1])))
    seconds = time.perf_counter() - start
    for p, out in zip(pages, results):  # joining is cheap; kept out of the timed loop
        text = "" if out.boxes is None or not out.txts else join_lines(out.boxes, out.txts)
        texts[(p["doc_id"], p["page_index"])] = text
    return seconds, texts


PLAIN = {"reading_order": False, "deskew": False, "rescale": False}


def run_batchocr(corpus: Path, out: Path, threads: int, render_spec, options: dict) -> tuple[float, dict, dict]:
    """Wall seconds of run_job end to end, the summary + run record, and the text of
    each (doc_id, page_index) as written to the page table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from batchocr.pipeline import run_job
    from batchocr.spec import JobSpec

    # route model: every page to rapidocr, the same work as the raw calls (bench/route.py weighs routing)
    spec = JobSpec(source=str(corpus), out=str(out), engine="rapidocr", route="model",
                   engines={"rapidocr": {"threads": threads, **options}}, render=render_spec)
    start = time.perf_counter()
    summary = run_job(spec, progress=False)
    seconds = time.perf_counter() - start

    parts = sorted((out / "pages").rglob("*.parquet"))
    table = pa.concat_tables([pq.read_table(p) for p in parts]).to_pydict()
    rows = list(zip(table["doc_id"], table["page_index"], table["text"], table["finish_reason"], table["latency_ms"]))
    texts = {(d, i): t for d, i, t, _, _ in rows}
    record = json.loads(next((out / "_runs").glob("*.json")).read_text())
    info = {
        "summary_seconds": summary.seconds,
        "pages": summary.pages,
        "rows": len(rows),
        "distinct_keys": len(texts),
        "not_stop": sum(r[3] != "stop" for r in rows),
        "latency_s": sum(r[4] or 0.0 for r in rows) / 1000,
        "timings": record["timings"],
        "parts": len(record["parts"]),
    }
    return seconds, info, texts


def compare(raw: dict, got: dict) -> dict:
    from batchocr.evaluate import normalise

    missing = sorted(set(raw) - set(got))
    extra = sorted(set(got) - set(raw))
    common = set(raw) & set(got)
    exact_diff = sum(raw[k] != got[k] for k in common)
    norm_diff = sorted(k for k in common if normalise(raw[k] or "") != normalise(got[k] or ""))
    return {"missing": len(missing), "extra": len(extra), "differ_exact": exact_diff,
            "differ_normalised": len(norm_diff), "differ_examples": [list(k) for k in norm_diff[:5]]}


def _version(name: str) -> str | None:
    """None where it is not installed as a distribution (the GPU machine: batchocr on PYTHONPATH, no rapidocr)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def machine_info(threads: int, workers: int) -> dict:
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10).stdout.strip() or None
        dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "batchocr"],
                                    capture_output=True, text=True, timeout=10).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = None, None
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {n: _version(n) for n in ("batchocr", "rapidocr", "onnxruntime", "pymupdf", "pyarrow", "numpy")},
        "git_commit": commit,
        "batchocr_dirty": dirty,
        "threads": threads,
        "render_workers": workers,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--copies", type=int, default=3, help="copies of the 10-page sample set [3: 30 pages]")
    ap.add_argument("--repeat", type=int, default=2, help="raw/batchocr pairs, undisturbed by other load [2]")
    ap.add_argument("--threads", type=int, default=0, help="onnxruntime intra-op threads, both paths [0: one per CPU, the engine default]")
    ap.add_argument("--workers", type=int, default=None, help="render workers [the RenderSpec default: one per CPU, at most 4]")
    ap.add_argument("--batch-pages", type=int, default=None, help="pages per render batch [the RenderSpec default]")
    ap.add_argument("--wait-quiet", type=float, default=60.0, metavar="S",
                    help="before each measurement, wait up to S seconds for other processes to use "
                         "< 10%% of the CPUs [60; 0: don't wait]")
    ap.add_argument("--max-pairs", type=int, default=0, metavar="N",
                    help="run further pairs, up to N in all, until --repeat pairs were undisturbed by "
                         "other load [0: 2 x --repeat]")
    ap.add_argument("--json", type=Path, help="write the figures and machine info here")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (corpus and OUTs)")
    args = ap.parse_args(argv)
    if args.copies < 1 or args.repeat < 1 or args.threads < 0:
        ap.error("--copies and --repeat must be >= 1, --threads >= 0")
    args.max_pairs = args.max_pairs or 2 * args.repeat

    os.environ["ORT_DISABLE_TELEMETRY"] = "1"  # before onnxruntime loads, like the engine
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that the temp folder is removed
    from batchocr.spec import RenderSpec

    overrides = {k: v for k, v in (("workers", args.workers), ("batch_pages", args.batch_pages)) if v is not None}
    render_spec = RenderSpec(**overrides)
    from batchocr.cpus import available_cpus

    threads = args.threads or available_cpus()  # what the engine resolves 0 to
    info = machine_info(threads, render_spec.worker_count)

    tmp = Path(tempfile.mkdtemp(prefix="batchocr-bench-"))
    try:
        corpus = tmp / "corpus"
        files = build_corpus(corpus, args.copies)
        t = time.perf_counter()
        pages = render_corpus(corpus, render_spec)
        render_s = time.perf_counter() - t
        n = len(pages)
        scans = sum(not p["name"].endswith("report.pdf") for p in pages)
        print(f"corpus: {len(files)} documents, {n} pages ({scans} scanned, {n - scans} born-digital, all OCRed), "
              f"rendered in-process in {render_s:.1f} s", file=sys.stderr)
        print(f"machine: {info['cpu_count']} CPUs, {info['cpu_model']}; onnxruntime threads {threads}, "
              f"render workers {render_spec.worker_count}, batch_pages {render_spec.batch_pages}", file=sys.stderr)

        t = time.perf_counter()
        ocr = make_rapidocr(threads)
        load_s = time.perf_counter() - t
        # Warm-up: onnxruntime pays a first-call cost per session and again per new
        # input shape, so one call per distinct page size; then every raw repeat
        # runs on an equally warm session (the best case for a direct caller).
        import numpy as np

        shapes = {p["rgb"].shape: p for p in pages}
        t = time.perf_counter()
        for p in shapes.values():
            ocr(np.ascontiguousarray(p["rgb"][:, :, ::-1]))
        warm_s = time.perf_counter() - t
        print(f"raw: model load {load_s:.2f} s, warm-up {len(shapes)} calls (one per page size) {warm_s:.2f} s "
              f"(both untimed)", file=sys.stderr)

        runs, reference = [], None
        max_pairs = max(args.repeat, args.max_pairs)
        r = 0
        while sum(not run["disturbed"] for run in runs) < args.repeat and r < max_pairs:
            r += 1
            waited = wait_quiet(args.wait_quiet)
            meter = CpuMeter()
            raw_s, raw_texts = run_raw(ocr, pages)
            raw_cpu = meter.stop() | {"waited_quiet_s": round(waited, 1)}
            if reference is None:
                reference = raw_texts
            raw_vs_first = compare(reference, raw_texts)
            print(f"[{r}] raw      {raw_s:7.1f} s  {n / raw_s:.3f} pages/s  cpu {raw_cpu}", file=sys.stderr)

            waited = wait_quiet(args.wait_quiet)
            meter = CpuMeter()
            b_s, b_info, b_texts = run_batchocr(corpus, tmp / f"out-{r}", args.threads, render_spec, PLAIN)
            b_cpu = meter.stop() | {"waited_quiet_s": round(waited, 1)}
            check = compare(raw_texts, b_texts)
            print(f"[{r}] batchocr {b_s:7.1f} s  {n / b_s:.3f} pages/s  ratio {raw_s / b_s:.3f}x  "
                  f"(engine latency sum {b_info['latency_s']:.1f} s, {b_info['timings']}) cpu {b_cpu}", file=sys.stderr)

            waited = wait_quiet(args.wait_quiet)
            meter = CpuMeter()
            l_s, l_info, _ = run_batchocr(corpus, tmp / f"layout-{r}", args.threads, render_spec, {})
            l_cpu = meter.stop() | {"waited_quiet_s": round(waited, 1)}
            print(f"[{r}] layout   {l_s:7.1f} s  {n / l_s:.3f} pages/s  vs batchocr {b_s / l_s:.3f}x  "
                  f"(engine latency sum {l_info['latency_s']:.1f} s) cpu {l_cpu}", file=sys.stderr)
            runs.append({
                "repeat": r,
                "raw": {"seconds": round(raw_s, 3), "pages_per_s": round(n / raw_s, 4),
                        "differ_from_first_raw": raw_vs_first["differ_exact"], "cpu": raw_cpu},
                "batchocr": {"seconds": round(b_s, 3), "pages_per_s": round(n / b_s, 4),
                             "summary_seconds": round(b_info["summary_seconds"], 3),
                             "ocr_latency_sum_s": round(b_info["latency_s"], 3),
                             "rows": b_info["rows"], "not_stop": b_info["not_stop"], "parts": b_info["parts"],
                             "timings": b_info["timings"], "vs_raw": check, "cpu": b_cpu,
                             # start-up (engine load, worker spawn), Arrow conversions, pool shutdown
                             "other_s": round(b_s - b_info["latency_s"] - b_info["timings"]["render_wait_s"]
                                              - b_info["timings"]["write_s"], 3)},
                "ratio": round(raw_s / b_s, 4),
                "layout": {"seconds": round(l_s, 3), "pages_per_s": round(n / l_s, 4),
                           "ocr_latency_sum_s": round(l_info["latency_s"], 3), "rows": l_info["rows"],
                           "not_stop": l_info["not_stop"], "cpu": l_cpu},
                "layout_ratio": round(b_s / l_s, 4),
            })
            runs[-1]["disturbed"] = disturbed(runs[-1])
            if runs[-1]["disturbed"]:
                print(f"[{r}] disturbed by other load: not counted"
                      + (", running another pair" if r < max_pairs else ""), file=sys.stderr)
        del ocr
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    quiet = [run for run in runs if not run["disturbed"]]
    ratio = statistics.median(run["ratio"] for run in (quiet or runs))
    layout_ratio = statistics.median(run["layout_ratio"] for run in (quiet or runs))
    ok_rows = all(run["batchocr"]["rows"] == n and run["batchocr"]["not_stop"] == 0
                  and run["layout"]["rows"] == n and run["layout"]["not_stop"] == 0
                  and run["batchocr"]["vs_raw"]["missing"] == 0 and run["batchocr"]["vs_raw"]["extra"] == 0
                  for run in runs)
    differ = max(run["batchocr"]["vs_raw"]["differ_normalised"] for run in runs)

    print()
    print(f"{'run':>3}  {'path':<9} {'pages':>5} {'seconds':>8} {'pages/s':>8} {'other CPU-s':>11}  notes")
    for run in runs:
        raw, b = run["raw"], run["batchocr"]
        print(f"{run['repeat']:>3}  {'raw':<9} {n:>5} {raw['seconds']:>8.1f} {raw['pages_per_s']:>8.3f} "
              f"{raw['cpu']['other_cpu_s']:>11.1f}  OCR calls only")
        tm = b["timings"]
        print(f"{run['repeat']:>3}  {'batchocr':<9} {n:>5} {b['seconds']:>8.1f} {b['pages_per_s']:>8.3f} "
              f"{b['cpu']['other_cpu_s']:>11.1f}  "
              f"wall = OCR {b['ocr_latency_sum_s']:.1f} + render wait {tm['render_wait_s']:.1f} "
              f"+ write {tm['write_s']:.2f} + other {b['other_s']:.1f} s; ratio {run['ratio']:.3f}x")
        lay = run["layout"]
        print(f"{run['repeat']:>3}  {'layout':<9} {n:>5} {lay['seconds']:>8.1f} {lay['pages_per_s']:>8.3f} "
              f"{lay['cpu']['other_cpu_s']:>11.1f}  OCR {lay['ocr_latency_sum_s']:.1f} s; "
              f"layout/batchocr {run['layout_ratio']:.3f}x")
    print()
    pairs = ", ".join(format(run["ratio"], ".3f") + ("*" if run["disturbed"] else "") for run in runs)
    print(f"median ratio batchocr/raw: {ratio:.3f}x (goal >= 0.9x), per pair [{pairs}]"
          + (f"; median of the {len(quiet)} undisturbed pairs" if quiet and len(quiet) < len(runs) else "")
          + ("; WARNING: every pair was disturbed by other load" if not quiet else ""))
    print(f"median ratio layout/batchocr (reading order, deskew, rescale on / off): {layout_ratio:.3f}x (goal >= 0.9x), "
          f"per round [{', '.join(format(run['layout_ratio'], '.3f') + ('*' if run['disturbed'] else '') for run in runs)}]")
    counted = quiet or runs
    print(f"median pages/s: raw {statistics.median(run['raw']['pages_per_s'] for run in counted):.3f}, "
          f"batchocr {statistics.median(run['batchocr']['pages_per_s'] for run in counted):.3f} "
          f"(batchocr wall includes engine construction, render worker spawn and the first-call warm-up)")
    print("*: disturbed (other processes used >= 10% of the CPUs during the raw or batchocr half)")
    print("other CPU-s: CPU seconds used meanwhile by other processes on the machine (noise; 0 is quiet)")
    print(f"correctness: rows {'= pages, all finish_reason stop' if ok_rows else '!= pages or not all stop'} ({n}); "
          f"texts differing from raw after whitespace normalisation: {differ} of {n}")

    if args.json:
        figures = {
            "command": " ".join(["python", "bench/cpu.py", *(argv if argv is not None else sys.argv[1:])]),
            "machine": info,
            "corpus": {"copies": args.copies, "documents": len(files), "pages": n, "scanned_pages": scans,
                       "render_in_process_s": round(render_s, 3)},
            "render": {"workers": render_spec.worker_count, "batch_pages": render_spec.batch_pages,
                       "dpi": render_spec.dpi},
            "raw_model_load_s": round(load_s, 3),
            "raw_warmup_calls": len(shapes),
            "raw_warmup_s": round(warm_s, 3),
            "runs": runs,
            "median_ratio": round(ratio, 4),
            "median_layout_ratio": round(layout_ratio, 4),
            "median_over": "undisturbed pairs" if quiet else "all pairs (all disturbed)",
            "rows_equal_pages": ok_rows,
            "texts_differing_normalised": differ,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if ok_rows and differ == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
