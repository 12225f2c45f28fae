"""The command line: parse, call the library, print. No logic of its own."""

from __future__ import annotations

import contextlib
import os
import sys

import click

from batchocr import __version__
from batchocr import cliargs
from batchocr.cliargs import not_empty, storage_option
from batchocr.errors import EXIT_FAILED, EXIT_OK, BatchocrError
from batchocr.readcommands import compact, eval_, export, report, status
from batchocr.spec import ENGINES, ROUTES, Shard
from batchocr.words import plural


class _Group(click.Group):
    """Turns library errors into one clear line and a documented exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BatchocrError as exc:
            from batchocr.storage import environment_secrets, redact

            # one line, whatever the message holds (a library's exception text may span lines)
            click.echo(f"Error: {' '.join(redact(str(exc), environment_secrets()).split())}", err=True)
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
    from batchocr.renderworker import own_process

    own_process()  # PyMuPDF's unused extras and pyarrow's pandas stay out of batchocr's processes
    if not sys.stderr.isatty():  # a pod's log, a file: rapidocr's colorlog honours NO_COLOR
        os.environ.setdefault("NO_COLOR", "1")


@main.command()
@click.argument("source", required=False, callback=not_empty)
@click.argument("out", required=False, callback=not_empty)
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
@click.option("--processes", callback=cliargs.processes, metavar="N|auto",
              help="run the shard as N processes side by side, each with its own render pool and engine over a "
                   "share of the documents (vllm: 1/N of the GPU's memory each; two keep busy a GPU that one "
                   "leaves half idle); auto: as many as pay for the model on this GPU and host "
                   "[default: 1, or the job spec's]")
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
        batchocr run az://scans/ az://results/ --engine vllm --model /models/Unlimited-OCR --preset unlimited-ocr --processes auto
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
@click.argument("source", callback=not_empty)
@click.argument("out", callback=not_empty)
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
@click.argument("cache", callback=not_empty)
@click.option("--job", "job", type=click.Path(dir_okay=False), required=True,
              help="the job spec whose vllm engine the later runs build (its preset, mode, processes, engine settings)")
@click.option("--pages", type=click.IntRange(1, 4096), default=64, show_default=True,
              help="generated pages the warm-up run reads (16-page documents)")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
def warm(cache, job, pages, quiet):
    """Fill a compile cache for a job's vLLM engine, so that its runs start without compiling.

    Builds the job spec's engine as its runs do, from empty caches of its own, reads
    PAGES generated pages of text (never a user's document: the caches hold compiled
    code that every later run executes), then writes vLLM's compiled graphs, Triton's
    and Inductor's kernels to the folder CACHE, whole (replacing an older one at once).
    A run whose job spec names it (engines.vllm.compile_cache: CACHE) copies it, before
    its engine builds, to the temporary folder the warm-up compiled in (the same path,
    where the compiled kernels are found): a fresh pod starts without compiling.
    Warm again after a new image (vLLM, torch), model, GPU type or engine
    settings: entries made for others are never used.

    \b
    Examples:
        batchocr warm /models/.compile-cache --job /etc/batchocr/aks-vllm.yaml
        batchocr warm ~/caches/uocr --job jobs/aks-vllm.yaml --pages 32
    """
    import time

    from batchocr.warm import warm as fill
    from batchocr.spec import load_job

    spec = load_job(job)
    t0 = time.monotonic()
    size, summary = fill(spec, cache, pages, progress=not quiet, spec_path=job)
    click.echo(f"warm: the engine read {plural(summary.pages, 'generated page')} ({summary.error_pages} errors) in "
               f"{summary.seconds:.0f} s")
    click.echo(f"warm: {cache} holds {size / 1e6:.0f} MB of compiled graphs and kernels (made in "
               f"{time.monotonic() - t0:.0f} s); runs with engines.vllm.compile_cache: {cache} start from it")


for _command in (status, compact, eval_, report, export):
    main.add_command(_command)


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
