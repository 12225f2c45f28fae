"""Where a command's start goes, from bench/gpu/processes.py --trace-start's files: each process
of the run (the command, its parts, their render workers, vLLM's engine core where it was
spawned) as its spans of one place, in seconds from the command's start.

    python bench/gpu/start_trace.py RESULTS/trace-2 [--until 120] [--min 1.0] [--depth 2]

A place is the innermost --depth frames of a sample in batchocr, vllm, torch, transformers,
pymupdf, importlib (an import: the module file being run is the frame above it); a span is
the samples in a row at one place (0.2 s apart), printed where it lasts --min seconds or more.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def read(folder: Path) -> list[dict]:
    procs = []
    for f in sorted(folder.glob("*.txt")):
        lines = f.read_text().splitlines()
        if not lines:
            continue
        t0, _, head = lines[0].partition(" start ")
        samples = []
        for line in lines[1:]:
            t, _, where = line.partition(" ")
            samples.append((float(t), where))
        procs.append({"pid": f.stem, "t0": float(t0), "head": head, "samples": samples})
    return procs


def place(where: str, depth: int) -> str:
    frames = where.split(" < ")
    inner = [fr for fr in frames if "importlib" not in fr and "<frozen" not in fr] or frames
    return " < ".join(inner[:depth])


def spans(samples: list[tuple[float, str]], depth: int) -> list[tuple[float, float, str]]:
    out: list[list] = []
    for t, where in samples:
        p = place(where, depth)
        if out and out[-1][2] == p:
            out[-1][1] = t
        else:
            out.append([t, t, p])
    return [tuple(s) for s in out]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--until", type=float, default=200.0, help="seconds from the command's start")
    ap.add_argument("--min", type=float, default=1.0, help="the shortest span printed, seconds")
    ap.add_argument("--depth", type=int, default=2, help="frames that name a place")
    args = ap.parse_args()
    procs = read(args.folder)
    if not procs:
        raise SystemExit(f"{args.folder}: no trace files")
    origin = min(p["t0"] for p in procs)
    for p in sorted(procs, key=lambda p: p["t0"]):
        last = p["samples"][-1][0] - origin if p["samples"] else p["t0"] - origin
        print(f"== pid {p['pid']} from {p['t0'] - origin:.1f} s to {last:.1f} s: {p['head']}")
        for a, b, where in spans(p["samples"], args.depth):
            if a - origin > args.until:
                break
            if b - a + 0.2 >= args.min:
                print(f"  {a - origin:7.1f} {b - a + 0.2:6.1f}  {where}")


if __name__ == "__main__":
    main()
