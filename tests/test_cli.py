"""The command line: help with examples, exit codes and one-line errors, state read back."""

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from batchocr.cli import main
from conftest import SAMPLES, read_table, run_cli


def _commands(group=main, prefix=()):
    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, prefix + (name,))


@pytest.mark.parametrize("path", [()] + [p for p, _ in _commands()], ids=lambda p: " ".join(p) or "batchocr")
def test_every_command_has_help_with_an_example(path):
    result = CliRunner().invoke(main, [*path, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output and "batchocr " in result.output


@pytest.mark.parametrize("args, message", [
    (["run", "/nonexistent/scans", "{tmp}/out"], "SOURCE /nonexistent/scans does not exist"),
    (["run", str(SAMPLES), "{tmp}/out", "--engine", "tesseract"], "Invalid value for '--engine'"),
    (["run", "--job", "{tmp}/missing.yaml"], "cannot read job spec"),
    (["run", "--job", "{tmp}/bad.yaml"], "not valid YAML"),
    (["run", str(SAMPLES), "{tmp}/out", "--shard", "5/4"], "0 <= I < N"),
    (["run", str(SAMPLES), "{tmp}/out", "--dpi", "0"], "render.dpi: got 0, expected greater than 0"),
    (["run"], "Missing argument 'SOURCE'. (see batchocr run --help)"),
    (["eval", "{tmp}", "--truth", str(SAMPLES / "truth")], "no page table under"),
    (["eval", "{tmp}", "--truth", str(SAMPLES / "truth"), "--max-cer", "nan"], "'nan' is not a finite number"),
    (["report", "{tmp}", "--gpu-hourly-usd", "inf"], "'inf' is not a finite number"),
])
def test_user_errors_print_one_line_and_exit_2(tmp_path, args, message):
    (tmp_path / "bad.yaml").write_text("source: [unclosed\n")
    result = CliRunner().invoke(main, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output
    assert len([line for line in result.output.splitlines() if line.startswith("Error")]) == 1


BAD_JOBS = [  # each bad value in a job spec, and the one line that must name it
    ("engines: {rapidocr: {threads: '4'}}", "engines.rapidocr.threads: got '4', expected a valid integer"),
    ("render: {workers: 1.5}", "render.workers: got 1.5, expected a valid integer"),
    ("commit: {every_pages: true}", "commit.every_pages: got True, expected a valid integer"),
    ("render: {dpi: 200.7}", "render.dpi: got 200.7, expected a valid integer"),
    ("render: {dip: 300}", "render: unknown key 'dip'; known: dpi, max_side"),
    ("render: {dpi: high}", "render.dpi: got 'high', expected a valid integer"),
    ("render: {max_side: 8}", "render.max_side: got 8, expected greater than or equal to 32"),
    ("commit: {every_seconds: 0}", "commit.every_seconds: got 0, expected greater than 0"),
    ("engines: {textlayer: {min_chars: 1, min_char: 2}}", "engines.textlayer: unknown key 'min_char'"),
    ("engines: {vllm: {model: /m, max_num_seqs: 1.5}}", "engines.vllm.max_num_seqs: got 1.5, expected a valid integer"),
    ("engines: {vllm: {model: /m, gpu_memory_utilization: 1.2}}",
     "engines.vllm.gpu_memory_utilization: got 1.2, expected less than or equal to 1"),
    ("engines: {vllm: {model: /m, mm_processor_cache_gb: 4}}",
     "engines.vllm.mm_processor_cache_gb: got 4.0, expected 0: vLLM's processor cache holds only"),
    ("engines: {vllm: {model: /m, engine_args: {mm_processor_cache_gb: 4}}}",
     "engines.vllm.engine_args.mm_processor_cache_gb: got 4, expected 0"),
    ("engines: {vllm: {model: /m, preset: qwen3-vl, vit_pad: true}}",
     "engines.vllm.vit_pad: pads Qwen2.5-VL's vision MLPs (qwen2.5-vl, olmocr-2); preset qwen3-vl has another"),
    ("engines: {vllm: {model: /m, preset: qwen2.5-vl, pixel_bytes: true}}",
     "engines.vllm.pixel_bytes: hands DeepSeek-OCR's image views over as bytes (unlimited-ocr, deepseek-ocr); "
     "preset qwen2.5-vl has another vision tower"),
    ("engines: {vllm: {model: /m, preset: unlimited-ocr, batch_encoder: false, pixel_bytes: true}}",
     "engines.vllm.pixel_bytes: the model takes the bytes in the batched encoder (patches.deepencoder): set "
     "batch_encoder true, or pixel_bytes false"),
    ("engines: {vllm: {model: /m, preset: qwen2.5-vl, sam_fold: true}}",
     "engines.vllm.sam_fold: folds the bias of DeepSeek-OCR's SAM into its attention (unlimited-ocr, deepseek-ocr); "
     "preset qwen2.5-vl has another vision tower"),
    ("engines: {vllm: {model: /m, preset: deepseek-ocr, sam_fold: true}}",
     "engines.vllm.sam_fold: SAM's attention is installed with the batched encoder (patches.deepencoder): set "
     "batch_encoder true, or sam_fold false"),
    ("engines: {vllm: {model: /m, prepare_threads: 0}}",
     "engines.vllm.prepare_threads: got 0, expected greater than or equal to 1"),
    ("engines: {vllm: {model: /m, queue_pages: -1}}", "engines.vllm.queue_pages: got -1, expected greater than or equal to 0"),
    ("engines: {vllm: {model: /m, max_num_seqs: 0}}", "engines.vllm.max_num_seqs: got 0, expected greater than or equal to 1"),
    ("engines: {vllm: {model: /m, max_tokens: 0}}", "engines.vllm.max_tokens: got 0, expected greater than or equal to 1"),
    ("engines: {vllm: {model: /m, temperature: -1}}", "engines.vllm.temperature: got -1, expected greater than or equal to 0"),
    ("engines: {vllm: {model: /m, max_model_len: 0}}", "engines.vllm.max_model_len: got 0, expected greater than or equal to 1"),
    ("engines: {vllm: {model: /m, repetition_max_period: 0}}",
     "engines.vllm.repetition_max_period: got 0, expected greater than or equal to 1"),
    ("engines: {vllm: {model: /m, repetition_span: 10}}",
     "engines.vllm.repetition_max_period: got 96, expected at most repetition_span / 2 (5)"),
    ("engines: {vllm: {model: /m, mode: document, preset: unlimited-ocr, group_pages: 51}}",
     "engines.vllm.group_pages: got 51, expected less than or equal to 50"),
    ("engines: {vllm: {model: /m, vit_pad: maybe}}", "engines.vllm.vit_pad: got 'maybe', expected a valid boolean"),
    ("engines: {tesseract: {}}", "engines.tesseract: got 'tesseract', expected 'rapidocr', 'textlayer' or 'vllm'"),
    ("render: 300", "render: got 300, expected a mapping"),
    ("render: {timeout_s: .inf}", "render.timeout_s: got inf, expected a finite number"),
    ("commit: {every_seconds: .nan}", "commit.every_seconds: got nan, expected a finite number"),
    ("gpu_hourly_usd: .inf", "gpu_hourly_usd: got inf, expected a finite number"),
    ("render: {dpi: 2024-01-01}", "render.dpi: got a value of type date, expected text, a number"),
    ("engines: {rapidocr: {lang: !!binary aGVsbG8=}}", "engines.rapidocr.lang: got a value of type bytes"),
    ("storage_options: {2024-01-01: x}", "storage_options: a key of type date, expected a name"),
    ("storage_options: &x {a: *x}", "storage_options.a.a: contains itself (a recursive YAML anchor)"),
    ("colour: red", "unknown key 'colour'; known: source, out, engine"),
]


@pytest.mark.parametrize("yaml_text, message", BAD_JOBS, ids=[m.split(":")[0] for _, m in BAD_JOBS])
def test_every_bad_job_spec_value_is_one_line_naming_its_key_and_exit_2(tmp_path, yaml_text, message):
    job = tmp_path / "job.yaml"
    job.write_text(f"source: {SAMPLES}\nout: {tmp_path / 'out'}\nengine: textlayer\n{yaml_text}\n")
    proc = run_cli("run", "--job", str(job), "-q")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"Error: {job}: {message}"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "out").exists(), "nothing is written for a bad configuration"


SECRET = "c2VjcmV0a2V5c2VjcmV0a2V5TOPSECRET=="
BAD_SYNTAX = [  # a job spec that is not YAML (or not text): one line FILE:LINE:COL, never the line itself
    (f"storage_options:\n  account_key: '{SECRET}\n  retry_total: 1\n".encode(),
     "job.yaml:7:1: not valid YAML: found unexpected end of stream (while scanning a quoted scalar from line 5, column 16)"),
    (f'storage_options:\n  account_key: "{SECRET}" extra: [\n'.encode(),
     "job.yaml:5:54: not valid YAML: expected <block end>, but found '<scalar>'"),
    (f"storage_options:\n  connection_string: AccountKey={SECRET}\n\tretry_total: 1\n".encode(),
     "job.yaml:6:1: not valid YAML: found character '\\t' that cannot start any token"),
    (b"note: !!python/object:os.system x\n", "job.yaml:4:7: not valid YAML: could not determine a constructor"),
    (b"note: caf\xe9\n", "job.yaml:4: not UTF-8 text (byte 0xe9)"),
]


@pytest.mark.parametrize("body, message", BAD_SYNTAX, ids=["quote", "mapping", "tab", "python-tag", "latin-1"])
def test_a_job_spec_that_is_not_yaml_is_one_line_without_its_text(tmp_path, body, message):
    job = tmp_path / "job.yaml"
    job.write_bytes(f"source: {SAMPLES}\nout: {tmp_path / 'out'}\nengine: textlayer\n".encode() + body)
    proc = run_cli("run", "--job", str(job), "-q")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("Error: ") and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "TOPSECRET" not in proc.stderr


@pytest.mark.parametrize("args, env, message", [
    (["--dpi", "0"], {}, "render.dpi: got 0, expected greater than 0"),
    (["--workers", "-1"], {}, "render.workers: got -1, expected greater than or equal to 0"),
    ([], {"JOB_COMPLETION_INDEX": "1", "BATCHOCR_SHARDS": "two"}, "environment: BATCHOCR_SHARDS: got 'two'"),
    ([], {"JOB_COMPLETION_INDEX": "4", "BATCHOCR_SHARDS": "4"},
     "environment: JOB_COMPLETION_INDEX=4 BATCHOCR_SHARDS=4: need 0 <= JOB_COMPLETION_INDEX < BATCHOCR_SHARDS"),
    ([], {"JOB_COMPLETION_INDEX": "3"}, "environment: JOB_COMPLETION_INDEX is set but BATCHOCR_SHARDS is not"),
    (["--shard", "1/x"], {}, "shard '1/x': count: got 'x', expected a valid integer"),
    (["--storage-option", "retry_total=many"], {}, "Azure storage options: retry_total: got 'many', expected a valid integer"),
    (["--storage-option", "acount_key=x"], {}, "Azure storage options: unknown key 'acount_key'"),
    (["--storage-option", "account_key=AAAA", "--storage-option", "sas_token=X"], {},
     "storage options give account_key and sas_token (more than one credential): give one"),
], ids=["flag", "flag-range", "env", "env-range", "env-alone", "shard-flag", "storage-type", "storage-key",
        "storage-two-credentials"])
def test_bad_flags_environment_and_storage_options_exit_2_naming_the_key(tmp_path, args, env, message):
    out = f"az://results/{tmp_path.name}" if "--storage-option" in args else str(tmp_path / "out")
    source = "az://scans/" if "--storage-option" in args else str(SAMPLES)
    proc = run_cli("run", source, out, "--engine", "textlayer", "-q", *args, env=env)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and proc.stderr.startswith("Error: ")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.fixture
def engines_built(monkeypatch):
    """Every engine a run builds, by name (the real ones are still built)."""
    from batchocr import engines

    built, real = [], engines.create
    monkeypatch.setattr(engines, "create", lambda name, options: built.append(name) or real(name, options))
    return built


@pytest.mark.parametrize("source, out, message", [
    ("{tmp}/no-such-source", "{tmp}/out", "SOURCE {tmp}/no-such-source does not exist"),
    (str(SAMPLES), "/proc/batchocr-out", "OUT /proc/batchocr-out: cannot write there (No such file or directory)"),
    (str(SAMPLES), "{tmp}/a-file/out", "OUT {tmp}/a-file/out: cannot write there (Not a directory)"),
], ids=["missing-source", "out-under-proc", "out-under-a-file"])
def test_source_and_out_are_checked_before_the_engine_loads(tmp_path, engines_built, source, out, message):
    (tmp_path / "a-file").write_text("not a folder")
    source, out, message = (x.replace("{tmp}", str(tmp_path)) for x in (source, out, message))
    proc = run_cli("run", source, out, "-q")  # rapidocr: a real engine that would load
    assert proc.returncode == 2, proc.stderr
    expected = f"{message}: OUT must be a writable folder" if message.startswith("OUT") else message
    assert proc.stderr == f"Error: {expected}\n"
    assert engines_built == []
    assert not (tmp_path / "out").exists(), "no run record, nothing written"
    # (the spy sees the engine of a run that gets that far)
    run_cli("run", str(SAMPLES / "report.pdf"), str(tmp_path / "good"), "--engine", "textlayer", "-q", check=True)
    assert engines_built == ["textlayer"]


def test_engine_from_env_shard_variables(tmp_path):
    """Inside an Indexed Job the shard comes from JOB_COMPLETION_INDEX / BATCHOCR_SHARDS."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(SAMPLES / "report.pdf", src / "report.pdf")
    out = tmp_path / "out"
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "-q",
                   env={"JOB_COMPLETION_INDEX": "1", "BATCHOCR_SHARDS": "3"}, check=True)
    from batchocr.sharding import shard_of
    from batchocr.sources import list_documents
    from batchocr.storage import Store

    (doc,) = list_documents(Store(str(src)))
    mine = shard_of(doc.uri, 3) == 1
    assert ("done: 1 document, 3 pages (0 errors" in proc.stdout) == mine
    assert (out / "pages" / "shard-00001").exists() == mine


def test_run_then_eval_through_the_console_script(textlayer_run):
    out, _ = textlayer_run
    exe = shutil.which("batchocr")
    assert exe, "the console script is installed"
    import subprocess

    proc = subprocess.run([exe, "eval", str(out), "--truth", str(SAMPLES / "truth")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "report.pdf" in proc.stdout and "overall:" in proc.stdout
    assert read_table(out).num_rows == 10
    # --max-cer fails the command when the text is worse than asked (scans were skipped here).
    proc = subprocess.run([exe, "eval", str(out), "--truth", str(SAMPLES / "truth"), "--max-cer", "0.02"],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "above --max-cer" in proc.stderr


@pytest.mark.parametrize("args, code", [(["--version"], 0), (["run", "/nonexistent/scans", "out"], 2),
                                        (["no-such-command"], 2)])
def test_the_console_script_exits_hard_with_the_documented_code(args, code):
    # Interpreter finalisation is skipped (a native thread pool torn down at exit once
    # turned an exit 2 into SIGABRT): an atexit hook never runs, the code is kept,
    # and what was printed is flushed.
    import subprocess
    import sys

    script = ("import atexit, sys; atexit.register(lambda: print('FINALISED', file=sys.stderr)); "
              "from batchocr.cli import entry; entry(sys.argv[1:])")
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == code, proc.stderr
    assert "FINALISED" not in proc.stderr
    assert (proc.stdout + proc.stderr).strip(), "the output was flushed before the hard exit"


def test_eval_counts_a_redone_page_once(tmp_path):
    # A changed document (new ETag) is OCRed again: until `compact`, OUT holds both
    # versions' rows. eval scores each truth page once, as compaction would keep it.
    import os

    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(SAMPLES / "report.pdf", src / "report.pdf")
    truth = tmp_path / "truth"
    shutil.copytree(SAMPLES / "truth" / "report.pdf", truth / "report.pdf")
    out = tmp_path / "out"
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    once = run_cli("eval", str(out), "--truth", str(truth), check=True).stdout
    stat = (src / "report.pdf").stat()
    os.utime(src / "report.pdf", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    assert read_table(out).num_rows == 6  # 3 pages, twice
    twice = run_cli("eval", str(out), "--truth", str(truth), check=True).stdout
    overall = [line for line in once.splitlines() if line.startswith("overall:")]
    assert overall and overall == [line for line in twice.splitlines() if line.startswith("overall:")]
    assert sum(line.startswith("report.pdf ") for line in twice.splitlines()) == 3


def test_eval_of_a_name_not_utf8_of_blank_truth_pages_and_of_truth_files_named_twice(tmp_path):
    """eval and report --truth on a document whose name is not UTF-8 (any name the file system
    allows is a document) were a UnicodeEncodeError traceback; blank truth pages all read as
    something scored 0.00% overall (--max-cer 0 passed); truth `².txt` was a ValueError
    traceback, and 0.txt beside 00.txt dropped one unread."""
    import pymupdf

    src, truth, out = tmp_path / "src", tmp_path / "truth", tmp_path / "out"
    src.mkdir()
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "hello")
    name = os.fsdecode(b"b-\xff.pdf")
    (src / name).write_bytes(doc.tobytes())
    (truth / name).mkdir(parents=True)
    (truth / name / "0.txt").write_text("hello")
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    for args in (("eval", str(out), "--truth", str(truth)), ("report", str(out), "--truth", str(truth))):
        proc = run_cli(*args, subprocess=True)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert "b-\\xff.pdf" in proc.stdout, proc.stdout
    (truth / name / "0.txt").write_text("")  # a blank page, read as "hello"
    proc = run_cli("eval", str(out), "--truth", str(truth), "--max-cer", "0")
    assert proc.returncode == 1 and "CER 100.00%" in proc.stdout.splitlines()[-1], proc.stdout
    (truth / name / "00.txt").write_text("hello")
    proc = run_cli("eval", str(out), "--truth", str(truth))
    assert proc.returncode == 2 and "are both page 0" in proc.stderr, proc.stderr
    (truth / name / "00.txt").unlink()
    (truth / name / "\u00b2.txt").write_text("x")  # not a page number: not a truth page
    proc = run_cli("eval", str(out), "--truth", str(truth))
    assert proc.returncode == 0 and "over 1 pages" in proc.stdout, proc.stdout + proc.stderr


def test_eval_matches_truth_by_the_files_own_name_and_scores_an_unopened_document(tmp_path):
    """Truth is DIR/<document file name>/: a name with `%` (spelt %25 in source_uri) is
    matched; a document that could not be opened has one document row, and its truth pages
    count with every character wrong (not as missing: that made the CER better when a whole
    document failed); two documents of one file name cannot be told apart: exit 2."""
    src, truth, out = tmp_path / "src", tmp_path / "truth", tmp_path / "out"
    src.mkdir()
    shutil.copy(SAMPLES / "report.pdf", src / "100% report.pdf")
    (src / "broken.pdf").write_bytes(b"%PDF-1.7 not really\n" * 10)
    shutil.copytree(SAMPLES / "truth" / "report.pdf", truth / "100% report.pdf")
    (truth / "broken.pdf").mkdir()
    (truth / "broken.pdf" / "0.txt").write_text("twelve chars")
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    proc = run_cli("eval", str(out), "--truth", str(truth))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "missing" not in proc.stdout
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("100% report.pdf ") for line in lines) == 3
    (broken,) = [line for line in lines if line.startswith("broken.pdf ")]
    assert "12/12" in broken and "CER 100.00%" in broken and broken.endswith("error")

    (src / "sub").mkdir()
    shutil.copy(src / "100% report.pdf", src / "sub" / "100% report.pdf")
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    proc = run_cli("eval", str(out), "--truth", str(truth))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "matches 2 documents of that file name" in proc.stderr and "sub/100%25 report.pdf" in proc.stderr


@pytest.mark.parametrize("args", [("plan", "SRC", "", "--shards", "2"), ("export", "OUT", ""), ("status", ""),
                                  ("compact", ""), ("report", "OUT", "--html", ""), ("eval", "", "--truth", "T")])
def test_an_empty_location_is_exit_2_naming_it(tmp_path, monkeypatch, args):
    """An unset variable ("$DEST"): plan and export wrote into the current folder with exit 0
    (plan printed "-> /_plan/"), report --html "" wrote nothing and said nothing."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.pdf").write_bytes((SAMPLES / "report.pdf").read_bytes())
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    args = [str(src) if a == "SRC" else str(tmp_path / "out") if a == "OUT" else str(SAMPLES / "truth") if a == "T"
            else a for a in args]
    if args[0] in ("export", "report"):
        run_cli("run", str(src), str(tmp_path / "out"), "--engine", "textlayer", "-q", check=True)
    proc = run_cli(*args)
    assert proc.returncode == 2 and "is empty" in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert not list(here.iterdir())


def _source_with_one_document(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(SAMPLES / "report.pdf", src / "report.pdf")
    return src


def _replaced_names(monkeypatch) -> list[str]:
    """The temp names local disk's atomic writes rename into place (every staged file OUT holds)."""
    names, real = [], os.replace
    monkeypatch.setattr(os, "replace", lambda a, b, **kw: names.append(os.fspath(a)) or real(a, b, **kw))
    return names


@pytest.mark.parametrize("out", ["src/out", "src", "src/./deep/../out"], ids=["under", "same", "spelled-apart"])
def test_an_out_inside_source_runs_with_one_warning_and_is_never_read(tmp_path, monkeypatch, out):
    """`batchocr run src src/out` and `batchocr run src src`: OUT's files are listed with SOURCE,
    and none is a document (layout.SUFFIXES): the run goes on, says so in one line, and a rerun,
    a compaction and a plan of the same SOURCE find the one document still."""
    from batchocr import layout
    from batchocr.sources import is_document

    src, out = _source_with_one_document(tmp_path), str(tmp_path / out)
    temps = _replaced_names(monkeypatch)
    first = run_cli("run", str(src), out, "--engine", "textlayer", "-q")
    assert first.returncode == 0, first.stderr
    assert "done: 1 document, 3 pages" in first.stdout
    (line,) = first.stderr.splitlines()
    assert line.startswith(f"batchocr: OUT {out} is ") and "SOURCE" in line and "*.parquet, *.json, *.tmp" in line
    again = run_cli("run", str(src), out, "--engine", "textlayer", "-q", check=True)
    assert "nothing to do (1 document already done)" in again.stdout and len(again.stderr.splitlines()) == 1
    run_cli("compact", out, check=True)
    planned = run_cli("plan", str(src), str(src / "planned"), "--shards", "2", check=True)
    assert planned.stdout.startswith("planned 1 document ") and "is inside SOURCE" in planned.stderr
    written = [p for p in src.rglob("*") if p.is_file() and p.name != "report.pdf"]
    assert written and temps, "OUT's files, and the temps renamed into place"
    for name in [str(p) for p in written] + temps:
        assert name.endswith(layout.SUFFIXES) and not is_document(name), name
    assert read_table(Path(os.path.normpath(out))).num_rows == 3


def test_an_out_beside_source_whose_name_starts_alike_is_not_inside(tmp_path):
    src = _source_with_one_document(tmp_path)
    proc = run_cli("run", str(src), str(tmp_path / "src2" / "out"), "--engine", "textlayer", "-q", check=True)
    assert proc.stderr == ""


@pytest.mark.parametrize("command", ["run", "plan"])
def test_an_out_inside_source_whose_files_could_be_documents_is_refused(tmp_path, monkeypatch, command):
    """Where one of OUT's suffixes were a document's extension (here: JSON read as documents),
    OUT inside SOURCE is exit 2 in one line, before OUT is made."""
    from batchocr import sources

    monkeypatch.setattr(sources, "EXTENSIONS", (*sources.EXTENSIONS, ".json"))
    src = _source_with_one_document(tmp_path)
    extra = ["--engine", "textlayer", "-q"] if command == "run" else ["--shards", "2"]
    proc = run_cli(command, str(src), str(src / "out"), *extra)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"Error: OUT {src / 'out'} is inside SOURCE {src}: its .json files would be read as "
                           "documents; give an OUT outside SOURCE\n")
    assert not (src / "out").exists()


def test_an_out_inside_source_is_said_once_by_a_run_of_parts(tmp_path):
    """--processes 2: the parent says it; the parts, which check SOURCE and OUT again, do not."""
    src = _source_with_one_document(tmp_path)
    shutil.copy(SAMPLES / "report.pdf", src / "copy.pdf")
    proc = run_cli("run", str(src), str(src / "out"), "--engine", "textlayer", "-q", "--processes", "2", check=True,
                   subprocess=True)  # the parts' stderr is the command's
    assert "done: 2 documents, 6 pages" in proc.stdout
    assert [line for line in proc.stderr.splitlines() if "is inside SOURCE" in line] == [proc.stderr.strip()]
