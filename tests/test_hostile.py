"""A hostile corpus through the real CLI and the real render pool: odd file
names, files that are not files, folders that cannot be listed, pages that hang
the renderer, workers that die, runs killed at random instants. Every page gets
exactly one row, computed here from what each file is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, strategies as st

from batchocr import read_pages
from batchocr.sharding import shard_of
from batchocr.sources import doc_id, native, spell
from conftest import run_cli
from corpus import text_pdf

# Every byte a POSIX name may hold (all but NUL and "/"), non-UTF-8 sequences included.
names = st.binary(min_size=1, max_size=40).filter(lambda b: b"\0" not in b and b"/" not in b)


@given(names, names)
def test_a_file_name_is_spelled_losslessly_as_utf8(a, b):
    uri = "file:///data/" + os.fsdecode(a)
    spelled = spell(uri)
    spelled.encode("utf-8")  # storable in Parquet, hashable
    assert native(spelled) == uri
    assert (spell("file:///data/" + os.fsdecode(b)) == spelled) == (a == b)
    assert 0 <= shard_of(spelled, 7) < 7 and len(doc_id(spelled)) == 16


ODD_NAMES = [b"b-\xff.pdf", b"a::b.pdf", b"hash#1.pdf", b"50%.pdf", b"pct%41.pdf", b"new\nline.pdf",
             b"-leading-dash.pdf", b"sp ace.pdf", "\u00e9t\u00e9.pdf".encode()]


def _read(out) -> list[dict]:
    return read_pages(str(out)).collect().sort("source_uri", "page_index").to_dicts()


def test_any_file_name_is_listed_sharded_opened_and_written(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    texts = {}
    for i, name in enumerate(ODD_NAMES):
        path = os.path.join(os.fsencode(src), name)
        text_pdf(tmp_path / "tmp.pdf", 2, seed=i)
        shutil.move(tmp_path / "tmp.pdf", os.fsdecode(path))
        texts[spell(f"file://{src}/{os.fsdecode(name)}")] = i
    out = tmp_path / "out"
    for shard in ("0/2", "1/2"):
        run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", "--shard", shard, check=True)
    rows = _read(out)
    assert {r["source_uri"] for r in rows} == set(texts)
    assert all(r["finish_reason"] == "stop" for r in rows), [r for r in rows if r["error_type"]]
    for r in rows:
        assert f" {texts[r['source_uri']] * 100_000 + r['page_index']}-0" in r["text"]
        assert r["shard"] == shard_of(r["source_uri"], 2)
    assert len(rows) == 2 * len(ODD_NAMES)
    assert "file://" + str(src) + "/b-%FF.pdf" in texts and "50%25.pdf" in " ".join(texts)


def _without_dac(*args: str) -> subprocess.CompletedProcess:
    """The CLI as a process without CAP_DAC_OVERRIDE: root here, yet mode 000 holds."""
    return subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-m",
                           "batchocr.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_a_folder_that_cannot_be_listed_stops_the_run(tmp_path):
    src = tmp_path / "src"
    text_pdf((src / "ok").mkdir(parents=True) or src / "ok" / "a.pdf", 1)
    text_pdf((src / "locked").mkdir() or src / "locked" / "b.pdf", 1)
    (src / "locked").chmod(0)
    out = tmp_path / "out"
    try:
        proc = _without_dac("run", str(src), str(out), "--engine", "textlayer", "-q")
    finally:
        (src / "locked").chmod(0o755)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "locked" in proc.stderr and "Permission denied" in proc.stderr
    assert not (out / "_done").exists()
