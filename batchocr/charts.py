"""Charts of a run summary (matplotlib), and the summary as one self-contained HTML
page: charts embedded as base64 PNGs, no external URL. matplotlib is the
`analysis` extra: without it, `report --html` stops with one line saying so,
before anything is printed (require_matplotlib).

Ticks come from matplotlib's own locators (AutoDateLocator with its
ConciseDateFormatter for time, MaxNLocator(integer=True) for counts), so an
axis reads right for a 10-page demo and a three-day backfill alike."""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
from typing import Any

from batchocr.errors import ConfigError
from batchocr.report import Report, format_text, run_state
from batchocr.words import duration, duration_word, plural

MAX_BARS = 40  # a bar chart of more (runs, CER pages) shows the first MAX_BARS and says so


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError("charts need matplotlib: pip install 'batchocr[analysis]'") from None


def _figure(height: float, ncols: int = 1, nrows: int = 1, **kw):
    # Figures made directly, not through pyplot: no GUI backend, no global state.
    require_matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, height), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False, **kw)


def _integer(axis) -> None:
    """A count: AutoLocator's own choice of steps and tick count, limited to whole
    numbers, written in full (1,000,000, not 1.0 under a 1e6)."""
    from matplotlib.ticker import MaxNLocator, StrMethodFormatter

    axis.set_major_locator(MaxNLocator(nbins="auto", steps=[1, 2, 2.5, 5, 10], integer=True))
    axis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))


def _dates(axis) -> None:
    import matplotlib.dates as mdates

    locator = mdates.AutoDateLocator(tz=dt.UTC)
    axis.set_major_locator(locator)
    axis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=dt.UTC))


def _time_unit(seconds: float) -> tuple[float, str]:
    """A divisor and its name, so that `seconds` reads as a number of a handy size."""
    return (1, "s") if seconds < 120 else (60, "min") if seconds < 2 * 3600 else (3600, "h")


def _labels(labels: list[str]) -> list[str]:
    """Bar labels from the data (file names, run ids) as matplotlib should show them: a `$`
    escaped (two of them would start its mathtext: a parse error, or garbled text), and each
    label once (two documents of one name in two folders are two bars, not one drawn twice)."""
    seen: dict[str, int] = {}
    out = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        out.append((label if seen[label] == 1 else f"{label} ({seen[label]})").replace("$", r"\$"))
    return out


def _barh(ax, labels: list[str], values: list[float], **kw) -> None:
    """Horizontal bars, the first label on top, each bar's value written at its end."""
    bars = ax.barh(_labels(labels)[::-1], values[::-1], **kw)
    ax.bar_label(bars, labels=[f"{v:,.3g}" if isinstance(v, float) else f"{v:,}" for v in values[::-1]],
                 padding=3, fontsize=8)
    ax.margins(x=0.12)


def figures(r: Report) -> dict[str, Any]:
    """title -> matplotlib Figure, for each chart the summary has data for."""
    require_matplotlib()
    out = {}
    if r.timeline:
        out["Throughput over time"] = _throughput(r)
    if len(r.finish_reasons) > 1:  # one reason is one bar: the summary says it in a line
        out["Pages by finish_reason"] = _counts(r.finish_reasons, "rows")
    if len(r.error_types) > 1:
        out["Errors by error_type"] = _counts(r.error_types, "rows")
    if len(r.routes) > 1:  # every page on one route: the summary says it in a line
        out["Routing"] = _routing(r)
    if r.latency_ms_by_route:
        out["Engine time per page, by route"] = _latency(r)
    if r.cost and r.runs:
        out["Cost: where the accelerator time went"] = _cost(r)
    if r.text_chars_histogram:
        h = r.text_chars_histogram
        fig, ((ax,),) = _figure(2.8)
        ax.stairs(h["counts"], h["edges"], fill=True)
        ax.set(xlabel="characters of text per page", ylabel="pages")
        _integer(ax.yaxis)
        out["Text length per page"] = fig
    if r.slowest_documents:
        docs = r.slowest_documents
        fig, ((ax,),) = _figure(0.7 + 0.3 * len(docs))
        div, unit = _time_unit(max(d["latency_ms"] for d in docs) / 1000)
        _barh(ax, [_name(d["source_uri"] or d["doc_id"]) for d in docs], [d["latency_ms"] / 1000 / div for d in docs])
        ax.set(xlabel=f"engine time, {unit} (sum of latency_ms)")
        out["Slowest documents"] = fig
    if r.cer and r.cer["pages"]:
        pages = sorted(r.cer["pages"], key=lambda p: -p["cer"])[:MAX_BARS]
        fig, ((ax,),) = _figure(0.7 + 0.25 * len(pages))
        _barh(ax, [f"{p['document']} p{p['page_index']}" for p in pages], [p["cer"] * 100 for p in pages])
        ax.set(xlabel="character error rate, %")
        if len(r.cer["pages"]) > len(pages):
            ax.set_title(f"the {len(pages)} worst of {plural(len(r.cer['pages']), 'page')}", fontsize=9)
        out["CER per page"] = fig
    return out


def _name(uri: str) -> str:
    name = uri.rsplit("/", 1)[-1]
    return name if len(name) <= 40 else name[:18] + "…" + name[-18:]


def _throughput(r: Report):
    width = r.timeline["bucket_s"]
    bucket = dt.timedelta(seconds=width)
    points = r.timeline["points"]
    starts = [dt.datetime.fromisoformat(p["at"]) for p in points]
    counts = [p["pages"] for p in points]
    fig, ((done,), (rate,)) = _figure(4.4, nrows=2, sharex=True, gridspec_kw={"height_ratios": [1, 1.2]})
    # Pages done at each commit: its slope is the rate, at any scale.
    cumulative = r.timeline["done"]
    done.plot([dt.datetime.fromisoformat(p["at"]) for p in cumulative], [p["pages"] for p in cumulative],
              drawstyle="steps-post", marker="o" if len(cumulative) <= 30 else None, markersize=3)
    done.set(ylabel="pages done", ylim=(0, None))
    _integer(done.yaxis)
    rate.bar(starts, counts, width=bucket, align="edge", edgecolor="white", linewidth=0.5 if len(points) < 60 else 0)
    rate.set(ylabel=f"pages per {duration_word(width)}", xlabel="time (UTC)",
             xlim=(starts[0], starts[-1] + bucket))
    _integer(rate.yaxis)
    _dates(rate.xaxis)
    done.set_title(f"{plural(r.pages, 'page')} over {duration(r.span_s or 0)}; a bar per {duration_word(width)}",
                   fontsize=9)
    return fig


def _counts(counts: dict[str, int], unit: str):
    fig, ((ax,),) = _figure(0.7 + 0.32 * len(counts))
    _barh(ax, list(counts), list(counts.values()))
    ax.set(xlabel=unit)
    _integer(ax.xaxis)
    return fig


def _routing(r: Report):
    """Pages by route, and the engine time each route took, with what the routed pages
    would have cost the model (route_saving)."""
    fig, ((pages, time),) = _figure(2.4, ncols=2)
    names = {"model": "model", "textlayer": "text layer"}
    routes = sorted(r.routes, key=lambda k: k != "model")
    _barh(pages, [names.get(k, k) for k in routes], [r.routes[k] for k in routes])
    pages.set(xlabel="pages")
    _integer(pages.xaxis)
    lat, s = r.latency_ms_by_route, r.route_saving
    spent = {k: lat[k]["mean"] * lat[k]["count"] / 1000 for k in routes if k in lat}
    if s is not None:  # the estimate the saving uses: vLLM's pages overlap, their latencies do not add up
        spent["model"] = s["seconds_per_model_page"] * s["model_pages"]
    bars = [("model pages", spent.get("model", 0.0), {}),
            ("text-layer pages", spent.get("textlayer", 0.0), {})]
    if s is not None and s["saved_s"] is not None:  # None: too few model pages to estimate it
        bars.append(("text-layer pages\nhad the model read them", s["saved_s"],
                     {"hatch": "//", "facecolor": "none", "edgecolor": "C0"}))
    div, unit = _time_unit(max(v for _, v, _ in bars) or 1)
    for label, seconds, style in bars[::-1]:
        b = time.barh(label, seconds / div, **({"color": "C0"} | style))
        time.bar_label(b, labels=[f"{seconds / div:,.3g}"], padding=3, fontsize=8)
    time.margins(x=0.15)
    time.set(xlabel=f"{s['device'] if s else 'engine'} time, {unit}")
    if s is not None:
        time.set_title(f"at {s['seconds_per_model_page']:.3g} s a model page of {s['engine']}", fontsize=9)
    return fig


def _latency(r: Report):
    """p50, p90, p99 and max of latency_ms for each route, side by side."""
    import numpy as np

    names = {"model": "model", "textlayer": "text layer"}
    routes = list(r.latency_ms_by_route)
    stats = ("p50", "p90", "p99", "max")
    fig, ((ax,),) = _figure(0.9 + 0.7 * len(routes))
    y = np.arange(len(routes))
    h = 0.8 / len(stats)
    for i, stat in enumerate(stats):
        values = [r.latency_ms_by_route[k][stat] for k in routes]
        bars = ax.barh(y + i * h - 0.4 + h / 2, values, height=h, label=stat)
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], padding=2, fontsize=7)
    ax.set_yticks(y, [f"{names.get(k, k)}\n({plural(r.latency_ms_by_route[k]['count'], 'page')})" for k in routes])
    ax.invert_yaxis()
    ax.margins(x=0.1)
    ax.set(xlabel="engine ms per page (latency_ms)")
    ax.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    return fig


def _cost(r: Report):
    """Each run's accelerator time, split at its first and last rows: start-up (the
    model's load, the first pages), reading, and finishing. Runs beyond MAX_BARS are
    summed into one bar."""
    seconds = {p["run_id"]: p["accelerator_seconds"] for p in r.cost["per_run"]}
    phases = []
    for run in r.runs:
        if run["run_id"] not in seconds or not run["started_at"] or not run["finished_at"]:
            continue
        t = {k: dt.datetime.fromisoformat(run[k]) for k in ("started_at", "finished_at")}
        first = dt.datetime.fromisoformat(run["first_row_at"]) if run["first_row_at"] else t["finished_at"]
        last = dt.datetime.fromisoformat(run["last_row_at"]) if run["last_row_at"] else first
        wall = max((t["finished_at"] - t["started_at"]).total_seconds(), 1e-9)
        share = seconds[run["run_id"]] / wall  # accelerators held (GPUs), as the record counts them
        parts = [(first - t["started_at"]).total_seconds(), (last - first).total_seconds(),
                 (t["finished_at"] - last).total_seconds()]
        phases.append((run["run_id"], [max(p, 0) * share for p in parts]))
    if len(phases) > MAX_BARS:
        phases = [(f"all {len(phases):,} runs", [sum(p[i] for _, p in phases) for i in range(3)])]
    fig, ((ax,),) = _figure(1.6 + 0.3 * max(len(phases), 1))
    div, unit = _time_unit(max((sum(p) for _, p in phases), default=1))
    left = [0.0] * len(phases)
    for i, (label, color) in enumerate((("start-up, before the first row", "C1"), ("reading pages", "C0"),
                                        ("after the last row", "C7"))):
        values = [p[i] / div for _, p in phases]
        ax.barh(_labels([name for name, _ in phases])[::-1], values[::-1], left=left[::-1], color=color, label=label)
        left = [a + b for a, b in zip(left, values)]
    c = r.cost
    price = (f"; ${c['usd_per_million_pages']:,.2f} per million pages at ${c['gpu_hourly_usd']:g} an hour"
             if c["usd_per_million_pages"] is not None else "")
    per_hour = f"{c['pages_per_accelerator_hour']:,.0f}" if c["pages_per_accelerator_hour"] else "n/a"
    ax.set(xlabel=f"accelerator time, {unit}")
    ax.set_title(f"in all {c['accelerator_seconds'] / 3600:,.3g} accelerator-hours, {per_hour} pages an "
                 f"accelerator-hour{price}", fontsize=9)
    fig.legend(loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    return fig


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)  # 960 px wide: the page's column at 1280 px
    return base64.b64encode(buf.getvalue()).decode()


STYLE = ("body{font-family:sans-serif;max-width:64em;margin:2em auto;padding:0 1em;color:#222}"
         "img{max-width:100%;height:auto}"
         "pre{background:#f6f6f6;padding:1em;font-size:0.8em;white-space:pre-wrap;overflow-wrap:anywhere}"
         "table.facts td{padding:0.1em 1em 0.1em 0;vertical-align:top}"
         "table.facts td:first-child{color:#666}")


def _facts(r: Report, most: int = 5) -> list[tuple[str, str]]:
    """The page's header: OUT, its runs, engines and models, pages, rate, cost."""
    facts = [("OUT", r.out)]
    if len(r.runs) > most:
        facts.append(("runs", f"{plural(len(r.runs), 'run')}, from {r.runs[0]['run_id']} to {r.runs[-1]['run_id']}"))
    else:
        facts += [("run" if i == 0 else "", f"{run['run_id']}: {run_state(run)}, {plural(run['pages'], 'page')}"
                   + (f", shard {run['shard']}" if run["shard"] and run["shard"] != "0/1" else ""))
                  for i, run in enumerate(r.runs)]
    facts += [("engine" if i == 0 else "", f"{m['engine']} ({m['model'] or '?'}): {plural(m['pages'], 'page')}")
              for i, m in enumerate(r.models)]
    facts.append(("pages", f"{plural(r.pages, 'page')} of {plural(r.documents, 'document')}"
                  + (f"; {plural(r.document_errors, 'document')} could not be opened" if r.document_errors else "")))
    if r.pages_per_minute is not None:
        facts.append(("throughput", f"{r.pages_per_minute:,.1f} pages a minute over {duration(r.span_s)}"))
    if r.cost and r.cost["usd_per_million_pages"] is not None:
        facts.append(("cost", f"${r.cost['usd_per_million_pages']:,.2f} per million pages "
                              f"(at ${r.cost['gpu_hourly_usd']:g} an accelerator-hour)"))
    return facts


def to_html(r: Report) -> str:
    charts = []
    for title, fig in figures(r).items():
        charts.append(f"<h2>{html.escape(title)}</h2>\n<img alt=\"{html.escape(title)}\" "
                      f"src=\"data:image/png;base64,{_png(fig)}\">")
    facts = "\n".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in _facts(r))
    return (
        "<!doctype html>\n<html><head><meta charset=\"utf-8\">"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
        f"<title>batchocr report: {html.escape(r.out)}</title>"
        f"<style>{STYLE}</style></head><body>\n"
        f"<h1>batchocr report</h1>\n<table class=\"facts\">\n{facts}\n</table>\n"
        + "\n".join(charts)
        + f"\n<h2>Summary</h2>\n<pre>{html.escape(format_text(r))}</pre>\n</body></html>\n"
    )
