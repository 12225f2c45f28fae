"""Every subcommand's errors in one form (one `Error: ...` line on stderr, exit 2, no
usage banner), and counts that agree with their nouns."""

import re

import pytest

from batchocr.words import duration, plural
from conftest import SAMPLES, run_cli
from synthetic import row, write_part

MISSING = "{tmp}/no-such-out"


@pytest.mark.parametrize("args, message", [
    (["status", MISSING], "OUT {tmp}/no-such-out does not exist"),
    (["compact", MISSING], "no page table under {tmp}/no-such-out (expected {tmp}/no-such-out/pages/shard-*/part-*.parquet)"),
    (["report", MISSING], "no page table under {tmp}/no-such-out (expected "),
    (["eval", MISSING, "--truth", str(SAMPLES / "truth")], "no page table under {tmp}/no-such-out (expected "),
    (["export", MISSING, "{tmp}/dest"], "no page table under {tmp}/no-such-out (expected "),
    (["plan", MISSING, "{tmp}/out", "--shards", "2"], "SOURCE {tmp}/no-such-out does not exist"),
    (["run", MISSING, "{tmp}/out"], "SOURCE {tmp}/no-such-out does not exist"),
    (["status"], "Missing argument 'OUT'. (see batchocr status --help)"),
    (["compact"], "Missing argument 'OUT'. (see batchocr compact --help)"),
    (["report"], "Missing argument 'OUT'. (see batchocr report --help)"),
    (["eval", "{tmp}"], "Missing option '--truth'. (see batchocr eval --help)"),
    (["export", "{tmp}"], "Missing argument 'DEST'. (see batchocr export --help)"),
    (["plan", "{tmp}", "{tmp}/out"], "Missing option '--shards'. (see batchocr plan --help)"),
    (["report", "{tmp}", "--top", "0"], "Invalid value for '--top': 0 is not in the range x>=1."),
    (["export", "{tmp}", "{tmp}/d", "--format", "pdf"], "Invalid value for '--format': 'pdf' is not one of"),
    (["status", "{tmp}", "--storage-option", "nokey"], "Invalid value for --storage-option: expected key=value"),
    (["report", "{tmp}", "--html", "{tmp}/no-folder/r.html"], "--html {tmp}/no-folder/r.html: folder {tmp}/no-folder does not exist"),
    (["frobnicate"], "No such command 'frobnicate'. (see batchocr --help)"),
    (["run", "{tmp}", "{tmp}/out", "--dpi"], "Option '--dpi' requires an argument. (see batchocr run --help)"),
    (["eval", "{tmp}", "--truth"], "Option '--truth' requires an argument. (see batchocr eval --help)"),
], ids=lambda v: " ".join(v[:2]) if isinstance(v, list) else None)
def test_every_command_says_what_is_wrong_in_one_line_and_exits_2(tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    proc = run_cli(*args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("Error: " + message.replace("{tmp}", str(tmp_path))), proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and "Usage:" not in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_the_console_script_gives_the_same_line(tmp_path):
    proc = run_cli("status", str(tmp_path / "nope"), subprocess=True)
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, f"Error: OUT {tmp_path / 'nope'} does not exist\n", "")


def test_plural_and_duration():
    assert [plural(n, "page") for n in (0, 1, 2, 1_000_000)] == ["0 pages", "1 page", "2 pages", "1,000,000 pages"]
    assert plural(1, "more run") == "1 more run" and plural(3, "more run") == "3 more runs"
    assert [duration(s) for s in (0.4, 14.2, 60, 483, 3725, 2 * 86400 + 4 * 3600)] == [
        "0.4 s", "14.2 s", "1 min 0 s", "8 min 3 s", "1 h 2 min", "2 d 4 h"]


def test_one_of_everything_is_said_in_the_singular(tmp_path):
    out = tmp_path / "out"
    write_part(out, "x", [row("file:///s/only.pdf", 0, 0, text="alone")])
    proc = run_cli("export", str(out), str(tmp_path / "dest"), check=True)
    assert proc.stdout.startswith("exported 1 document, 1 page (0 marked) into 1 file -> ")
    text = run_cli("report", str(out), check=True).stdout
    assert "(1 page)" in text and "(0 duplicates" in text and "(1 bucket)" in text
    assert "pages per minute                n/a  (every row has the same timestamp)" in text
    assert not re.search(r"\b1 (pages|runs|documents|files|buckets|minutes|duplicates)\b", text), text


def test_the_run_summary_line_says_one_of_everything_in_the_singular():
    from batchocr.pipeline import RunSummary

    one = RunSummary("r1", "0/1", "out", documents=1, pages=1, error_pages=1, seconds=2.0).line()
    assert one.startswith("batchocr: done: 1 document, 1 page (1 error), 0.50 pages/s, 2.0 s -> out/"), one
    many = RunSummary("r2", "0/1", "out", documents=5, pages=1024, error_pages=0, seconds=1.0).line()
    assert "done: 5 documents, 1,024 pages (0 errors)" in many
    idle = RunSummary("r3", "0/1", "out", documents_skipped=1).line()
    assert "nothing to do (1 document already done)" in idle
    assert not re.search(r"\b1 (pages|documents|errors)\b", one + idle)


def _commands():
    from batchocr.cli import main

    return sorted(main.commands.items())


@pytest.mark.parametrize("name, command", _commands(), ids=[n for n, _ in _commands()])
def test_every_subcommand_without_its_arguments_names_the_first_in_one_style(name, command):
    """One style for a missing argument, whichever subcommand: click's, `Error: Missing argument
    'X'. (see batchocr NAME --help)`, exit 2, one line, no usage banner, no traceback (run's
    SOURCE and OUT are optional for a job spec's sake, and still said so)."""
    import click

    first = next(p for p in command.params if isinstance(p, click.Argument))
    proc = run_cli(name)
    assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
    assert proc.stderr == f"Error: Missing argument '{first.human_readable_name}'. (see batchocr {name} --help)\n"


@pytest.mark.parametrize("args", [["run", "{tmp}"], ["plan", "{tmp}"], ["export", "{tmp}"], ["plan", "{tmp}", "{tmp}/o"],
                                  ["eval", "{tmp}"]], ids=lambda a: " ".join(a))
def test_a_later_missing_argument_or_option_is_said_the_same_way(tmp_path, args):
    proc = run_cli(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert re.fullmatch(rf"Error: Missing (argument '[A-Z]+'|option '--[a-z]+')\. \(see batchocr {args[0]} --help\)\n",
                        proc.stderr), proc.stderr
