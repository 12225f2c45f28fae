"""The subcommands that read an OUT: status, compact, eval, report, export (cli.py adds
them to `batchocr`)."""

from __future__ import annotations

import os
import sys

import click

from batchocr import layout
from batchocr.cliargs import Finite, not_empty, storage_option, write_whole
from batchocr.errors import ConfigError
from batchocr.words import plural


@click.command()
@click.argument("out", callback=not_empty)
@storage_option("OUT")
def status(out, storage):
    """Show each shard of OUT: done, partial or not started; pages and error pages.

    \b
    Example:
        batchocr status out/demo
    """
    from batchocr.status import status as shard_status
    from batchocr.storage import Store

    store = Store(out, storage)
    if not store.exists():
        raise ConfigError(f"OUT {out} does not exist")
    rows = shard_status(store)
    click.echo(f"{'shard':>5}  {'state':<11} {'documents':>9} {'pages':>8} {'errors':>7}  planned")
    for r in rows:
        planned = "" if r.planned_documents is None else str(r.planned_documents)
        click.echo(f"{r.shard:>5}  {r.state:<11} {r.documents:>9} {r.pages:>8} {r.error_pages:>7}  {planned}")
    states = [r.state for r in rows]
    click.echo(f"{states.count('done')}/{len(rows)} shards done, {states.count('partial')} partial, "
               f"{states.count('not started')} not started; {plural(sum(r.pages for r in rows), 'page')}, "
               f"{plural(sum(r.error_pages for r in rows), 'error page')}")
    if set(states) == {"not started"} and not any(store.exists(p) for p in (layout.PRODUCER, layout.PLAN)) \
            and not store.find(layout.RUNS, suffix=".json"):  # a mistyped OUT reads the same as one not begun
        click.echo(f"batchocr: nothing of batchocr's under {out} yet (no run or plan has written it): "
                   "is that OUT's path?", err=True)


@click.command()
@click.argument("out", callback=not_empty)
@storage_option("OUT")
def compact(out, storage):
    """Rewrite each shard's part files as one, one row per (doc_id, page_index).

    A page redone by a resumed run can have rows in two parts; compaction keeps
    the rows of the document's latest version that has a row for every page, a
    text row over an error row, otherwise the latest. Safe to run while a run
    writes: parts committed meanwhile are left alone, and a run or `status` that
    reads the shard meanwhile reads the compacted file in place of the parts it
    replaced. A shard another compaction is at work on is left to it.

    \b
    Example:
        batchocr compact out/demo
    """
    from batchocr.compact import Busy
    from batchocr.compact import compact as compact_out
    from batchocr.storage import Store
    from batchocr.table import has_no_rows_yet, no_page_table

    store = Store(out, storage)
    if not store.exists(layout.PAGES):
        if has_no_rows_yet(store):
            click.echo(f"nothing to compact: no page rows in {out} yet")
            return
        raise no_page_table(out)
    for c in compact_out(store):
        if isinstance(c, Busy):
            click.echo(f"shard {c.shard}: left to another batchocr compact at work on it ({c.holder})", err=True)
            continue
        click.echo(f"shard {c.shard}: {plural(c.parts_before, 'part')}, {plural(c.rows_before, 'row')} -> 1 part, "
                   f"{plural(c.rows_after, 'row')}")


@click.command("eval")
@click.argument("out", callback=not_empty)
@click.option("--truth", required=True, type=click.Path(file_okay=False), help="folder of <document name>/<page_index>.txt")
@click.option("--max-cer", type=Finite(min=0), help="exit 1 if the overall CER is above this (e.g. 0.02)")
@storage_option("OUT")
def eval_(out, truth, max_cer, storage):
    """Character error rate of OUT's page text against ground truth.

    Truth files are TRUTH/<document file name>/<page_index>.txt (page_index from 0);
    the page's Markdown is read as plain text and whitespace is normalised on both
    sides. Prints CER per page and overall.

    \b
    Example:
        batchocr eval out/demo --truth samples/truth --max-cer 0.02
    """
    from batchocr import producer
    from batchocr.evaluate import evaluate_output, page_line
    from batchocr.storage import Store
    from batchocr.table import read_pages, reading

    pages = read_pages(out, storage)
    with reading(out, storage):
        result = evaluate_output(pages, truth, producer.stale_in(Store(out, storage)))
    for row in result.pages.iter_rows(named=True):
        click.echo(page_line(row))
    for page in result.missing:
        click.echo(f"{page:<28} missing from the output")
    click.echo(f"overall: {result.errors}/{result.chars} characters wrong, CER {result.cer:.2%} "
               f"over {result.pages.height} pages")
    if result.missing:
        raise click.ClickException(f"{len(result.missing)} truth pages have no row in {out}")
    if max_cer is not None and result.cer > max_cer:
        click.echo(f"Error: CER {result.cer:.2%} is above --max-cer {max_cer:.2%}", err=True)
        sys.exit(1)


@click.command()
@click.argument("out", callback=not_empty)
@click.option("--truth", type=click.Path(file_okay=False), help="also CER per page against DIR/<document name>/<page_index>.txt")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON instead of a table")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, writable=True), callback=not_empty, help="also write a self-contained HTML page with charts (needs matplotlib: batchocr[analysis])")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="slowest documents to list")
@click.option("--gpu-hourly-usd", "gpu_hourly_usd", type=Finite(min=0), metavar="PRICE",
              help="price of one accelerator-hour (a GPU; for CPU engines the machine): adds $ per million pages "
                   "[default: the job spec's gpu_hourly_usd]")
@storage_option("OUT")
def report(out, truth, as_json, html_file, top, gpu_hourly_usd, storage):
    """Summarise a run from its page table and run records: runs, engines and models,
    pages, documents, finish reasons, errors, throughput over time, cost, engine time
    by route, tokens and text length per page, slowest documents, pages that hit the
    token limit or looped, and CER per page with --truth.

    Reads only the columns it needs, so it stays quick on millions of pages.

    \b
    Example:
        batchocr report out/demo --truth samples/truth --html out/demo-report.html
        batchocr report az://results/run1 --gpu-hourly-usd 3.50 --json
    """
    from batchocr.report import format_text, load_report

    if html_file:  # before anything is read or printed: a run without the extra stops at once
        from batchocr.charts import require_matplotlib

        require_matplotlib()
        folder = os.path.dirname(os.path.abspath(html_file))
        if not os.path.isdir(folder):
            raise ConfigError(f"--html {html_file}: folder {folder} does not exist")
    from batchocr.table import reading

    with reading(out, storage):
        summary = load_report(out, storage, truth=truth, top=top, gpu_hourly_usd=gpu_hourly_usd)
    click.echo(summary.to_json() if as_json else format_text(summary))
    if html_file:
        from pathlib import Path

        from batchocr.charts import to_html

        write_whole(Path(html_file), to_html(summary))
        click.echo(f"batchocr: wrote {Path(html_file).resolve()}", err=True)


@click.command()
@click.argument("out", callback=not_empty)
@click.argument("dest", callback=not_empty)
@click.option("--format", "fmt", type=click.Choice(["markdown", "text", "jsonl"]), default="markdown", show_default=True,
              help="markdown or text: one file per document; jsonl: one line per document")
@storage_option("OUT and DEST")
def export(out, dest, fmt, storage):
    """Write whole documents out of OUT's page table into the folder DEST.

    Pages in page order; a page with an error, skipped, cut off or missing is
    marked in its place, never dropped. OUT and DEST are folders or fsspec URLs.

    \b
    Example:
        batchocr export out/demo out/demo-documents --format markdown
        batchocr export az://results/run1 az://exports/run1 --format jsonl
    """
    from batchocr import producer
    from batchocr.export import export as export_documents
    from batchocr.storage import Store
    from batchocr.table import read_pages, reading, shard_groups

    pages = read_pages(out, storage)
    source, target = Store(out, storage), Store(dest, storage)
    table = f"{source.canonical.rstrip('/')}/{layout.PAGES}"
    if f"{target.canonical.rstrip('/')}/".startswith(f"{table}/"):  # its files among the parts break every reader
        raise ConfigError(f"DEST {dest} is inside OUT's page table ({layout.PAGES}/): its files would break "
                          "every reader of the table; export to a folder outside it")
    target.check_writable_root("DEST")  # one line now, not a traceback at the first file
    with reading(out, storage):
        unread = _planned_without_rows(source, out, storage)  # a damaged plan stops it before any file
        groups = (group for _, group in shard_groups(out, storage))
        done = export_documents(pages, target, fmt, producer.stale_in(source), groups)
    click.echo(f"exported {plural(done.documents, 'document')}, {plural(done.pages, 'page')} ({done.marked:,} marked) "
               f"into {plural(done.files, 'file')} -> {dest}")
    if unread:  # a missing page is marked in its document; a document of no row has no file to mark it in
        click.echo(f"note: {plural(unread, 'document')} of OUT's plan {'has' if unread == 1 else 'have'} no rows "
                   f"yet, so no file (batchocr status {out} says which shards are not done)", err=True)


def _planned_without_rows(out, url: str, storage) -> int:
    """How many documents OUT's plan gives its shards that no row names (0 without a plan):
    a shard at a time, its planned documents against the doc_ids of its own rows (a plan
    keeps a document on the shard that holds its rows), so no set of every document."""
    from batchocr.plan import planned_documents, read_plan
    from batchocr.table import shard_groups

    plan = read_plan(out)
    if plan is None:
        return 0
    unread, seen = 0, set()
    for shards, group in shard_groups(url, storage):
        have = set(group.select("doc_id").unique().collect()["doc_id"].to_list())
        for shard in (s for s in shards if 0 <= s < plan.shards):
            seen.add(shard)
            unread += sum(d.doc_id not in have for d in planned_documents(out, shard))
    return unread + sum(1 for shard in range(plan.shards) if shard not in seen for _ in planned_documents(out, shard))
