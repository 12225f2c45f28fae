"""`batchocr export`: every page's text back, in order, in each format; error, skipped
and missing pages marked in place; one row per page before compaction; az:// both ways."""

import json
import re
import shutil
from pathlib import Path

import pytest

from azurite import azurite  # noqa: F401 - a fixture
from batchocr.export import FORM_FEED, file_name
from batchocr.mdescape import plain
from conftest import count_pages, read_table, run_cli, sample_documents
from corpus import text_pdf
from synthetic import resumed_output

MARKER = re.compile(r"^<!-- (page (\d+)|document)(?: · (.*))? -->\n", re.M)


def _expected(out: Path) -> dict[str, list[tuple[int, str | None, str]]]:
    """source_uri -> [(page_index, text, finish_reason)] in page order, read by pyarrow."""
    docs: dict[str, list] = {}
    for r in read_table(out).to_pylist():
        docs.setdefault(r["source_uri"], []).append((r["page_index"], r["text"], r["finish_reason"]))
    return {uri: sorted(pages) for uri, pages in docs.items()}


def parse_markdown(md: str) -> list[tuple[int, str, str | None]]:
    """[(page_index, note, body)] from an exported markdown file; body exactly the page's text."""
    marks = list(MARKER.finditer(md))
    pages = []
    for m, nxt in zip(marks, marks[1:] + [None]):
        body = md[m.end(): nxt.start() if nxt else len(md)]
        assert body.endswith("\n\n")
        index = int(m.group(2)) - 1 if m.group(2) else -1
        pages.append((index, m.group(3) or "", body[:-2]))
    return pages


def unescaped(markdown: str) -> str:
    """Markdown's backslash escapes read: what a CommonMark parser makes of escaped plain lines."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", markdown)


def _export(out, dest, fmt, env=None):
    return run_cli("export", str(out), str(dest), "--format", fmt, env=env, check=True)


def _by_uri_jsonl(dest: Path) -> dict[str, dict]:
    lines = [json.loads(line) for f in sorted(dest.glob("*.jsonl")) for line in f.read_text().splitlines()]
    return {d["source_uri"]: d for d in lines}


@pytest.mark.parametrize("fmt", ["markdown", "text", "jsonl"])
def test_export_round_trips_every_page_in_order(rapidocr_run, tmp_path, fmt):
    out, _ = rapidocr_run
    proc = _export(out, tmp_path / "docs", fmt)
    expected = _expected(out)
    assert len(expected) == 5 and sum(map(len, expected.values())) == 10
    assert "exported 5 documents, 10 pages (0 marked)" in proc.stdout
    dest = tmp_path / "docs"
    ids = {r["source_uri"]: r["doc_id"] for r in read_table(out).select(["source_uri", "doc_id"]).to_pylist()}
    for uri, pages in expected.items():
        doc_id = ids[uri]
        name = file_name(uri, doc_id)
        texts = [t for _, t, _ in pages]
        if fmt == "markdown":
            got = parse_markdown((dest / f"{name}.md").read_text())
            assert [(i, note) for i, note, _ in got] == [(i, "") for i, _, _ in pages]
            assert [body for _, _, body in got] == texts
        elif fmt == "text":  # rapidocr's lines, their escapes read (batchocr.mdescape)
            assert (dest / f"{name}.txt").read_text().split(FORM_FEED) == [unescaped(t) for t in texts]
        else:
            doc = _by_uri_jsonl(dest)[uri]
            assert doc["doc_id"] == doc_id and doc["page_count"] == len(pages)
            assert [(p["page_index"], p["text"]) for p in doc["pages"]] == [(i, t) for i, t, _ in pages]
    suffix = {"markdown": ".md", "text": ".txt", "jsonl": ".jsonl"}[fmt]
    assert len(list(dest.glob(f"*{suffix}"))) == (1 if fmt == "jsonl" else 5)


def test_export_marks_skipped_pages_in_place(textlayer_run, tmp_path):
    """textlayer: the scans have no text layer. Their pages are marked, not dropped."""
    out, _ = textlayer_run
    _export(out, tmp_path / "md", "markdown")
    _export(out, tmp_path / "txt", "text")
    _export(out, tmp_path / "jl", "jsonl")
    jl = _by_uri_jsonl(tmp_path / "jl")
    expected = _expected(out)
    assert {r for pages in expected.values() for _, _, r in pages} == {"stop", "skipped"}
    for path in sample_documents():
        (uri,) = [u for u in expected if u.endswith("/" + path.name)]
        pages = expected[uri]
        assert len(pages) == count_pages(path)
        name = file_name(uri, jl[uri]["doc_id"])
        md = parse_markdown((tmp_path / "md" / f"{name}.md").read_text())
        txt = (tmp_path / "txt" / f"{name}.txt").read_text().split(FORM_FEED)
        assert len(md) == len(txt) == len(jl[uri]["pages"]) == len(pages)
        for (i, text, reason), (mi, note, body), t, j in zip(pages, md, txt, jl[uri]["pages"]):
            assert mi == i and j["page_index"] == i and j["finish_reason"] == reason
            if reason == "stop":
                assert body == j["text"] == text and t == plain(text) and note == ""
            else:
                assert note.startswith("skipped no_text_layer: ")
                assert body.startswith(f"> **page {i + 1} not read** — skipped no_text_layer")
                assert t.startswith(f"[page {i + 1} not read: skipped no_text_layer") and j["text"] is None


@pytest.mark.parametrize("dest", ["/proc/batchocr-export", "{tmp}/a-file/export"], ids=["under-proc", "under-a-file"])
def test_export_to_a_folder_it_cannot_write_is_one_line_exit_2(textlayer_run, tmp_path, dest):
    out, _ = textlayer_run
    (tmp_path / "a-file").write_text("not a folder")
    dest = dest.replace("{tmp}", str(tmp_path))
    proc = run_cli("export", str(out), dest)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"Error: DEST {dest}: cannot write there (") and "Traceback" not in proc.stderr
    assert proc.stderr.rstrip().endswith("DEST must be a writable folder") and len(proc.stderr.splitlines()) == 1


@pytest.mark.parametrize("inside", ["pages", "pages/shard-00000", "pages/../pages/md"])
def test_export_into_outs_page_table_is_exit_2_and_writes_nothing(textlayer_run, tmp_path, inside):
    """DEST under OUT/pages put its files among the Parquet parts: every reader of the table
    (pyarrow, polars, pandas, `batchocr report`) then failed on them ("magic bytes not found")."""
    out = tmp_path / "out"
    shutil.copytree(textlayer_run[0], out)
    before = sorted(p for p in (out / "pages").rglob("*"))
    proc = run_cli("export", str(out), str(out / inside))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"Error: DEST {out / inside} is inside OUT's page table"), proc.stderr
    assert sorted(p for p in (out / "pages").rglob("*")) == before
    run_cli("export", str(out), str(out / "documents"), check=True)  # beside the table: fine
    assert len(read_table(out)) == len(read_table(textlayer_run[0]))


def test_export_before_compaction_keeps_one_row_per_page_like_compact(tmp_path):
    resumed_output(tmp_path / "out")
    _export(tmp_path / "out", tmp_path / "before", "jsonl")
    docs = _by_uri_jsonl(tmp_path / "before")
    pages = {uri: [(p["page_index"], p["finish_reason"], p["text"]) for p in d["pages"]] for uri, d in docs.items()}
    assert pages == {
        "az://s/a.pdf": [(0, "stop", "alpha"), (1, "stop", "beta!"), (2, "length", "gamma")],
        "az://s/b.pdf": [(-1, "error", None)],
        "az://s/c.pdf": [(0, "repetition", "new c")],  # the new version only
        "az://s/d.pdf": [(0, "skipped", None), (1, "stop", "delta delta")],
    }
    # the same documents as after `batchocr compact`, byte for byte, in every format
    shutil.copytree(tmp_path / "out", tmp_path / "compacted")
    run_cli("compact", str(tmp_path / "compacted"), check=True)
    for fmt in ("markdown", "text", "jsonl"):
        _export(tmp_path / "out", tmp_path / f"b-{fmt}", fmt)
        _export(tmp_path / "compacted", tmp_path / f"a-{fmt}", fmt)
        before = {p.name: p.read_bytes() for p in (tmp_path / f"b-{fmt}").iterdir()}
        after = {p.name: p.read_bytes() for p in (tmp_path / f"a-{fmt}").iterdir()}
        assert before == after and len(before) == (2 if fmt == "jsonl" else 4)
    b = parse_markdown(next((tmp_path / "b-markdown").glob("b.pdf.*.md")).read_text())
    assert b == [(-1, "error open_failed: it failed (open_failed)",
                  "> **document not read** — error open_failed: it failed (open_failed)")]
    a = parse_markdown(next((tmp_path / "b-markdown").glob("a.pdf.*.md")).read_text())
    assert a == [(0, "", "alpha"), (1, "", "beta!"), (2, "length", "gamma")]  # cut off: marked, text kept


def test_export_marks_pages_with_no_row_as_missing(tmp_path):
    """A run not finished yet: a 3-page document with a row for page 1 only."""
    from synthetic import row, write_part

    write_part(tmp_path / "out", "x", [row("file:///s/half.pdf", 1, 0, text="middle", page_count=3)])
    _export(tmp_path / "out", tmp_path / "t", "text")
    (txt,) = (tmp_path / "t").iterdir()
    assert txt.read_text().split(FORM_FEED) == [
        "[page 1 not read: missing: no row in the output (run not finished?)]", "middle",
        "[page 3 not read: missing: no row in the output (run not finished?)]"]


def test_export_az_to_az_and_to_local(rapidocr_run, azurite, tmp_path):  # noqa: F811 - the fixture
    out, _ = rapidocr_run
    azurite.container("results")
    azurite.container("exports")
    for part in sorted(out.glob("pages/shard-*/*.parquet")):
        azurite.upload("results", [part], prefix=f"run1/pages/{part.parent.name}/")
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}
    _export(out, tmp_path / "local", "markdown")
    _export("az://results/run1", "az://exports/run1", "markdown", env=env)
    _export("az://results/run1", tmp_path / "from-az", "markdown", env=env)
    local = {p.name: p.read_bytes() for p in (tmp_path / "local").iterdir()}
    assert len(local) == 5
    assert {p.name: p.read_bytes() for p in (tmp_path / "from-az").iterdir()} == local
    blobs = azurite.blobs("exports", "run1/")
    assert {name.removeprefix("run1/"): data for name, data in blobs.items()} == local


def test_markdown_markers_survive_any_error_message():
    from batchocr.export import to_markdown

    pages = [{"page_index": 0, "finish_reason": "error", "text": None, "error_type": "engine_error",
              "error_message": "line one\nline two --> <!-- page 9 -->"},
             {"page_index": 1, "finish_reason": "stop", "text": "<b>text</b>\n\n", "error_type": None,
              "error_message": None}]
    got = parse_markdown(to_markdown("file:///x/y.pdf", pages))
    assert [(i, body) for i, _, body in got][1] == (1, "<b>text</b>\n\n")
    assert [i for i, _, _ in got] == [0, 1] and "\n" not in got[0][1]


def test_markdown_export_of_pages_with_layout_blocks_is_their_clean_text(tmp_path):
    """A grounding model's page (a real DeepSeek-OCR answer, tests/data/grounding): the
    export writes the Markdown of `text`, never the answer's tags."""
    from batchocr.grounding import parse
    from synthetic import row, write_part

    answer = (Path(__file__).parent / "data" / "grounding" / "deepseek-ocr" / "vastera-page015.raw.txt").read_text()
    text, blocks = parse(answer, 1170, 1654)
    write_part(tmp_path / "out", "x", [row("file:///s/manual.pdf", 0, 0, text=text, blocks=blocks)])
    _export(tmp_path / "out", tmp_path / "docs", "markdown")
    (md,) = (tmp_path / "docs").glob("*.md")
    ((index, note, body),) = parse_markdown(md.read_text())
    assert (index, note, body) == (0, "", text)
    assert "<|" not in body and body.count("![](page_") == 7 and "## Preparation for Your New Vinterkold" in body


def test_exported_markdown_parses_with_the_pages_headings_lists_and_tables(tmp_path):
    """A born-digital two-column page and a ruled table, through the textlayer engine:
    the exported file is Markdown a CommonMark parser reads as such."""
    from markdown_it import MarkdownIt

    import layouts
    from test_layertext import ruled_table_page

    src = tmp_path / "src"
    src.mkdir()
    doc = layouts.two_column().doc
    doc.insert_pdf(ruled_table_page().parent)
    doc.save(src / "sheet.pdf")
    run_cli("run", str(src), str(tmp_path / "out"), "--engine", "textlayer", "-q", check=True)
    _export(tmp_path / "out", tmp_path / "md", "markdown")
    (md,) = (tmp_path / "md").glob("sheet.pdf.*.md")
    tokens = MarkdownIt("commonmark").enable("table").parse(md.read_text())
    headings = [(t.tag, tokens[i + 1].content) for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings == [("h1", "sheet.pdf"), ("h1", "Series 40 Circulation Pumps"), ("h2", "Overview"),  # nested: one below the title
                        ("h2", "Spare parts"), ("h2", "Spare parts list")]  # one outline for the document
    items = [tokens[i + 2].content for i, t in enumerate(tokens) if t.type == "list_item_open"]
    assert items == ["Stainless steel body", "Quiet fan cover", "Dry-run protection", "Ten-year spare parts"]
    cells = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type in ("th_open", "td_open")]
    assert cells[:4] == ["Part no.", "Description", "Qty", "Price"] and "Shaft seal kit" in cells


def test_text_export_marks_cut_off_pages_before_their_text(tmp_path):
    """length and repetition pages keep their text, marked as markdown marks them: the
    count of marked pages is what the files hold."""
    resumed_output(tmp_path / "out")
    proc = _export(tmp_path / "out", tmp_path / "t", "text")
    assert "(4 marked)" in proc.stdout
    pages = {p.name.split(".pdf.")[0]: p.read_text().split(FORM_FEED) for p in (tmp_path / "t").iterdir()}
    assert pages["a"] == ["alpha", "beta!", "[page 3 cut off: length]\ngamma"]
    assert pages["c"] == ["[page 1 cut off: repetition]\nnew c"]
    marked = sum(t.startswith("[") for texts in pages.values() for t in texts)
    assert marked == 4


def test_a_vllm_pages_mark_names_it_once_by_its_page_number(tmp_path):
    """The vLLM engine's messages open with the page's 0-based index ("page 2: ..."), and a looping
    page's finish_reason and error_type are both `repetition`: its mark read "[page 3 cut off:
    repetition repetition: page 2: the output kept repeating itself ...]", two pages named for one."""
    from synthetic import row, write_part

    uri = "file:///d/loop.pdf"
    looped = "page 2: the output kept repeating itself; stopped after 385 tokens, 3 attempts"
    write_part(tmp_path / "out", "a", [
        row(uri, 0, 1, text="one", page_count=3),
        row(uri, 1, 1, page_count=3, finish_reason="error", error_type="rejected",
            error_message="page 1: vLLM rejected the request: ValueError: too long"),
        row(uri, 2, 1, text="7 8 9 7 8 9", page_count=3, finish_reason="repetition", error_type="repetition",
            error_message=looped)])
    _export(tmp_path / "out", tmp_path / "t", "text")
    (txt,) = (tmp_path / "t").iterdir()
    assert txt.read_text().split(FORM_FEED) == [
        "one", "[page 2 not read: error rejected: vLLM rejected the request: ValueError: too long]",
        "[page 3 cut off: repetition: the output kept repeating itself; stopped after 385 tokens, 3 attempts]\n"
        "7 8 9 7 8 9"]
    _export(tmp_path / "out", tmp_path / "md", "markdown")
    (md,) = (tmp_path / "md").iterdir()
    assert "<!-- page 3 · repetition: the output kept repeating itself; stopped after 385 tokens, 3 attempts -->" \
        in md.read_text()
    _export(tmp_path / "out", tmp_path / "j", "jsonl")  # the machine's format keeps the message as it is
    (doc,) = _by_uri_jsonl(tmp_path / "j").values()
    assert doc["pages"][2]["error_message"] == looped


def test_export_of_a_long_file_name_fits_the_file_systems_name_limit(tmp_path):
    """A name of 244 bytes (80 CJK characters) is legal; with the doc_id, the suffix and a
    temporary name's it was over 255 bytes: OSError, and the documents after it unexported."""
    from synthetic import row, write_part

    long = "文" * 80 + "x.pdf"
    write_part(tmp_path / "out", "x", [row(f"file:///s/{long}", 0, 0, text="long", page_count=1),
                                       row("file:///s/zz-short.pdf", 0, 1, text="short", page_count=1)])
    for fmt, suffix in (("markdown", ".md"), ("text", ".txt")):
        proc = _export(tmp_path / "out", tmp_path / fmt, fmt)
        assert "exported 2 documents" in proc.stdout
        names = sorted(p.name for p in (tmp_path / fmt).iterdir())
        assert len(names) == 2 and all(len(n.encode()) <= 200 and n.endswith(suffix) for n in names)
        assert names[0].startswith("zz-short.pdf.") and names[1].startswith("文" * 53 + ".")


def test_export_names_files_and_headings_by_the_documents_own_names(tmp_path):
    """`100%.pdf` exported as `100_25.pdf.<id>.md` headed `# 100%25.pdf` (its URI's spelling,
    sources.spell): a user looking for 50%.pdf's export looks for its own name."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("100%.pdf", "a%20b.pdf"):
        text_pdf(src / name, 1, seed=3)
    out = tmp_path / "out"
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    run_cli("export", str(out), str(tmp_path / "md"), check=True)
    files = sorted(p.name.split(".")[0] + "." + p.name.split(".")[1] for p in (tmp_path / "md").iterdir())
    assert files == ["100_.pdf", "a_20b.pdf"]
    headings = sorted(p.read_text().splitlines()[0] for p in (tmp_path / "md").iterdir())
    assert headings == ["# 100%.pdf", "# a%20b.pdf"]


def test_export_of_a_plan_not_all_run_says_how_many_documents_have_no_rows(tmp_path):
    """One shard of two run: the other shard's documents have no row, so no file, and the
    export said nothing of them (exit 0, "exported 2 documents" of a plan of 4)."""
    from corpus import text_corpus

    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=4, pages=1)
    run_cli("plan", str(src), str(out), "--shards", "2", check=True)
    run_cli("run", str(src), str(out), "--engine", "textlayer", "--shard", "1/2", "-q", check=True)
    proc = run_cli("export", str(out), str(tmp_path / "dest"), check=True)
    exported = int(re.search(r"exported (\d+) document", proc.stdout).group(1))
    assert 0 < exported < 4 and f"note: {4 - exported} document" in proc.stderr, proc.stdout + proc.stderr
    run_cli("run", str(src), str(out), "--engine", "textlayer", "--shard", "0/2", "-q", check=True)
    proc = run_cli("export", str(out), str(tmp_path / "dest"), check=True)
    assert "exported 4 documents" in proc.stdout and "note" not in proc.stderr, proc.stdout + proc.stderr


PAGE = """# Pump \\# 40

Some *emphasis*, **strong** and `code`, a [link](https://example.org) and \\*fsolve \\<lazy>
with a second line.

## Parts

- Stainless steel body
- Quiet fan cover
  - nested note

1. First step
2. Second step

| Part no. | Description |
| --- | --- |
| 4711 | Shaft seal \\| kit |
| 4712 | Impeller |

```python
def f(x):
    return x * 2
```

> A quoted remark

---

<table><tr><th>Model</th><th>Flow</th></tr><tr><td>P-40</td><td>3 m<sup>3</sup>/h</td></tr></table>
"""

PLAIN = """Pump # 40

Some emphasis, strong and code, a link and *fsolve <lazy>
with a second line.

Parts

Stainless steel body
Quiet fan cover
nested note

1. First step
2. Second step

Part no.\tDescription
4711\tShaft seal | kit
4712\tImpeller

def f(x):
    return x * 2

A quoted remark

Model\tFlow
P-40\t3 m3/h"""


def test_text_export_is_the_plain_text_without_markdowns_marks(tmp_path):
    """Headings, lists, emphasis, escapes, a table, a code fence, a quote, a rule and a model's
    HTML table: the text keeps every word and line, and none of the marks."""
    from synthetic import row, write_part

    write_part(tmp_path / "out", "x", [row("file:///s/pump.pdf", 0, 0, text=PAGE, page_count=1)])
    _export(tmp_path / "out", tmp_path / "t", "text")
    (txt,) = (tmp_path / "t").iterdir()
    text = txt.read_text()
    assert text == PLAIN
    assert not re.search(r"^(#|- |> |```|\||-{3})|\\[*<#|]|\*\*|\]\(|</?(table|tr|th|td|sup)>", text, re.M)
    # every letter and digit of the page's words, in order (not the fence's language, the link's
    # address or the HTML's tag names)
    source = re.sub(r"</?(table|tr|th|td|sup)>|python|https://example.org", "", PAGE)
    assert re.findall(r"[A-Za-z0-9]", text) == re.findall(r"[A-Za-z0-9]", source)
