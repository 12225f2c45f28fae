"""Whole documents out of the page table: pages in page order, every page accounted
for (an error, skipped or missing page is marked in its place, never dropped).

- markdown: DEST/<file name>.<doc_id>.md, a `<!-- page N -->` line before each page
- text: DEST/<file name>.<doc_id>.txt, pages separated by a form feed (as pdftotext does);
  a page not read is `[page N not read: why]`, a cut-off one has `[page N cut off: why]` before its text.
  Each page's Markdown as the plain text it renders to: no heading hashes, bullets,
  emphasis, escapes or code fences; a table's cells a tab apart, a row a line
  (batchocr.mdescape.plain)
- jsonl: DEST/documents-<shard>.jsonl, one line per document with its pages

A few whole shards are read at a time (a document's rows are all in its shard;
batchocr.table.shard_groups), so memory holds their text, not the whole output's. Before compaction a redone page
can have several rows: one per (doc_id, page_index) is kept by compaction's rule
(after a `--reprocess`, a row of the current settings over an older run's).
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Iterable

import polars as pl

from batchocr.compact import dedupe
from batchocr.mdescape import plain
from batchocr.sources import native
from batchocr.storage import Store

FORMATS = ("markdown", "text", "jsonl")
COLUMNS = ["doc_id", "source_uri", "source_etag", "page_index", "page_count", "text", "finish_reason",
           "error_type", "error_message", "processed_at", "run_id", "blocks"]
FORM_FEED = "\f"


@dataclass(frozen=True)
class Exported:
    documents: int
    pages: int
    marked: int  # pages written as error / skipped / missing, or with cut-off text (length, repetition)
    files: int


NAME_BYTES = 160  # of the file name kept: with the doc_id, the suffix and a temp name's, under 255


def own_name(uri: str) -> str:
    """The document file's own name (`100%.pdf`), not its URI's spelling (`100%25.pdf`,
    sources.spell); the spelling where the name is not text (bytes that are not UTF-8)."""
    spelled = posixpath.basename(uri.rstrip("/"))
    name = native(spelled)
    try:
        name.encode()  # bytes that are not UTF-8 come back as surrogate escapes
    except UnicodeEncodeError:
        return spelled
    return name if name.isprintable() else spelled


def file_name(uri: str, doc_id: str) -> str:
    """The document's own file name, made safe (what is not a letter, digit, `.`, `-` or `_`
    becomes `_`) and cut to NAME_BYTES of UTF-8 (a file system's names end at 255 bytes), and
    its doc_id: two documents of one name in different folders, or of one long name's start,
    get different files."""
    name = re.sub(r"[^\w.-]+", "_", own_name(uri)) or "document"
    if len(name.encode()) > NAME_BYTES:
        name = name.encode()[:NAME_BYTES].decode(errors="ignore")
    return f"{name}.{doc_id}"


def document_pages(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per page 0..page_count-1 (a page with no row is `missing`); a document
    that could not be opened is its one row (page_index -1)."""
    by_index = {r["page_index"]: r for r in rows}
    count = max((r["page_count"] or 0 for r in rows), default=0)
    indices = sorted(set(range(count)) | set(by_index))
    pages = []
    for i in indices:
        r = by_index.get(i)
        pages.append({"page_index": i, "finish_reason": r["finish_reason"] if r else "missing",
                      "text": r["text"] if r else None, "error_type": r["error_type"] if r else None,
                      "error_message": r["error_message"] if r else "no row in the output (run not finished?)",
                      "blocks": r["blocks"] if r else None})  # layout blocks (JSONL), null without layout
    return pages


def _note(page: dict[str, Any]) -> str:
    """Why a page is marked: '' for a page read normally."""
    if page["finish_reason"] == "stop":
        return ""
    what = " ".join(dict.fromkeys(filter(None, [page["finish_reason"], page["error_type"]])))  # repetition once
    message = page["error_message"]
    if message and page["page_index"] >= 0:  # the engines' "page 2: ..." (0-based): the label names the page
        message = message.removeprefix(f"page {page['page_index']}: ")
    return f"{what}: {message}" if message else what


def _label(page: dict[str, Any]) -> str:
    return "document" if page["page_index"] < 0 else f"page {page['page_index'] + 1}"


def to_markdown(uri: str, pages: list[dict[str, Any]]) -> str:
    parts = [f"# {own_name(uri)}\n\n`{uri}`\n\n"]
    for p in pages:
        # One line, and no "-->" to end the comment early: the page markers must stay parseable.
        note = " ".join(_note(p).split()).replace("-->", "->")
        parts.append(f"<!-- {_label(p)}{' · ' + note if note else ''} -->\n")
        if p["text"] is not None:
            parts.append(p["text"] + "\n\n")
        else:
            parts.append(f"> **{_label(p)} not read** — {note}\n\n")
    return "".join(parts)


def to_text(pages: list[dict[str, Any]]) -> str:
    """A page not read is a line in brackets in its place; a page cut off (length,
    repetition) has one before its text."""
    return FORM_FEED.join(f"[{_label(p)} not read: {_note(p)}]" if p["text"] is None
                          else f"[{_label(p)} cut off: {_note(p)}]\n{plain(p['text'])}" if _note(p)
                          else plain(p["text"]) for p in pages)


def to_json(doc: dict[str, Any], pages: list[dict[str, Any]]) -> str:
    return json.dumps({**doc, "pages": pages}, ensure_ascii=False)


def export(pages: pl.LazyFrame, dest: Store, fmt: str, stale: frozenset[str] | set[str] = frozenset(),
           groups: Iterable[pl.LazyFrame] | None = None) -> Exported:
    """stale: runs made with settings OUT no longer has (batchocr.producer.stale_in).
    groups: the same rows a few whole shards at a time (batchocr.table.shard_groups), read one
    after another, so that neither memory nor a shard's read grows with the table (none:
    `pages` is one group)."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {FORMATS}")
    done = [0, 0, 0, 0]  # documents, pages, marked, files
    for group in groups if groups is not None else [pages]:
        rows = group.select(*COLUMNS, "shard").collect()
        for shard_rows in sorted(rows.partition_by("shard"), key=lambda r: r["shard"][0]):
            shard = shard_rows["shard"][0]
            counts = _export_shard(dedupe(shard_rows.drop("shard"), stale), dest, fmt, shard)
            done = [a + b for a, b in zip(done, counts)]
    return Exported(*done)


def _export_shard(rows: pl.DataFrame, dest: Store, fmt: str, shard: int) -> tuple[int, int, int, int]:
    """One shard's documents (one row a page) into DEST: documents, pages, marked pages, files."""
    documents = page_total = marked = files = 0
    lines = []
    for doc in rows.sort("source_uri", "doc_id", "page_index").partition_by("doc_id", maintain_order=True):
        first = doc.row(0, named=True)
        entries = document_pages(doc.to_dicts())
        documents += 1
        page_total += len(entries)
        marked += sum(p["finish_reason"] != "stop" for p in entries)
        name = file_name(first["source_uri"], first["doc_id"])
        if fmt == "markdown":
            dest.write_atomic(f"{name}.md", to_markdown(first["source_uri"], entries).encode())
            files += 1
        elif fmt == "text":
            dest.write_atomic(f"{name}.txt", to_text(entries).encode())
            files += 1
        else:
            meta = {k: first[k] for k in ("doc_id", "source_uri", "source_etag", "page_count")}
            lines.append(to_json(meta, entries))
    if lines:
        dest.write_atomic(f"documents-{shard:05d}.jsonl", ("\n".join(lines) + "\n").encode())
        files += 1
    return documents, page_total, marked, files
