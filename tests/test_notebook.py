"""samples/analysis.ipynb runs top to bottom on the demo output (the real rapidocr
run over the samples) in a real kernel, and shows what it promises."""

import json

import nbformat
from nbclient import NotebookClient

from conftest import ROOT, SAMPLES

NOTEBOOK = ROOT / "samples" / "analysis.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    assert all(not c.get("outputs") and not c.get("execution_count") for c in nb.cells if c.cell_type == "code")


def test_notebook_runs_on_the_demo_output(rapidocr_run, monkeypatch, tmp_path):
    out, _ = rapidocr_run
    monkeypatch.setenv("BATCHOCR_OUT", str(out))
    monkeypatch.setenv("BATCHOCR_TRUTH", "samples/truth")  # the default, relative to the repository
    nb = nbformat.read(NOTEBOOK, as_version=4)
    # python3: ipykernel's kernel of this interpreter (jupyter_client runs it with sys.executable).
    # A cell that raises fails the test (CellExecutionError).
    NotebookClient(nb, kernel_name="python3", timeout=300, resources={"metadata": {"path": str(SAMPLES)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "batchocr report: " + str(out) in text
    assert "overall CER 0." in text and "missing from the output: none" in text
    pngs = [o for o in outputs if "image/png" in o.get("data", {})]
    # throughput, the report's five charts (finish reasons, text length, slowest, CER, throughput), CER bars
    assert len(pngs) >= 7, [o.output_type for o in outputs]
    html = json.dumps([o.get("data", {}).get("text/html", "") for o in outputs])
    assert "report.pdf" in html and "fax.tiff" in html
