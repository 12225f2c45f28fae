"""`batchocr plan --inventory`: a plan from Azure's blob inventory (on Azurite, through
az://) or a plain manifest writes the rows a listed plan writes for the same files,
leaves out what is not SOURCE's or cannot be read, keeps planned documents on their
shards, and refuses a bad inventory in one line."""

import datetime as dt
import json
import os

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchocr import inventory, planner, read_pages
from batchocr.plan import make_plan
from batchocr.storage import Store
from azurite import azurite  # noqa: F401 - a fixture
from conftest import run_cli
from corpus import text_corpus


def plan_rows(out, shards: int) -> dict[int, pl.DataFrame]:
    return {i: pl.read_parquet(out / "_plan" / f"shard-{i:05d}.parquet") for i in range(shards)}


def all_rows(out, shards: int) -> pl.DataFrame:
    return pl.concat(plan_rows(out, shards).values()).sort("uri")


def make_source(folder):
    """Real small files: documents of several sizes (one in a subfolder, one with `%` in its
    name, one with an upper-case extension) and one that is not a document."""
    folder.mkdir()
    (folder / "sub").mkdir()
    for i in range(1, 8):
        (folder / f"doc{i}.pdf").write_bytes(os.urandom(i * 700))
    (folder / "sub" / "50%.PNG").write_bytes(b"x" * 10)
    (folder / "notes.txt").write_text("not a document")
    for i, path in enumerate(sorted(p for p in folder.rglob("*") if p.is_file())):
        os.utime(path, (1.7e9 + i * 1.25, 1.7e9 + i * 1.25))
    return folder


def manifest_rows(folder):
    return [{"Name": str(p.relative_to(folder)), "Content-Length": p.stat().st_size,
             "Last-Modified": p.stat().st_mtime} for p in sorted(folder.rglob("*")) if p.is_file()]


@pytest.mark.parametrize("form", ["csv", "parquet"])
def test_plain_manifest_plans_the_rows_a_listing_plans(tmp_path, form):
    source = make_source(tmp_path / "src")
    manifest = tmp_path / f"manifest.{form}"
    frame = pl.DataFrame(manifest_rows(source))
    frame.write_csv(manifest) if form == "csv" else frame.write_parquet(manifest)
    run_cli("plan", str(source), str(tmp_path / "listed"), "--shards", "1", check=True)
    run_cli("plan", str(source), str(tmp_path / "inv"), "--shards", "1", "--inventory", str(manifest), check=True)
    listed, planned = plan_rows(tmp_path / "listed", 1)[0], plan_rows(tmp_path / "inv", 1)[0]
    assert planned.height == 8  # seven PDFs and the PNG, not the text file
    assert planned.equals(listed)  # same rows, same order, same types
    assert pq.read_schema(tmp_path / "inv" / "_plan" / "shard-00000.parquet").equals(
        pq.read_schema(tmp_path / "listed" / "_plan" / "shard-00000.parquet"))

    run_cli("plan", str(source), str(tmp_path / "inv3"), "--shards", "3", "--inventory", str(manifest), check=True)
    shards = plan_rows(tmp_path / "inv3", 3)
    assert all(s["uri"].is_sorted() for s in shards.values())
    assert all_rows(tmp_path / "inv3", 3).equals(listed)
    info = json.loads((tmp_path / "inv3" / "_plan" / "plan.json").read_text())
    assert info["documents"] == 8 and info["bytes"] == listed["size"].sum()
    assert [s["documents"] for s in info["per_shard"]] == [shards[i].height for i in range(3)]
    loads = [shards[i]["size"].sum() for i in range(3)]
    assert max(loads) - min(loads) <= listed["size"].max()

    proc = run_cli("status", str(tmp_path / "inv3"))
    assert proc.returncode == 0 and "0/3 shards done" in proc.stdout, proc.stdout


def test_replan_keeps_every_planned_document_on_its_shard(tmp_path):
    source = make_source(tmp_path / "src")
    manifest, out = tmp_path / "manifest.parquet", tmp_path / "out"
    pl.DataFrame(manifest_rows(source)).write_parquet(manifest)
    run_cli("plan", str(source), str(out), "--shards", "3", "--inventory", str(manifest), check=True)
    before = {u: i for i, rows in plan_rows(out, 3).items() for u in rows["uri"]}
    for i in range(8, 20):
        (source / f"new{i}.pdf").write_bytes(os.urandom(i * 500))
    pl.DataFrame(manifest_rows(source)).write_parquet(manifest)
    run_cli("plan", str(source), str(out), "--shards", "3", "--inventory", str(manifest), check=True)
    after = {u: i for i, rows in plan_rows(out, 3).items() for u in rows["uri"]}
    assert len(after) == len(before) + 12
    assert all(after[u] == i for u, i in before.items())
    proc = run_cli("plan", str(source), str(out), "--shards", "4", "--inventory", str(manifest))
    assert proc.returncode == 2 and "shard count cannot change" in proc.stderr


def test_dealing_is_balanced_within_the_largest_document(monkeypatch):
    """LPT onto one load array: from equal loads, two shards differ by at most the largest
    document, in one step or in steps of any sizes (the engine's buckets)."""
    monkeypatch.setattr(planner, "CHUNK", 777)  # several chunks a step
    rng = np.random.default_rng(3)
    sizes = rng.lognormal(12, 1, 5000).astype(np.int64)
    for shards in (1, 7, 64):
        load = np.zeros(shards)
        shard = planner.deal(np.sort(sizes)[::-1], load)
        assert sorted(set(shard)) == list(range(shards))
        assert np.array_equal(load, np.bincount(shard, weights=np.sort(sizes)[::-1], minlength=shards))
        assert load.max() - load.min() <= sizes.max()
        load = np.zeros(shards)
        for part in np.array_split(rng.permutation(sizes), 9):
            planner.deal(np.sort(part)[::-1], load)
        assert load.sum() == sizes.sum() and load.max() - load.min() <= sizes.max()


def test_bad_inventory_is_one_line_exit_2(tmp_path):
    source = make_source(tmp_path / "src")
    no_size = tmp_path / "nosize.csv"
    no_size.write_text("Name,Etag\ndoc1.pdf,x\n")
    not_json = tmp_path / "rule-manifest.json"
    not_json.write_text("{not json")
    bad_number = tmp_path / "bad.csv"
    bad_number.write_text("Name,Content-Length\ndoc1.pdf,many\n")
    cases = {str(no_size): "no column Content-Length", str(not_json): "not an Azure inventory manifest",
             str(tmp_path / "gone.parquet"): "cannot read it", str(bad_number): "cannot read it",
             str(tmp_path / "src" / "sub"): "no manifest JSON, Parquet or CSV file there"}
    for url, what in cases.items():
        proc = run_cli("plan", str(source), str(tmp_path / "out"), "--shards", "2", "--inventory", url)
        assert proc.returncode == 2, (url, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and what in lines[0] and "Traceback" not in proc.stderr, (url, proc.stderr)
    assert not (tmp_path / "out" / "_plan" / "plan.json").exists()


def test_azure_inventory_on_azurite(azurite, tmp_path):  # noqa: F811 - the fixture
    """Azure's layout: a manifest and two Parquet report files in a destination container,
    names `container/blob`; SOURCE a prefix of the container."""
    azurite.container("scans")
    azurite.container("results")
    blobs = {"batch/a.pdf": 3000, "batch/b.tif": 2000, "batch/deep/c.pdf": 1000, "batch/cold.pdf": 500,
             "batch/readme.txt": 10, "other/d.pdf": 4000, "batchx/e.pdf": 100}
    scans = azurite.client().get_container_client("scans")
    for name, size in blobs.items():
        scans.upload_blob(name, os.urandom(size))
    scans.get_blob_client("batch/cold.pdf").set_standard_blob_tier("Archive")  # Azurite answers reads BlobArchived
    listed = sorted(scans.list_blobs(), key=lambda b: b.name)
    assert all(b.last_modified.microsecond == 0 for b in listed)  # the listing's Last-Modified: whole seconds
    finer = [dt.timedelta(microseconds=i * 123457) for i in range(len(listed))]  # a report's may be finer
    rows = [{"Name": f"scans/{b.name}", "Content-Length": b.size, "Etag": b.etag.strip('"'),
             "Last-Modified": b.last_modified.astimezone(dt.UTC).replace(tzinfo=None) + finer[i],
             "AccessTier": "Archive" if b.name == "batch/cold.pdf" else "Hot"} for i, b in enumerate(listed)]
    inv = azurite.container("inventory")
    run = "2026/12/05/01-00-00/scans-rule"
    files = []
    for n, part in enumerate((rows[:4], rows[4:]), 1):
        table = pa.Table.from_pylist(part).cast(pa.schema([
            ("Name", pa.string()), ("Content-Length", pa.int64()), ("Etag", pa.string()),
            ("Last-Modified", pa.timestamp("us", "UTC")), ("AccessTier", pa.string())]))
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        inv.upload_blob(f"{run}/scans-rule_{n}.parquet", sink.getvalue().to_pybytes())
        files.append({"blob": f"{run}/scans-rule_{n}.parquet", "size": sink.getvalue().size})
    inv.upload_blob(f"{run}/scans-rule-manifest.json", json.dumps(
        {"destinationContainer": "inventory", "files": files, "ruleName": "scans-rule", "status": "Succeeded",
         "summary": {"objectCount": len(rows)}, "version": "1.0"}))
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}

    proc = run_cli("plan", "az://scans/batch/", "az://results/inv", "--shards", "2", "--inventory",
                   f"az://inventory/{run}/scans-rule-manifest.json", env=env, check=True)
    assert "1 document in the Archive tier: planned, each gets an unreadable row until rehydrated" in proc.stdout
    run_cli("plan", "az://scans/batch/", "az://results/listed", "--shards", "1", env=env, check=True)
    options = {"connection_string": azurite.connection_string}

    def read(out, shards):
        return pl.concat([pl.from_arrow(pq.read_table(f"results/{out}/_plan/shard-{i:05d}.parquet",
                                                        filesystem=_fs(options))) for i in range(shards)]).sort("uri")

    planned, by_listing = read("inv", 2), read("listed", 1)
    assert planned["uri"].to_list() == ["az://scans/batch/a.pdf", "az://scans/batch/b.tif",
                                        "az://scans/batch/cold.pdf", "az://scans/batch/deep/c.pdf"]  # not readme,
    assert planned.equals(by_listing)  # other/, batchx/; the archived blob as a listing plans it

    # The runs of the plan: the archived blob gets exactly one row, an error naming the tier.
    for i in range(2):
        run_cli("run", "az://scans/batch/", "az://results/inv", "--engine", "textlayer", "-q", "--shard", f"{i}/2",
                env=env)
    pages = read_pages("az://results/inv", options).collect()
    cold = pages.filter(pl.col("source_uri") == "az://scans/batch/cold.pdf")
    assert cold.height == 1 and cold["error_type"][0] == "unreadable", cold
    assert "Archive tier" in cold["error_message"][0] and "rehydrate" in cold["error_message"][0]
    assert pages["source_uri"].n_unique() == 4  # every planned document has its rows


def _fs(options):
    import adlfs

    return adlfs.AzureBlobFileSystem(**options)


def test_a_name_twice_is_planned_once(tmp_path):
    source = make_source(tmp_path / "src")
    rows = manifest_rows(source)
    manifest = tmp_path / "manifest.parquet"
    pl.DataFrame(rows + rows[2:4] + [dict(rows[0], **{"Content-Length": 1})]).write_parquet(manifest)
    run_cli("plan", str(source), str(tmp_path / "listed"), "--shards", "1", check=True)
    run_cli("plan", str(source), str(tmp_path / "inv"), "--shards", "2", "--inventory", str(manifest), check=True)
    assert all_rows(tmp_path / "inv", 2).equals(plan_rows(tmp_path / "listed", 1)[0])  # the first row of each


def test_a_run_off_the_inventory_plan_and_documents_with_rows_stay_on_their_shard(tmp_path):
    """Documents done by a run without a plan stay on the shard holding their rows; runs of
    the inventory's plan do the rest, and every page has one row after compaction."""
    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=6, pages=2)
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)  # 0/1: all on shard 0
    text_corpus(src / "new", documents=4, pages=1)
    manifest = tmp_path / "manifest.csv"
    pl.DataFrame(manifest_rows(src)).write_csv(manifest)
    run_cli("plan", str(src), str(out), "--shards", "3", "--inventory", str(manifest), check=True)
    shards = plan_rows(out, 3)
    assert set(shards[0]["uri"]) >= {f"file://{src}/doc{i:05d}.pdf" for i in range(6)}
    assert sum(s.height for s in shards.values()) == 10
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", "--shard", "0/3", check=True)
    assert "nothing to do" in proc.stdout or "done:" in proc.stdout
    for i in (1, 2):
        run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", "--shard", f"{i}/3", check=True)
    run_cli("compact", str(out), check=True)
    pages = read_pages(str(out)).collect()
    assert pages.height == 6 * 2 + 4 and pages.select("doc_id", "page_index").n_unique() == 16
    assert "3/3 shards done" in run_cli("status", str(out), check=True).stdout


def test_a_plan_that_spills_to_disk_is_a_listing_s_and_an_inventory_s_alike(tmp_path, monkeypatch):
    """Past STEP_ROWS rows both plans spill to hash buckets and write shard files from spool
    files of shard ranges: the listed and the inventory plan of the same files stay identical,
    every shard file sorted, each document once; a re-plan (its kept rows spilled too) keeps
    every planned document on its shard and places the new ones."""
    monkeypatch.setattr(planner, "STEP_ROWS", 60)
    monkeypatch.setattr(planner, "BUCKETS", 8)
    spills = []
    append = planner.Files.append
    monkeypatch.setattr(planner.Files, "append", lambda self, *a: spills.append(self.prefix) or append(self, *a))
    source = tmp_path / "src"
    source.mkdir()
    for i in range(400):
        (source / f"d{i:04d}.pdf").write_bytes(b"x" * ((i * 37) % 1000))
    manifest = tmp_path / "manifest.parquet"
    pl.DataFrame(manifest_rows(source)).write_parquet(manifest)
    src, listed, inv = Store(str(source)), tmp_path / "listed", tmp_path / "inv"
    info = make_plan(src, Store(str(listed)), 5)
    assert spills  # the rows went to disk
    inventory.plan_from_inventory(src, Store(str(inv)), 5, str(manifest))
    for i in range(5):
        assert plan_rows(inv, 5)[i].equals(plan_rows(listed, 5)[i])
    shards = plan_rows(listed, 5)
    assert all(s["uri"].is_sorted() for s in shards.values()) and info.documents == 400
    assert all_rows(listed, 5)["uri"].to_list() == sorted(f"file://{source}/d{i:04d}.pdf" for i in range(400))
    assert [s["documents"] for s in info.per_shard] == [shards[i].height for i in range(5)]
    loads = [shards[i]["size"].sum() for i in range(5)]
    assert max(loads) - min(loads) <= 999

    before = {u: i for i, rows in shards.items() for u in rows["uri"]}
    for i in range(400, 700):
        (source / f"d{i:04d}.pdf").write_bytes(b"y" * ((i * 53) % 2000))
    assert make_plan(src, Store(str(listed)), 5).documents == 700
    after = {u: i for i, rows in plan_rows(listed, 5).items() for u in rows["uri"]}
    assert len(after) == 700 and all(after[u] == i for u, i in before.items())


def test_sub_second_last_modified_reads_as_a_listing_reads_it(tmp_path):
    """A file's mtime in microseconds, given as an inventory's timestamp (Parquet) or ISO
    text (CSV), is the listing's: the same mtime (os.stat's float) and, with no Etag, the same
    etag `<size>-<mtime in us>`, so the plans agree."""
    source = tmp_path / "src"
    source.mkdir()
    rng = np.random.default_rng(11)
    stamps = {}
    for i, us in enumerate(rng.integers(0, 10**6, 300).tolist()):
        path = source / f"d{i:03d}.pdf"
        path.write_bytes(b"x" * i)
        stamps[path.name] = (1_733_400_000 + i) * 10**6 + us
        os.utime(path, ns=(stamps[path.name] * 1000, stamps[path.name] * 1000))
    when = [dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=us) for us in stamps.values()]
    frame = pl.DataFrame({"Name": list(stamps), "Content-Length": [i for i in range(300)],
                          "Last-Modified": pl.Series(when, dtype=pl.Datetime("us", "UTC"))})
    frame.write_parquet(tmp_path / "m.parquet")
    frame.with_columns(pl.col("Last-Modified").dt.strftime("%Y-%m-%dT%H:%M:%S.%6fZ")).write_csv(tmp_path / "m.csv")
    run_cli("plan", str(source), str(tmp_path / "listed"), "--shards", "1", check=True)
    listed = plan_rows(tmp_path / "listed", 1)[0]
    for form in ("parquet", "csv"):
        run_cli("plan", str(source), str(tmp_path / form), "--shards", "1", "--inventory", str(tmp_path / f"m.{form}"),
                check=True)
        planned = plan_rows(tmp_path / form, 1)[0]
        assert planned["mtime"].to_list() == listed["mtime"].to_list(), form
        assert planned["etag"].to_list() == listed["etag"].to_list(), form
