"""samples/analysis.ipynb, run as README says (`jupyter nbconvert --execute --to html
--output-dir out samples/analysis.ipynb`) on the demo output (the real rapidocr run
over the samples) in a real kernel: the page it writes shows the summary `batchocr
report` prints, cost included, and every chart."""

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from conftest import ROOT, SAMPLES, run_cli

NOTEBOOK = ROOT / "samples" / "analysis.ipynb"
README_COMMAND = "jupyter nbconvert --execute --to html --output-dir out samples/analysis.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code")


def test_readme_and_notebook_give_the_same_command():
    assert README_COMMAND in (ROOT / "README.md").read_text()
    assert README_COMMAND in nbformat.read(NOTEBOOK, as_version=4).cells[0].source


def test_readmes_command_writes_the_results_page(rapidocr_run, tmp_path):
    out, _ = rapidocr_run
    # README's command, from the repository root, but writing into this test's folder
    args = README_COMMAND.replace("--output-dir out", f"--output-dir {tmp_path}").split()
    jupyter = Path(sys.executable).with_name("jupyter")
    proc = subprocess.run([str(jupyter), *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "BATCHOCR_OUT": str(out)})  # truth: the default
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (tmp_path / "analysis.html").read_text()
    assert 'class="jp-OutputArea-output jp-RenderedText" data-mime-type="application/vnd.jupyter.stderr"' not in page
    assert "Traceback" not in page and "Error" not in re.sub(r"<(style|script)[^>]*>.*?</\1>", "", page, flags=re.S)
    # the summary, character for character as `batchocr report OUT --truth DIR` prints it (one library call)
    cli = run_cli("report", str(out), "--truth", str(SAMPLES / "truth"), check=True).stdout.rstrip("\n")
    texts = [html.unescape(t) for t in re.findall(r"<pre>(.*?)</pre>", page, re.S)]
    assert any(t.rstrip("\n") == cli for t in texts), "the notebook's summary differs from batchocr report's"
    assert "accelerator-hours" in cli and re.search(r"\d\.\d{4} accelerator-hours on 1 x ", page)  # cost included
    # every chart of the HTML report, each once, under its title
    from batchocr.charts import figures
    from batchocr.report import load_report

    titles = list(figures(load_report(str(out), truth=str(SAMPLES / "truth"))))
    assert [html.unescape(t) for t in re.findall(r"<h3[^>]*>(.*?)<a", page)] == titles
    assert len(re.findall(r'<img[^>]+src="data:image/png;base64,', page)) == len(titles)
    assert "overall CER 0." in page and "missing from the output: none" in page
    assert "fax.tiff" in page and "report.pdf" in page


@pytest.mark.parametrize("source", ["unopened", "empty"])
def test_notebook_runs_on_an_output_whose_documents_all_failed_to_open(tmp_path, source):
    """An OUT of document rows only (nothing could be opened), or of runs over an empty
    source (no row at all): no timeline, no page with truth; every cell still runs (the
    timeline and CER cells raised TypeError/ColumnNotFound; read_pages "no page table")."""
    from nbclient import NotebookClient

    src, out = tmp_path / "src", tmp_path / "out"
    src.mkdir()
    if source == "unopened":
        (src / "a.pdf").write_bytes(b"not a pdf at all\n" * 8)
        (src / "b.pdf").write_bytes(b"%PDF-1.7 broken\n" * 8)
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    os.environ["BATCHOCR_OUT"] = str(out)  # the kernel inherits this process's environment
    try:
        NotebookClient(nb, timeout=180, resources={"metadata": {"path": str(ROOT)}}).execute()
    finally:
        del os.environ["BATCHOCR_OUT"]
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "no timeline" in text and "no page of OUT has truth" in text
