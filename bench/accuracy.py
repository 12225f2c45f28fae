"""Accuracy benchmark of the CPU engine: CER per category and overall, and pages/s,
on the generated layout set (tests/layouts.py BENCH_SET: two- and three-column
pages, skewed, single-column, degraded, low and high resolution) and real scans
(REAL: fetched from PyPI, truth in tests/data/scans; category real-scan), with the
rapidocr engine as it was (reading order, deskew and rescale off: "before") and
as it is ("after"), in one process run.

    python bench/accuracy.py [--json FILE] [--keep]
    python bench/accuracy.py --baseline DIR --modes after    # another version against this one

--baseline DIR: a checkout of another commit (`git worktree add DIR main`); its
`batchocr` package runs the same pages with its defaults, in a subprocess, as the
mode "baseline" (this file's layouts: the same pages, new cases included).

CER is batchocr eval's: edit distance over truth length after whitespace runs
become one space; a category's CER is its errors over its characters. Pages/s is
batchocr.pipeline.run_job wall time over the set (engine load included); the two
modes run one after the other on the same pages, and CPU time other processes
used meanwhile is shown (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]
import tools  # noqa: E402 (tests/tools.py: the real scans' fetch)

MODES = {"before": {"reading_order": False, "deskew": False, "rescale": False}, "after": {}}
# Real scans: ((PyPI project, version, member of its sdist), truth file in tests/data/scans)
REAL = [(tools.LINN, "linn.txt")]


@dataclass(frozen=True)
class RealScan:
    """A real scanned page in the set, described as layouts.Variant describes the generated."""
    name: str
    category: str = "real-scan"
    skew: float = 0.0
    degrade: str = "scan"
    form: str = "png"
    dpi: int = 300


def add_real(src: Path) -> dict[str, RealScan]:
    made = {}
    for sdist_member, truth in REAL:
        scan = tools.pypi_sdist_member(*sdist_member)
        shutil.copy(scan, src / scan.name)
        (src / "truth" / scan.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "tests" / "data" / "scans" / truth, src / "truth" / scan.name / "0.txt")
        made[scan.name] = RealScan(scan.name)
    return made


def run_mode(src: Path, out: Path, options: dict, threads: int) -> dict:
    import batchocr
    from batchocr.evaluate import evaluate
    from batchocr.pipeline import run_job
    from batchocr.spec import JobSpec
    from cpu import CpuMeter

    spec = JobSpec(source=str(src), out=str(out), engine="rapidocr",
                   engines={"rapidocr": {**options, "threads": threads}})
    meter = CpuMeter()
    start = time.perf_counter()
    summary = run_job(spec, progress=False)
    seconds = time.perf_counter() - start
    cpu = meter.stop()
    pages = batchocr.read_pages(str(out)).collect()
    scored = evaluate(pages, src / "truth").pages
    angles = dict(zip(pages["source_uri"].str.split("/").list.last(), pages["skew_angle"]))
    return {"seconds": round(seconds, 2), "pages": summary.pages, "pages_per_s": round(summary.pages / seconds, 4),
            "cpu": cpu, "ocr_latency_sum_s": round(float(pages["latency_ms"].sum()) / 1000, 2),
            "per_page": {d: {"chars": c, "errors": e, "cer": round(r, 4), "skew_angle": angles.get(d)}
                         for d, c, e, r in scored.select("document", "chars", "errors", "cer").iter_rows()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=0, help="onnxruntime threads [0: one per usable CPU]")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--keep", action="store_true", help="keep the temp folder (pages, truth, OUTs)")
    ap.add_argument("--modes", default="before,after", help="of before (geometry off), after (as it is)")
    ap.add_argument("--baseline", type=Path, help="a checkout of another version: its batchocr, defaults")
    ap.add_argument("--src", type=Path, help=argparse.SUPPRESS)  # the baseline's subprocess: pages made
    args = ap.parse_args(argv)
    os.environ["ORT_DISABLE_TELEMETRY"] = "1"
    import layouts
    from cpu import machine_info

    if args.src:  # the baseline's run, in its own process
        results = {m: run_mode(args.src, args.src.parent / f"baseline-{m}", MODES[m], args.threads)
                   for m in args.modes.split(",")}
        args.json.write_text(json.dumps(results))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="batchocr-accuracy-"))
    try:
        variants = layouts.build(tmp / "src", layouts.BENCH_SET) | add_real(tmp / "src")
        results = {}
        if args.baseline:
            env = {**os.environ, "PYTHONPATH": str(args.baseline.resolve())}
            subprocess.run([sys.executable, __file__, "--src", str(tmp / "src"), "--modes", "after", "--json",
                            str(tmp / "baseline.json"), "--threads", str(args.threads)], env=env, check=True)
            results["baseline"] = json.loads((tmp / "baseline.json").read_text())["after"]
        for mode in args.modes.split(","):
            results[mode] = run_mode(tmp / "src", tmp / mode, MODES[mode], args.threads)
    finally:
        if args.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    modes = list(results)
    per = {m: results[m]["per_page"] for m in modes}
    first, last = modes[0], modes[-1]
    print(f"{'page':30s} {'category':14s} {'truth chars':>11s} " + " ".join(f"{m:>8s}" for m in modes)
          + f" {'skew (set)':>10s} {'skew (est.)':>11s}")
    for name, v in sorted(variants.items(), key=lambda kv: (kv[1].category, kv[0])):
        print(f"{name:30s} {v.category:14s} {per[last][name]['chars']:>11d} "
              + " ".join(f"{per[m][name]['cer']:>8.3f}" for m in modes)
              + f" {v.skew:>10.1f} {per[last][name]['skew_angle'] or 0.0:>11.2f}")
    categories = sorted({v.category for v in variants.values()}) + ["overall"]
    table = {}
    print()
    print(f"{'category':14s} {'pages':>5s} " + " ".join(f"{'CER ' + m:>12s}" for m in modes))
    for cat in categories:
        names = [n for n, v in variants.items() if cat == "overall" or v.category == cat]
        row = {m: sum(per[m][n]["errors"] for n in names) / sum(per[m][n]["chars"] for n in names) for m in modes}
        table[cat] = {"pages": len(names), **{k: round(v, 4) for k, v in row.items()}}
        print(f"{cat:14s} {len(names):>5d} " + " ".join(f"{row[m]:>12.3f}" for m in modes))
    worse = [n for n in variants if per[last][n]["errors"] > per[first][n]["errors"]]
    print(f"\npages worse in {last} than in {first}: {', '.join(sorted(worse)) or 'none'}")
    print()
    for mode, r in results.items():
        print(f"{mode:8s} {r['pages']} pages in {r['seconds']:.1f} s: {r['pages_per_s']:.3f} pages/s "
              f"(OCR {r['ocr_latency_sum_s']:.1f} s; other processes' CPU {r['cpu']['other_cpu_s']:.1f} s)")
    ratio = results[last]["pages_per_s"] / results[first]["pages_per_s"]
    print(f"pages/s {last} / {first}: {ratio:.3f}x")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "command": " ".join(["python", "bench/accuracy.py", *(argv if argv is not None else sys.argv[1:])]),
            "machine": machine_info(args.threads, 0), "categories": table, "modes": results,
            "ratio_pages_per_s": round(ratio, 4),
            "variants": {n: {"category": v.category, "skew": v.skew, "degrade": v.degrade, "form": v.form,
                             "dpi": v.dpi} for n, v in variants.items()},
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
