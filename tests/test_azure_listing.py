"""Listing an Azure container streams: over 20,000 blobs on Azurite the listing's
memory stays flat (bench/azure_listing.py measures it; docs/BENCHMARKS.md has the
figures). A listing that held the blobs grows by ~5 MB of live heap and ~5 MB of
peak over the same 20,000 (the bench's contrast run)."""

import sys

from azurite import azurite  # noqa: F401 - a fixture
from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
from azure_listing import report, run  # noqa: E402

BLOBS = 20_000


def test_listing_20000_blobs_holds_one_page_at_a_time(azurite):
    result = run(azurite.connection_string, BLOBS, container="listing", hold=False)
    print(report(result))
    streamed = result["streamed"]
    assert streamed["documents"] == BLOBS  # all of them, in name order (checked as they came)
    live, peaks = streamed["live_mb"], streamed["window_peaks_mb"]
    assert len(live) == len(peaks) == 10
    # What the listing holds after 2,000 blobs is what it holds after 20,000 ...
    assert max(live) - live[0] < 0.5, live
    # ... and so is its peak, garbage included.
    assert max(peaks) - peaks[0] < 1.0, peaks
    assert streamed["peak_mb"] < 32
