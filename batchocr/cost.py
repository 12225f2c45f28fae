"""What a run costs: every run records the accelerators it held and for how long
(OUT/_runs/<run_id>.json, `accelerator`), and `batchocr report --gpu-hourly-usd X`
turns the runs of an OUT into pages per accelerator-hour and dollars per million
pages.

An accelerator is a GPU for a GPU engine (vLLM: every GPU visible to the process,
i.e. the pod's), and the whole machine for a CPU engine (count 1). Its seconds are
the run's wall time from start to end, the model's load included: what is paid for.

And what routing pages to their text layer saved (route_saving): an estimate that says
what it rests on, and gives no total on too few model pages.
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


# Fewer model pages than this in OUT: `report` gives what a model page cost and on what,
# not a total for the routed pages (seven scans read on a busy machine made "5,714.5 s").
MIN_BASIS_PAGES = 20


def route_saving(routed: int, latency_ms, runs, engines: set[str]) -> dict[str, Any] | None:
    """The engine time the pages routed to their text layer did not cost, from the same
    output's own model pages: routed pages x engine seconds per model page, with its basis
    (how many model pages, which statistic, when they were read). `saved_s` is None where
    fewer than MIN_BASIS_PAGES model pages stand behind it. From report's rollup
    (Rollup.saving_basis): `latency_ms` the model pages' engine ms counted (v, n), `runs`
    each run's first and last model-page time (lo, hi), its model pages (n) and those at
    its first time (at_lo).

    A page's latency_ms is its own wall time inside the engine. A sequential engine
    (rapidocr) spends that on it; the median, since a few pages read while the machine was
    busy would pull a mean far off. A concurrent engine (vLLM) overlaps hundreds, so its
    cost per page is the interval between finished pages: the processed_at span of each
    run's model pages over the pages after its first timestamp (rows written together share
    one). The smaller of the two is the estimate. None without routed or model pages."""
    from batchocr.rollup import counted_median

    model = int(latency_ms["n"].sum()) if not latency_ms.is_empty() else 0
    if not routed or not model:
        return None
    median_s = counted_median(latency_ms) / 1000
    after = int((runs["n"] - runs["at_lo"]).sum())
    interval_s = float((runs["hi"] - runs["lo"]).dt.total_microseconds().sum()) / 1e6 / after if after > 0 else None
    by_interval = interval_s is not None and interval_s < median_s
    per_page = interval_s if by_interval else median_s
    first, last = runs["lo"].min(), runs["hi"].max()
    return {"engine": ", ".join(sorted(engines)), "device": "GPU" if "vllm" in engines else "CPU",
            "routed_pages": routed, "model_pages": model, "seconds_per_model_page": per_page,
            "basis": "finish interval" if by_interval else "median latency",
            "median_latency_s": median_s, "finish_interval_s": interval_s,
            "measured_from": first.isoformat() if first is not None else None,
            "measured_to": last.isoformat() if last is not None else None,
            "min_model_pages": MIN_BASIS_PAGES,
            "saved_s": routed * per_page if model >= MIN_BASIS_PAGES else None}


def saving_lines(s: dict[str, Any]) -> list[str]:
    """route_saving as `report` prints it: the total (or why there is none), then its basis."""
    from batchocr.words import plural

    name = s["device"] + " time saved"
    pages = plural(s["model_pages"], f"{s['engine']} page")
    if s["basis"] == "finish interval":
        how = f"the interval between their finishes (their median engine time {s['median_latency_s']:.3f} s)"
    else:
        how = "their median engine time"
    when = f" read {_span(s['measured_from'], s['measured_to'])}" if s["measured_from"] else ""
    basis = [f"    basis: {pages}{when}", f"    {s['seconds_per_model_page']:.3f} s a page: {how}"]
    if s["saved_s"] is None:
        return [f"  {name:<22} {'not estimated':>12}  ({pages} here, {s['min_model_pages']} needed to estimate "
                f"{plural(s['routed_pages'], 'routed page')})", *basis]
    return [f"  {name:<22} {s['saved_s']:>12,.1f} s  ({plural(s['routed_pages'], 'page')} "
            f"x {s['seconds_per_model_page']:.3f} s, a {s['engine']} page here)", *basis]


def _span(first: str, last: str) -> str:
    """'2026-12-05 14:02 to 14:10 UTC', or with both dates where they differ."""
    import datetime as dt

    a, b = dt.datetime.fromisoformat(first), dt.datetime.fromisoformat(last)
    zone = " UTC" if a.utcoffset() == dt.timedelta(0) else a.strftime(" %z")
    end = b.strftime("%H:%M") if a.date() == b.date() else b.strftime("%Y-%m-%d %H:%M")
    return f"{a.strftime('%Y-%m-%d %H:%M')} to {end}{zone}"
