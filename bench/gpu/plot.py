"""Plot pages finished and GPU busy over time from throughput.py's JSON.

    python bench/gpu/plot.py docs/gpu/throughput-7b-run2.json docs/gpu/throughput-7b-run2.png
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src: str, dst: str) -> None:
    r = json.load(open(src))
    b = r.get("b_batchocr", {})
    samples = r["gpu_samples"]
    # b runs last: it ends at the last busy sample and lasted wall_s (older JSON has no start time).
    end = b.get("end_abs") or max(t for t, u in samples if u > 0)
    t0 = b.get("start_abs") or end - b.get("wall_s", 0)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    window = [(t - t0, u) for t, u in samples if t0 - 1 <= t <= end + 1]
    bottom.plot([t for t, _ in window], [u for _, u in window], lw=0.8, color="tab:gray")
    bottom.set_ylabel("GPU busy % (during b)")
    bottom.set_xlabel("seconds since b started")
    for name in ("a_vllm_alone", "b_batchocr", "c_batch_at_a_time"):
        if name not in r:
            continue
        if "timeline" in r[name]:
            ts = r[name]["timeline"]
            # rolling pages/s over 5 s windows
            xs = [x / 2 for x in range(int(max(ts) * 2) + 1)]
            ys = [sum(1 for t in ts if x - 5 < t <= x) / 5 for x in xs]
            top.plot(xs, ys, label=f"{name} ({r[name]['pages_per_s']:.2f} pages/s end to end)")
        else:
            top.axhline(r[name]["pages_per_s"], ls="--", color="tab:orange",
                        label=f"{name}: {r[name]['pages_per_s']:.2f} pages/s (one call, no per-page times)")
    top.set_ylabel("pages/s (5 s window)")
    top.legend(fontsize=8)
    top.set_title(f"{r['args']['model'].rsplit('/', 1)[-1]}, {r['pages']} pages, lengths {r['args']['lengths']}")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
