"""The run summary, read back from the page table: pages, documents, finish reasons,
errors, throughput over time, tokens and text length per page, slowest documents,
pages that hit the token limit or looped, and CER against ground truth.

Only the columns a figure needs are read (a lazy scan with projection pushdown;
the text column only for its length, the text itself only with --truth), so a
summary of millions of pages holds a few small columns, never the text. Before
compaction a redone page can have several rows: the summary keeps one per
(doc_id, page_index) by compaction's own rule (batchocr.compact.dedupe). The rows
are read a few whole shards at a time and tallied (batchocr.rollup), so memory
follows a group of shards, not the table.
"""

from __future__ import annotations

import collections
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Iterable

import polars as pl

from batchocr import cost
from batchocr.compact import dedupe
from batchocr.evaluate import page_line
from batchocr.rollup import Rollup, counted_distribution, counted_timeline
from batchocr.words import duration, duration_word, plural

# What the summary reads: dedupe's keys and the figures' columns; text only as its length.
COLUMNS = ["doc_id", "source_etag", "page_index", "page_count", "finish_reason", "error_type", "prompt_tokens",
           "output_tokens", "latency_ms", "processed_at", "engine", "model", "run_id", "route", "skew_angle"]


def scan(pages: pl.LazyFrame) -> pl.LazyFrame:
    # An output written before routing existed has no route column.
    route = [] if "route" in pages.collect_schema().names() else [pl.lit(None, pl.String).alias("route")]
    return pages.with_columns(route).select(*COLUMNS, pl.col("text").str.len_chars().alias("text_chars"))


def one_row_per_page(rows: pl.DataFrame, stale: frozenset[str] | set[str] = frozenset()) -> pl.DataFrame:
    """dedupe(rows), applied only to the documents it can change: those with a page
    of several rows, several versions, or a document row beside page rows. A
    compacted or clean output has none, and sorting every row is what costs memory
    (the report's peak RSS over 1M rows: 760 MB with dedupe over all, 415 MB so)."""
    docs = rows.group_by("doc_id").agg(n=pl.len(), keys=pl.col("page_index").n_unique(),
                                       etags=pl.col("source_etag").n_unique(), low=pl.col("page_index").min())
    redo = docs.filter((pl.col("n") != pl.col("keys")) | (pl.col("etags") > 1)
                       | ((pl.col("low") < 0) & (pl.col("n") > 1)))["doc_id"].implode()
    if redo.list.len()[0] == 0:
        return rows
    return pl.concat([rows.filter(~pl.col("doc_id").is_in(redo)), dedupe(rows.filter(pl.col("doc_id").is_in(redo)), stale)])


def distribution(values: pl.Series) -> dict[str, float] | None:
    """count, mean, min, p50, p90, p99, max of the non-null values; None if there are none."""
    values = values.drop_nulls().cast(pl.Float64)
    if values.is_empty():
        return None
    q = {f"p{p}": float(values.quantile(p / 100, interpolation="nearest")) for p in (50, 90, 99)}
    return {"count": values.len(), "mean": float(values.mean()), "min": float(values.min()), **q,
            "max": float(values.max())}


def histogram(values: pl.Series, max_bins: int = 40) -> dict[str, list] | None:
    """numpy's "auto" bins (Sturges for few values, Freedman-Diaconis for many: 10
    pages get 5 bins, not 20 bars of 0 or 1), at most max_bins."""
    import numpy as np

    values = values.drop_nulls().to_numpy()
    if not len(values):
        return None
    edges = np.histogram_bin_edges(values, bins="auto")
    counts, edges = np.histogram(values, bins=edges if len(edges) <= max_bins + 1 else max_bins)
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


@dataclass(frozen=True)
class Report:
    out: str
    rows: int  # rows read, duplicates of a redone page included
    duplicates: int  # rows a compaction would drop
    documents: int
    pages: int  # one per (doc_id, page_index >= 0)
    document_errors: int  # rows about a document that could not be opened (page_index -1)
    finish_reasons: dict[str, int]
    error_types: dict[str, int]
    first_at: str | None
    last_at: str | None
    span_s: float | None  # from the first row to the last
    pages_per_minute: float | None  # pages over that span; None when every row has one timestamp
    per_minute: list[dict[str, Any]]  # {"minute": ISO time, "pages": n} for each minute with rows
    text_chars: dict[str, float] | None
    text_chars_histogram: dict[str, list] | None
    output_tokens: dict[str, float] | None  # VLM engines only: None for CPU engines
    prompt_tokens: dict[str, float] | None
    # Engine time per page, by where the text came from ("model", "textlayer"): a text-layer
    # page costs ~0 ms, and pooled with the model's pages it would hide their latency.
    latency_ms_by_route: dict[str, dict[str, float]]
    slowest_documents: list[dict[str, Any]]  # source_uri, doc_id, pages, latency_ms (sum)
    flagged_total: int  # pages with finish_reason length or repetition
    flagged_pages: list[dict[str, Any]]  # the first `limit` of them
    routes: dict[str, int] = dataclasses.field(default_factory=dict)  # pages by route (textlayer, model)
    # Pages an engine turned upright, by the quarter turn they lay at ("90", "180", "-90": skew_angle's nearest)
    turned: dict[str, int] = dataclasses.field(default_factory=dict)
    route_saving: dict[str, Any] | None = None  # engine time the routed pages did not cost (cost.route_saving)
    cer: dict[str, Any] | None = None  # with truth: overall, chars, errors, pages, missing
    cost: dict[str, Any] | None = None  # accelerator-seconds of the runs, $ per million pages (cost.summarise)
    timeline: dict[str, Any] | None = None  # pages in buckets sized to the span (timeline())
    runs: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # the run records, in brief (run_brief)
    models: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # pages by engine and model

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)


def load_report(out: str, storage_options: dict[str, Any] | None = None, **options) -> Report:
    """The report of an OUT, as `batchocr report` prints it: its page table and its run
    records (for the header and the cost). options: build_report's (truth, top,
    limit, gpu_hourly_usd)."""
    from batchocr import layout, producer
    from batchocr.storage import Store
    from batchocr.table import read_pages, shard_groups

    pages = read_pages(out, storage_options)
    store = Store(out, storage_options)
    runs = store.read_jsons(layout.RUNS)
    groups = (group for _, group in shard_groups(out, storage_options))
    return build_report(pages, out=out, runs=runs, stale=producer.stale_in(store, runs), groups=groups, **options)


def build_report(pages: pl.LazyFrame, out: str = "", truth: str | None = None, top: int = 10,
                 limit: int = 100, runs: list[dict[str, Any]] | None = None,
                 gpu_hourly_usd: float | None = None, stale: frozenset[str] | set[str] = frozenset(),
                 groups: Iterable[pl.LazyFrame] | None = None) -> Report:
    """pages: the page table (batchocr.read_pages). truth: a folder for evaluate().
    runs: the OUT's run records (OUT/_runs/*.json), for the header and the cost.
    stale: runs made with settings OUT no longer has, whose rows lose to the current
    settings' (batchocr.producer.stale_in; load_report reads all three). groups: the same
    rows a few whole shards at a time (batchocr.table.shard_groups), each read, given one
    row a page and tallied in turn, so memory follows a group, not the table (none: `pages`
    is one group)."""
    t = Rollup(top, limit)
    for group in groups if groups is not None else [pages]:
        raw = scan(group).collect()
        t.add(raw.height, one_row_per_page(raw, stale))
    if not t.added:  # no part at all: the figures of no rows
        t.add(0, scan(pages).collect())
    span_s = (t.last - t.first).total_seconds() if t.first is not None else None
    run_rows = {run: {"pages": n, "first_row_at": lo, "last_row_at": hi}
                for run, n, lo, hi in t.frame("run").select("run_id", "pages", "lo", "hi").iter_rows()}
    models = t.frame("model").drop_nulls("engine").sort(["pages", "engine", "model"], descending=[True, False, False])
    minutes = t.frame("minute").drop_nulls("minute").sort("minute")
    ordered = lambda c: dict(sorted(c.items(), key=lambda kv: (-kv[1], str(kv[0]))))  # noqa: E731
    return Report(
        out=out, rows=t.read, duplicates=t.read - t.kept, documents=t.documents, pages=t.pages,
        document_errors=t.kept - t.pages, finish_reasons=ordered(t.finish_reasons), error_types=ordered(t.error_types),
        first_at=t.first.isoformat() if t.first is not None else None,
        last_at=t.last.isoformat() if t.last is not None else None,
        span_s=span_s,
        pages_per_minute=t.pages / (span_s / 60) if span_s else None,  # over the real span, however short
        per_minute=[{"minute": m.isoformat(), "pages": n} for m, n in minutes.iter_rows()],
        text_chars=counted_distribution(t.frame("text_chars")),
        text_chars_histogram=histogram(t.take("text_chars")),
        output_tokens=counted_distribution(t.frame("output_tokens")),
        prompt_tokens=counted_distribution(t.frame("prompt_tokens")),
        latency_ms_by_route={k: d for k in ("model", "textlayer") if (d := distribution(t.take(k))) is not None},
        **_notable(pages, t),
        routes=ordered(t.routes),
        turned=ordered(t.turned),
        route_saving=cost.route_saving(*t.saving_basis()),
        cer=_cer(pages, truth, stale) if truth else None,
        cost=cost.summarise(runs, t.pages, gpu_hourly_usd, {r: v["pages"] for r, v in run_rows.items()}) if runs else None,
        timeline=counted_timeline(t.frame("stamp"), BUCKETS_S, MAX_BUCKETS, MIN_PAGES_A_BUCKET, DONE_POINTS),
        runs=sorted((run_brief(r, run_rows) for r in runs or []), key=lambda r: (r["started_at"] or "", r["run_id"])),
        models=models.to_dicts(),
    )


def _notable(pages: pl.LazyFrame, t: Rollup) -> dict[str, Any]:
    """The `top` slowest documents and the first `limit` pages that hit the token limit or looped
    (as tallied), each with its document's source URI."""
    slowest, flagged = t.frame("slowest"), t.frame("flagged")
    uris = _uris(pages, slowest["doc_id"].to_list() + flagged["doc_id"].to_list())
    return {
        "slowest_documents": [{"source_uri": uris.get(d), "doc_id": d, "pages": n, "latency_ms": float(ms or 0)}
                              for d, n, ms in slowest.select("doc_id", "pages", "latency_ms").iter_rows()],
        "flagged_total": t.flagged_total,
        "flagged_pages": [{"source_uri": uris.get(d), "doc_id": d, "page_index": i, "finish_reason": r,
                           "output_tokens": o} for d, i, r, o in flagged.iter_rows()],
    }


START_TIMINGS = ("turn_wait_s", "engine_start_s", "first_page_s", "first_request_s", "first_row_s")  # a run record's


def run_brief(record: dict[str, Any], run_rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What the report says of a run record (OUT/_runs/<run_id>.json), with its rows
    in the table (pages, first and last processed_at): the header, and where its
    accelerator time went (start-up before its first row, reading, after its last)."""
    shard = (record.get("spec") or {}).get("shard") or {}
    mine = run_rows.get(record.get("run_id"), {})
    timings = record.get("timings") or {}
    iso = lambda t: t.isoformat() if t is not None else None  # noqa: E731
    return {"run_id": record.get("run_id"), "status": record.get("status"), "engine": record.get("engine"),
            "model": record.get("model"), "started_at": record.get("started_at"),
            "finished_at": record.get("finished_at"), "host": record.get("host"),
            "shard": f"{shard['index']}/{shard['count']}" if "index" in shard and "count" in shard else None,
            "accelerators": (record.get("accelerator") or {}).get("count"),
            "pages": mine.get("pages", 0), "first_row_at": iso(mine.get("first_row_at")),
            "last_row_at": iso(mine.get("last_row_at")),
            # where its start went, in seconds from its start (runs recorded before these timings: none)
            "start": {k: timings[k] for k in START_TIMINGS if k in timings}}


# Bucket widths for the throughput chart, in seconds: round figures from a second to a week.
BUCKETS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 2 * 3600, 3 * 3600, 6 * 3600,
             12 * 3600, 86400, 7 * 86400)
MAX_BUCKETS = 100  # a readable chart: at most this many bars...
DONE_POINTS = 400
MIN_PAGES_A_BUCKET = 10  # ...and this many pages a bar on average: rows are committed in batches, so
#                          finer buckets only show when a batch happened to land (60 → 0 → 180 → 0)


def timeline(stamps: pl.Series) -> dict[str, Any] | None:
    """Pages over time, in buckets that follow the run's length: the first width in
    BUCKETS_S with at most MAX_BUCKETS buckets over the span and MIN_PAGES_A_BUCKET
    pages a bucket on average (a 10-page demo: 15 s; 655 pages in 8 minutes: 10 s;
    10 million pages in three days: 1 h). {"bucket_s", "points": [{"at": ISO start
    of the bucket, "pages": n}], "done": [{"at", "pages": done by then}]}, empty
    buckets included (a stall shows as zero)."""
    stamps = stamps.drop_nulls()
    counts = stamps.to_frame("t").group_by("t").agg(pl.len().cast(pl.Int64).alias("n"))
    return counted_timeline(counts, BUCKETS_S, MAX_BUCKETS, MIN_PAGES_A_BUCKET, DONE_POINTS)


def _uris(pages: pl.LazyFrame, doc_ids: list[str]) -> dict[str, str]:
    """source_uri of a few documents: a second scan, filtered, rather than carrying
    every row's URI through the summary."""
    if not doc_ids:
        return {}
    found = (pages.filter(pl.col("doc_id").is_in(sorted(set(doc_ids))))
             .select("doc_id", "source_uri").unique().collect())
    return dict(found.iter_rows())


def _cer(pages: pl.LazyFrame, truth: str, stale: frozenset[str] | set[str]) -> dict[str, Any]:
    from batchocr.evaluate import evaluate_output

    result = evaluate_output(pages, truth, stale)
    return {"overall": result.cer, "chars": result.chars, "errors": result.errors,
            "pages": result.pages.to_dicts(), "missing": result.missing}


def _dist_line(name: str, d: dict[str, float] | None, unit: str = "") -> str:
    if d is None:
        return f"  {name:<22} n/a"
    return (f"  {name:<22} mean {d['mean']:>8.1f}  p50 {d['p50']:>8.1f}  p90 {d['p90']:>8.1f}  "
            f"p99 {d['p99']:>8.1f}  max {d['max']:>8.1f}{unit}  ({plural(d['count'], 'page')})")


def _stamp(iso: str | None) -> str:
    if not iso:
        return "?"
    import datetime as dt

    t = dt.datetime.fromisoformat(iso)
    return t.strftime("%Y-%m-%d %H:%M:%S") + (" UTC" if t.utcoffset() == dt.timedelta(0) else t.strftime(" %z"))


def run_state(run: dict[str, Any]) -> str:
    """A run's status as its record has it; a run recorded `running` has no end recorded:
    it still runs, or it was killed (SIGKILL, a spot node reclaimed) and nothing can say so."""
    if run["status"] != "running":
        return run["status"] or "?"
    last = f"its last row {_stamp(run['last_row_at'])}" if run["last_row_at"] else "no row yet"
    return f"running or killed (no end recorded; {last})"


def header_lines(r: Report, most: int = 3) -> list[str]:
    """Which runs and engines made OUT: run ids (the first `most`), engines and models."""
    lines = []
    if len(r.runs) > 1:
        states = collections.Counter(run["status"] or "?" for run in r.runs)
        lines.append(f"  {'runs':<10} {plural(len(r.runs), 'run')}: "
                     + ", ".join(f"{n:,} {state}" for state, n in states.most_common()))
    for i, run in enumerate(r.runs[:most]):
        shard = f", shard {run['shard']}" if run["shard"] and run["shard"] != "0/1" else ""
        lines.append(f"  {'run' if i == 0 and len(r.runs) == 1 else '':<10} {run['run_id']}  {run_state(run)}, "
                     f"started {_stamp(run['started_at'])}, {plural(run['pages'], 'page')} in the table{shard}")
    if len(r.runs) > most:
        lines.append(f"  {'':<10} ... and {plural(len(r.runs) - most, 'more run')} (--json lists them all)")
    for i, m in enumerate(r.models):
        lines.append(f"  {'engine' if i == 0 else '':<10} {m['engine']} ({m['model'] or '?'}): "
                     f"{plural(m['pages'], 'page')}")
    return lines


def _cost_lines(c: dict[str, Any] | None) -> list[str]:
    if c is None:
        return ["  (no run recorded its accelerator time)"]
    lines = [f"  {'accelerators':<22} {', '.join(c['accelerators'])}",
             f"  {'accelerator-hours':<22} {c['accelerator_seconds'] / 3600:>12,.3f}  ({plural(c['runs'], 'run')}, "
             f"start to end, model load included)"]
    if c["pages_per_accelerator_hour"] is not None:
        lines.append(f"  {'pages per acc.-hour':<22} {c['pages_per_accelerator_hour']:>12,.0f}")
    if c["usd_per_million_pages"] is not None:
        lines.append(f"  {'$ per million pages':<22} {c['usd_per_million_pages']:>12,.2f}  "
                     f"(at ${c['gpu_hourly_usd']:g} an accelerator-hour, from {c['price_from']})")
    else:
        lines.append(f"  {'$ per million pages':<22} {'n/a':>12}  (give --gpu-hourly-usd PRICE)")
    if c["runs_without_record"]:
        lines.append(f"  ({plural(c['runs_without_record'], 'run')} without a finished accelerator record "
                     f"not counted)")
    return lines


def _throughput_lines(r: Report) -> list[str]:
    if r.first_at is None:
        return ["  (no timestamps)"]
    lines = [f"  {'first row':<22} {_stamp(r.first_at)}", f"  {'last row':<22} {_stamp(r.last_at)}"]
    if r.pages_per_minute is None:
        lines.append(f"  {'pages per minute':<22} {'n/a':>12}  (every row has the same timestamp)")
    else:
        lines.append(f"  {'pages per minute':<22} {r.pages_per_minute:>12,.1f}  ({plural(r.pages, 'page')} "
                     f"over the {duration(r.span_s)} from the first row to the last)")
    t = r.timeline
    if t is not None:
        per = [p["pages"] for p in t["points"]]
        width = duration_word(t["bucket_s"])
        lines.append(f"  {'pages per ' + width:<22} busiest {max(per):,}, quietest {min(per):,} "
                     f"({plural(len(per), 'bucket')})")
        if len(per) <= 15:
            lines += [f"    {_stamp(p['at'])}  {p['pages']:>9,}" for p in t["points"]]
    return lines


def format_text(r: Report) -> str:
    """The report as a readable terminal table (lines of at most ~100 characters)."""
    lines = [f"batchocr report: {r.out}", *header_lines(r), "",
             f"  {'documents':<22} {r.documents:>12,}",
             f"  {'pages':<22} {r.pages:>12,}",
             f"  {'document error rows':<22} {r.document_errors:>12,}",
             f"  {'rows read':<22} {r.rows:>12,}  ({plural(r.duplicates, 'duplicate')} of redone pages: "
             f"compact drops them)", "", "finish_reason"]
    lines += [f"  {k:<22} {v:>12,}  {v / max(r.rows - r.duplicates, 1):7.2%}"
              for k, v in r.finish_reasons.items()] or ["  (none)"]
    lines += ["", "error_type"]
    lines += [f"  {k:<22} {v:>12,}" for k, v in r.error_types.items()] or ["  (none)"]
    lines += ["", "throughput"] + _throughput_lines(r)
    lines += ["", "cost"] + _cost_lines(r.cost)
    lines += ["", "per page", _dist_line("text chars", r.text_chars), _dist_line("output tokens", r.output_tokens),
              _dist_line("prompt tokens", r.prompt_tokens)]
    lines += [_dist_line(f"engine ms, {'text layer' if k == 'textlayer' else k}", d)
              for k, d in r.latency_ms_by_route.items()] or [_dist_line("engine ms", None)]
    lines += ["", "slowest documents (engine time, sum of latency_ms)"]
    lines += [f"  {d['latency_ms'] / 1000:>9.1f} s  {plural(d['pages'], 'page'):<11}  {d['source_uri']}"
              for d in r.slowest_documents] or ["  (none)"]
    lines += ["", "route (where each page's text came from)"]
    lines += [f"  {k:<22} {v:>12,}  {v / max(r.pages, 1):7.2%}" for k, v in r.routes.items()] or ["  (not routed)"]
    if r.route_saving is not None:
        lines += cost.saving_lines(r.route_saving)
    lines += ["", "turned upright (the quarter turn a page lay at: skew_angle)"]
    lines += [f"  {k:<22} {v:>12,}  {v / max(r.pages, 1):7.2%}" for k, v in r.turned.items()] or ["  (none)"]
    lines += ["", f"pages that hit the token limit (length) or looped (repetition): {r.flagged_total:,}"]
    lines += [f"  {p['finish_reason']:<11} page {p['page_index']:>5}  {p['output_tokens'] or '':>6} tokens  "
              f"{p['source_uri']}" for p in r.flagged_pages]
    if r.flagged_total > len(r.flagged_pages):
        lines.append(f"  ... and {r.flagged_total - len(r.flagged_pages):,} more (--json lists {len(r.flagged_pages)})")
    if r.cer is not None:
        lines += ["", "CER against truth"]
        lines += [f"  {page_line(p)}" for p in r.cer["pages"]]
        lines += [f"  {m:<28} missing from the output" for m in r.cer["missing"]]
        lines.append(f"  overall: {r.cer['errors']}/{r.cer['chars']} characters wrong, CER {r.cer['overall']:.2%}")
    return "\n".join(lines)
