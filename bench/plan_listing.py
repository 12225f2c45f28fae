"""`batchocr plan` by listing a local folder of N empty `.pdf` files: wall time and the
child process's peak RSS, so that only listing and planning cost anything.

The files lie 1,000 to a folder (`f0000/d0000000.pdf` ...), made with os.open in a loop,
and are deleted after (unless --keep). Sizes are all 0: the plan deals them by name.

    python bench/plan_listing.py --files 100000 1000000 --shards 1000 --folder /tmp/plan-listing
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path

from inventory import time_plan  # bench/inventory.py: this script's folder comes first on sys.path

PER_FOLDER = 1000


def make_files(folder: Path, count: int) -> None:
    """`count` empty .pdf files under folder, PER_FOLDER a subfolder."""
    for start in range(0, count, PER_FOLDER):
        sub = folder / f"f{start // PER_FOLDER:04d}"
        sub.mkdir(parents=True, exist_ok=True)
        fd = os.open(sub, os.O_RDONLY)
        try:
            for i in range(start, min(count, start + PER_FOLDER)):
                os.close(os.open(f"d{i:07d}.pdf", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
        finally:
            os.close(fd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="+", default=[100_000])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/batchocr-plan-listing"))
    parser.add_argument("--keep", action="store_true", help="keep the files after")
    args = parser.parse_args()
    try:
        for count in args.files:
            source = args.folder / f"files-{count}"
            if not source.exists():
                started = time.perf_counter()
                make_files(source.with_suffix(".tmp"), count)
                source.with_suffix(".tmp").rename(source)
                print(f"made {count:,} files in {time.perf_counter() - started:.0f} s", flush=True)
            load = os.getloadavg()[0]
            wall, peak, said = time_plan(source, args.folder / "out", args.shards)
            print(f"files={count:,} shards={args.shards} wall={wall:.1f} s peak_rss={peak / 1e6:.0f} MB "
                  f"load={load:.1f}-{os.getloadavg()[0]:.1f} | {said}", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(args.folder, ignore_errors=True)


if __name__ == "__main__":
    main()
