"""The report's figures gathered a group of shards at a time (batchocr.table.shard_groups)
and merged: sums, value counts and short sorted lists, each exact across groups, since a
document's rows are all in its shard. Only text length and engine time stay one value a
page (4 bytes each: their histogram and percentiles need every value); a summary of 100
million pages holds those and the distinct timestamps, never a row's strings."""

from __future__ import annotations

import collections
import math
from typing import Any, Callable

import numpy as np
import polars as pl

FLAGGED = ("length", "repetition")  # hit max tokens; looping output cut off
FOLD_EVERY = 32  # frames of one kind held before they are merged into one


def _layer() -> pl.Expr:
    """A page whose text came from the text layer (routed, or the textlayer engine); null
    where neither route nor engine says (such a page counts for neither source)."""
    return (pl.col("route") == "textlayer") | (pl.col("route").is_null() & (pl.col("engine") == "textlayer"))


def _turn() -> pl.Expr:
    """The quarter turn a page lay at ("90", "180", "-90"), from its skew_angle's nearest; null
    for a page that lay upright or was not looked at."""
    quarter = ((pl.col("skew_angle") / 90).round().cast(pl.Int64) + 4) % 4
    return quarter.replace_strict({1: "90", 2: "180", 3: "-90"}, default=None, return_dtype=pl.String)


def _folds(top: int, limit: int) -> dict[str, Callable[[pl.DataFrame], pl.DataFrame]]:
    """How each kind of partial figure merges with another of its kind."""
    counted = lambda f: f.group_by("v").agg(pl.col("n").sum())  # noqa: E731 - (value, times) merged
    at_lo = pl.col("at_lo").filter(pl.col("lo") == pl.col("lo").min()).sum()
    return {
        "minute": lambda f: f.group_by("minute").agg(pl.col("pages").sum()),
        "stamp": lambda f: f.group_by("t").agg(pl.col("n").sum()),
        "output_tokens": counted,
        "prompt_tokens": counted,
        "text_chars": counted,
        "run": lambda f: f.group_by("run_id").agg(pl.col("pages").sum(), pl.col("lo").min(), pl.col("hi").max()),
        "model": lambda f: f.group_by("engine", "model").agg(pl.col("pages").sum()),
        "saving": lambda f: f.group_by("run_id").agg(pl.col("lo").min(), pl.col("hi").max(), pl.col("n").sum(), at_lo),
        "saving_ms": counted,
        "slowest": lambda f: f.sort(["latency_ms", "doc_id"], descending=[True, False]).head(top),
        "flagged": lambda f: f.sort("doc_id", "page_index").head(limit),
    }


class Rollup:
    """Figures of the rows added so far (add: one group's rows, one a page already)."""

    def __init__(self, top: int = 10, limit: int = 100):
        self.read = self.kept = self.documents = self.pages = self.flagged_total = 0
        self.added = False  # whether any group was added, even of no rows
        self.finish_reasons: collections.Counter = collections.Counter()
        self.error_types: collections.Counter = collections.Counter()
        self.routes: collections.Counter = collections.Counter()
        self.turned: collections.Counter = collections.Counter()
        self.first = self.last = None
        self.text_chars: list[np.ndarray] = []
        self.latency: dict[str, list[np.ndarray]] = {"model": [], "textlayer": []}
        self.saving = {"routed": 0, "engines": set()}
        self._fold = _folds(top, limit)
        self._frames: dict[str, list[pl.DataFrame]] = {k: [] for k in self._fold}

    def _keep(self, kind: str, frame: pl.DataFrame) -> None:
        frames = self._frames[kind]
        frames.append(frame)
        if len(frames) >= FOLD_EVERY:
            self._frames[kind] = [self._fold[kind](pl.concat(frames))]

    def frame(self, kind: str) -> pl.DataFrame:
        """The merged figure of one kind (an empty frame of its columns where no row gave one)."""
        frames = self._frames[kind]
        return self._fold[kind](pl.concat(frames)) if frames else pl.DataFrame()

    def add(self, read: int, rows: pl.DataFrame) -> None:
        """A group's rows (report.scan's columns): `read` as read, `rows` one a page."""
        self.added = True
        pages = rows.filter(pl.col("page_index") >= 0)
        self.read, self.kept, self.pages = self.read + read, self.kept + rows.height, self.pages + pages.height
        self.documents += rows["doc_id"].n_unique()
        for counter, frame, col in ((self.finish_reasons, rows, "finish_reason"),
                                    (self.error_types, rows, "error_type"), (self.routes, pages, "route")):
            counter.update(dict(frame[col].drop_nulls().value_counts().iter_rows()))
        self.turned.update(dict(pages.select(_turn()).drop_nulls().to_series().value_counts().iter_rows()))
        times = rows["processed_at"].drop_nulls()
        if len(times):
            self.first = min(self.first, times.min()) if self.first is not None else times.min()
            self.last = max(self.last, times.max()) if self.last is not None else times.max()
        at = pl.col("processed_at")
        self._keep("minute", pages.group_by(at.dt.truncate("1m").alias("minute")).agg(pl.len().cast(pl.Int64)
                                                                                     .alias("pages")))
        self._keep("stamp", pages.select(at.alias("t")).drop_nulls().group_by("t").agg(pl.len().cast(pl.Int64)
                                                                                       .alias("n")))
        for col in ("output_tokens", "prompt_tokens", "text_chars"):
            self._keep(col, pages.select(pl.col(col).alias("v")).drop_nulls().group_by("v")
                       .agg(pl.len().cast(pl.Int64).alias("n")))
        self.text_chars.append(pages["text_chars"].drop_nulls().to_numpy())
        for key, mask in (("model", ~_layer()), ("textlayer", _layer())):
            self.latency[key].append(pages.filter(mask.fill_null(False))["latency_ms"].drop_nulls().to_numpy())
        self._keep("run", pages.drop_nulls("run_id").group_by("run_id")
                   .agg(pl.len().cast(pl.Int64).alias("pages"), at.min().alias("lo"), at.max().alias("hi")))
        self._keep("model", pages.group_by("engine", "model").agg(pl.len().cast(pl.Int64).alias("pages")))
        self._keep("slowest", self._fold["slowest"](pages.group_by("doc_id").agg(
            pl.len().alias("pages"), pl.col("latency_ms").sum())))
        flagged = pages.filter(pl.col("finish_reason").is_in(FLAGGED))
        self.flagged_total += flagged.height
        self._keep("flagged", self._fold["flagged"](
            flagged.select("doc_id", "page_index", "finish_reason", "output_tokens")))
        self._add_saving(pages)

    def _add_saving(self, pages: pl.DataFrame) -> None:
        """What cost.route_saving needs (saving_basis): routed pages; the model pages' engine
        ms to the millisecond, counted; each run's first and last model-page time, its model
        pages and those at its first time."""
        self.saving["routed"] += pages.filter(pl.col("route") == "textlayer").height
        model = pages.filter((pl.col("route") == "model") & (pl.col("finish_reason") != "error")
                             & pl.col("latency_ms").is_not_null())
        self.saving["engines"] |= set(model["engine"].drop_nulls())
        self._keep("saving_ms", model.select(pl.col("latency_ms").cast(pl.Float64).round(0).cast(pl.Int64).alias("v"))
                   .group_by("v").agg(pl.len().cast(pl.Int64).alias("n")))
        at = pl.col("processed_at")
        self._keep("saving", model.group_by("run_id").agg(
            at.min().alias("lo"), at.max().alias("hi"), at.count().cast(pl.Int64).alias("n"),
            (at == at.min()).sum().cast(pl.Int64).alias("at_lo")))

    def saving_basis(self) -> tuple[int, pl.DataFrame, pl.DataFrame, set[str]]:
        """cost.route_saving's arguments: routed pages, the model pages' engine ms counted
        (v, n), each run's (lo, hi, n, at_lo) of its model pages, their engines."""
        return self.saving["routed"], self.frame("saving_ms"), self.frame("saving"), self.saving["engines"]

    def take(self, name: str) -> pl.Series:
        """Every page's text_chars, or engine ms of one source of text ("model", "textlayer"),
        handed over once: the tally lets go of them (the largest thing it holds)."""
        arrays = self.text_chars if name == "text_chars" else self.latency[name]
        values = np.concatenate(arrays) if arrays else []
        arrays.clear()
        return pl.Series(name, values, pl.UInt32 if name == "text_chars" else pl.Float32)


def counted_distribution(counts: pl.DataFrame) -> dict[str, float] | None:
    """report.distribution of the values `counts` holds as (v, n): value v, n times."""
    if counts.is_empty():
        return None
    counts = counts.sort("v")
    values = counts["v"].cast(pl.Float64).to_numpy()
    cum = np.cumsum(counts["n"].to_numpy())
    n = int(cum[-1])

    def nearest(q: float) -> float:  # polars' "nearest": the value at rank round((n - 1) q)
        return float(values[np.searchsorted(cum, math.floor((n - 1) * q + 0.5), side="right")])

    total = float(np.dot(values, counts["n"].to_numpy().astype(np.float64)))
    return {"count": n, "mean": total / n, "min": float(values[0]),
            **{f"p{p}": nearest(p / 100) for p in (50, 90, 99)}, "max": float(values[-1])}


def counted_median(counts: pl.DataFrame) -> float:
    """The median of the values `counts` holds as (v, n), as polars' median: the middle
    value, or the mean of the two middle ones."""
    counts = counts.sort("v")
    values, cum = counts["v"].cast(pl.Float64).to_numpy(), np.cumsum(counts["n"].to_numpy())
    n = int(cum[-1])
    at = lambda rank: float(values[np.searchsorted(cum, rank, side="right")])  # noqa: E731
    return (at((n - 1) // 2) + at(n // 2)) / 2


def counted_timeline(counts: pl.DataFrame, buckets_s: tuple[int, ...], max_buckets: int, min_pages: int,
                     done_points: int) -> dict[str, Any] | None:
    """report.timeline of the timestamps `counts` holds as (t, n): rows at t."""
    if counts.is_empty():
        return None
    counts = counts.sort("t")
    total = int(counts["n"].sum())
    span = (counts["t"].max() - counts["t"].min()).total_seconds()
    bucket = next((b for b in buckets_s if span / b <= max_buckets and total * b >= min_pages * span), buckets_s[-1])
    per = (counts.group_by(pl.col("t").dt.truncate(f"{bucket}s").alias("at"))
           .agg(pl.col("n").sum()).sort("at"))
    start, end = per["at"].min(), per["at"].max()
    full = pl.datetime_range(start, end, f"{bucket}s", eager=True).alias("at").to_frame()
    per = full.join(per, on="at", how="left").fill_null(0)
    # The stamps at evenly spread ranks of the sorted rows, and the rows done by each.
    cum = np.cumsum(counts["n"].to_numpy())
    ranks = sorted({round(i * (total - 1) / done_points) for i in range(done_points + 1)})
    at = counts["t"].gather(np.searchsorted(cum, ranks, side="right"))
    done = pl.DataFrame({"t": at, "n": cum[np.searchsorted(cum, ranks, side="right")]}).unique("t").sort("t")
    return {"bucket_s": bucket, "points": [{"at": a.isoformat(), "pages": int(n)} for a, n in per.iter_rows()],
            "done": [{"at": a.isoformat(), "pages": int(n)} for a, n in done.iter_rows()]}
