"""Bytes that resume and `batchocr status` download from Azure Blob (Azurite), before and
after reading only the key columns, over an OUT of many part files with long texts.

"before" is the old way, in the same run: every part file downloaded whole
(Store.read_bytes), then its key columns parsed. "after" is sink.committed_keys
(Store.read_parquet: the footer and the key column chunks only). Bytes are counted
by a loopback proxy between the client and Azurite (what the server sent back).

    python bench/resume_bytes.py [--parts 20] [--pages-per-part 500] [--chars 3000] [--json FILE]

Needs npm (tests/tools.py installs Azurite into .tools/) and the azure extra.
"""

from __future__ import annotations

import argparse
import io
import json
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", type=int, default=20)
    ap.add_argument("--pages-per-part", type=int, default=500)
    ap.add_argument("--chars", type=int, default=3000, help="characters of text per page")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    import pyarrow as pa
    import pyarrow.parquet as pq

    from azurite import Azurite, connection_string
    from batchocr.sink import KEY_COLUMNS, committed_keys, to_parquet
    from batchocr.status import status
    from batchocr.storage import Store
    from faultproxy import FaultProxy
    from synthetic import long_text_parts

    pages = args.parts * args.pages_per_part
    parts = long_text_parts(documents=pages // 10, pages=10, parts=args.parts, chars=args.chars)
    server = Azurite(Path(tempfile.mkdtemp()))
    try:
        server.container("bench")
        store = Store("az://bench/out", server.options())
        total = 0
        for n, table in enumerate(parts):
            data = to_parquet(table)
            total += len(data)
            store.write_atomic(f"pages/shard-00000/part-r-{n:05d}.parquet", data)
        proxy = FaultProxy(server.port, reset_share=0.0)
        counted = Store("az://bench/out", {"connection_string": connection_string(proxy.port)})

        def measure(fn) -> tuple[int, int]:
            before, requests = proxy.bytes_to_client, proxy.requests
            fn()
            return proxy.bytes_to_client - before, proxy.requests - requests

        def old_keys():
            tables = [pq.read_table(io.BytesIO(counted.read_bytes(rel)), columns=KEY_COLUMNS)
                      for rel in counted.find("pages/shard-00000", suffix=".parquet")]
            assert sum(t.num_rows for t in tables) == pages

        def new_keys():
            assert committed_keys(counted, 0).num_rows == pages

        def new_status():
            assert status(counted)[0].pages == pages

        (old, old_requests), (new, new_requests), (st, st_requests) = map(measure, (old_keys, new_keys, new_status))
        proxy.stop()
    finally:
        server.stop()
    result = {
        "parts": args.parts, "pages": pages, "chars_per_page": args.chars, "part_bytes_total": total,
        "resume_bytes_before": old, "resume_bytes_after": new, "status_bytes_after": st,
        "resume_requests_before": old_requests, "resume_requests_after": new_requests, "status_requests_after": st_requests,
        "after_over_before": round(new / old, 4),
        "machine": f"{platform.machine()}, Python {platform.python_version()}, pyarrow {pa.__version__}",
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
