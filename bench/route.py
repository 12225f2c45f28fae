"""Routing benchmark: `route: auto` against `route: model` on a mixed corpus, half
born-digital, with one engine, in one process run.

    python bench/route.py [--docs D] [--repeat R] [--json FILE]                      # rapidocr, CPU
    python bench/route.py --engine vllm --model /models/olmOCR-2-7B-1025 --preset olmocr-2 --docs 64
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
  finish_reason stop; auto must route exactly the born-digital pages.

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
    return {
        "mode": mode, "seconds": round(seconds, 3), "pages": pages.height,
        "pages_per_s": round(pages.height / seconds, 4),
        "cer": round(result.cer, 5), "cer_errors": result.errors, "cer_chars": result.chars,
        "missing": result.missing,
        "cer_by_route": {r: round(float(g["errors"].sum()) / max(float(g["chars"].sum()), 1), 5)
                         for (r,), g in _with_route(result.pages, pages).group_by("route")},
        "routes": counts("route"), "engines": counts("engine"), "finish_reasons": counts("finish_reason"),
        "engine_latency_s": round(float(model_rows["latency_ms"].sum() or 0) / 1000, 3),
        "timings": summary.timings,
        "routed_names": sorted(f"{u.rsplit('/', 1)[-1]}#{i}" for u, i in
                               pages.filter(pl.col("route") == "textlayer").select("source_uri", "page_index").iter_rows()),
    }


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
    ap.add_argument("--threads", type=int, default=0, help="rapidocr: onnxruntime threads [0: one per usable CPU]")
    ap.add_argument("--workers", type=int, default=0, help="render workers [0: the spec's default]")
    ap.add_argument("--dpi", type=int, help="PDF render resolution [the spec's default, or the preset's size]")
    ap.add_argument("--fake", action="store_true", help="vllm: dry run on the CPU with tests/fake_vllm.py")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (corpus, OUTs)")
    args = ap.parse_args(argv)
    if args.engine == "vllm" and not (args.model or args.fake):
        ap.error("--engine vllm needs --model (or --fake)")
    if args.fake:
        if args.engine != "vllm":
            ap.error("--fake stands in for vLLM: with --engine vllm")
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
        docs = routing_corpus.mixed_corpus(corpus, args.docs)
        routing_corpus.write_truth(docs, truth)
        n = sum(len(p) for p in docs.values())
        born = sorted(f"{name}#{i}" for name, pages in docs.items() for i, p in enumerate(pages) if p.route == "textlayer")
        options = ({"threads": args.threads} if args.engine == "rapidocr"
                   else {k: v for k, v in (("model", args.model or "fake"), ("preset", args.preset)) if v})
        t = time.perf_counter()
        engine = engines.create(args.engine, options)
        load_s = time.perf_counter() - t
        shared = Shared(engine)
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

    equal = all(p[m]["pages"] == n and p[m]["finish_reasons"] == {"stop": n} and not p[m]["missing"]
                for p in pairs for m in modes)
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
                  f"{m['routes']}")
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
    print(f"equal work: {'yes' if equal else 'NO'} (one stop row per page in both modes); "
          f"auto routed exactly the born-digital pages: {'yes' if routed_right else 'NO'}")
    if args.json:
        figures = {
            "command": " ".join(["python", "bench/route.py", *(argv if argv is not None else sys.argv[1:])]),
            "machine": machine_info(args.threads, args.workers),
            "engine": args.engine, "engine_options": options, "engine_build_s": round(load_s, 3),
            "warmup_s": round(warm_s, 3),
            "corpus": {"documents": len(docs), "pages": n, "born_digital": len(born)},
            "pairs": pairs, "median_ratio_auto_over_model": ratio, "median_cpu_ratio_model_over_auto": cpu_ratio,
            "equal_work": equal, "routed_exactly_born_digital": routed_right,
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if equal and routed_right else 1


if __name__ == "__main__":
    sys.exit(main())
