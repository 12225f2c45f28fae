"""Incremental runs (the nightly CronJob, or by hand): a run over the same SOURCE and OUT
processes only the documents whose (uri, etag) is not complete in OUT: new ones and
changed ones. Unchanged documents are not touched."""

import json
import os
import re
import shutil
import time

import polars as pl

from batchocr import read_pages
from batchocr.compact import compact
from batchocr.sources import list_documents
from batchocr.spec import Shard
from batchocr.status import check_shard_count, output_shard_counts
from batchocr.storage import Store
from conftest import run_cli
from corpus import text_corpus, text_pdf

SHARDS = 2


def _run_all_shards(src, out) -> list[str]:
    """One run of every shard, as the CronJob's pods do; returns their run ids."""
    run_ids = []
    for i in range(SHARDS):
        proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "--quiet",
                       env={"JOB_COMPLETION_INDEX": str(i), "BATCHOCR_SHARDS": str(SHARDS)}, check=True)
        # Every run names its run id, the ones that find nothing to do included (they
        # write a _runs record too; which shard gets the new documents depends on the
        # hash of their URIs, so a shard with nothing new is a normal case here).
        run_ids.append(re.search(r"\(run (\S+)\)", proc.stdout).group(1))
    return run_ids


def _runs(out) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in (out / "_runs").glob("*.json")}


def test_a_rerun_processes_exactly_the_new_and_changed_documents(tmp_path):
    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=10, pages=2)
    _run_all_shards(src, out)
    first = read_pages(str(out)).select("doc_id", "source_etag", "page_index", "text", "run_id").collect()
    assert first.height == 20

    # 3 new documents, 1 changed (new content: a new size and mtime, as a new ETag on a
    # store), the other 9 untouched.
    for i in (10, 11, 12):
        text_pdf(src / f"doc{i:05d}.pdf", 2, seed=i)
    changed = src / "doc00004.pdf"
    new_text = text_pdf(changed, 3, seed=999)
    stat = changed.stat()
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    docs = {d.name: d for d in list_documents(Store(str(src)))}
    wanted = {docs[n].doc_id for n in ("doc00010.pdf", "doc00011.pdf", "doc00012.pdf", "doc00004.pdf")}

    before = set(_runs(out))
    second_ids = _run_all_shards(src, out)
    second = {k: v for k, v in _runs(out).items() if k not in before}
    assert sorted(second) == sorted(second_ids)
    assert sum(r["counts"]["documents"] for r in second.values()) == 4
    assert sum(r["counts"]["documents_skipped"] for r in second.values()) == 9

    rows = read_pages(str(out)).select("doc_id", "source_etag", "page_index", "text", "run_id").collect()
    new_rows = rows.filter(pl.col("run_id").is_in(second_ids))
    assert set(new_rows["doc_id"]) == wanted  # exactly those 4, nothing else redone
    assert new_rows.height == 3 * 2 + 3
    # Unchanged documents keep their first rows, untouched.
    old = rows.filter(~pl.col("run_id").is_in(second_ids)).sort("doc_id", "page_index")
    assert old.equals(first.sort("doc_id", "page_index"))

    # The changed document's new version wins compaction: its 3 new pages, no old row.
    compact(Store(str(out)))
    table = read_pages(str(out)).select("doc_id", "source_etag", "page_index", "text").collect()
    mine = table.filter(pl.col("doc_id") == docs["doc00004.pdf"].doc_id).sort("page_index")
    assert mine["source_etag"].unique().to_list() == [docs["doc00004.pdf"].etag]
    assert [t.split() for t in mine["text"]] == [t.split() for t in new_text]
    assert table.height == 12 * 2 + 3

    # A third run finds nothing to do in any shard.
    for i in range(SHARDS):
        proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "--quiet",
                       env={"JOB_COMPLETION_INDEX": str(i), "BATCHOCR_SHARDS": str(SHARDS)}, check=True)
        assert "nothing to do" in proc.stdout


def test_another_shard_count_on_the_same_out_is_exit_2_until_it_is_planned(tmp_path):
    """A document's shard depends on the count: a run with another count would redo
    documents on shards where compaction never meets their old rows. It stops with one
    line naming both counts, writing nothing; `batchocr plan` with the new count keeps
    done documents where their rows are, so the runs then redo nothing."""
    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=4, pages=2)
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)  # 0/1
    written = sorted(p.relative_to(out) for p in out.rglob("*"))

    def refused(*args, **env):
        proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", *args, env=env)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert "holds output of 1 shard, this run is shard 1/3" in proc.stderr
        assert "--shards 3" in proc.stderr
        assert sorted(p.relative_to(out) for p in out.rglob("*")) == written

    refused(JOB_COMPLETION_INDEX="1", BATCHOCR_SHARDS="3")  # an Indexed Job's pods with another completions
    refused("--shard", "1/3", "--processes", "2")  # before any part starts
    # A shard not done (no done-marker): its run records say what count made the rows.
    marker = out / "_done" / "shard-00000.json"
    kept = marker.read_bytes()
    marker.unlink()
    written.remove(marker.relative_to(out))
    refused(JOB_COMPLETION_INDEX="1", BATCHOCR_SHARDS="3")
    marker.write_bytes(kept)

    text_corpus(src / "new", documents=2, pages=1)
    run_cli("plan", str(src), str(out), "--shards", "3", check=True)
    for i in range(3):  # with the plan, its count is the one compared
        run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", "--shard", f"{i}/3", check=True)
    compact(Store(str(out)))
    table = read_pages(str(out)).select("doc_id", "page_index").collect()
    assert table.height == table.n_unique() == 4 * 2 + 2


def test_a_run_killed_before_its_first_commit_leaves_no_shard_count(tmp_path):
    """A run SIGKILLed once its record was written ("running": its end, and so its parts, never
    listed) but before its first part file left no output, yet a run with another count was
    exit 2, 'OUT holds output of 3 shards'. Such a record counts once its shard holds rows of
    the run: its part files, or their rows compacted."""
    src, out, job = tmp_path / "src", tmp_path / "out", tmp_path / "job.yaml"
    # A part file a document: shard 0 of 3 (by the hash of paths under tmp_path) gets fewer than
    # the two the test needs with a chance of ~1e-4 (every 4 pages: 5 or more, ~3% short)
    text_corpus(src, documents=30, pages=1)
    job.write_text("engine: textlayer\ncommit: {every_pages: 1}\n")
    run_cli("run", str(src), str(out), "--job", str(job), "-q", "--shard", "0/3", check=True)
    (record,) = (out / "_runs").glob("*.json")
    ended = json.loads(record.read_text())
    record.write_text(json.dumps({k: v for k, v in ended.items() if k not in ("finished_at", "parts")}
                                 | {"status": "running"}))
    (out / "_done" / "shard-00000.json").unlink()
    parts = {p: p.read_bytes() for p in (out / "pages" / "shard-00000").glob("*.parquet")}
    assert len(parts) > 1
    for p in parts:
        p.unlink()
    store = Store(str(out))
    assert output_shard_counts(store) == set()
    check_shard_count(store, Shard(0, 4), str(out))  # no output to keep on its shards: any count may start

    for p, data in parts.items():  # killed after its commits
        p.write_bytes(data)
    assert output_shard_counts(store) == {3}
    compact(store)  # its rows in a part named after no run
    assert [p.name[:13] for p in (out / "pages" / "shard-00000").glob("*.parquet")] == ["part-compact-"]
    proc = run_cli("run", str(src), str(out), "--job", str(job), "-q", "--shard", "0/4")
    assert proc.returncode == 2 and "holds output of 3 shards, this run is shard 0/4" in proc.stderr


def test_out_remembers_what_made_it_and_reprocess_redoes_its_pages(rapidocr_run, tmp_path, monkeypatch):
    """A rerun on the same OUT with another engine (or model, preset, prompt, route,
    render settings) stops with exit 2 naming both, before any engine is built,
    writing nothing; with --reprocess its pages are redone, and compaction keeps the
    new rows."""
    import shutil

    from batchocr import engines
    from conftest import SAMPLES

    built = []
    create = engines.create
    monkeypatch.setattr(engines, "create", lambda name, options: built.append(name) or create(name, options))
    out = tmp_path / "out"
    shutil.copytree(rapidocr_run[0], out)
    before = sorted(p.name for p in out.rglob("*") if p.is_file())
    for args, changed in [(["--engine", "textlayer"], "engine 'rapidocr', model 'rapidocr"),
                          (["--dpi", "150"], "render.dpi 200; this run: render.dpi 150"),
                          (["--route", "model"], "route 'auto'; this run: route 'model'")]:
        proc = run_cli("run", str(SAMPLES), str(out), "-q", *args)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"Error: OUT {out} holds pages made with {changed}"), proc.stderr
        assert "--reprocess" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
        assert sorted(p.name for p in out.rglob("*") if p.is_file()) == before, "a refused run wrote something"
        assert not built, f"a refused run built the {built} engine"
    if "engine 'textlayer'" not in run_cli("run", str(SAMPLES), str(out), "-q", "--engine", "textlayer").stderr:
        raise AssertionError("the message names this run's engine too")

    proc = run_cli("run", str(SAMPLES), str(out), "-q", "--engine", "textlayer", "--reprocess", check=True)
    assert "done: 5 documents, 10 pages" in proc.stdout and built == ["textlayer"]
    # OUT has the new settings now: the same run again has nothing to do, without the flag
    assert "nothing to do" in run_cli("run", str(SAMPLES), str(out), "-q", "--engine", "textlayer", check=True).stdout
    compact(Store(str(out)))
    rows = read_pages(str(out)).collect()
    assert rows.height == 10 and rows.select("doc_id", "page_index").is_unique().all()
    assert set(rows["engine"]) == {"textlayer"}  # the redone rows, not rapidocr's text
    assert json.loads((out / "_producer.json").read_text())["engine"] == "textlayer"


def test_before_compaction_export_report_and_eval_keep_the_row_compaction_keeps_after_reprocess(
        rapidocr_run, tmp_path):
    """After --reprocess, the older run's rows are stale: compaction keeps the current
    settings' row for a page even where it is an error and the stale one has text. export,
    report and eval read an uncompacted OUT by the same rule, so what they say does not change
    when OUT is compacted (rerun with a pixel limit that refuses the samples' images: error
    rows where the first run's rows have text)."""
    import shutil

    from conftest import SAMPLES

    out = tmp_path / "out"
    shutil.copytree(rapidocr_run[0], out)
    (tmp_path / "small.yaml").write_text("render:\n  max_image_pixels: 1000\n")
    run_cli("run", str(SAMPLES), str(out), "-q", "--job", str(tmp_path / "small.yaml"), "--reprocess")

    def views(tag: str) -> tuple:
        run_cli("export", str(out), str(tmp_path / f"docs-{tag}"), "--format", "jsonl", check=True)
        exported = sorted((json.loads(line) for f in sorted((tmp_path / f"docs-{tag}").glob("*.jsonl"))
                           for line in f.read_text().splitlines()), key=lambda doc: doc["doc_id"])
        report = json.loads(run_cli("report", str(out), "--json", check=True).stdout)
        ev = run_cli("eval", str(out), "--truth", str(SAMPLES / "truth"))
        return (exported, {k: report[k] for k in ("pages", "finish_reasons", "error_types", "models")},
                ev.stdout, ev.returncode)

    before = views("before")
    compact(Store(str(out)))
    after = views("after")
    assert "too_large" in after[1]["error_types"], "no current error row: this would show nothing"
    assert before == after


def test_one_local_source_spelled_several_ways_is_one_set_of_documents(tmp_path, monkeypatch):
    """`d//x/`, `./d/x` and `d/../d/x` name one folder: the same documents (doc_id from the
    URI), so a rerun so spelled finds them done. Each spelling made every document new
    (three rows a page after three runs, eval matching the same file three times)."""
    monkeypatch.chdir(tmp_path)
    text_corpus(tmp_path / "d" / "x", documents=2, pages=2)
    out = tmp_path / "out"
    run_cli("run", "d/x", str(out), "--engine", "textlayer", "-q", check=True)
    for spelling in ("./d//x/", "d/../d/x", str(tmp_path / "d" / "." / "x")):
        proc = run_cli("run", spelling, str(out), "--engine", "textlayer", "-q", check=True)
        assert "nothing to do" in proc.stderr + proc.stdout, (spelling, proc.stderr)
    pages = read_pages(str(out)).collect()
    assert pages.height == 4 and pages["source_uri"].n_unique() == 2
    assert all("//" not in u[len("file://"):] and "/./" not in u for u in pages["source_uri"])


def test_dot_dot_past_a_symbolic_link_is_not_collapsed(tmp_path):
    """`link/..` is the link target's parent, not the folder holding the link: collapsing it
    as text would read another folder."""
    text_corpus(tmp_path / "real" / "docs", documents=1, pages=1)
    (tmp_path / "real" / "sub").mkdir()
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "link").symlink_to(tmp_path / "real" / "sub")
    store = Store(str(tmp_path / "here" / "link" / ".." / "docs"))
    assert [d.uri.rsplit("/", 1)[1] for d in list_documents(store)] == ["doc00000.pdf"]  # real/docs's


def test_a_document_restored_to_an_earlier_version_is_read_again(tmp_path):
    """A file restored from a backup with its mtime (`cp -p`; on a store, an ETag that is the
    content's hash) lists an etag OUT has complete rows for, from before the newer version:
    the rerun skipped it and compaction then kept the newer version's pages, for a file that
    holds the older one."""
    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=2, pages=1)
    doc = src / "doc00001.pdf"
    original, stat = doc.read_bytes(), doc.stat()
    old_text = text_pdf(tmp_path / "again.pdf", 1, seed=1)
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    text_pdf(doc, 3, seed=999)  # version 2: three pages
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    doc.write_bytes(original)  # version 1 again, with its mtime: its etag as in the first run
    os.utime(doc, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (listed,) = [d for d in list_documents(Store(str(src))) if d.name == "doc00001.pdf"]
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    assert "1 document, 1 page" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    compact(Store(str(out)))
    mine = read_pages(str(out)).filter(pl.col("doc_id") == listed.doc_id).collect()
    assert mine["source_etag"].to_list() == [listed.etag] and mine["page_index"].to_list() == [0]
    assert mine["text"][0].split() == old_text[0].split()
    # and a fourth run has nothing to do
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    assert "nothing to do" in proc.stdout + proc.stderr


def test_a_file_reached_by_a_symbolic_link_rewritten_at_the_same_size_is_read_again(tmp_path):
    """A link's etag took the target's size but the link's own mtime, which never changes: a
    target rewritten at the same size (a fixed-size scan) kept its old text under the link."""
    import pymupdf

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()

    def write(text: str) -> None:
        doc = pymupdf.open()
        doc.new_page().insert_text((72, 72), text)
        doc.save(src / "real.pdf")

    write("Version one ABCD")
    (src / "link.pdf").symlink_to("real.pdf")
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    size = (src / "real.pdf").stat().st_size
    # the same letters in the same file's bytes: the same size (MuPDF writes a random /ID whose
    # length varies, so a second save may not be)
    first = (src / "real.pdf").read_bytes()
    (src / "real.pdf").write_bytes(first.replace(b"Version one ABCD".hex().encode(), b"Version one DCBA".hex().encode()))
    assert (src / "real.pdf").read_bytes() != first and (src / "real.pdf").stat().st_size == size
    os.utime(src / "real.pdf", (time.time() + 5, time.time() + 5))
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    assert "2 documents" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    compact(Store(str(out)))
    texts = {u.rsplit("/", 1)[1]: t.strip() for u, t in read_pages(str(out)).select("source_uri", "text").collect().rows()}
    assert texts == {"real.pdf": "Version one DCBA", "link.pdf": "Version one DCBA"}, texts


def test_the_route_of_a_textlayer_run_is_no_setting_of_its_out(tmp_path):
    """The textlayer engine does not route, but OUT remembered its --route: a rerun with
    another was exit 2, and --reprocess redid every page for the same rows. An OUT written
    before (its _producer.json holds route 'auto') takes the new runs too."""
    import json

    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=1, pages=1)
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    text_pdf(src / "new.pdf", 1)
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "--route", "textlayer", "-q")
    assert proc.returncode == 0 and "1 document" in proc.stdout + proc.stderr, proc.stderr
    producer = json.loads((out / "_producer.json").read_text())
    assert producer["route"] is None
    (out / "_producer.json").write_text(json.dumps(producer | {"route": "auto"}))  # as written before
    text_pdf(src / "newer.pdf", 1)
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "--route", "model", "-q")
    assert proc.returncode == 0 and "1 document" in proc.stdout + proc.stderr, proc.stderr
    assert run_cli("run", str(src), str(out), "--engine", "rapidocr", "-q").returncode == 2  # an engine still counts


def test_another_shard_count_is_told_a_plan_count_that_plan_takes(tmp_path):
    """A run of fewer shards than OUT's output was told "`batchocr plan SOURCE OUT --shards 2`
    first to change the count", and that plan was exit 2: output in shard 2 stays on its shard,
    so a plan needs 3 shards or more. The line names a count that plan takes."""
    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=12, pages=1)  # shard 2 of 3 gets none with a chance of (2/3)^12
    for i in range(3):
        run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", "--shard", f"{i}/3", check=True)
    assert (out / "pages" / "shard-00002").is_dir()
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", "--shard", "0/2")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    told = re.search(r"`batchocr plan SOURCE OUT --shards (\d+)`", proc.stderr)
    assert told, proc.stderr
    run_cli("plan", str(src), str(out), "--shards", told.group(1), check=True)
    # A count above OUT's output's shards is told as it is: that plan takes it.
    shutil.rmtree(out / "_plan")
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", "--shard", "0/5")
    assert proc.returncode == 2 and "`batchocr plan SOURCE OUT --shards 5` first" in proc.stderr, proc.stderr
