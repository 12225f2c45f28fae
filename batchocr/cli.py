"""The command line: parse, call the library, print. No logic of its own."""

from __future__ import annotations

import contextlib
import math
import os
import sys

import click

from batchocr import __version__, layout
from batchocr.errors import EXIT_FAILED, EXIT_OK, BatchocrError, ConfigError
from batchocr.spec import ENGINES, ROUTES, Shard
from batchocr.words import plural


class _Group(click.Group):
    """Turns library errors into one clear line and a documented exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BatchocrError as exc:
            from batchocr.storage import environment_secrets, redact

            click.echo(f"Error: {redact(str(exc), environment_secrets())}", err=True)
            ctx.exit(exc.exit_code)
        except click.UsageError as exc:  # a subcommand's bad flag or argument: the same one line, no banner
            # An option's missing value is raised by the parser without a context: the
            # subcommand, named before it parsed, is the one whose --help tells.
            words = (exc.ctx or ctx).command_path.split()[1:] or [ctx.invoked_subcommand or ""]
            command = " ".join(["batchocr", *filter(None, words)])
            click.echo(f"Error: {exc.format_message()} (see {command} --help)", err=True)
            ctx.exit(exc.exit_code)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="batchocr")
def main():
    """batchocr: OCR a container of scans (PDF, TIFF, PNG, JPEG) into Parquet page tables.

    \b
    Example:
        batchocr run samples/ out/demo
        batchocr eval out/demo --truth samples/truth
    """
    from batchocr.renderworker import skip_pymupdf_extras

    skip_pymupdf_extras()  # this process is batchocr's own: PyMuPDF's unused extras stay out
    if not sys.stderr.isatty():  # a pod's log, a file: rapidocr's colorlog honours NO_COLOR
        os.environ.setdefault("NO_COLOR", "1")


def _write_whole(target, text: str) -> None:
    """A file written whole or not at all: a full disk or a read-only folder is one line (exit
    1), and no half-written page is left (nor an older one truncated). Written beside it, then
    renamed over it; a target that is not a regular file (/dev/stdout) is written as it is."""
    tmp = target if target.exists() and not target.is_file() else target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        if tmp != target:
            os.replace(tmp, target)
    except OSError as exc:
        if tmp != target:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise BatchocrError(f"{target}: cannot write it ({exc.strerror or exc})") from None


class _Finite(click.FloatRange):
    """A number in range that is a number: nan passes FloatRange (no comparison holds), inf
    passes an open end."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _storage_options(ctx, param, pairs: tuple[str, ...]) -> dict[str, str]:
    """--storage-option KEY=VALUE ... as the dict the command receives."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            # Not echoed: what was typed may be a secret.
            raise click.BadParameter("expected key=value (e.g. account_name=NAME)", param_hint="--storage-option")
        out[key] = value
    return out


def storage_option(what: str):
    return click.option("--storage-option", "storage", multiple=True, metavar="KEY=VALUE",
                        callback=_storage_options, help=f"fsspec storage option for {what} (repeatable)")


def _not_empty(ctx, param, value):
    """An empty SOURCE, OUT, DEST or --html (an unset shell variable: "$OUT") is refused: it
    named the current folder (plan, export wrote there with exit 0) or nothing (report --html)."""
    if value is not None and value.strip() == "":
        hint = f"'{param.human_readable_name}'" if isinstance(param, click.Argument) else None  # run's: not '[OUT]'
        raise click.BadParameter("is empty (an unset variable?)", param_hint=hint)
    return value


@main.command()
@click.argument("source", required=False, callback=_not_empty)
@click.argument("out", required=False, callback=_not_empty)
@click.option("--engine", type=click.Choice(ENGINES), help="OCR engine [default: rapidocr, or the job spec's]")
@click.option("--model", help="vllm engine: the model folder (or hub name)")
@click.option("--preset", help="vllm engine: model preset (prompt, image size, sampling), e.g. unlimited-ocr, olmocr-2")
@click.option("--prompt", help="vllm engine: replaces the preset's instruction (page mode; in document mode, for pages "
                                "read alone), e.g. '<|grounding|>Convert the document to markdown.' for deepseek-ocr")
@click.option("--mode", type=click.Choice(["page", "document"]),
              help="vllm engine: page reads a page a request; document reads a document's pages in one request "
                   "and splits the output back a row a page (unlimited-ocr) [default: page]")
@click.option("--job", "job", type=click.Path(dir_okay=False), help="job spec YAML (see jobs/example.yaml); flags override it")
@click.option("--route", type=click.Choice(ROUTES),
              help="per page: auto takes a good text layer and sends the rest to the engine; model: every page "
                   "to the engine; textlayer: every page with a text layer takes it [default: auto]")
@click.option("--dpi", type=int, help="render PDF pages at this resolution [default: 200]")
@click.option("--max-side", type=int, help="scale pages down so the longest side is at most this many pixels")
@click.option("--workers", type=int, help="render worker processes [default: one per usable CPU, at most 4]")
@click.option("--shard", "shard", help="process shard I of N, as I/N [default: JOB_COMPLETION_INDEX/BATCHOCR_SHARDS, else the "
                   "job spec's shard:, else 0/1]")
@click.option("--processes", type=int,
              help="run the shard as N processes side by side, each with its own render pool and engine over a "
                   "share of the documents (vllm: 1/N of the GPU's memory each; two keep busy a GPU that one "
                   "leaves half idle) [default: 1, or the job spec's]")
@click.option("--reprocess", is_flag=True,
              help="OUT was made with another engine, model, preset, prompt, route or render settings: redo its "
                   "pages with these (without it, such a run stops with exit 2); compact keeps the new rows")
@storage_option("SOURCE and OUT")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
def run(source, out, engine, model, preset, prompt, mode, job, route, dpi, max_side, workers, shard, processes, reprocess,
        storage, quiet):
    """OCR every document under SOURCE into a page table under OUT.

    SOURCE and OUT are folders or fsspec URLs. Every page gets exactly one row in
    OUT/pages/shard-NNNNN/part-*.parquet: its text, or an error row saying why.
    A rerun resumes: pages already committed are skipped. OUT remembers the
    settings that made it; a run with others stops unless --reprocess is given.

    \b
    Examples:
        batchocr run samples/ out/demo
        batchocr run samples/ out/text --engine textlayer
        batchocr run samples/ out/all-ocr --route model
        batchocr run --job jobs/example.yaml --shard 3/16
        batchocr run samples/ out/demo --engine textlayer --reprocess
        batchocr run az://scans/ az://results/ --engine vllm --model /models/Unlimited-OCR --preset unlimited-ocr
        batchocr run az://scans/ az://results/ --engine vllm --model /models/Unlimited-OCR --preset unlimited-ocr --mode document
        batchocr run az://scans/ az://results/ --engine vllm --model /models/Unlimited-OCR --preset unlimited-ocr --processes 2
        batchocr run az://scans/ az://results/ --engine vllm --model /models/olmOCR-2-7B-1025 --preset olmocr-2
    """
    from batchocr.signals import graceful_stop

    if job is None:
        _given_or_missing(click.get_current_context())
    with graceful_stop() as stop:  # first: an eviction notice during start-up is honoured too
        _run(source, out, engine, {"model": model, "preset": preset, "prompt": prompt, "mode": mode}, job, dpi, max_side,
             workers, shard, storage, quiet, stop, route, reprocess, processes)


def _given_or_missing(ctx: click.Context) -> None:
    """run's SOURCE and OUT are optional only for a job spec to give them: without one, the first
    missing is the usage error every subcommand gives for its missing argument (`Error: Missing
    argument 'OUT'. (see batchocr run --help)`), not the job spec's."""
    for param in ctx.command.params:
        if isinstance(param, click.Argument) and ctx.params.get(param.name) is None:
            raise click.MissingParameter(ctx=ctx, param=param, param_hint=f"'{param.human_readable_name}'")


def _run(source, out, engine, engine_options, job, dpi, max_side, workers, shard, storage, quiet, stop, route=None,
         reprocess=None, processes=None):
    from batchocr.pipeline import run_job
    from batchocr.spec import load_job

    shard_spec = Shard.parse(shard) if shard else Shard.from_env(os.environ)
    spec = load_job(
        job,
        source=source,
        out=out,
        engine=engine,
        route=route,
        reprocess=reprocess or None,  # the flag sets it; without it, the job spec's
        processes=processes,
        shard=shard_spec,
        storage_options=storage,
        engine_options={k: v for k, v in engine_options.items() if v is not None},
        **{"render.dpi": dpi, "render.max_side": max_side, "render.workers": workers},
    )
    summary = run_job(spec, progress=not quiet, stop=stop)
    click.echo(summary.line())


@main.command()
@click.argument("source", callback=_not_empty)
@click.argument("out", callback=_not_empty)
@click.option("--shards", type=int, required=True, help="number of shards (pods of the Indexed Job)")
@click.option("--inventory", metavar="URL",
              help="plan from this inventory instead of listing SOURCE: an Azure blob inventory's manifest "
                   "(az://inv/2026/12/05/01-00-00/scans/scans-manifest.json), its destination (az://inv/: the "
                   "newest Succeeded run of its one rule) or one rule's runs there (az://inv/scans), or a "
                   "Parquet or CSV manifest "
                   "(or a folder of them) with the columns Name (relative to SOURCE) and Content-Length, "
                   "and where present Etag, Last-Modified and AccessTier")
@storage_option("SOURCE, OUT and the inventory")
def plan(source, out, shards, inventory, storage):
    """List SOURCE once and freeze which shard each document belongs to.

    Writes OUT/_plan/ (uri, size, etag of every document, shards balanced by
    size). A later `batchocr run SOURCE OUT --shard I/N` takes shard I's documents
    from the plan, so every pod agrees and blobs added mid-run wait for the next
    plan. Planning again over an existing plan keeps every planned document on
    its shard and balances only the new ones; a document with rows in OUT
    already stays on the shard that holds them (nothing is redone elsewhere).

    \b
    With --inventory, no listing: the documents are read from Azure Storage's
    blob inventory (or a manifest of SOURCE's files) in columns, with no Python
    object a document. Blobs in the Archive tier are planned and counted: a run
    gives each an unreadable row until it is rehydrated.

    \b
    Example:
        batchocr plan az://scans/ az://results/run1 --shards 16
        batchocr plan az://scans/ az://results/run1 --shards 10000 \\
            --inventory az://inv/2026/12/05/01-00-00/scans/scans-manifest.json
        batchocr plan az://scans/ az://results/run1 --shards 10000 --inventory az://inv/scans
    """
    from batchocr.plan import make_plan
    from batchocr.storage import Store

    if inventory is None:
        info = make_plan(Store(source, storage), Store(out, storage), shards)
    else:
        from batchocr.inventory import plan_from_inventory
        from batchocr.inventoryruns import newest_manifest
        from batchocr.replan import record
        from batchocr.storage import public_url

        manifest = newest_manifest(inventory, storage)
        if manifest != inventory:
            click.echo(f"inventory: {public_url(manifest)} (the newest Succeeded run under {public_url(inventory)})")
        planned = plan_from_inventory(Store(source, storage), Store(out, storage), shards, manifest, storage)
        record(Store(out, storage), manifest)
        info = planned.info
        if planned.archived:
            click.echo(f"{plural(planned.archived, 'document')} in the Archive tier: planned, each gets an unreadable "
                       "row until rehydrated (set its tier to Hot or Cool, then run its shard again)")
    sizes = [s["bytes"] for s in info.per_shard]
    click.echo(f"planned {plural(info.documents, 'document')} ({info.bytes / 1e6:.1f} MB) into "
               f"{plural(info.shards, 'shard')} "
               f"({min(sizes) / 1e6:.1f}-{max(sizes) / 1e6:.1f} MB each) -> {out}/_plan/")


@main.command()
@click.argument("out", callback=_not_empty)
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


@main.command()
@click.argument("out", callback=_not_empty)
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


@main.command("eval")
@click.argument("out", callback=_not_empty)
@click.option("--truth", required=True, type=click.Path(file_okay=False), help="folder of <document name>/<page_index>.txt")
@click.option("--max-cer", type=_Finite(min=0), help="exit 1 if the overall CER is above this (e.g. 0.02)")
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
    from batchocr.table import read_pages, reading, shard_groups

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


@main.command()
@click.argument("out", callback=_not_empty)
@click.option("--truth", type=click.Path(file_okay=False), help="also CER per page against DIR/<document name>/<page_index>.txt")
@click.option("--json", "as_json", is_flag=True, help="print the summary as JSON instead of a table")
@click.option("--html", "html_file", type=click.Path(dir_okay=False, writable=True), callback=_not_empty, help="also write a self-contained HTML page with charts (needs matplotlib: batchocr[analysis])")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True, help="slowest documents to list")
@click.option("--gpu-hourly-usd", "gpu_hourly_usd", type=_Finite(min=0), metavar="PRICE",
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

        _write_whole(Path(html_file), to_html(summary))
        click.echo(f"batchocr: wrote {Path(html_file).resolve()}", err=True)


@main.command()
@click.argument("out", callback=_not_empty)
@click.argument("dest", callback=_not_empty)
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


def entry(argv: list[str] | None = None) -> None:
    """The console script: `main`, then a hard exit with its code.

    The exit code is the contract with Kubernetes (0 done, 1 failed, 2 bad
    configuration: fail the Job, 75 interrupted: retry the index). Interpreter
    finalisation can abort a process whose work is over (SIGABRT, "terminate called
    without an active exception": a native thread pool torn down while a thread is
    still joinable, apache/arrow#34314; seen here once in CI after an exit-2 error),
    which would turn a configuration error into a retried crash. Everything batchocr
    writes is committed before `main` returns, so nothing is lost by skipping it.
    """
    for stream in (sys.stdout, sys.stderr):  # a path given in bytes that are not UTF-8 is printed as given
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="surrogateescape")
    from batchocr.signals import graceful_stop

    args = sys.argv[1:] if argv is None else list(argv)
    command = next((a for a in args if not a.startswith("-")), None)
    try:
        # A run's SIGTERM (a spot eviction notice, Kubernetes' pod deletion) from the first
        # instant: before `run` itself is reached, the group's set-up and click's parsing took
        # ~0.1-0.5 s in which it killed the process (143; SIGINT a traceback, exit 1) instead
        # of the run's exit 75. `run` shares this flag (graceful_stop nests).
        with graceful_stop() if command == "run" else contextlib.nullcontext():
            main.main(args=args, prog_name="batchocr")
        code = EXIT_OK
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (EXIT_OK if exc.code is None else EXIT_FAILED)
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - an unexpected crash: its traceback, exit 1
        import traceback

        traceback.print_exc()
        code = EXIT_FAILED
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if "batchocr.renderpool" in sys.modules:  # a command that rendered: its fork server's folder
        sys.modules["batchocr.renderpool"].before_os_exit()
    os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
