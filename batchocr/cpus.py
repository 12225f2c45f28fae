"""How many CPUs (and how much memory) this process may really use.

`os.cpu_count()` is the host's count: in a Kubernetes pod with `limits.cpu: 4` on a
64-core node it says 64, and 64 OCR threads on a 4-CPU quota are throttled most of
each scheduling period. The usable count is the smallest of the CPUs this process
may run on (its affinity) and its cgroup's quota (cgroup v2 `cpu.max`, v1
`cpu.cfs_quota_us / cpu.cfs_period_us`), rounded up.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def cgroup_quota(root: Path = CGROUP) -> float | None:
    """CPUs allowed by the cgroup quota, None when unlimited or unknown."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]  # v2: "max 100000" or "400000 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # v1
        quota = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


def available_cpus(root: Path = CGROUP) -> int:
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        count = os.cpu_count() or 1
    quota = cgroup_quota(root)
    if quota is not None:
        count = min(count, math.ceil(quota))
    return max(1, count)


def available_memory_gib(root: Path = CGROUP, meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """GiB of memory this process may use: its cgroup's limit (a pod's `limits.memory`: v2
    `memory.max`, v1 `memory.limit_in_bytes`), else the host's; None where neither is known."""
    for limit in (root / "memory.max", root / "memory" / "memory.limit_in_bytes"):
        try:
            text = limit.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 says "no limit" with a huge number
            return int(text) / 2**30
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20  # kB
    except (OSError, ValueError, IndexError):
        pass
    return None
