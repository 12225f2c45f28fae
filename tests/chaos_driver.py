"""`python tests/chaos_driver.py JOB.yaml MS_PER_PAGE`: batchocr run with the textlayer
engine slowed down to MS_PER_PAGE a page, so that kills land mid-run. Exit codes as
the CLI's."""

import sys
import time

from batchocr.signals import graceful_stop  # noqa: I001 - before the heavy imports

_stop = graceful_stop()
STOP = _stop.__enter__()

from batchocr.engines.textlayer import TextLayerEngine, TextLayerOptions
from batchocr.errors import BatchocrError
from batchocr.pipeline import run_job
from batchocr.spec import load_job


class SlowTextLayer(TextLayerEngine):
    def __init__(self, seconds_per_page: float):
        super().__init__(TextLayerOptions())
        self.delay = seconds_per_page

    def run(self, pages, stop=None):
        for results in super().run(pages, stop):
            time.sleep(self.delay * results.num_rows)
            yield results


if __name__ == "__main__":
    spec = load_job(sys.argv[1])
    try:
        print(run_job(spec, progress=False, engine=SlowTextLayer(float(sys.argv[2]) / 1000), stop=STOP).line(), flush=True)
    except BatchocrError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
