"""An installation that lacks a module the render workers need is a systemic failure:
the run stops with one line and exit 1, and no page gets an error row for it (every
page would fail the same way)."""

import os

from conftest import SAMPLES, run_cli


def test_a_module_missing_in_the_render_workers_stops_the_run(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    # Every process of the run (the render workers too) finds no word list for routing.
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['spellchecker'] = None\n")
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out"
    proc = run_cli("run", str(SAMPLES / "report.pdf"), str(out), "--engine", "rapidocr", "--quiet",
                   env=env, subprocess=True)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "spellchecker" in errors[0] and "installation" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(out.glob("pages/**/*.parquet"))  # no rows claiming per-page errors
