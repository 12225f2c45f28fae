"""Does writing a step's n-gram bans make the host wait for the GPU? On the lent GPU, torch alone:

    python3 bench/gpu/check_ban_sync.py --json /tmp/ban-sync.json

The GPU is kept busy (a queue of matrix products, ~30 ms), then the bans of a step of 256 requests
are written into logits of Unlimited-OCR's vocabulary, the old way (`logits[r, c] = -inf`, batchocr
before the sixth lease) and by batchocr.engines.vllm.patches.ngram.write_bans; the host's time in the call is timed.
A call that waits for the GPU takes about the queue's length; one that does not, well under a
millisecond. Both must leave the same logits. Exit 1 if they differ or write_bans waits.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--bans", type=int, default=3, help="tokens banned a request")
    ap.add_argument("--vocab", type=int, default=129280)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    from batchocr.engines.vllm.patches.ngram import write_bans

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    rows = [r for r in range(args.requests) for _ in range(args.bans)]
    cols = torch.randint(0, args.vocab, (len(rows),), generator=g).tolist()
    base = torch.randn(args.requests, args.vocab, device=dev)
    x = torch.randn(4096, 4096, device=dev)

    def old(logits):  # batchocr.engines.vllm.patches.ngram before the sixth lease
        index = torch.tensor([rows, cols], dtype=torch.long).to(logits.device, non_blocking=True)
        logits[index[0], index[1]] = -float("inf")

    def new(logits):
        write_bans(logits, rows, cols)

    def busy_ms() -> float:  # how long the queued work takes alone
        torch.cuda.synchronize()
        t = time.perf_counter()
        queue()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) * 1e3

    def queue():
        y = x
        for _ in range(12):
            y = y @ x
        return y

    report = {"requests": args.requests, "bans_per_request": args.bans, "vocab": args.vocab,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    outs = {}
    for name, fn in (("old", old), ("new", new), ("old", old), ("new", new)):  # each twice: warm, then timed
        host = []
        for _ in range(args.repeat):
            logits = base.clone()
            torch.cuda.synchronize()
            queue()  # the step's forward, still running when the processor writes its bans
            t = time.perf_counter()
            fn(logits)
            host.append((time.perf_counter() - t) * 1e3)
            torch.cuda.synchronize()
        outs[name] = logits
        report[name] = {"host_ms_median": round(statistics.median(host), 3), "host_ms_max": round(max(host), 3)}
    report["queue_ms"] = round(statistics.median(busy_ms() for _ in range(5)), 2)
    report["same_logits"] = bool(torch.equal(outs["old"], outs["new"]))
    report["banned"] = int(torch.isinf(outs["new"]).sum())
    report["new_waits"] = report["new"]["host_ms_median"] > report["queue_ms"] / 4
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    sys.exit(0 if report["same_logits"] and not report["new_waits"] else 1)


if __name__ == "__main__":
    main()
