"""What a run costs: every run records the accelerators it held and for how long
(OUT/_runs/<run_id>.json, `accelerator`), and `batchocr report --gpu-hourly-usd X`
turns the runs of an OUT into pages per accelerator-hour and dollars per million
pages.

An accelerator is a GPU for a GPU engine (vLLM: every GPU visible to the process,
i.e. the pod's), and the whole machine for a CPU engine (count 1). Its seconds are
the run's wall time from start to end, the model's load included: what is paid for.
"""

from __future__ import annotations

import os
import platform
from typing import Any, Iterable

from batchocr.cpus import available_cpus


def cpu_machine() -> dict[str, Any]:
    return {"kind": "cpu", "name": _cpu_name(), "count": 1, "cpus": available_cpus()}


def visible_gpus() -> dict[str, Any]:
    """The GPUs this process can see: NVML (nvidia-ml-py, which vLLM installs) when
    it answers, else the count in CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES.
    NVML does not create a CUDA context (torch.cuda.get_device_name would)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) if count else "GPU"
        finally:
            pynvml.nvmlShutdown()
        return {"kind": "gpu", "name": name.decode() if isinstance(name, bytes) else str(name), "count": count}
    except Exception:  # noqa: BLE001 - no NVML here: the environment's word
        pass
    for var in ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"):
        value = os.environ.get(var, "").strip()
        if value and value not in ("all", "none", "void"):
            return {"kind": "gpu", "name": "GPU", "count": len([d for d in value.split(",") if d.strip()])}
    return {"kind": "gpu", "name": "GPU", "count": 1}


def accelerator(engine) -> dict[str, Any]:
    """What the run holds: the engine's own answer (`Engine.accelerator`: the machine for a
    CPU engine, the GPUs it sees for a GPU engine)."""
    return dict(engine.accelerator)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def summarise(runs: Iterable[dict[str, Any]], pages: int, hourly_usd: float | None = None,
              pages_by_run: dict[str, int] | None = None) -> dict[str, Any] | None:
    """Accelerator-seconds of the runs and, for `pages` pages in the table, pages per
    accelerator-hour and (with a price per accelerator-hour: `hourly_usd`, else the
    latest run's job-spec `gpu_hourly_usd`) dollars per million pages; `per_run`, the
    same for each run from pages_by_run (its pages in the table, after compaction's
    rule). None when no run recorded its accelerator."""
    seconds, names, priced, counted, unrecorded, per_run = 0.0, {}, None, 0, 0, []
    pages_by_run = pages_by_run or {}
    for run in sorted(runs, key=lambda r: r.get("started_at", "")):
        acc = run.get("accelerator")
        if not acc or "seconds" not in acc:  # still running, or written before cost records
            unrecorded += 1
            continue
        counted += 1
        seconds += float(acc["seconds"])
        names[f"{acc.get('count', 1):g} x {acc.get('name', '?')} ({acc.get('kind', '?')})"] = None
        priced = run.get("spec", {}).get("gpu_hourly_usd") or priced  # the latest run that names one
        per_run.append({"run_id": run.get("run_id"), "started_at": run.get("started_at"),
                        "accelerator_seconds": round(float(acc["seconds"]), 3),
                        "pages": pages_by_run.get(run.get("run_id"), 0)})
    if not counted:
        return None
    price, source = (hourly_usd, "--gpu-hourly-usd") if hourly_usd is not None else (priced, "job spec")
    for r in per_run:
        r.update(_rates(r["accelerator_seconds"], r["pages"], price))
    return {
        "accelerators": list(names),
        "runs": counted,
        "runs_without_record": unrecorded,
        "accelerator_seconds": round(seconds, 3),
        "pages": pages,
        **_rates(seconds, pages, price),
        "gpu_hourly_usd": price,
        "price_from": source if price is not None else None,
        "per_run": per_run,
    }


def _rates(seconds: float, pages: int, price: float | None) -> dict[str, float | None]:
    hours = seconds / 3600
    return {"pages_per_accelerator_hour": pages / hours if hours else None,
            "usd_per_million_pages": price * hours / pages * 1e6 if price is not None and pages else None}
