"""OUT remembers what produced it: the engine, model, preset, prompt, routing and
render settings, in OUT/_producer.json (written by the first run). A run whose
settings differ stops with exit 2 naming both (checked before the engine loads,
from the configuration alone: engines.settings), unless it is asked to reprocess
(`--reprocess`, `reprocess: true`): then the file takes the new settings, pages
made by runs with other settings no longer count as done (they are redone), and
`compact` keeps the rows of runs with the current settings over older ones.

Which run made a row: its `run_id`, whose OUT/_runs/<run_id>.json has the settings.
"""

from __future__ import annotations

import os
from typing import Any, Iterable

from batchocr import layout
from batchocr.errors import ConfigError
from batchocr.storage import Store, each

PRODUCER = layout.PRODUCER
# Render settings that change what a page becomes (not workers, timeouts, batch sizes).
RENDER_KEYS = ("dpi", "max_side", "size_multiple", "max_pixels", "max_image_pixels")


def of_record(record: dict[str, Any]) -> dict[str, Any]:
    """The settings that made a run's rows, from its run record."""
    params = record.get("engine_params") or {}
    return settings(record.get("engine"), record.get("model"), params.get("preset"), params.get("prompt"),
                    (record.get("spec") or {}).get("route"), record.get("render") or {})


def settings(engine: str | None, model: str | None, preset: str | None, prompt: str | None, route: str | None,
             render: dict[str, Any]) -> dict[str, Any]:
    """What OUT remembers: from a run record (of_record), or from the configuration
    alone before the engine loads (pipeline.run_job). The textlayer engine does not route:
    its route is None, whatever was given (an OUT made with --route auto was exit 2 for the
    same engine with --route textlayer, which changes no row)."""
    return {"engine": engine, "model": model, "preset": preset, "prompt": prompt,
            "route": None if engine == "textlayer" else route, "render": {k: render.get(k) for k in RENDER_KEYS}}


def _written(out: Store) -> dict[str, Any] | None:
    """OUT/_producer.json (None: no file) as settings() would give it now: one written before
    a textlayer run's route was None holds its route."""
    producer = out.read_json(PRODUCER) if out.exists(PRODUCER) else None
    if not isinstance(producer, dict) or producer.get("engine") != "textlayer":
        return producer
    return producer | {"route": None}


def _flat(producer: dict[str, Any]) -> dict[str, Any]:
    flat = {k: v for k, v in producer.items() if k != "render"}
    return flat | {f"render.{k}": v for k, v in (producer.get("render") or {}).items()}


def _show(value: Any, other: Any = None) -> str:
    """`value` in at most 60 characters; a string from just before where it differs
    from `other` (two prompts share their model's chat template for ~60 characters)."""
    text = repr(value)
    if isinstance(value, str) and isinstance(other, str):
        cut = len(os.path.commonprefix([text, repr(other)])) - 12
        if cut > 12:
            text = text[0] + "..." + text[cut:]
    return text if len(text) <= 60 else text[:57] + "..."


def describe_change(old: dict[str, Any], new: dict[str, Any]) -> str:
    a, b = _flat(old), _flat(new)
    changed = [k for k in a.keys() | b.keys() if a.get(k) != b.get(k)]
    order = list(a) + [k for k in b if k not in a]
    changed.sort(key=order.index)
    return (", ".join(f"{k} {_show(a.get(k), b.get(k))}" for k in changed) + "; this run: "
            + ", ".join(f"{k} {_show(b.get(k), a.get(k))}" for k in changed))


def check(out: Store, producer: dict[str, Any], reprocess: bool, url: str) -> dict[str, Any] | None:
    """OUT's settings are this run's, or it is asked to reprocess; writes nothing
    (run before the engine loads: a refused run, or one whose engine fails to load,
    leaves OUT as it was). Returns what OUT/_producer.json holds (None: no file)."""
    written = _written(out)
    stored = written if written is not None else _from_runs(out)
    if stored is not None and stored != producer and not reprocess:
        raise ConfigError(f"OUT {url} holds pages made with {describe_change(stored, producer)}: use another OUT, "
                          "or --reprocess to redo its pages with this run's settings")
    return written


def remember(out: Store, producer: dict[str, Any], reprocess: bool, url: str) -> None:
    """Once the engine is up, before the run writes anything: checked again (another
    pod may have written OUT meanwhile), then OUT takes this run's settings."""
    if check(out, producer, reprocess, url) != producer:
        out.write_json(PRODUCER, producer)


def _from_runs(out: Store) -> dict[str, Any] | None:
    """An OUT from before _producer.json: the settings of its latest run."""
    records = [r for r in out.read_jsons(layout.RUNS) if r.get("status") in ("done", "interrupted", "failed")]
    return of_record(max(records, key=lambda r: r.get("started_at", ""))) if records else None


def other_runs(out: Store, run_ids: Iterable[str], producer: dict[str, Any]) -> set[str]:
    """Those of `run_ids` whose record says they ran with other settings (a run
    without a record is taken to be current: its rows are kept)."""
    def other(run_id: str) -> bool:
        rel = layout.run_record(run_id)
        return out.exists(rel) and of_record(out.read_json(rel)) != producer

    ids = sorted({r for r in run_ids if r})  # a shard's rows name a run a day, a year on, in a CronJob's OUT
    return {run_id for run_id, found in zip(ids, each(other, ids)) if found}


def stale_runs(out: Store, run_ids: Iterable[str]) -> set[str]:
    """Those of `run_ids` that ran with settings other than OUT's now (compaction)."""
    now = _written(out)
    return set() if now is None else other_runs(out, run_ids, now)


def stale_in(out: Store, records: list[dict[str, Any]] | None = None) -> set[str]:
    """The runs of OUT's run records (read here unless given) that ran with settings other
    than OUT's now: after a `--reprocess`, their rows lose to the current settings' rows, by
    compaction's rule, which export, eval and report apply before compaction too."""
    now = _written(out)
    if now is None:
        return set()
    records = out.read_jsons(layout.RUNS) if records is None else records
    return {r["run_id"] for r in records if r.get("run_id") and of_record(r) != now}
