"""`python tests/pod_driver.py JOB.yaml MS_PER_PAGE`: what one pod of the Indexed Job
runs, `batchocr run --job JOB.yaml` through the real CLI (shard from
JOB_COMPLETION_INDEX and BATCHOCR_SHARDS, exit codes as documented), with only the
engine swapped for the textlayer engine slowed down to MS_PER_PAGE a page, so that
kills land mid-run. With CHAOS_STARTED set, the engine appends a line to that file
when the run hands it its first pages: the chaos tests time their kills from there,
not from the process start, which a busy machine stretches."""

import os
import sys
import time

from batchocr.signals import graceful_stop  # noqa: I001 - first: a SIGTERM during the imports counts

graceful_stop().__enter__()  # the CLI's own graceful_stop() shares this flag

from batchocr import engines  # noqa: E402
from batchocr.cli import entry  # noqa: E402
from batchocr.engines.textlayer import TextLayerEngine, TextLayerOptions


class SlowTextLayer(TextLayerEngine):
    def __init__(self, seconds_per_page: float):
        super().__init__(TextLayerOptions())
        self.delay = seconds_per_page

    def run(self, pages, stop=None):
        if started := os.environ.get("CHAOS_STARTED"):
            with open(started, "a") as f:
                f.write(f"{os.getpid()}\n")
        for results in super().run(pages, stop):
            time.sleep(self.delay * results.num_rows)
            yield results


if __name__ == "__main__":
    delay = float(sys.argv[2]) / 1000
    engines.create = lambda name, options: SlowTextLayer(delay)
    entry(["run", "--job", sys.argv[1], "--quiet"])  # as the console script: hard exit with the code
