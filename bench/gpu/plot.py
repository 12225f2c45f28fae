"""Plot pages/s, requests running in vLLM, GPU busy and the host memory of the run's processes
over time, one line per mode (a vLLM alone, b batchocr, c batch at a time), from throughput.py's
JSON (gzipped or not).

    python bench/gpu/plot.py docs/gpu/tp-7b-bf16.json docs/gpu/tp-7b-bf16.png
"""

import gzip
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MODES = {"a_vllm_alone": ("a vLLM alone (one generate)", "tab:orange"),
         "a0_vllm_defaults": ("a' vLLM's defaults, generate per 256 pages", "tab:red"),
         "c_batch_at_a_time": ("c generate per 256 pages", "tab:green"),
         "b_batchocr": ("b batchocr", "tab:blue")}
MORE = ["tab:purple", "tab:brown", "tab:pink", "tab:gray", "tab:olive", "tab:cyan"]


def modes(r: dict) -> dict:
    """The modes of this JSON, b's variants (b_NAME: another engine, another process) after them."""
    out = {k: v for k, v in MODES.items() if isinstance(r.get(k), dict)}
    extra = [k for k, v in r.items() if k.startswith("b_") and k not in MODES and isinstance(v, dict) and "start_abs" in v]
    return out | {k: (f"b {k[2:]}", MORE[i % len(MORE)]) for i, k in enumerate(extra)}


def rolling(points: list[tuple[float, float]], end: float, width: float = 5.0) -> tuple[list[float], list[float]]:
    """Sum of values per second over a trailing window of `width` seconds, every 0.5 s."""
    xs = [x / 2 for x in range(int(end * 2) + 1)]
    return xs, [sum(v for t, v in points if x - width < t <= x) / width for x in xs]


def main(src: str, dst: str) -> None:
    r = json.load((gzip.open if src.endswith(".gz") else open)(src, "rt"))
    steps = r.get("engine_steps", [])
    gpu = r["gpu_samples"]
    host = r.get("cpu_samples", [])  # (t, {"rss_gb_all": ...}) every second: this process and its children
    fig, (top, mid, bottom, memory) = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    for name, (label, color) in modes(r).items():
        m = r[name]
        t0, t1 = m["start_abs"], m["end_abs"]
        mine = [s for s in steps if t0 <= s[0] <= t1]
        if mine:
            finished = [(s[0] - t0, s[5]) for s in mine]
        else:  # no engine timeline (older JSON): the finish times recorded by the script
            finished = [(t, 1) for t in m.get("timeline", [])]
        xs, ys = rolling(finished, t1 - t0)
        steady = m.get("steady") or {}
        extra = f", steady {steady['pages_per_s']:.2f}" if steady.get("pages_per_s") else ""
        top.plot(xs, ys, color=color, lw=1.2, label=f"{label}: {m['pages_per_s']:.2f} pages/s end to end{extra}")
        if steady.get("window_start_s") is not None:
            top.axvspan(steady["window_start_s"], steady["window_end_s"], color=color, alpha=0.06)
        mid.plot([s[0] - t0 for s in mine], [s[1] for s in mine], color=color, lw=0.8, label=label)
        busy = [(t - t0, u) for t, u in gpu if t0 <= t <= t1]
        bottom.plot([t for t, _ in busy], [u for _, u in busy], color=color, lw=0.6, alpha=0.8,
                    label=f"{label}: {m['gpu_busy_pct']}% overall"
                          + (f", {steady['gpu_busy_pct']}% steady" if steady.get("gpu_busy_pct") else ""))
        rss = [(t - t0, v["rss_gb_all"]) for t, v in host if t0 <= t <= t1 and "rss_gb_all" in v]
        if rss:  # a variant in a process of its own has no samples here
            memory.plot([t for t, _ in rss], [v for _, v in rss], color=color, lw=0.8,
                        label=f"{label}: peak {max(v for _, v in rss):.1f} GB"
                              + (f", queue {m['queue_pages']}" if m.get("queue_pages") else ""))
    top.set_ylabel("pages/s (5 s window)")
    top.legend(fontsize=7, loc="lower center")
    mid.set_ylabel("requests running in vLLM")
    bottom.set_ylabel("GPU busy % (NVML)")
    bottom.legend(fontsize=7, loc="lower center")
    memory.set_ylabel("host RSS, GB (all processes)")
    memory.set_xlabel("seconds since the mode started")
    memory.set_ylim(bottom=0)
    if memory.lines:
        memory.legend(fontsize=7, loc="lower center")
    args = r["args"]
    top.set_title(f"{args['model'].rstrip('/').rsplit('/', 1)[-1]}"
                  f"{' ' + args['quantization'] if args.get('quantization') else ''}, {r['pages']} pages, "
                  f"lengths {args['lengths']}, max_num_seqs {args['max_num_seqs']} (shaded: steady window)")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
