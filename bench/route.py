"""Routing benchmark: `route: auto` against `route: model` on a mixed corpus, half
born-digital, with one engine, in one process run.

    python bench/route.py [--docs D] [--repeat R] [--json FILE]                      # rapidocr, CPU
    python bench/route.py --engine vllm --model /models/olmOCR-2-7B-1025 --preset olmocr-2 --docs 64
    python bench/route.py --engine vllm --model /tmp/models/qwen2.5-vl-7b --dummy 1000 --docs 128 \
        --modes auto,model --repeat 2      # random weights (bench/gpu/make_models.py): the lent H200
    python bench/route.py --engine vllm --fake --docs 1   # dry run on the CPU: checks the script only

* corpus (tests/routing_corpus.py, made on the fly): D PDFs of 4 pages each,
  born-digital, scan, born-digital, and a page whose text layer must not be
  trusted (in turn a bad hidden OCR layer over a scan, a wrong ToUnicode map,
  text under a full-page scan); the truth of every page;
* the engine is built once and shared by every run (its close() is deferred to
  the end), and warmed up by an untimed run over one document, so neither mode
  pays model loading or first calls;
* each round runs every mode (--modes; by default also `textlayer`, which trusts
  every layer, to show what the scoring is for) over the same corpus into fresh
  OUTs, the order reversed every other round; a mode's figure: wall seconds of
  run_job, pages/s, CER against the truth (batchocr.evaluate), rows by route and
  engine, and the engine's latency sum; the ratio auto / model of pages/s per
  round, median over rounds;
* equal work: every mode must write one row per page of the corpus, all
  finish_reason stop; auto must route exactly the born-digital pages. Each mode
  records its work: pages by engine, tokens generated, attempts;
* --dummy TOKENS (vllm): random weights of the model folder's architecture
  (load_format dummy), every page the model reads generates exactly TOKENS tokens
  (ignore_eos: finish_reason length) in one attempt, the repetition guard off (random
  weights loop; retries would be other work). CER is then meaningless (random text):
  the pages/s ratio is the figure.

Heavy imports stay inside functions: render workers are spawned, and a spawned
child re-imports this file as __mp_main__.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # routing_corpus: the corpus the router's tests use


class Shared:
    """The engine, for several run_job calls: run_job closes its engine, this one
    closes at the end of the benchmark."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def close(self) -> None:
        pass


def run_mode(corpus: Path, out: Path, truth: Path, mode: str, engine, args) -> dict:
    import polars as pl

    from batchocr import read_pages
    from batchocr.evaluate import evaluate
    from batchocr.pipeline import run_job
    from batchocr.spec import JobSpec, RenderSpec

    render = RenderSpec(workers=args.workers, **({"dpi": args.dpi} if args.dpi else {}))
    spec = JobSpec(source=str(corpus), out=str(out), engine=args.engine, route=mode, render=render)
    start = time.perf_counter()
    summary = run_job(spec, progress=False, engine=engine)
    seconds = time.perf_counter() - start
    pages = read_pages(str(out)).collect()
    result = evaluate(pages, truth)
    counts = lambda col: dict(pages[col].value_counts(sort=True).iter_rows())  # noqa: E731
    model_rows = pages.filter(pl.col("engine") != "textlayer")
    tokens = model_rows["output_tokens"].fill_null(0)
    return {
        "mode": mode, "seconds": round(seconds, 3), "pages": pages.height,
        "pages_per_s": round(pages.height / seconds, 4),
        "cer": round(result.cer, 5), "cer_errors": result.errors, "cer_chars": result.chars,
        "missing": result.missing,
        "cer_by_route": {r: round(float(g["errors"].sum()) / max(float(g["chars"].sum()), 1), 5)
                         for (r,), g in _with_route(result.pages, pages).group_by("route")},
        "routes": counts("route"), "engines": counts("engine"), "finish_reasons": counts("finish_reason"),
        "engine_latency_s": round(float(model_rows["latency_ms"].sum() or 0) / 1000, 3),
        # the work: what the model was asked for (tokens of its rows, attempts of every row)
        "work": {"model_pages": model_rows.height, "output_tokens": int(tokens.sum()),
                 "output_tokens_per_model_page": sorted(set(tokens.to_list())),
                 "finish_reasons_model": counts_of(model_rows, "finish_reason"),
                 "attempts": int(pages["attempts"].fill_null(1).sum()),
                 "attempts_max": int(pages["attempts"].fill_null(1).max() or 0)},
        "timings": summary.timings,
        "routed_names": sorted(f"{u.rsplit('/', 1)[-1]}#{i}" for u, i in
                               pages.filter(pl.col("route") == "textlayer").select("source_uri", "page_index").iter_rows()),
    }


def counts_of(frame, col: str) -> dict:
    return dict(frame[col].value_counts(sort=True).iter_rows()) if frame.height else {}


def build_corpus(folder: Path, documents: int) -> dict:
    """routing_corpus.mixed_corpus, its documents built in parallel (one process a CPU):
    a scan page costs ~0.5 s of Pillow, and on the GPU machine the GPU waits for it."""
    import concurrent.futures
    import multiprocessing
    import os

    import routing_corpus

    procs = max(1, min(documents, len(os.sched_getaffinity(0)), 16))
    if procs == 1:
        return routing_corpus.mixed_corpus(folder, documents)
    with concurrent.futures.ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return dict(pool.map(routing_corpus.mixed_document, [folder] * documents, range(documents)))


def _with_route(evaluated, pages):
    import polars as pl

    names = pages.select(pl.col("source_uri").str.split("/").list.last().alias("document"),
                         pl.col("page_index").cast(pl.Int32), "route")
    return evaluated.join(names, on=["document", "page_index"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=4, help="documents of 4 pages, half born-digital [4]")
    ap.add_argument("--repeat", type=int, default=1, help="pairs of runs (auto, model), alternating order [1]")
    ap.add_argument("--modes", default="auto,model,textlayer",
                    help="routes to run, comma-separated; auto and model are required [auto,model,textlayer: "
                         "textlayer trusts every layer, to show what the scoring is for]")
    ap.add_argument("--engine", choices=("rapidocr", "vllm"), default="rapidocr")
    ap.add_argument("--model", help="vllm: the model folder")
    ap.add_argument("--preset", help="vllm: the model preset, e.g. olmocr-2")
    ap.add_argument("--dummy", type=int, metavar="TOKENS",
                    help="vllm: random weights (load_format dummy), exactly TOKENS tokens a model page "
                         "(ignore_eos), the repetition guard off; CER is then meaningless")
    ap.add_argument("--threads", type=int, default=0, help="rapidocr: onnxruntime threads [0: one per usable CPU]")
    ap.add_argument("--workers", type=int, default=0, help="render workers [0: the spec's default]")
    ap.add_argument("--dpi", type=int, help="PDF render resolution [the spec's default, or the preset's size]")
    ap.add_argument("--fake", action="store_true", help="vllm: dry run on the CPU with tests/fake_vllm.py")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (corpus, OUTs)")
    args = ap.parse_args(argv)
    if args.engine == "vllm" and not (args.model or args.fake):
        ap.error("--engine vllm needs --model (or --fake)")
    if (args.fake or args.dummy) and args.engine != "vllm":
        ap.error("--fake and --dummy are for --engine vllm")
    if args.fake:
        import fake_vllm

        fake_vllm.install_modules()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not {"auto", "model"} <= set(modes) or not set(modes) <= {"auto", "model", "textlayer"}:
        ap.error("--modes: auto and model, optionally textlayer")

    import routing_corpus
    from batchocr import engines
    from cpu import CpuMeter, machine_info

    tmp = Path(tempfile.mkdtemp(prefix="batchocr-route-"))
    try:
        corpus, truth = tmp / "corpus", tmp / "truth"
        t = time.perf_counter()
        docs = build_corpus(corpus, args.docs)
        print(f"corpus: {args.docs} documents in {time.perf_counter() - t:.1f} s", file=sys.stderr)
        routing_corpus.write_truth(docs, truth)
        n = sum(len(p) for p in docs.values())
        born = sorted(f"{name}#{i}" for name, pages in docs.items() for i, p in enumerate(pages) if p.route == "textlayer")
        options = ({"threads": args.threads} if args.engine == "rapidocr"
                   else {k: v for k, v in (("model", args.model or "fake"), ("preset", args.preset)) if v})
        if args.dummy:  # repetition_span past max_tokens: the guard never looks (bench/gpu/throughput.py)
            options |= {"load_format": "dummy", "ignore_eos": True, "max_tokens": args.dummy,
                        "repetition_span": 10**6}
        t = time.perf_counter()
        engine = engines.create(args.engine, options)
        load_s = time.perf_counter() - t
        shared = Shared(engine)
        engine_info = {k: _try(lambda k=k: getattr(engine, k)) for k in ("accelerator",)}
        if hasattr(engine, "describe"):
            engine_info["describe"] = _try(engine.describe)
        try:
            warm = tmp / "warm"
            warm.mkdir()
            first = next(iter(docs))
            shutil.copyfile(corpus / first, warm / first)
            t = time.perf_counter()
            run_mode(warm, tmp / "out-warm", truth, "model", shared, args)
            warm_s = time.perf_counter() - t
            print(f"{args.engine}: built in {load_s:.1f} s, warmed up on {first} in {warm_s:.1f} s (untimed)",
                  file=sys.stderr)
            pairs = []
            for r in range(args.repeat):
                order = modes if r % 2 == 0 else modes[::-1]
                pair = {}
                for mode in order:
                    meter = CpuMeter()
                    pair[mode] = run_mode(corpus, tmp / f"out-{mode}-{r}", truth, mode, shared, args)
                    pair[mode]["cpu"] = meter.stop()
                    m = pair[mode]
                    print(f"[{r}] {mode:<5} {m['seconds']:7.1f} s  {m['pages_per_s']:.3f} pages/s  CER {m['cer']:.4%}  "
                          f"routes {m['routes']}  cpu {m['cpu']}", file=sys.stderr)
                pair["ratio"] = round(pair["auto"]["pages_per_s"] / pair["model"]["pages_per_s"], 4)
                pairs.append(pair)
        finally:
            engine.close()
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    # One row per page, none missing, one attempt each; the layer's rows stop, the model's stop
    # (real weights) or run to exactly --dummy tokens (finish_reason length).
    model_reason = "length" if args.dummy else "stop"
    def equal_work(m: dict) -> bool:
        w = m["work"]
        return (m["pages"] == n and not m["missing"] and w["attempts"] == n
                and w["finish_reasons_model"] == ({model_reason: w["model_pages"]} if w["model_pages"] else {})
                and m["finish_reasons"].get("stop", 0) == n - (w["model_pages"] if args.dummy else 0)
                and (not args.dummy or w["output_tokens_per_model_page"] in ([args.dummy], [])))

    equal = all(equal_work(p[m]) for p in pairs for m in modes)
    routed_right = all(p["auto"]["routed_names"] == born and p["model"]["routes"] == {"model": n} for p in pairs)
    ratio = statistics.median(p["ratio"] for p in pairs)
    med = lambda mode, key: statistics.median(p[mode][key] for p in pairs)  # noqa: E731

    print()
    print(f"{'round':>5}  {'route':<9} {'pages':>5} {'seconds':>8} {'pages/s':>8} {'CER':>8} {'engine s':>9} "
          f"{'own CPU-s':>9} {'others':>7}  pages by route")
    for r, p in enumerate(pairs):
        for mode in modes:
            m = p[mode]
            print(f"{r:>5}  {mode:<9} {m['pages']:>5} {m['seconds']:>8.1f} {m['pages_per_s']:>8.3f} {m['cer']:>8.3%} "
                  f"{m['engine_latency_s']:>9.1f} {m['cpu']['own_cpu_s']:>9.1f} {m['cpu']['other_cpu_s']:>7.1f}  "
                  f"{m['routes']}  model pages {m['work']['model_pages']}, tokens {m['work']['output_tokens']}, "
                  f"attempts {m['work']['attempts']}")
    print("own CPU-s: this process and its render workers; others: CPU-s of other processes meanwhile (noise)")
    print()
    print(f"{args.engine}, {n} pages ({len(born)} born-digital): pages/s auto {med('auto', 'pages_per_s'):.3f} vs "
          f"model {med('model', 'pages_per_s'):.3f}: {ratio:.2f}x (median of {len(pairs)} pairs); "
          f"CER auto {med('auto', 'cer'):.3%} vs model {med('model', 'cer'):.3%}"
          + (f"; textlayer (every layer trusted) {med('textlayer', 'pages_per_s'):.3f} pages/s, "
             f"CER {med('textlayer', 'cer'):.3%}" if "textlayer" in modes else ""))
    cpu_ratio = statistics.median(p["model"]["cpu"]["own_cpu_s"] / max(p["auto"]["cpu"]["own_cpu_s"], 1e-9)
                                  for p in pairs)
    print(f"own CPU seconds, model / auto: {cpu_ratio:.2f}x (median over rounds; robust to other load, unlike seconds)")
    if args.dummy:
        print("random weights (--dummy): CER is meaningless (random text); the pages/s ratio is the figure")
    print(f"equal work: {'yes' if equal else 'NO'} (one row per page, one attempt, the layer's rows stop, the "
          f"model's {model_reason}{f' at exactly {args.dummy} tokens' if args.dummy else ''}); "
          f"auto routed exactly the born-digital pages: {'yes' if routed_right else 'NO'}")
    if args.json:
        figures = {
            "command": " ".join(["python", "bench/route.py", *(argv if argv is not None else sys.argv[1:])]),
            "machine": machine_info(args.threads, args.workers),
            "engine": args.engine, "engine_options": options, "engine_build_s": round(load_s, 3),
            "engine_info": engine_info, "dummy_weights": bool(args.dummy),
            "warmup_s": round(warm_s, 3),
            "corpus": {"documents": len(docs), "pages": n, "born_digital": len(born)},
            "pairs": pairs, "median_ratio_auto_over_model": ratio, "median_cpu_ratio_model_over_auto": cpu_ratio,
            "equal_work": equal, "routed_exactly_born_digital": routed_right,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if equal and routed_right else 1


def _try(get):
    try:
        return get()
    except Exception as exc:  # noqa: BLE001 - a figure's context, not the figure
        return f"unavailable: {type(exc).__name__}: {exc}"


if __name__ == "__main__":
    sys.exit(main())
