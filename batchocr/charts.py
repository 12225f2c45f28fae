"""Charts of a run summary (matplotlib), and the summary as one self-contained HTML
page: charts embedded as base64 PNGs, no external URL. matplotlib is the
`analysis` extra: without it, `report --html` stops with one line saying so."""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
from typing import Any

from batchocr.errors import ConfigError
from batchocr.report import Report, format_text


def _figure_class():
    # Figures made directly, not through pyplot: no GUI backend, no global state.
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("charts need matplotlib: pip install 'batchocr[analysis]'") from None
    return Figure


def figures(r: Report) -> dict[str, Any]:
    """title -> matplotlib Figure, for each chart the summary has data for."""
    Figure = _figure_class()

    def subplots(figsize):
        fig = Figure(figsize=figsize)
        return fig, fig.subplots()

    out = {}
    if r.timeline:
        import matplotlib.dates as mdates

        bucket = dt.timedelta(seconds=r.timeline["bucket_s"])
        points = r.timeline["points"]
        at = [dt.datetime.fromisoformat(p["at"]) + bucket / 2 for p in points]  # a bucket's middle
        fig, ax = subplots(figsize=(8, 3))
        ax.plot(at, [p["pages_per_minute"] for p in points], marker="o" if len(points) <= 60 else None,
                markersize=3, drawstyle="steps-mid")
        # The span of the run itself: a single bucket would otherwise get an axis of years.
        ax.set_xlim(at[0] - bucket, at[-1] + bucket)
        locator = mdates.AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        ax.set(ylabel="pages per minute", ylim=(0, None), title=f"in buckets of {_duration(bucket)}")
        out["Throughput over time"] = fig
    for title, counts in (("Pages by finish_reason", r.finish_reasons), ("Errors by error_type", r.error_types)):
        if counts:
            fig, ax = subplots(figsize=(8, 0.5 + 0.35 * len(counts)))
            ax.barh(list(counts)[::-1], list(counts.values())[::-1])
            ax.set(xlabel="rows")
            out[title] = fig
    if r.text_chars_histogram:
        h = r.text_chars_histogram
        fig, ax = subplots(figsize=(8, 3))
        ax.stairs(h["counts"], h["edges"], fill=True)
        ax.set(xlabel="characters of text per page", ylabel="pages")
        out["Text length per page"] = fig
    if r.slowest_documents:
        docs = r.slowest_documents[::-1]
        fig, ax = subplots(figsize=(8, 0.5 + 0.35 * len(docs)))
        ax.barh([(d["source_uri"] or d["doc_id"]).rsplit("/", 1)[-1] for d in docs],
                [d["latency_ms"] / 1000 for d in docs])
        ax.set(xlabel="engine seconds (sum of latency_ms)")
        out["Slowest documents"] = fig
    if r.cer and r.cer["pages"]:
        pages = r.cer["pages"]
        fig, ax = subplots(figsize=(8, 0.5 + 0.3 * len(pages)))
        ax.barh([f"{p['document']} p{p['page_index']}" for p in pages][::-1], [p["cer"] for p in pages][::-1])
        ax.set(xlabel="character error rate")
        out["CER per page"] = fig
    for fig in out.values():
        fig.tight_layout()
    return out


def _duration(d: dt.timedelta) -> str:
    s = int(d.total_seconds())
    return f"{s // 3600} h" if s >= 3600 else f"{s // 60} min" if s >= 60 else f"{s} s"


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96)
    return base64.b64encode(buf.getvalue()).decode()


def to_html(r: Report) -> str:
    charts = []
    for title, fig in figures(r).items():
        charts.append(f"<h2>{html.escape(title)}</h2>\n<img alt=\"{html.escape(title)}\" "
                      f"src=\"data:image/png;base64,{_png(fig)}\">")
    return (
        "<!doctype html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>batchocr report: {html.escape(r.out)}</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        "pre{background:#f6f6f6;padding:1em;overflow-x:auto}</style></head><body>\n"
        f"<h1>batchocr report: {html.escape(r.out)}</h1>\n"
        + "\n".join(charts)
        + f"\n<h2>Summary</h2>\n<pre>{html.escape(format_text(r))}</pre>\n</body></html>\n"
    )
