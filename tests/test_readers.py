"""The page table opens with no options in pandas, duckdb, polars and pyarrow, from
OUT/pages and from a glob, with the same column types, including the null rows of a
document that could not be opened and the temp file a killed writer leaves (under OUT/_tmp)."""

import shutil
from pathlib import Path

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchocr import schema
from conftest import SAMPLES, count_pages, run_cli


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    for p in SAMPLES.glob("*.pdf"):
        shutil.copy(p, src / p.name)
    (src / "broken.pdf").write_bytes(b"%PDF-1.7 this is not a PDF")  # one row, page_index -1, nulls
    out = tmp_path_factory.mktemp("readers") / "out"
    run_cli("run", str(src), str(out), "--engine", "textlayer", "--shard", "0/1", "--quiet", check=True)
    (out / "_tmp").mkdir()  # the run left none (gone when empty): as a killed writer leaves it
    (out / "_tmp" / "pages__shard-00000__part-x-00001.parquet.1234abcd.tmp").write_bytes(b"PAR1 half")
    return out


def _canonical(t: pa.DataType) -> str:
    """Type names across the readers' Arrow exports: every string kind is `string`,
    every list kind `list` (polars exports large lists), and UTC is UTC whatever the
    zone's name."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_timestamp(t) and t.tz in ("Etc/UTC", "UTC"):  # duckdb exports its session zone's name
        return f"timestamp[{t.unit}, tz=UTC]"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return f"list<{_canonical(t.value_type)}>"
    if pa.types.is_struct(t):
        return "struct<" + ", ".join(f"{f.name}: {_canonical(f.type)}" for f in t) + ">"
    return str(t)


EXPECTED = {f.name: _canonical(f.type) for f in schema.PAGE_TABLE}


def _readers(out):
    pages, glob = str(out / "pages"), str(out / "pages" / "**" / "*.parquet")
    return {
        "pyarrow OUT/pages": lambda: pq.read_table(pages),
        "pandas OUT/pages": lambda: pa.Table.from_pandas(pd.read_parquet(pages), preserve_index=False),
        "polars OUT/pages": lambda: pl.read_parquet(pages).to_arrow(),
        "polars glob": lambda: pl.scan_parquet(glob).collect().to_arrow(),
        "duckdb glob": lambda: duckdb.sql(f"FROM '{glob}'").arrow(),
        "duckdb OUT/pages": lambda: duckdb.sql(f"FROM read_parquet('{pages}/*/*.parquet')").arrow(),
    }


def _blocks_out(tmp_path):
    """An OUT whose rows hold real layout blocks (a DeepSeek-OCR and an Unlimited-OCR
    answer, tests/data/grounding), a page without layout and an error row."""
    from synthetic import row, write_part

    from batchocr.grounding import parse

    data = Path(__file__).parent / "data" / "grounding"
    rows, parsed = [], []
    for i, (name, size) in enumerate([("deepseek-ocr/vastera-page015", (1170, 1654)),
                                      ("unlimited-ocr/documented-page", (1240, 1754))]):
        text, blocks = parse((data / f"{name}.raw.txt").read_text(encoding="utf-8"), *size)
        rows.append(row("file:///s/manual.pdf", i, i, text=text, blocks=blocks, page_count=4, width=size[0],
                        height=size[1]))
        parsed.append(blocks)
    rows.append(row("file:///s/manual.pdf", 2, 3, text="plain", page_count=4))  # no layout: null
    rows.append(row("file:///s/manual.pdf", 3, 4, finish_reason="error", error_type="engine_error", page_count=4))
    out = tmp_path / "out"
    write_part(out, "blocks", rows)
    return out, parsed + [None, None]


def test_every_reader_opens_a_table_with_layout_blocks_and_reads_them_back(tmp_path):
    out, parsed = _blocks_out(tmp_path)
    expected = [[b["type"] for b in blocks] if blocks is not None else None for blocks in parsed]
    for name, read in _readers(out).items():
        table = read()
        if isinstance(table, pa.RecordBatchReader):
            table = table.read_all()
        got = {f.name: _canonical(f.type) for f in table.schema}
        assert got == EXPECTED, f"{name}: {set(got.items()) ^ set(EXPECTED.items())}"
        rows = sorted(table.select(["page_index", "blocks"]).to_pylist(), key=lambda r: r["page_index"])
        assert [[b["type"] for b in r["blocks"]] if r["blocks"] is not None else None for r in rows] == expected, name
        image = next(b for b in rows[0]["blocks"] if b["type"] == "image")
        want = next(b for b in parsed[0] if b["type"] == "image")
        assert image["box"] == want["box"] and image["text"] == want["text"], name
        assert image["box_norm"] == pytest.approx(want["box_norm"]), name
    df = pd.read_parquet(out / "pages")  # pandas itself: a column of lists of dicts, nulls None
    first = df.sort_values("page_index")["blocks"].tolist()
    assert [b["type"] for b in first[1]] == expected[1] and first[2] is None and first[3] is None
    assert list(first[1][-1]["box"]) == parsed[1][-1]["box"]
    # the README's example: one row per block
    from batchocr import read_pages

    blocks = (read_pages(str(out)).select("source_uri", "page_index", "blocks")
              .explode("blocks").unnest("blocks").collect())
    figures = blocks.filter(pl.col("type") == "image").select("source_uri", "page_index", "box")
    assert figures.height == 8  # 7 on the DeepSeek-OCR page, 1 on the Unlimited-OCR one
    assert figures["box"].to_list()[0] == next(b for b in parsed[0] if b["type"] == "image")["box"]


def test_every_reader_opens_the_table_with_the_files_own_types(out):
    truth = pq.ParquetFile(next((out / "pages").glob("*/part-*.parquet"))).read()
    pages = sum(count_pages(p) for p in SAMPLES.glob("*.pdf")) + 1  # the broken file: one row
    assert truth.num_rows == pages and truth["page_count"].null_count == 1
    for name, read in _readers(out).items():
        table = read()
        if isinstance(table, pa.RecordBatchReader):
            table = table.read_all()
        got = {f.name: _canonical(f.type) for f in table.schema}
        if name.startswith("pandas") and table["blocks"].null_count == table.num_rows:
            got["blocks"] = EXPECTED["blocks"]  # pandas' column of None has no type to give back to Arrow
        assert got == EXPECTED, f"{name}: {set(got.items()) ^ set(EXPECTED.items())}"
        assert table.num_rows == truth.num_rows, name
        assert sorted(table["shard"].to_pylist()) == [0] * truth.num_rows, name
        assert sorted(table["page_index"].to_pylist()) == sorted(truth["page_index"].to_pylist()), name


def test_pandas_keeps_integer_columns_with_nulls_as_integers(out):
    df = pd.read_parquet(out / "pages")
    assert str(df["page_count"].dtype) == "Int32" and df["page_count"].isna().sum() == 1
    assert str(df["prompt_tokens"].dtype) == "Int32"  # all null for a CPU engine, still not float64
    assert str(df["source_size"].dtype) == "Int64" and str(df["shard"].dtype) == "Int32"
    assert str(df["processed_at"].dtype) == "datetime64[us, UTC]"
    assert df.loc[df["page_index"] == -1, "error_type"].tolist() == ["open_failed"]


def test_an_out_with_parts_from_before_a_column_existed_still_reads_and_compacts(tmp_path):
    """A resumed OUT whose first parts were written by a version without the newer
    columns (route, route_score, route_reason, skew_angle, blocks): read_pages, report and compact take it."""
    from batchocr import read_pages
    from batchocr.grounding import parse
    from synthetic import row, write_part

    out = tmp_path / "out"
    text, blocks = parse((Path(__file__).parent / "data" / "grounding" / "unlimited-ocr" / "npu-invoice.raw.txt")
                         .read_text(encoding="utf-8"), 100, 100)
    write_part(out, "new", [row("file:///s/a.pdf", 1, 5, text="new", page_count=2, route="model", route_score=0.1,
                                route_reason="text layer scored 0.10 < 0.5", blocks=blocks)])
    old_file = out / "pages" / "shard-00000" / "part-old.parquet"
    new = pq.read_table(next((out / "pages" / "shard-00000").glob("*.parquet")))
    newer = [c for c in ("route", "route_score", "route_reason", "skew_angle", "blocks") if c in new.column_names]
    assert "blocks" in newer and "route_reason" in newer
    pq.write_table(pa.Table.from_pylist([row("file:///s/a.pdf", 0, 0, text="old", page_count=2)],
                                        schema=schema.PAGE_TABLE).drop_columns(newer), old_file)
    pages = read_pages(str(out)).collect().sort("page_index")
    assert pages["text"].to_list() == ["old", "new"] and pages["route"].to_list() == [None, "model"]
    assert pages["route_reason"].to_list() == [None, "text layer scored 0.10 < 0.5"]
    assert pages["blocks"].to_list()[0] is None and len(pages["blocks"].to_list()[1]) == 3
    got = run_cli("report", str(out), "--json", check=True)
    assert '"pages": 2' in got.stdout
    run_cli("compact", str(out), check=True)
    (part,) = (out / "pages" / "shard-00000").glob("*.parquet")
    table = pq.read_table(part)
    assert table.schema.remove_metadata() == schema.PAGE_TABLE.remove_metadata() and table.num_rows == 2
    compacted = sorted(table.to_pylist(), key=lambda r: r["page_index"])
    assert compacted[0]["blocks"] is None and [b["text"] for b in compacted[1]["blocks"]] == [b["text"] for b in blocks]
    assert compacted[1]["blocks"][0]["box"] == [5, 19, 27, 24]  # [59, 194, 273, 240] on 0-1000, 100 x 100 pixels
