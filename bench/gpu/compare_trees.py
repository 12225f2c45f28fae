"""b of one batchocr tree against b of another, and each against a, from three throughput.py runs.

Two batchocr trees cannot share one process (each imports its own `batchocr`), so suite.sh's
`rebuild-*` runs measure each in a process of its own, on the same pages and output lengths:
a (vLLM alone), b with the old tree, b with the new one. This checks that the two b's did the
same work (pages, requests, prompt and output tokens, attempts, finish reasons, no error rows;
the same run arguments) and that a's pages, prompt and output tokens are theirs too, then prints
new/old pages/s end to end and in the steady state, and b/a for each tree.

    python bench/gpu/compare_trees.py OLD.json NEW.json A.json [--json OUT.json] [--within 0.03]

Exit 1 where the work differs (no ratio is worth reading then), 2 where a file lacks its mode;
0 otherwise, whatever the ratios: the verdict against --within is printed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

B, A = "b_batchocr", "a_vllm_alone"
# The arguments that make the work and the engine: equal in both b's, or the runs are not comparable.
# (json, modes and the like name where a run writes and which modes it ran; variants are other runs.)
NOT_WORK = {"json", "barrier", "part", "modes", "llm", "fake", "env", "profile", "profile_stack", "variant",
            "b_variants"}
# b's work fields that must match between the trees (engine_tokens: the engine core's own count)
B_WORK = ("pages", "requests", "prompt_tokens_rows", "output_tokens_rows", "client_tokens", "engine_tokens",
          "attempts", "finish_reasons", "errors")
# and those a shares with b (a's requests are pages or groups; b's are every attempt sent)
A_WORK = ("pages", "prompt_tokens_rows", "output_tokens_rows")


def load(path: str) -> dict:
    p = Path(path)
    with (gzip.open(p, "rt") if p.suffix == ".gz" else open(p)) as f:
        return json.load(f)


def tokens(work: dict):
    """The engine core's count of generated tokens where there is one, else the client's."""
    return work.get("engine_tokens") or work.get("client_tokens")


def differences(old: dict, new: dict, a: dict) -> list[str]:
    """Every way the three runs did not do the same work, in words; empty where they did."""
    out = []
    ob, nb, aa = old[B], new[B], a[A]
    for key in B_WORK:
        x, y = ob["work"].get(key), nb["work"].get(key)
        if key == "engine_tokens" and (x is None or y is None):
            continue  # a dry run has no engine count; client_tokens is compared above
        if x != y:
            out.append(f"b's {key}: old {x}, new {y}")
    for name, rec in (("old", ob), ("new", nb)):
        if rec["work"].get("errors"):
            out.append(f"{name} b has error rows {rec['work']['errors']}: {rec['work'].get('first_error')}")
    for key in A_WORK:
        if aa["work"].get(key) != ob["work"].get(key):
            out.append(f"a's {key} {aa['work'].get(key)} against old b's {ob['work'].get(key)}")
    if tokens(aa["work"]) != tokens(ob["work"]):
        out.append(f"a's output tokens {tokens(aa['work'])} against old b's {tokens(ob['work'])}")
    for key in ("pages", "output_tokens_total"):
        values = {old.get(key), new.get(key), a.get(key)}
        if len(values) > 1:
            out.append(f"{key}: old {old.get(key)}, new {new.get(key)}, a {a.get(key)}")
    # an argument one tree's throughput.py lacks is a note (engine_differences), not a difference
    for key in sorted((set(old["args"]) & set(new["args"]) & set(a["args"])) - NOT_WORK):
        values = [run["args"][key] for run in (old, new, a)]
        if any(v != values[0] for v in values):
            out.append(f"argument {key}: old {values[0]}, new {values[1]}, a {values[2]}")
    return out


def engine_differences(old: dict, new: dict, a: dict) -> list[str]:
    """Where the engine arguments differ, and arguments one run's throughput.py lacks (printed, not
    a failure: a worker extension's fingerprint in additional_config is a hash of its modules'
    source, and changes with any edit of them)."""
    out = []
    for key in sorted((set(old["args"]) | set(new["args"]) | set(a["args"])) - NOT_WORK):
        if not all(key in run["args"] for run in (old, new, a)):
            values = [run["args"].get(key, "(none)") for run in (old, new, a)]
            out.append(f"argument {key} not in every run: old {values[0]}, new {values[1]}, a {values[2]}")
    for key in sorted(set(old["llm_args"]) | set(new["llm_args"]) | set(a["llm_args"])):
        values = [run["llm_args"].get(key, "(none)") for run in (old, new, a)]
        if any(v != values[0] for v in values):
            out.append(f"llm_args {key}: old {values[0]}, new {values[1]}, a {values[2]}")
    return out


def rate(rec: dict, steady: bool):
    return (rec.get("steady") or {}).get("pages_per_s") if steady else rec.get("pages_per_s")


def ratio(x, y):
    return round(x / y, 3) if x and y else None


def figures(old: dict, new: dict, a: dict) -> dict:
    ob, nb, aa = old[B], new[B], a[A]
    out = {}
    for kind, steady in (("end_to_end", False), ("steady", True)):
        o, n, r = rate(ob, steady), rate(nb, steady), rate(aa, steady)
        out[kind] = {"old_b": o, "new_b": n, "a": r, "new/old": ratio(n, o),
                     "old_b/a": ratio(o, r), "new_b/a": ratio(n, r)}
    out["context"] = {
        name: {"wall_s": rec.get("wall_s"), "llm_init_s": run.get("llm_init_s"),
               "gpu_busy_pct": rec.get("gpu_busy_pct"),
               "steady_gpu_busy_pct": (rec.get("steady") or {}).get("gpu_busy_pct"),
               "host_rss_peak_gb": (rec.get("host_rss_peak_gb") or {}).get("all"),
               **{k: (rec.get("timings") or {}).get(k) for k in ("first_request_s", "first_row_s")}}
        for name, run, rec in (("old_b", old, ob), ("new_b", new, nb), ("a", a, aa))}
    return out


def show(figs: dict, within: float, equal: bool) -> list[str]:
    lines = [f"{'pages/s':<12}{'old b':>9}{'new b':>9}{'a':>9}{'new/old':>9}{'old b/a':>9}{'new b/a':>9}"]
    for kind in ("end_to_end", "steady"):
        f = figs[kind]
        lines.append(f"{kind:<12}" + "".join(f"{'-' if f[k] is None else f[k]:>9}"
                                             for k in ("old_b", "new_b", "a", "new/old", "old_b/a", "new_b/a")))
    for name, c in figs["context"].items():
        lines.append(f"  {name}: " + ", ".join(f"{k} {v}" for k, v in c.items() if v is not None))
    for kind in ("end_to_end", "steady"):
        r = figs[kind]["new/old"]
        if not equal:
            lines.append(f"{kind}: new/old {r}: not comparable, the work differs")
        elif r is None:
            lines.append(f"{kind}: no figure (no steady window at these pages?)")
        else:
            verdict = "within" if r >= 1 - within else "NOT within"
            lines.append(f"{kind}: new/old {r}: {verdict} {within:.0%} of the old tree")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", help="throughput.py --modes b with the old tree")
    ap.add_argument("new", help="throughput.py --modes b with the new tree")
    ap.add_argument("a", help="throughput.py --modes a (either tree)")
    ap.add_argument("--within", type=float, default=0.03, help="the slowdown allowed, new against old")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    old, new, a = load(args.old), load(args.new), load(args.a)
    for path, run, key in ((args.old, old, B), (args.new, new, B), (args.a, a, A)):
        if not isinstance(run.get(key), dict):
            print(f"{path}: no {key} (the run failed? its log)", flush=True)
            return 2
    diffs = differences(old, new, a)
    figs = figures(old, new, a)
    print(f"work: {old[B]['work']['pages']} pages, {old[B]['work']['requests']} requests, "
          f"{old[B]['work']['prompt_tokens_rows']} prompt and {tokens(old[B]['work'])} output tokens, "
          f"attempts {old[B]['work']['attempts']}, finish {old[B]['work']['finish_reasons']}")
    print("equal work: " + ("yes" if not diffs else "NO"))
    for d in diffs:
        print("  " + d)
    for d in engine_differences(old, new, a):
        print("  " + d)
    print("\n".join(show(figs, args.within, not diffs)), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"equal_work": not diffs, "differences": diffs,
                                         "engine_differences": engine_differences(old, new, a),
                                         **figs, "files": [args.old, args.new, args.a]}, indent=1))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
