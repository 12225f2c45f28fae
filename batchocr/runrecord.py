"""A run's record, OUT/_runs/<run_id>.json: opened "running" before the first page (with the
settings OUT remembers of the run), closed with the run's status, counts, timings, part files
and the accelerator it held."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import platform
from typing import Any, Iterator

import pyarrow as pa

from batchocr import __version__, layout, producer
from batchocr.engines import Engine
from batchocr.errors import BatchocrError, BoundaryError
from batchocr.shard import RunSummary, Shard
from batchocr.spec import RenderSpec


@dataclasses.dataclass
class RunRecord:
    shard: Shard
    engine: Engine
    run_id: str
    record: dict[str, Any]
    settings: dict[str, Any]  # what OUT remembers of the run (producer.of_record)
    held: dict[str, Any]  # the accelerator the run holds (batchocr/cost.py)

    @classmethod
    def open(cls, shard: Shard, engine: Engine, run_id: str, started_at: dt.datetime, render: RenderSpec,
             held: dict[str, Any]) -> "RunRecord":
        """The record written "running", once OUT has taken the run's settings (checked again,
        and against those checked before the engine loaded)."""
        spec, out = shard.spec, shard.out
        # The render settings used: the worker count resolved (the spec's own, 0 for "one per CPU", is in "spec").
        used = dataclasses.asdict(dataclasses.replace(render, workers=render.worker_count))
        record = _record(shard, engine, run_id, started_at) | {"render": used}
        settings = producer.of_record(record)
        expected = shard.settings
        if expected is not None and settings != expected:  # the check before the load was on other settings
            raise BoundaryError(f"engine {engine.name}: OUT was checked before it loaded against settings other than "
                                f"the built engine's ({producer.describe_change(expected, settings)}): "
                                f"engines.{engine.name}.settings() disagrees with the engine")
        producer.remember(out, settings, spec.reprocess, spec.out)
        out.write_json(layout.run_record(run_id), record | {"status": "running"})
        return cls(shard, engine, run_id, record, settings, held)

    @contextlib.contextmanager
    def failed_unless_set_up(self) -> Iterator[None]:
        """A failure before the run closes its record must not leave it "running"."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(BatchocrError):  # the run's own error is the one to tell
                self.shard.out.write_json(layout.run_record(self.run_id), self.record | {
                    "status": "failed", "finished_at": dt.datetime.now(dt.UTC).isoformat()})
            raise

    def close(self, status: str, summary: RunSummary, parts: list[str]) -> None:
        """The record's last word: engine_params again (what it counted, document mode's groups,
        is known now), the counts, timings and part files, the accelerator's seconds."""
        counts = dataclasses.asdict(summary)
        timings = counts.pop("timings")
        self.shard.out.write_json(layout.run_record(self.run_id), self.record | {
            "engine_params": self.engine.describe(),
            "status": status,
            "finished_at": dt.datetime.now(dt.UTC).isoformat(),
            "counts": counts,
            "timings": timings,
            "pages_per_s": round(summary.pages_per_s, 3),
            "parts": parts,
            "accelerator": self.held | {"seconds": round(summary.seconds * self.held["count"], 3)},
        })


def _record(shard: Shard, engine: Engine, run_id: str, started_at: dt.datetime) -> dict[str, Any]:
    import fsspec
    import pymupdf

    return {
        "run_id": run_id,
        "started_at": started_at.isoformat(),
        "engine": engine.name,
        "model": engine.model,
        "engine_params": engine.describe(),
        "spec": shard.spec.public(),
        "versions": {
            "batchocr": __version__,
            "python": platform.python_version(),
            "pyarrow": pa.__version__,
            "pymupdf": pymupdf.__version__,
            "fsspec": fsspec.__version__,
        },
        "host": platform.node(),
    }
