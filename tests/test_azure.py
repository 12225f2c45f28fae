"""Azure Blob for real, on Azurite: `batchocr run az://scans/ az://results/run1` end to
end, read back through pyarrow/adlfs and read_pages; plan, resume, status and compact
on az://; credentials in their documented order; user errors; no secret anywhere."""

import base64
import io
import json
import re
import urllib.parse

import adlfs
import polars as pl
import pyarrow.parquet as pq
import pytest

import batchocr
from batchocr.errors import ConfigError
from batchocr.sources import doc_id
from batchocr.storage import Store
from batchocr.storage.azureauth import polars_options, resolve
from azurite import ACCOUNT, KEY, azurite, connection_string  # noqa: F401 - azurite is a fixture
from conftest import SAMPLES, count_pages, run_cli, sample_documents
from corpus import text_pdf

KEYS = ["doc_id", "page_index"]
OTHER_KEY = base64.b64encode(bytes(range(7, 71))).decode()  # valid base64, wrong key: also a secret


def _env(azurite):
    return {"AZURE_STORAGE_CONNECTION_STRING": azurite.connection_string}


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("Error")]


def test_run_az_to_az_end_to_end_read_back_by_pyarrow_and_read_pages(azurite):
    azurite.container("scans")
    azurite.upload("scans", sample_documents())
    azurite.container("results")
    proc = run_cli("run", "az://scans/", "az://results/run1", "--quiet", env=_env(azurite), check=True)
    pages = sum(count_pages(p) for p in sample_documents())
    assert f"done: 5 documents, {pages} pages (0 errors, " in proc.stdout  # then how many came from the text layer

    # pyarrow through plain adlfs (not batchocr's filesystem), and batchocr.read_pages (polars' own client)
    fs = adlfs.AzureBlobFileSystem(connection_string=azurite.connection_string)
    arrow = pq.read_table("results/run1/pages", filesystem=fs, partitioning=None)
    rows = batchocr.read_pages("az://results/run1", storage_options={"connection_string": azurite.connection_string})
    assert isinstance(rows, pl.LazyFrame)
    rows = rows.collect()
    assert arrow.num_rows == rows.height == pages
    assert pl.from_arrow(arrow).sort(KEYS).equals(rows.sort(KEYS))
    assert rows.select(KEYS).is_unique().all()
    for path in sample_documents():
        uri = f"az://scans/{path.name}"
        mine = rows.filter(pl.col("source_uri") == uri)
        assert sorted(mine["page_index"]) == list(range(count_pages(path))), path.name
        assert set(mine["doc_id"]) == {doc_id(uri)} and set(mine["source_size"]) == {path.stat().st_size}
        assert mine["source_etag"].str.starts_with("0x").all()  # the blob's ETag
    assert set(rows["finish_reason"]) == {"stop"} and rows["text"].str.len_chars().min() > 0

    # the text is right: eval reads az:// (through read_pages) against the samples' truth
    proc = run_cli("eval", "az://results/run1", "--truth", str(SAMPLES / "truth"), "--max-cer", "0.02",
                   "--storage-option", f"connection_string={azurite.connection_string}")
    assert proc.returncode == 0, proc.stderr
    assert "overall:" in proc.stdout

    done = json.loads(fs.cat_file("results/run1/_done/shard-00000.json"))
    assert done["pages"] == pages and done["documents"] == 5
    (record_path,) = fs.glob("results/run1/_runs/*.json")
    record = json.loads(fs.cat_file(record_path))
    assert record["status"] == "done" and record["spec"]["out"] == "az://results/run1"
    assert sorted(f"results/run1/{p}" for p in record["parts"]) == sorted(fs.glob("results/run1/pages/*/*.parquet"))

    proc = run_cli("status", "az://results/run1", env=_env(azurite), check=True)
    assert f"1/1 shards done, 0 partial, 0 not started; {pages} pages, 0 error pages" in proc.stdout
    proc = run_cli("run", "az://scans/", "az://results/run1", "--quiet", env=_env(azurite), check=True)
    assert "nothing to do (5 documents already done)" in proc.stdout


def test_plan_resume_status_and_compact_on_azure(azurite, tmp_path):
    azurite.container("planned")
    for i in range(6):
        text_pdf(tmp_path / f"doc{i}.pdf", pages=2, seed=i)
    azurite.upload("planned", sorted(tmp_path.glob("doc*.pdf")), prefix="in/")
    env = _env(azurite)
    src, out = "az://planned/in", "az://planned/out"
    proc = run_cli("plan", src, out, "--shards", "2", env=env, check=True)
    assert "planned 6 documents" in proc.stdout
    for shard in ("0/2", "1/2"):
        run_cli("run", src, out, "--engine", "textlayer", "--shard", shard, "-q", env=env, check=True)
    assert "2/2 shards done, 0 partial, 0 not started; 12 pages" in run_cli("status", out, env=env).stdout

    # A new blob: planned again (old documents keep their shard), then only it is processed.
    text_pdf(tmp_path / "late.pdf", pages=3, seed=99)
    azurite.upload("planned", [tmp_path / "late.pdf"], prefix="in/")
    run_cli("plan", src, out, "--shards", "2", env=env, check=True)
    lines = [run_cli("run", src, out, "--engine", "textlayer", "--shard", s, "-q", env=env, check=True).stdout
             for s in ("0/2", "1/2")]
    assert sorted("done: 1 document, 3 pages" in line for line in lines) == [False, True]
    assert sum("nothing to do" in line for line in lines) == 1
    assert "2/2 shards done, 0 partial, 0 not started; 15 pages" in run_cli("status", out, env=env).stdout

    proc = run_cli("compact", out, env=env, check=True)
    assert proc.stdout.count("-> 1 part") == 2
    fs = adlfs.AzureBlobFileSystem(connection_string=azurite.connection_string)
    assert len(fs.glob("planned/out/pages/*/*.parquet")) == 2
    rows = batchocr.read_pages(out, {"connection_string": azurite.connection_string}).collect()
    assert rows.height == 15 and rows.select(KEYS).is_unique().all()
    assert not fs.glob("planned/out/_compact/*")  # the shards' claims, released
    store = Store(out, {"connection_string": azurite.connection_string})  # a claim is If-None-Match: one wins
    assert [store.create("_compact/x.json", b"{}"), store.create("_compact/x.json", b"{}")] == [True, False]


def test_a_reader_whose_part_compaction_deletes_mid_read_reads_the_compacted_part_on_azure(azurite):
    """`batchocr compact` beside a run on Azure: a part deleted after the reader opened it (its
    size known) and before its bytes came answered 404 BlobNotFound, which stopped the run at its
    end (the done-marker's counts) with exit 1, where a part gone from a local OUT is read again
    from the compacted file (sink.read_parts)."""
    import pyarrow as pa

    from batchocr import schema
    from batchocr.compact import compact_shard
    from batchocr.sink import PartWriter, committed_keys
    from batchocr.spec import CommitSpec

    azurite.container("racing")
    out = "az://racing/out"
    store = Store(out, azurite.options())
    writer = PartWriter(store, 0, "r", CommitSpec(every_pages=1))
    for doc in ("a", "b", "c"):
        writer.add(pa.Table.from_pylist([
            {"doc_id": doc, "source_uri": f"az://x/{doc}", "source_etag": "e", "page_index": i, "page_count": 2,
             "text": f"page {i}", "finish_reason": "stop", "run_id": "r"} for i in range(2)],
            schema=schema.PAGE_TABLE))
    fs = store._backend.fs
    real_open, compacted = fs.open, []

    def open_(path, *args, **kwargs):  # opened (its size read), then compacted away before the read
        f = real_open(path, *args, **kwargs)
        if path.endswith(".parquet") and not compacted:
            compacted.append(None)  # (fsspec shares the filesystem: compaction's own reads come here too)
            compacted[0] = compact_shard(Store(out, azurite.options()), 0)
        return f

    fs.open = open_
    try:
        keys = committed_keys(store, 0)
    finally:
        del fs.open
    assert compacted[0].parts_before == 3
    assert sorted(zip(keys["doc_id"].to_pylist(), keys["page_index"].to_pylist())) == [
        (d, i) for d in "abc" for i in range(2)]


def test_a_blob_rewritten_after_the_plan_is_not_read_under_the_planned_etag(azurite, tmp_path):
    """Planned as one version, rewritten, then run: the row held the new blob's text under the
    planned etag and size. Now `unreadable` (changed after it was listed); the next plan
    lists the new version, which the run then reads."""
    azurite.container("rewrite")
    text_pdf(tmp_path / "a.pdf", pages=1, seed=1)
    azurite.upload("rewrite", [tmp_path / "a.pdf"], prefix="in/")
    env = _env(azurite)
    src, out = "az://rewrite/in", "az://rewrite/out"
    run_cli("plan", src, out, "--shards", "1", env=env, check=True)
    new = text_pdf(tmp_path / "a.pdf", pages=2, seed=2)
    azurite.upload("rewrite", [tmp_path / "a.pdf"], prefix="in/")
    run_cli("run", src, out, "--engine", "textlayer", "-q", env=env, check=True)
    options = {"connection_string": azurite.connection_string}
    (row,) = batchocr.read_pages(out, options).collect().to_dicts()
    assert row["error_type"] == "unreadable" and "changed after it was listed" in row["error_message"]
    run_cli("plan", src, out, "--shards", "1", env=env, check=True)
    run_cli("run", src, out, "--engine", "textlayer", "-q", env=env, check=True)
    run_cli("compact", out, env=env, check=True)
    rows = batchocr.read_pages(out, options).collect().sort("page_index")
    assert [t.split() for t in rows["text"]] == [t.split() for t in new] and rows["error_type"].null_count() == 2


def test_a_blob_whose_name_holds_a_tab_says_why_it_cannot_be_read(azurite, tmp_path):
    """adlfs strips control characters from a path, so it asks for another name: the row said
    "the blob was deleted after it was listed" of a blob that is there."""
    azurite.container("tabs")
    cc = azurite.client().get_container_client("tabs")
    cc.upload_blob("in/tab\tname.png", (SAMPLES / "receipt.png").read_bytes())
    cc.upload_blob("in/plain.png", (SAMPLES / "receipt.png").read_bytes())
    out = "az://tabs/out"
    run_cli("run", "az://tabs/in", out, "--engine", "textlayer", "-q", env=_env(azurite), check=True)
    rows = batchocr.read_pages(out, {"connection_string": azurite.connection_string}).collect()
    (row,) = rows.filter(pl.col("source_uri") == "az://tabs/in/tab%09name.png").to_dicts()
    assert row["error_type"] == "unreadable" and "holds a control character" in row["error_message"], row
    assert rows.filter(pl.col("source_uri") == "az://tabs/in/plain.png")["error_type"].to_list() == ["no_text_layer"]


def test_blobs_named_with_colons_and_brackets_are_read(azurite, tmp_path):
    """A blob named `Scan 2024-01-05 10:30.png` or `br[ack]et.png` at SOURCE's top stopped every
    run, rerun included, with exit 2: the check made of SOURCE and OUT's own names (adlfs
    parses a path as a URL when it writes) was made of each document's. What only one blob's
    name concerns is that blob's row, as for any bad input."""
    azurite.container("odd")
    cc = azurite.client().get_container_client("odd")
    png = (SAMPLES / "receipt.png").read_bytes()
    names = ["Scan 2024-01-05 10:30.png", "a:1.png", "br[ack]et.png", "run[1]/c.png", "plain.png"]
    for name in names:  # at the container's top: adlfs's URL parsing trips on them there
        cc.upload_blob(name, png)
    azurite.container("oddout")
    out = "az://oddout/out"
    done = run_cli("run", "az://odd/", out, "--engine", "textlayer", "-q", env=_env(azurite))
    assert done.returncode == 0, done.stderr
    rows = batchocr.read_pages(out, {"connection_string": azurite.connection_string}).collect()
    assert rows.height == len(names), rows
    # A PNG has no text layer: each was read (adlfs reads all these names).
    assert rows["error_type"].to_list() == ["no_text_layer"] * len(names), rows.to_dicts()


def test_credentials_come_in_the_documented_order():
    cs = connection_string(10000)
    env = {"AZURE_STORAGE_CONNECTION_STRING": cs, "AZURE_STORAGE_ACCOUNT_KEY": KEY, "AZURE_STORAGE_SAS_TOKEN": "sv=x&sig=y",
           "AZURE_STORAGE_ACCOUNT_NAME": "envaccount"}
    # 1. storage options (job spec or --storage-option) win over everything in the environment
    creds, _ = resolve({"account_key": OTHER_KEY, "account_name": "mine"}, env)
    assert (creds.origin, creds.account_key, creds.account_name, creds.connection_string) == (
        "storage option account_key", OTHER_KEY, "mine", None)
    creds, _ = resolve({"sas_token": "?sv=1&sig=2"}, env)
    assert creds.origin == "storage option sas_token" and creds.account_name == "envaccount"
    # 2. AZURE_STORAGE_CONNECTION_STRING, 3. account key, 4. SAS token, 5. DefaultAzureCredential
    assert resolve({}, env)[0].origin == "AZURE_STORAGE_CONNECTION_STRING"
    env.pop("AZURE_STORAGE_CONNECTION_STRING")
    assert resolve({}, env)[0].origin == "AZURE_STORAGE_ACCOUNT_KEY"
    env.pop("AZURE_STORAGE_ACCOUNT_KEY")
    assert resolve({}, env)[0].origin == "AZURE_STORAGE_SAS_TOKEN"
    env.pop("AZURE_STORAGE_SAS_TOKEN")
    creds, retry = resolve({"retry_total": "9"}, env)
    assert creds.uses_default_credential and creds.account_name == "envaccount" and retry["retry_total"] == 9
    # the account may come from an abfs:// URL (container@account.dfs.core.windows.net)
    assert resolve({}, {}, url_account="fromurl")[0].account_name == "fromurl"
    assert KEY not in repr(resolve({"connection_string": cs}, {})[0])


@pytest.mark.parametrize("options, env, message", [
    ({}, {}, "need the storage account's name"),
    ({"account_key": KEY, "sas_token": "sv=1"}, {}, "give account_key and sas_token (more than one credential): give one"),
    ({"acount_key": KEY}, {}, "Azure storage options: unknown key 'acount_key'; known: account_name"),
    ({KEY: "x"}, {}, "Azure storage options: unknown key (a key that is not a name)"),
    ({"connection_string": 5}, {}, "connection_string: got (hidden), expected a valid string"),
    ({"account_name": "a", "account_key": "not base64!"}, {}, "is not valid base64"),
    ({}, {"AZURE_STORAGE_CONNECTION_STRING": f"AccountKey={KEY};nonsense"}, "is malformed"),
    ({"connection_string": f"Foo=1;AccountKey={KEY}"}, {}, "names no AccountName or BlobEndpoint"),
    ({"connection_string": connection_string(1), "retry_total": "many"}, {},
     "retry_total: got 'many', expected a valid integer"),
    # a count of retries: 2.5 was taken and cut to 2 (int() in do_connect), where README says a
    # wrong type exits 2 naming the key
    ({"connection_string": connection_string(1), "retry_total": "2.5"}, {},
     "retry_total: got '2.5', expected a valid integer"),
    ({"connection_string": connection_string(1), "read_timeout": "-1"}, {},
     "read_timeout: got '-1', expected greater than or equal to 0"),
])
def test_bad_credentials_are_config_errors_without_the_secret(options, env, message):
    with pytest.raises(ConfigError) as err:
        resolve(options, env)
    assert message in str(err.value)
    assert KEY not in str(err.value)


def test_polars_gets_account_key_and_endpoint_instead_of_a_connection_string():
    creds, _ = resolve({"connection_string": connection_string(10123)}, {})
    assert polars_options(creds) == ({"account_name": ACCOUNT, "account_key": KEY, "allow_http": "true",
                                      "endpoint": f"http://127.0.0.1:10123/{ACCOUNT}"}, None)
    creds, _ = resolve({"connection_string": "UseDevelopmentStorage=true"}, {})
    assert polars_options(creds) == ({"use_emulator": "true"}, None)
    creds, _ = resolve({"account_name": "acct", "sas_token": "?sv=1&sig=2"}, {})
    assert polars_options(creds) == ({"account_name": "acct", "sas_token": "sv=1&sig=2"}, None)
    cs = f"DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={KEY};EndpointSuffix=core.windows.net"
    creds, _ = resolve({"connection_string": cs}, {})
    assert polars_options(creds)[0] == {"account_name": "acct", "account_key": KEY,
                                        "endpoint": "https://acct.blob.core.windows.net"}


def test_user_errors_on_azure_are_one_line_exit_2(azurite):
    azurite.container("scans2")
    azurite.upload("scans2", [SAMPLES / "report.pdf"])
    cases = [
        (["run", "az://scans2/", "az://nosuch/run1"], _env(azurite), "the container 'nosuch' does not exist"),
        (["run", "az://nosuch/", "az://scans2/out"], _env(azurite), "SOURCE az://nosuch/ does not exist"),
        (["run", "az://scans2/", "az://scans2/out"],
         {"AZURE_STORAGE_CONNECTION_STRING": connection_string(azurite.port, OTHER_KEY)},
         "Azure refused the account key from AZURE_STORAGE_CONNECTION_STRING"),
        (["run", "az://scans2/", "az://scans2/out", "--storage-option", f"account_key={OTHER_KEY}"],
         _env(azurite), "need the storage account's name"),
        (["status", "az://scans2/out", "--storage-option", "connection_string=garbage"], {}, "is malformed"),
    ]
    for args, env, message in cases:
        proc = run_cli(*args, env=env)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 2, (args, output)
        assert message in output, (args, output)
        assert len(_error_lines(output)) == 1 and "Traceback" not in output, output
        for secret in (KEY, OTHER_KEY):
            assert secret not in output and urllib.parse.quote(secret, safe="") not in output


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _strings(k) + _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def test_no_secret_in_any_output_log_run_record_marker_or_table(azurite, tmp_path):
    """The account key goes in by every way there is; it never comes out: not on
    stdout/stderr (progress line included), not in _runs/*.json, the done marker or
    any cell or metadata of the parquet parts; neither when the run fails."""
    azurite.container("secrets")
    azurite.upload("secrets", [SAMPLES / "report.pdf", SAMPLES / "receipt.png"], prefix="in/")
    cs = azurite.connection_string
    job = tmp_path / "job.yaml"
    job.write_text(f"source: az://secrets/in\nout: az://secrets/by-job\nengine: textlayer\n"
                   f"storage_options:\n  connection_string: '{cs}'\n")
    unreachable = connection_string(1) + ";"
    runs = [
        (["run", "az://secrets/in", "az://secrets/by-env", "--engine", "textlayer"], _env(azurite), 0),
        (["run", "az://secrets/in", "az://secrets/by-flag", "--engine", "textlayer",
          "--storage-option", f"connection_string={cs}"], {}, 0),
        (["run", "--job", str(job)], {}, 0),
        (["status", "az://secrets/by-job"], _env(azurite), 0),
        (["compact", "az://secrets/by-job"], _env(azurite), 0),
        (["run", "az://secrets/in", "az://secrets/wrong-key", "--engine", "textlayer"],
         {"AZURE_STORAGE_CONNECTION_STRING": connection_string(azurite.port, OTHER_KEY)}, 2),
        (["run", "az://secrets/in", "az://secrets/down", "--engine", "textlayer", "--storage-option",
          f"connection_string={unreachable}", "--storage-option", "retry_total=1",
          "--storage-option", "retry_backoff=0.1"], {}, 1),
    ]
    secrets = [KEY, OTHER_KEY]
    secrets += [urllib.parse.quote(s, safe="") for s in secrets] + [urllib.parse.quote_plus(s) for s in secrets]
    for args, env, code in runs:
        proc = run_cli(*args, env=env)  # with the progress bar: the progress line is checked too
        output = proc.stdout + proc.stderr
        assert proc.returncode == code, (args, output)
        assert not [s for s in secrets if s in output], (args, output)
        if code:
            assert len(_error_lines(output)) == 1 and "Traceback" not in output, output

    written = azurite.blobs("secrets")
    kinds = {"runs": 0, "done": 0, "producer": 0, "parquet": 0}
    for name, data in written.items():
        if name.startswith("in/"):
            continue
        assert not [s for s in secrets if s.encode() in data], name
        if name.endswith(".json"):
            kinds["runs" if "/_runs/" in name else "producer" if name.endswith("/_producer.json") else "done"] += 1
            assert not [s for s in secrets for text in _strings(json.loads(data)) if s in text], name
        elif name.endswith(".parquet"):
            kinds["parquet"] += 1
            table = pq.read_table(io.BytesIO(data))
            texts = _strings(table.to_pylist()) + [v.decode(errors="replace") for v in (table.schema.metadata or {}).values()]
            assert texts and not [s for s in secrets for text in texts if s in text], name
    assert kinds == {"runs": 3, "done": 3, "producer": 3, "parquet": 3}, kinds


def test_abfs_urls_name_the_same_documents_as_az(azurite, tmp_path):
    azurite.container("spelled")
    text_pdf(tmp_path / "a.pdf", pages=1)
    azurite.upload("spelled", [tmp_path / "a.pdf"], prefix="in/")
    from batchocr.sources import list_documents
    from batchocr.storage import Store

    options = azurite.options()
    urls = ["az://spelled/in", "abfs://spelled/in/", "abfss://spelled@devstoreaccount1.dfs.core.windows.net/in"]
    stores = [Store(url, options) for url in urls]
    assert {s.canonical for s in stores} == {"az://spelled/in"}
    assert {tuple(d.uri for d in list_documents(s)) for s in stores} == {("az://spelled/in/a.pdf",)}


def test_redact_removes_secrets_in_any_spelling():
    from batchocr.storage import redact

    text = (f"key {KEY} quoted {urllib.parse.quote(KEY, safe='')} plus {urllib.parse.quote_plus(KEY)} "
            f"AccountKey=abc123;SharedAccessSignature=sv=1&sig=zzz https://x/c?sv=1&sig=s3cr3t account_key: k")
    out = redact(text, [KEY])
    assert KEY not in out and urllib.parse.quote(KEY, safe="") not in out and "abc123" not in out
    assert "s3cr3t" not in out and "zzz" not in out and "account_key: ***" in out
    assert out.startswith("key *** quoted *** plus ***")
    # A quoted value (a YAML or JSON line) is a value too.
    quoted = redact("""account_key: 'k3y0ne sas_token: "sv=1&sig=s3g" "account_key": "k3ytwo" """)
    assert not {"k3y0ne", "s3g", "k3ytwo"} & set(re.findall(r"\w+", quoted)), quoted
    # Signed URLs (S3, GCS) and a password in a URL.
    urls = redact("http://h/a.pdf?X-Amz-Signature=s1gn&X-Goog-Signature=s2gn https://user:pa55@h/a.pdf")
    assert urls == "http://h/a.pdf?X-Amz-Signature=***&X-Goog-Signature=*** https://user:***@h/a.pdf", urls


def test_missing_azure_credentials_are_one_line_without_the_sdks_log(tmp_path):
    """No credential anywhere: DefaultAzureCredential tries each of its own (here its developer
    ones, which find no tool, so nothing leaves the machine) and logs every failure; batchocr's
    one line is all that is printed."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "IDENTITY_", "MSI_"))}
    # No developer sign-in of this machine's either: no az/azd on PATH, an empty HOME.
    env |= {"AZURE_TOKEN_CREDENTIALS": "dev", "PATH": os.path.dirname(sys.executable), "HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "batchocr.cli", "run", "az://scans/", str(tmp_path / "out"), "-q",
                           "--storage-option", "account_name=acct", "--storage-option", "account_host=127.0.0.1:9",
                           "--storage-option", "retry_total=0"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("Error: az://scans: checking it exists: no Azure credentials"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("source, out, said", [
    ("az://names/", "az://names/run[1]", "az://names/run[1]: adlfs cannot address this name"),
    ("az://Bad_Name/", "az://names/out", "az://Bad_Name: checking it exists: Azure refuses the name "
                                         "(InvalidResourceName)"),
])
def test_names_azure_cannot_take_are_configuration(azurite, source, out, said):
    """OUT az://c/run[1] (adlfs parses it as a URL: an IPv6 host) and a container name Azure
    refuses (HTTP 400) were exit 1 'rerun to resume': exit 2, one line naming the URL."""
    cc = azurite.container("names")
    cc.upload_blob("a.pdf", (SAMPLES / "report.pdf").read_bytes())
    proc = run_cli("run", source, out, "--engine", "textlayer", "--quiet",
                   "--storage-option", f"connection_string={azurite.connection_string}")
    assert proc.returncode == 2, proc.stderr
    (line,) = _error_lines(proc.stderr)
    assert said in line and "rerun" not in line, line


def test_a_large_document_is_downloaded_in_chunks_that_show_it_moving(azurite, tmp_path):
    """The render pool stops a run whose download makes no progress for render.timeout_s;
    read whole, a large scan on a slow link made none until it was all there (a 1 GB scan at
    3 MB/s stopped every run that reached it, at the default 300 s). Over DOWNLOAD_CHUNK it
    is read a range at a time, each a sign of progress, and the bytes are the blob's."""
    import os

    import numpy as np
    import pymupdf

    from batchocr.storage import DOWNLOAD_CHUNK, Store

    doc = pymupdf.open()  # a real PDF larger than two chunks: one page of incompressible pixels
    page = doc.new_page(width=612, height=792)
    noise = np.random.default_rng(0).integers(0, 256, (3000, 2000, 3), dtype=np.uint8)
    page.insert_image(page.rect, pixmap=pymupdf.Pixmap(pymupdf.csRGB, 2000, 3000, noise.tobytes(), False))
    page.insert_text((72, 72), "large scan", fontsize=24)
    big = tmp_path / "big.pdf"
    doc.save(big)
    size = os.path.getsize(big)
    assert size > 2 * DOWNLOAD_CHUNK
    azurite.container("large")
    azurite.upload("large", [big])
    calls = []
    store = Store("az://large/big.pdf", azurite.options())
    assert store.read_document(progress=lambda: calls.append(1)) == big.read_bytes()
    assert len(calls) == -(-size // DOWNLOAD_CHUNK)
    # the whole run: the worker reads it in chunks, MuPDF opens what they make
    proc = run_cli("run", "az://large/", str(tmp_path / "out"), "--engine", "textlayer", "-q",
                   env=_env(azurite), check=True)
    assert "1 document, 1 page (0 errors" in proc.stdout, proc.stdout
