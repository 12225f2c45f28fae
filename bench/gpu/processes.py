"""`batchocr run --processes N` against N = 1 on one GPU, at equal work: the whole command
(listing, render pools, engines, part files), Unlimited-OCR's layout with random weights.

    python bench/gpu/processes.py --models /tmp/models --work /tmp/proc --json $OUT/processes.json
    python bench/gpu/processes.py --fake --pages 64 --max-tokens 16 --work /tmp/procdry   # a dry run on the CPU

Every page generates exactly its length (ignore_eos; the repetition guard out of reach, one
attempt): --lengths A, --max-tokens for every page; B, throughput.py's lognormal (sigma 1,
mean ~1000, clipped to [50, 4000]) drawn from a hash of the page's doc_id and index, set by
a `sitecustomize` on the runs' path that wraps VLLMEngine.sampling in every process (the
parts are processes of their own). So each N does the same work: the same pages, the same
prompt and output tokens, one attempt each; the JSON records them and says whether they
are equal.
Three figures a run, each as pages/s and as a ratio against the first N of the same run:
the command's wall time (the engines' loads included: N > 1 builds its engines one after
the other), its rows' span (first committed row to last), and its steady window (the 20th
to the 80th percentile row). With them the GPU busy (NVML, every 100 ms) over the span and
the window, and the host memory peak of the whole process tree.
Each run starts as a fresh pod does (--caches fresh, the default): its own empty vLLM, Triton
and Inductor caches, so a later run does not load the compiled graphs and kernels of an
earlier one (a warm compile cache cut an engine's start from 93-104 s to 17 s:
docs/history/GPU.md, second lease). --caches seeded: the first run from empty caches, each
later one from a copy of what the first left, in the same place (a pod whose $HOME/.cache is
copied in from a volume before it starts). --caches shared leaves the machine's own. A run named
twice (2,2@48,2) is keyed 2, 2@48, 2#2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))
from batchocr.engines.vllm.compilecache import COMPLETE  # noqa: E402  (the compile cache's marker)
sys.path.insert(0, str(Path(__file__).parent))


def kv_of(item: str) -> tuple[str, tuple[float, float]]:
    """--processes' N, N@GIB or N%GIB: N and job()'s (kv_gib, kv_each_gib)."""
    n, how, gib = re.fullmatch(r"([^@%]+)([@%]?)(.*)", item).groups()
    return n, (float(gib or 0) if how == "@" else 0, float(gib or 0) if how == "%" else 0)


def job(path: Path, src: Path, out: Path, model: str, args, kv_gib: float = 0, kv_each_gib: float = 0,
        compile_cache: Path | None = None, processes: str | None = None) -> Path:
    """KV_GIB: kv_cache_gib (split over the parts, which build at once); KV_EACH_GIB: each engine's KV
    as vLLM's own kv_cache_memory_bytes (engine_args: the parts build in turn); COMPILE_CACHE:
    engines.vllm.compile_cache; PROCESSES: the spec's processes (else the command line's)."""
    engine_args = ([] if args.fake else ["attention_config: {backend: TRITON_ATTN}"]) + (  # the kit's R-SWA
        [f"kv_cache_memory_bytes: {int(kv_each_gib * 2**30)}"] if kv_each_gib else [])
    attention = f"    engine_args: {{{', '.join(engine_args)}}}\n" if engine_args else ""
    path.write_text(
        f"source: {src}\nout: {out}\nengine: vllm\nroute: model\n"  # born-digital pages: the model reads them all
        f"engines:\n  vllm:\n    model: {model}\n    preset: unlimited-ocr\n    load_format: dummy\n"
        f"    ignore_eos: true\n    max_tokens: {args.max_tokens}\n    max_attempts: 1\n"
        f"    repetition_span: 1000000\n    repetition_max_period: 1\n"  # never reached: random weights loop
        f"    mode: {args.mode}\n"
        + (f"    group_pages: {args.group_pages}\n    document_fallback: false\n"  # random weights write no <page>
           if args.mode == "document" else "") +
        f"    gpu_memory_utilization: {args.gpu_memory_utilization}\n{attention}"
        + (f"    kv_cache_gib: {kv_gib}\n" if kv_gib else "")
        + (f"    compile_cache: {compile_cache}\n" if compile_cache else "")
        + "".join(f"    {key}: {value}\n" for key, _, value in (kv.partition("=") for kv in args.vllm)) +
        "commit: {every_pages: 256, every_seconds: 30}\n"
        + (f"processes: {processes}\n" if processes else "")
    )
    return path


LENGTHS = '''"""bench/gpu/processes.py --lengths B: each page's output length, in every process."""
import importlib.abc
import importlib.util
import sys


class _Lengths(importlib.abc.MetaPathFinder):
    """Wraps batchocr.engines.vllm.VLLMEngine.sampling once that module is imported."""

    def find_spec(self, name, path, target=None):
        if name != "batchocr.engines.vllm":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            sys.path.insert(0, {gpu!r})
            from throughput import length_of

            sampling = module.VLLMEngine.sampling

            def with_lengths(self, request):
                sp = sampling(self, request)
                sp.max_tokens = sum(length_of(f"{{p.doc_id}}/{{p.page_index}}", "B", 0) for p in request.pages)
                return sp

            module.VLLMEngine.sampling = with_lengths

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Lengths())
'''


TRACE = '''
import os as _os

if _os.environ.get("BENCH_START_TRACE"):  # bench/gpu/processes.py --trace-start: where each process's start goes
    import sys as _sys
    import threading as _threading
    import time as _time

    _KEEP = ("batchocr/", "vllm/", "torch/", "transformers/", "pymupdf/", "multiprocessing/", "pyarrow/", "bench/",
             "polars/", "triton/", "fsspec/", "onnxruntime/", "rapidocr/", "numpy/")

    def _where(frame) -> str:
        """The main thread's innermost frames in the libraries a start spends its time in."""
        out = []
        while frame is not None and len(out) < 8:
            name = frame.f_code.co_filename
            cut = name.rfind("site-packages/")
            cut = cut + len("site-packages/") if cut >= 0 else max(name.rfind("/batchocr/"), name.rfind("/bench/")) + 1
            short = name[cut:] if cut > 0 else name.rsplit("/", 1)[-1]
            if any(k in short for k in _KEEP) or not out:
                out.append(f"{short}:{frame.f_code.co_name}:{frame.f_lineno}")
            frame = frame.f_back
        return " < ".join(out)

    def _trace(folder, until):
        main = _threading.main_thread().ident
        t0 = _time.time()
        with open(f"{folder}/{_os.getpid()}.txt", "a", buffering=1) as f:
            f.write(f"{t0:.3f} start ppid={_os.getppid()} {' '.join(_sys.argv)[:200]}\\n")
            while _time.time() - t0 < until:
                _time.sleep(0.2)
                frame = _sys._current_frames().get(main)
                if frame is None:
                    break
                f.write(f"{_time.time():.3f} {_where(frame)}\\n")

    _threading.Thread(target=_trace, args=(_os.environ["BENCH_START_TRACE"],
                                           float(_os.environ.get("BENCH_START_TRACE_S", "200"))),
                      daemon=True, name="bench-start-trace").start()
'''


def shim_of(work: Path, lengths: bool, trace: bool) -> list[str]:
    """A folder whose sitecustomize.py gives each page its lognormal length (--lengths B) and
    traces each process's start (--trace-start), in every process of a run; none where neither."""
    if not (lengths or trace):
        return []
    d = work / "shim"
    d.mkdir(parents=True, exist_ok=True)
    (d / "sitecustomize.py").write_text((LENGTHS.format(gpu=str(Path(__file__).parent)) if lengths else "")
                                        + (TRACE if trace else ""))
    return [str(d)]


def stand_in(work: Path) -> str:
    """A `vllm` package on the path that is tests/fake_vllm.py (for --fake)."""
    from fake_vllm import package

    return package(work / "shim")


def caches_of(root: Path, seed: Path | None = None) -> dict:
    """The environment of a run with caches of its own under root, emptied first (or a copy of
    seed): vLLM's (compiled graphs: VLLM_CACHE_ROOT under XDG_CACHE_HOME), Triton's kernels and
    Inductor's."""
    shutil.rmtree(root, ignore_errors=True)
    if seed is not None:
        shutil.copytree(seed, root, symlinks=True)
    dirs = {"XDG_CACHE_HOME": root, "TRITON_CACHE_DIR": root / "triton", "TORCHINDUCTOR_CACHE_DIR": root / "inductor"}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    return {k: str(v) for k, v in dirs.items()}


def without_root(cache: Path, dest: Path) -> Path:
    """A copy of the compile cache at `cache` at `dest` whose marker records no root: a run copies
    it into its own cache root, as every run did before batchocr recorded the path it was compiled in."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(cache, dest, symlinks=True)
    marker = dest / COMPLETE
    made = json.loads(marker.read_text())
    made.pop("root", None)
    marker.write_text(json.dumps(made, indent=1) + "\n")
    return dest


def cache_gained(root: Path, seed: Path | None, most: int = 40) -> dict:
    """What a run wrote into its cache root beyond the compile cache it was seeded from (all of it
    where none): files and MB by folder (vllm/'s three levels down, to the compile hash; the others'
    first, Triton's and Inductor's), the `most` largest, so that a build that still compiles or
    tunes what the compile cache lacks says where."""
    have = {f.relative_to(seed) for f in seed.rglob("*") if f.is_file()} if seed is not None and seed.is_dir() else set()
    by: dict[str, list] = {}
    for f in root.rglob("*"):
        rel = f.relative_to(root)
        if f.is_file() and not f.is_symlink() and rel not in have:
            depth = 3 if rel.parts[0] == "vllm" else 1
            key = "/".join(rel.parts[:min(depth, len(rel.parts) - 1)]) or "."
            entry = by.setdefault(key, [0, 0])
            entry[0] += 1
            entry[1] += f.stat().st_size
    ranked = sorted(by.items(), key=lambda kv: -kv[1][1])
    out = {k: {"files": n, "mb": round(b / 2**20, 2)} for k, (n, b) in ranked[:most]}
    if ranked[most:]:
        out["(the rest)"] = {"files": sum(n for _, (n, _) in ranked[most:]),
                             "mb": round(sum(b for _, (_, b) in ranked[most:]) / 2**20, 2)}
    return out


def work_of(out: Path, sampler=None, clock: float = 0.0, t0: float = 0.0) -> dict:
    """What a run did, from its table and run records; with a sampler (throughput.Sampler),
    the GPU busy and host memory over the rows' span and their steady window (the 20th to the
    80th percentile finish). clock: time.time() - time.monotonic() when the run started."""
    table = pq.read_table(out / "pages", partitioning=None)
    rows = table.to_pylist()
    at = sorted(r["processed_at"] for r in rows)
    records = [json.loads(p.read_text()) for p in (out / "_runs").glob("*.json")]
    attempts: dict[str, int] = {}
    for r in rows:
        attempts[str(r["attempts"])] = attempts.get(str(r["attempts"]), 0) + 1
    return {
        "rows": len(rows), "unique_pages": len({(r["doc_id"], r["page_index"]) for r in rows}),
        "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in rows),
        "output_tokens": sum(r["output_tokens"] or 0 for r in rows),
        "attempts": attempts, "finish_reasons": sorted({r["finish_reason"] for r in rows}),
        "first_error": next((r["error_message"] for r in rows if r["error_message"]), None),
        # engines.vllm.orient as the runs had it, and the pages it turned (skew_angle non-zero): a turned
        # page's image has other sides, so its prompt tokens differ from an unturned run's
        "orient": sorted({(r.get("engine_params") or {}).get("orient") for r in records}, key=str),
        "turned_pages": sum(1 for r in rows if r.get("skew_angle")),
        "rows_span_s": (at[-1] - at[0]).total_seconds() if at else None,
        "runs": [{k: r.get(k) for k in ("run_id", "status", "timings", "accelerator")} for r in records],
        **(window_of(at, sampler, clock) if at else {}),
        **(start_of(rows, clock, t0, records) if at else {}),
    }


def start_of(rows: list, clock: float, t0: float, records: list | None = None) -> dict:
    """The command's start, in seconds from t0 (its start, monotonic): to its first row, and to
    each part's (run_id's) first row: with parts built one after the other, the last part's is
    when the GPU first has them all. With the run records, each part's first page handed to its
    engine on the same clock (its record's first_request_s, on its own clock from its start,
    moved by the difference of the two first rows), and where the part's start went (its timings)."""
    first: dict = {}
    ends: dict = {}
    tokens: dict = {}
    by_10s: dict = {}
    for r in rows:
        t = r["processed_at"].timestamp() - clock - t0
        first[r["run_id"]] = min(first.get(r["run_id"], t), t)
        ends[r["run_id"]] = max(ends.get(r["run_id"], t), t)
        tokens[r["run_id"]] = tokens.get(r["run_id"], 0) + (r["output_tokens"] or 0)
        at = max(0, int(t // 10))
        by_10s[at] = by_10s.get(at, 0) + (r["output_tokens"] or 0)
    by_part = {k: round(v, 1) for k, v in sorted(first.items(), key=lambda kv: kv[1])}
    last = max(ends.values())
    # each part's last row and output tokens: how far apart the parts end (the later runs alone at the end)
    # and the output tokens of the rows written in each 10 s from the command's start: the fill and the drain
    bins = [by_10s.get(i, 0) for i in range(int(last // 10) + 1)]
    out = {"first_row_s": min(by_part.values()), "first_row_s_by_part": by_part, "last_row_s": round(last, 2),
           "last_row_s_by_part": {k: round(ends[k], 2) for k in by_part},
           "output_tokens_by_part": {k: tokens[k] for k in by_part}, "output_tokens_by_10s": bins}
    timings = {r["run_id"]: r.get("timings") or {} for r in records or []}
    requests = {k: round(first[k] - timings[k]["first_row_s"] + timings[k]["first_request_s"], 1)
                for k in by_part if "first_row_s" in timings.get(k, {}) and "first_request_s" in timings[k]}
    if requests:
        out |= {"first_request_s": min(requests.values()), "first_request_s_by_part": requests,
                "part_started_s_by_part": {k: round(first[k] - timings[k]["first_row_s"], 1) for k in requests}}
    return out


def window_of(at: list, sampler, clock: float) -> dict:
    """Pages/s between the 20th and 80th percentile finish, and what the sampler saw then."""
    t = [a.timestamp() - clock for a in at]  # on the monotonic clock
    i, j = int(len(t) * 0.2), int(len(t) * 0.8)
    out: dict = {"steady_pages_per_s": round((j - i) / (t[j] - t[i]), 3) if t[j] > t[i] else None}
    if sampler is not None:
        out |= {"gpu_busy_pct_rows": sampler.gpu_between(t[0], t[-1]),
                "gpu_busy_pct_steady": sampler.gpu_between(t[i], t[j]),
                "host_rss_peak_gb": sampler.rss_peak(t[0] - 3600, t[-1] + 5).get("all"),
                "cpu_cores_steady": sampler.cpu_between(t[i], t[j])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=Path, default=Path("/tmp/models"))
    ap.add_argument("--work", type=Path, default=Path("/tmp/proc"))
    ap.add_argument("--src", type=Path,
                    help="the documents' folder, made where absent (default WORK/src): a page's length (--lengths B) "
                         "follows its document's id, a hash of its path, so runs compared at equal work read one folder")
    ap.add_argument("--pages", type=int, default=4096)
    ap.add_argument("--per-doc", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=1000, help="--lengths A: every page's length")
    ap.add_argument("--lengths", choices=["A", "B"], default="A",
                    help="A: --max-tokens a page; B: lognormal, mean ~1000, in [50, 4000] (throughput.py's)")
    ap.add_argument("--mode", choices=["page", "document"], default="page",
                    help="document: groups of --group-pages a request, the split's fallback off (random weights "
                         "never write <page>, so every row is a document_split error row with its group's tokens)")
    ap.add_argument("--group-pages", type=int, default=4)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--processes", default="1,2",
                    help="the runs, in order, the first the baseline: N, or N@GIB with kv_cache_gib GIB (the KV's "
                         "size given, so the N parts build their engines at once), or N%%GIB with each engine's KV "
                         "GIB in engine_args (the parts build in turn, each that KV), e.g. 2,2@48,2%%21.8")
    ap.add_argument("--caches", choices=["fresh", "seeded", "shared", "warm"], default="fresh",
                    help="fresh: each run its own empty vLLM/Triton/Inductor caches, as a new pod; seeded: the "
                         "first run's from empty, each later one's a copy of what the first left; shared: the machine's; "
                         "warm: `batchocr warm` fills a compile cache first (timed), then each run from empty caches "
                         "of its own with engines.vllm.compile_cache naming it (the product's way), the first run "
                         "without it (cold)")
    ap.add_argument("--warm-pages", type=int, default=32, help="--caches warm: the pages `batchocr warm` reads")
    ap.add_argument("--warm-root", default="warm",
                    help="--caches warm: where each run's compiled caches go, a comma list beside --processes (the "
                         "last for the rest): warm (batchocr's way: the compile cache copied to the path `batchocr "
                         "warm` compiled in, recorded in it; removed before each run, as on a fresh pod) or own (a "
                         "copy of the compile cache without that record: the run copies it into its own root, "
                         "WORK/cache-RUN), e.g. own,warm,own,warm")
    ap.add_argument("--no-cold", action="store_true",
                    help="--caches warm: the first run from the compile cache too (the warm-up's own log says the cold build)")
    ap.add_argument("--timeout", type=int, default=1500, help="seconds a run may take")
    ap.add_argument("--trace-start", action="store_true",
                    help="every process's main thread sampled each 0.2 s for its first 200 s (the runs', not the "
                         "warm-up's), one file a process beside --json: trace-RUN/PID.txt (bench/gpu/start_trace.py)")
    ap.add_argument("--fake", action="store_true", help="tests/fake_vllm.py for vLLM (a dry run on the CPU)")
    ap.add_argument("--vllm", action="append", default=[], metavar="KEY=VALUE",
                    help="an engines.vllm key in every run's job spec (VALUE as YAML), e.g. sam_fold=false")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if set(args.warm_root.split(",")) - {"own", "warm"}:
        ap.error(f"--warm-root: got {args.warm_root!r}, expected own or warm, comma-separated")
    from e2e import a4_documents

    src = args.src or args.work / "src"
    if not src.exists():
        a4_documents(src, [args.per_doc] * (args.pages // args.per_doc))
    pages = (args.pages // args.per_doc) * args.per_doc
    fake = [stand_in(args.work), str(ROOT / "tests")] if args.fake else []
    shim = shim_of(args.work, args.lengths == "B", args.trace_start)
    if args.lengths == "B":
        args.max_tokens = 4000  # the job's budget: the longest page (the shim sets each page's)
    path = [*shim, str(ROOT), *fake, os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    model = "fake-model" if args.fake else str(args.models / "unlimited-ocr")
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "pages": pages,
                    "started": dt.datetime.now(dt.UTC).isoformat(), "runs": {}}

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(report, indent=2, default=str))

    if args.caches == "warm":  # the compile cache as a pod's volume gets it: `batchocr warm`, its own caches
        n, kv = kv_of(args.processes.split(",")[0])
        # the first run's processes, as the pods' job spec gives `batchocr warm` them (jobs/aks-vllm.yaml's
        # auto): its engines built as the runs' are, each with its share of the GPU
        spec = job(args.work / "job-warm.yaml", src, args.work / "out-warm", model, args, *kv, processes=n)
        shutil.rmtree(args.work / "compile-cache", ignore_errors=True)
        tmp = args.work / "tmp"  # the warm-up's temporary folders: the root it compiles in, which runs copy back to
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "batchocr.cli", "warm", str(args.work / "compile-cache"), "--job",
                               str(spec), "--pages", str(args.warm_pages), "--quiet"], capture_output=True, text=True,
                              env=env | caches_of(args.work / "cache-warm-home") | {"TMPDIR": str(tmp)},
                              timeout=args.timeout)
        if args.json:
            args.json.with_name(f"{args.json.stem}-warm.log").write_text(proc.stdout + proc.stderr)
        marker = args.work / "compile-cache" / COMPLETE
        report["warm"] = {"rc": proc.returncode, "wall_s": round(time.monotonic() - t0, 2), "pages": args.warm_pages,
                          "root": json.loads(marker.read_text()).get("root") if marker.is_file() else None,
                          "stdout": proc.stdout.strip()[-400:], "stderr_tail": proc.stderr.strip()[-1500:]}
        if "own" in args.warm_root.split(",") and marker.is_file():
            without_root(args.work / "compile-cache", args.work / "compile-cache-own")
        print("warm", json.dumps(report["warm"]), flush=True)
        save()

    seen: dict[str, int] = {}
    for item in args.processes.split(","):
        n, kv = kv_of(item)
        seen[item] = seen.get(item, 0) + 1
        item = item if seen[item] == 1 else f"{item}#{seen[item]}"  # the same N again: its own key
        out = args.work / f"out-{item}"
        shutil.rmtree(out, ignore_errors=True)  # an earlier run's OUT in the same --work would have nothing to do
        cache = None  # engines.vllm.compile_cache
        from throughput import Sampler

        if args.caches == "fresh":
            run_env = env | caches_of(args.work / f"cache-{item}")
            caches = run_env["XDG_CACHE_HOME"]
        elif args.caches == "seeded":  # one place, as a pod's $HOME/.cache: empty, then the first run's
            first = next(iter(report["runs"]), None)
            run_env = env | caches_of(args.work / "cache", args.work / "cache-seed" if first else None)
            caches = f"seeded from {first}" if first else "cold (the seed)"
        elif args.caches == "warm":  # a fresh pod: empty caches; the first run cold, the others from the cache
            roots = args.warm_root.split(",")
            root = roots[min(len(report["runs"]), len(roots) - 1)]
            at = report["warm"].get("root")
            if at:  # where the last run put it: a fresh pod has none there
                shutil.rmtree(at, ignore_errors=True)
            run_env = env | caches_of(args.work / f"cache-{item}")
            cold = not report["runs"] and not args.no_cold
            caches = "cold" if cold else "compile_cache (batchocr warm) " + (
                "copied into the run's own root" if root == "own" else f"at the path it was compiled in, {at}")
            if not cold:
                cache = args.work / ("compile-cache-own" if root == "own" else "compile-cache")
        else:
            run_env, caches = env, "shared"
        spec = job(args.work / f"job-{item}.yaml", src, out, model, args, *kv, compile_cache=cache)
        if args.trace_start:
            trace = (args.json.parent if args.json else args.work) / f"trace-{item}"
            shutil.rmtree(trace, ignore_errors=True)
            trace.mkdir(parents=True)
            run_env = run_env | {"BENCH_START_TRACE": str(trace)}
        sampler = Sampler()  # GPU busy (NVML) and this process's tree: the run and its parts
        sampler.start()
        clock = time.time() - time.monotonic()
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "batchocr.cli", "run", "--job", str(spec), "--processes", str(n),
                               "--quiet"], capture_output=True, text=True, env=run_env, timeout=args.timeout)
        wall = time.monotonic() - t0
        if args.json:  # the whole log (vLLM's start: compile, warm-up, CUDA graphs, Triton JIT), beside the JSON
            args.json.with_name(f"{args.json.stem}-{item}.log").write_text(proc.stdout + proc.stderr)
        sampler.running = False
        sampler.join()
        rec = {"rc": proc.returncode, "wall_s": round(wall, 2), "stdout": proc.stdout.strip()[-400:],
               "stderr_tail": proc.stderr.strip()[-1500:], "caches": caches}
        if proc.returncode == 0:
            rec |= work_of(out, sampler, clock, t0)
            rec["pages_per_s"] = round(pages / wall, 3)
            rec["rows_pages_per_s"] = round(pages / rec["rows_span_s"], 3) if rec["rows_span_s"] else None
            rec["output_tokens_per_s"] = round(rec["output_tokens"] / wall, 1)
            # issue 53's measure: from the first page handed to an engine to the last row committed
            # (the engines' load and compile apart), and the GPU's busy share over that span
            if rec.get("first_request_s") is not None and rec.get("last_row_s") is not None:
                span = rec["last_row_s"] - rec["first_request_s"]
                rec["engine_span_s"] = round(span, 2)
                rec["engine_span_output_tokens_per_s"] = round(rec["output_tokens"] / span, 1) if span > 0 else None
                rec["gpu_busy_pct_engine_span"] = sampler.gpu_between(t0 + rec["first_request_s"], t0 + rec["last_row_s"])
            if rec.get("first_request_s") is not None:  # the start: the machine's cores while the engines build
                rec["cpu_cores_start"] = sampler.cpu_between(t0, t0 + rec["first_request_s"])
                rec["gpu_busy_pct_start"] = sampler.gpu_between(t0, t0 + rec["first_request_s"])
        if args.caches in ("fresh", "warm"):  # what the build compiled that the compile cache (if any) did not hold
            placed = cache is not None and root == "warm" and at  # where batchocr put the run's caches
            rec["cache_gained"] = cache_gained(Path(placed or run_env["XDG_CACHE_HOME"]),
                                               args.work / "compile-cache" if cache is not None else None)
        if args.caches == "seeded" and not report["runs"]:  # what the first run left: the later runs' seed
            shutil.rmtree(args.work / "cache-seed", ignore_errors=True)
            shutil.copytree(args.work / "cache", args.work / "cache-seed", symlinks=True)
            rec["seed_mb"] = round(sum(f.stat().st_size for f in (args.work / "cache-seed").rglob("*") if f.is_file())
                                   / 2**20, 1)
        report["runs"][item] = rec
        print(item, json.dumps({k: v for k, v in rec.items() if k not in ("runs", "stderr_tail")}), flush=True)
        save()
    done = {n: r for n, r in report["runs"].items() if r["rc"] == 0}
    if len(done) > 1:
        base_n = next(iter(done))
        base = done[base_n]
        keys = ("rows", "unique_pages", "prompt_tokens", "output_tokens", "attempts")
        report["equal_work"] = {"equal": all(all(r[k] == base[k] for k in keys) for r in done.values()),
                                **{k: {n: r[k] for n, r in done.items()} for k in keys}}
        for n, r in done.items():
            if n != base_n:
                report[f"ratio_{n}/{base_n}"] = round(base["wall_s"] / r["wall_s"], 3)
                if r["rows_span_s"] and base["rows_span_s"]:
                    report[f"rows_ratio_{n}/{base_n}"] = round(base["rows_span_s"] / r["rows_span_s"], 3)
                if r.get("steady_pages_per_s") and base.get("steady_pages_per_s"):
                    report[f"steady_ratio_{n}/{base_n}"] = round(r["steady_pages_per_s"] / base["steady_pages_per_s"], 3)
        print({k: v for k, v in report.items() if k.startswith(("ratio", "rows_ratio", "steady_ratio", "equal"))}, flush=True)
    save()


if __name__ == "__main__":
    main()
