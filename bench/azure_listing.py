"""Peak memory of listing an Azure Blob container (on Azurite) of 20,000 blobs.

The listing streams one page of names (1,000) at a time, so its memory must not
grow as it goes. The listing runs in a fresh process, after a warm-up listing
(imports, client, connections), with tracemalloc on, and at every tenth of the way
records: the Python heap's peak over that stretch, and the heap still live after a
garbage collection (what the listing holds). For contrast the same blobs are also
listed into a list, as a listing that holds the container would. Also reported: the
growth of the process's peak RSS.

    python bench/azure_listing.py [--blobs 20000] [--json FILE]
    python bench/azure_listing.py --folders 200 --per-folder 100

With --folders: the listing's time over that many virtual folders at the top of a
container, listed flat (one continuation chain, as before issue 51) and by folders
(AzureBackend.walk: LIST_AHEAD folders at once), each best of three, in one process: on
loopback, then with 50 ms slept before each listing request (a round trip to Azure).

Needs npm (tests/tools.py installs Azurite into .tools/) and the azure extra.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

CHILD = """
import gc, json, resource, sys, time, tracemalloc
from batchocr.sources import list_documents
from batchocr.storage import Store
url, warm, mode, count, cs = sys.argv[1:6]
options, step = {"connection_string": cs}, int(count) // 10
sum(1 for _ in list_documents(Store(warm, options)))  # imports, client, connections
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
t = time.monotonic()
n, last, held, peaks, live = 0, "", [], [], []
for doc in list_documents(Store(url, options)):
    assert doc.uri > last, "not in name order"
    n, last = n + 1, doc.uri
    if mode == "hold":
        held.append(doc)
    if n % step == 0:
        peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
        gc.collect()
        live.append(tracemalloc.get_traced_memory()[0] / 2**20)
        tracemalloc.reset_peak()
print(json.dumps({"mode": mode, "documents": n, "seconds": time.monotonic() - t, "peak_mb": max(peaks),
                  "window_peaks_mb": peaks, "live_mb": live,
                  "rss_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024}))
"""


def upload(connection_string: str, container: str, prefix: str, count: int, concurrency: int = 32) -> None:
    """`count` tiny blobs named PREFIX/doc000000.pdf ...; the listing's cost is per name, not per byte."""
    from azure.storage.blob.aio import BlobServiceClient

    async def put_all():
        async with BlobServiceClient.from_connection_string(connection_string) as service:
            cc = service.get_container_client(container)
            if not await cc.exists():
                await cc.create_container()
            names = iter([f"{prefix}/doc{i:06d}.pdf" for i in range(count)])

            async def worker():
                for name in names:
                    await cc.upload_blob(name, b"%PDF-1.4 tiny", overwrite=True)

            await asyncio.gather(*(worker() for _ in range(concurrency)))

    asyncio.run(put_all())


def measure(connection_string: str, url: str, warm_url: str, count: int, mode: str = "stream") -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, url, warm_url, mode, str(count), connection_string],
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(connection_string: str, blobs: int, container: str = "listing", hold: bool = True) -> dict:
    upload(connection_string, container, "warm", 10)
    upload(connection_string, container, "big", blobs)
    base, warm = f"az://{container}", f"az://{container}/warm"
    result = {"streamed": measure(connection_string, f"{base}/big", warm, blobs)}
    if hold:
        result["held"] = measure(connection_string, f"{base}/big", warm, blobs, mode="hold")
    return result


def by_folders(connection_string: str, folders: int, per_folder: int, latencies=(0.0, 0.05),
               container: str = "folders") -> dict:
    """Seconds to list FOLDERS x PER_FOLDER blobs flat and by folders (best of three each),
    on loopback and with each listing request delayed by the given latencies (seconds)."""
    import time

    from fsspec.asyn import sync

    from batchocr.storage import azureblob

    for i in range(folders):
        upload(connection_string, container, f"f{i:04d}", per_folder)
    backend = azureblob.AzureBackend(f"az://{container}/", {"connection_string": connection_string})

    def flat() -> int:
        count, token = 0, None
        while True:
            page, token = sync(backend.fs.loop, azureblob._list_page, backend.fs.service_client, container, "", token)
            count += len(page)
            if not token:
                return count

    def walked() -> int:
        return sum(1 for _ in backend.walk(container))

    real = azureblob._list_page

    async def far(*args, **kwargs):  # a round trip longer than loopback's, as to Azure
        await asyncio.sleep(delay)
        return await real(*args, **kwargs)

    result = {"folders": folders, "per_folder": per_folder, "list_ahead": azureblob.LIST_AHEAD, "runs": []}
    for delay in latencies:
        azureblob._list_page = far if delay else real
        run = {"latency_ms": delay * 1000}
        for name, listing in (("flat", flat), ("by_folders", walked)):
            times = []
            for _ in range(3):
                t = time.monotonic()
                assert listing() == folders * per_folder
                times.append(time.monotonic() - t)
            run[name] = min(times)
        result["runs"].append(run)
    azureblob._list_page = real
    return result


def report(result: dict) -> str:
    if "runs" in result:
        return "\n".join(f"{result['folders']} folders x {result['per_folder']} blobs, {r['latency_ms']:.0f} ms "
                         f"added a request: flat {r['flat']:.2f} s, by folders ({result['list_ahead']} ahead) "
                         f"{r['by_folders']:.2f} s" for r in result["runs"])
    lines = []
    for key, what in (("streamed", "streamed"), ("held", "held in a list (contrast)")):
        if key not in result:
            continue
        r = result[key]
        lines += [f"{what}: {r['documents']} blobs in {r['seconds']:.1f} s; heap peak {r['peak_mb']:.1f} MB, "
                  f"peak RSS growth {r['rss_growth_mb']:.1f} MB",
                  "  heap peak per tenth (MB): " + " ".join(f"{p:.1f}" for p in r["window_peaks_mb"]),
                  "  heap live per tenth (MB): " + " ".join(f"{p:.2f}" for p in r["live_mb"])]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blobs", type=int, default=20_000)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--folders", type=int, help="time a listing of this many folders, flat and by folders")
    ap.add_argument("--per-folder", type=int, default=100)
    args = ap.parse_args()
    from azurite import Azurite

    with tempfile.TemporaryDirectory() as tmp:
        server = Azurite(Path(tmp))
        try:
            result = (by_folders(server.connection_string, args.folders, args.per_folder) if args.folders
                      else run(server.connection_string, args.blobs))
        finally:
            server.stop()
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result | {"python": platform.python_version(),
                                                  "machine": platform.machine()}, indent=2))


if __name__ == "__main__":
    main()
