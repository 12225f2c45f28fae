"""The command line: parse, call the library, print. No logic of its own."""

from __future__ import annotations

import os
import sys

import click

from batchocr import __version__
from batchocr.errors import BatchocrError
from batchocr.spec import ENGINES, Shard


class _Group(click.Group):
    """Turns library errors into one clear line and a documented exit code."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BatchocrError as exc:
            click.echo(f"Error: {exc}", err=True)
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


def _storage_options(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected key=value, got {pair!r}", param_hint="--storage-option")
        out[key] = value
    return out


@main.command()
@click.argument("source", required=False)
@click.argument("out", required=False)
@click.option("--engine", type=click.Choice(ENGINES), help="OCR engine [default: rapidocr, or the job spec's]")
@click.option("--job", "job", type=click.Path(dir_okay=False), help="job spec YAML (see jobs/example.yaml); flags override it")
@click.option("--dpi", type=int, help="render PDF pages at this resolution [default: 200]")
@click.option("--max-side", type=int, help="scale pages down so the longest side is at most this many pixels")
@click.option("--workers", type=int, help="render worker processes [default: one per core, at most 4]")
@click.option("--shard", "shard", help="process shard I of N, as I/N [default: JOB_COMPLETION_INDEX/BATCHOCR_SHARDS, else 0/1]")
@click.option("--storage-option", "storage", multiple=True, metavar="KEY=VALUE", help="fsspec storage option for SOURCE and OUT (repeatable)")
@click.option("--quiet", "-q", is_flag=True, help="no progress bar")
def run(source, out, engine, job, dpi, max_side, workers, shard, storage, quiet):
    """OCR every document under SOURCE into a page table under OUT.

    SOURCE and OUT are folders or fsspec URLs. Every page gets exactly one row in
    OUT/pages/shard=NNNNN/part-*.parquet: its text, or an error row saying why.
    A rerun resumes: pages already committed are skipped.

    \b
    Examples:
        batchocr run samples/ out/demo
        batchocr run samples/ out/text --engine textlayer
        batchocr run --job jobs/example.yaml --shard 3/16
    """
    from batchocr.pipeline import run_job
    from batchocr.spec import load_job

    shard_spec = Shard.parse(shard) if shard else Shard.from_env(os.environ)
    spec = load_job(
        job,
        source=source,
        out=out,
        engine=engine,
        shard=shard_spec,
        storage_options=_storage_options(storage),
        **{"render.dpi": dpi, "render.max_side": max_side, "render.workers": workers},
    )
    summary = run_job(spec, progress=not quiet)
    click.echo(summary.line())


@main.command("eval")
@click.argument("out")
@click.option("--truth", required=True, type=click.Path(file_okay=False), help="folder of <document name>/<page_index>.txt")
@click.option("--max-cer", type=float, help="exit 1 if the overall CER is above this (e.g. 0.02)")
@click.option("--storage-option", "storage", multiple=True, metavar="KEY=VALUE", help="fsspec storage option for OUT")
def eval_(out, truth, max_cer, storage):
    """Character error rate of OUT's page text against ground truth.

    Truth files are TRUTH/<document file name>/<page_index>.txt (page_index from 0);
    whitespace is normalised on both sides. Prints CER per page and overall.

    \b
    Example:
        batchocr eval out/demo --truth samples/truth --max-cer 0.02
    """
    from batchocr.evaluate import evaluate
    from batchocr.table import read_pages

    pages = read_pages(out, _storage_options(storage)).select(
        "source_uri", "page_index", "text", "finish_reason").collect()
    result = evaluate(pages, truth)
    for row in result.pages.iter_rows(named=True):
        click.echo(f"{row['document']:<28} page {row['page_index']:>4}  {row['errors']:>5}/{row['chars']:<6} "
                   f"CER {row['cer']:7.2%}  {row['finish_reason']}")
    for page in result.missing:
        click.echo(f"{page:<28} missing from the output")
    click.echo(f"overall: {result.errors}/{result.chars} characters wrong, CER {result.cer:.2%} "
               f"over {result.pages.height} pages")
    if result.missing:
        raise click.ClickException(f"{len(result.missing)} truth pages have no row in {out}")
    if max_cer is not None and result.cer > max_cer:
        click.echo(f"Error: CER {result.cer:.2%} is above --max-cer {max_cer:.2%}", err=True)
        sys.exit(1)


if __name__ == "__main__":  # pragma: no cover
    main()
