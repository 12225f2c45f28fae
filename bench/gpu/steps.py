"""Where a page's time goes in a throughput.py run's steady state, from the engine's own steps.

throughput.py records every engine step (`engine_steps`: the engine core's output timestamp,
running and waiting requests, KV use, new tokens, finished requests). In a mode's steady window
the gap from one step to the next is that step's length, and the steps fall in two kinds: a
step that carries new pages' prefill (vision encoder and prompt, the running pages' decode
riding along) is several times as long as a pure decode step. This splits the window's time
between the two and divides by the pages finished in it: ms a page of prefill steps, ms a page
of decode steps. Admission groups show as jumps of the running count. The modes' work (pages,
prompt and output tokens, attempts, throughput.py's `equal_work`) is printed under the table.

    python bench/gpu/steps.py docs/gpu/tp21-7b-enc3-2026-12-04.json.gz
    python bench/gpu/steps.py run.json --modes b_batchocr --long 3 --json steps.json

A step is counted as a prefill step when it is longer than `--long` times the window's median
step (the median is a decode step: they are most of the steps). That holds where pages are
admitted in groups, as b does (a group's prefill in a few long steps, then tens of decode
steps); where vLLM admits a page a step as it frees a sequence (a, `admit_pages: 0`), most
steps carry a prefill, the median is one of them, and the split means little (it shows as a
"pages a group" near the window's pages). A mode run on several engines at once (`instances`,
`engines`) has their steps interleaved, so its gaps are not step lengths: it is reported as
such and not split.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path


def load(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def split(steps: list, t0: float, t1: float, pages: int, long: float = 3.0, jump: int = 8) -> dict | None:
    """The window [t0, t1]'s steps split into prefill and decode steps; None if too few."""
    window = sorted(s for s in steps if t0 <= s[0] <= t1)
    if len(window) < 3 or pages <= 0:
        return None
    gaps = [b[0] - a[0] for a, b in zip(window, window[1:])]
    median = statistics.median(gaps)
    cut = long * median
    prefill = [g for g in gaps if g > cut]
    decode = [g for g in gaps if g <= cut]
    total = sum(gaps)
    groups = sum(1 for a, b in zip(window, window[1:]) if b[1] - a[1] >= jump)
    ms = lambda seconds: round(seconds / pages * 1000, 1)  # noqa: E731
    return {
        "pages": pages, "window_s": round(total, 2), "steps": len(gaps),
        "median_step_ms": round(median * 1000, 2), "prefill_cut_ms": round(cut * 1000, 2),
        "prefill_steps": len(prefill), "prefill_s": round(sum(prefill), 2),
        "prefill_share": round(sum(prefill) / total, 3) if total else None,
        "prefill_ms_per_page": ms(sum(prefill)),
        "decode_steps": len(decode), "decode_s": round(sum(decode), 2),
        "decode_median_ms": round(statistics.median(decode) * 1000, 2) if decode else None,
        "decode_ms_per_page": ms(sum(decode)), "ms_per_page": ms(total),
        "pages_per_s": round(pages / total, 2) if total else None,
        "groups": groups, "pages_per_group": round(pages / groups, 1) if groups else None,
    }


def modes(report: dict) -> list[str]:
    return [k for k, v in report.items() if isinstance(v, dict) and isinstance(v.get("steady"), dict)
            and "window_start_abs" in v["steady"]]


def analyse(report: dict, names: list[str] | None = None, long: float = 3.0) -> dict:
    out = {}
    for name in names or modes(report):
        mode = report.get(name)
        if not isinstance(mode, dict) or not isinstance(mode.get("steady"), dict):
            out[name] = {"error": "no steady window"}
            continue
        if (mode.get("instances") or 1) > 1 or (mode.get("engines") or 1) > 1:
            out[name] = {"error": "several engines at once: their steps interleave, gaps are not step lengths"}
            continue
        s = mode["steady"]
        got = split(report.get("engine_steps", []), s["window_start_abs"], s["window_end_abs"], s.get("pages", 0),
                    long)
        out[name] = got or {"error": "too few steps in the window"}
    return out


def work(report: dict, names) -> str:
    """The modes' work as the run recorded it (throughput.py's equal_work and each mode's
    attempts): what makes their ms a page comparable."""
    eq = report.get("equal_work") or {}
    each = {n: {"pages": (eq.get("pages") or {}).get(n), "prompt_tokens": (eq.get("prompt_tokens") or {}).get(n),
                "output_tokens": (eq.get("tokens") or {}).get(n),
                "attempts": ((report.get(n) or {}).get("work") or {}).get("attempts")} for n in names}
    return f"equal work: {eq.get('equal')} {json.dumps(each)}"


def table(result: dict) -> str:
    head = ("| mode | pages | prefill steps: count, time (share) | their ms a page | decode steps: count, median "
            "| their ms a page | ms a page in all (pages/s) | pages a group |")
    rows = [head, "| --- " * 8 + "|"]
    for name, r in result.items():
        if "error" in r:
            rows.append(f"| {name} | {r['error']} |" + " |" * 6)
            continue
        rows.append(f"| {name} | {r['pages']} | {r['prefill_steps']}, {r['prefill_s']} s ({r['prefill_share']:.0%}) "
                    f"| {r['prefill_ms_per_page']} | {r['decode_steps']}, {r['decode_median_ms']} ms "
                    f"| {r['decode_ms_per_page']} | {r['ms_per_page']} ({r['pages_per_s']}) | {r['pages_per_group']} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("report", type=Path, help="throughput.py's JSON (.json or .json.gz)")
    ap.add_argument("--modes", default="", help="comma-separated mode names (default: every mode with a steady window)")
    ap.add_argument("--long", type=float, default=3.0, help="a prefill step is longer than this times the median step")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args(argv)
    if args.long <= 1:
        ap.error("--long must be above 1 (a multiple of the median step)")
    try:
        report = load(args.report)
    except (OSError, ValueError) as exc:
        print(f"steps.py: cannot read {args.report}: {exc}", file=sys.stderr)
        return 2
    result = analyse(report, [m for m in args.modes.split(",") if m] or None, args.long)
    print(table(result))
    print(work(report, result))
    if args.json:
        args.json.write_text(json.dumps(result | {"equal_work": report.get("equal_work")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
