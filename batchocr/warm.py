"""`batchocr warm`: a compile cache for a job's vLLM engine, made by a run of that engine over
pages it generates (batchocr/engines/vllm/compilecache.py holds the cache's layout, its copy into
a run, its publication)."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

from batchocr.engines.vllm.compilecache import at_root, pin_keys, publish, what_built
from batchocr.errors import ConfigError
from batchocr.pipeline import run_job
from batchocr.spec import JobSpec, Shard


def warm(spec: JobSpec, cache: str, pages: int, progress: bool = True, spec_path: str | None = None) -> tuple[int, object]:
    """Fill the compile cache at `cache` for spec's vLLM engine: a run of spec's engine settings
    (its processes, mode, preset) over `pages` generated pages of text, in 16-page documents,
    from empty caches of its own, whose caches are then published whole at `cache`. The bytes
    published and the run's summary."""
    if spec.engine != "vllm":
        raise ConfigError(f"batchocr warm fills vLLM's compile caches: the job spec's engine is {spec.engine}, "
                          f"expected vllm (engine: vllm)")
    # The caches' root is a folder of its own, recorded in the cache: each run copies the cache to
    # that same path before it builds (compilecache.place), where the compiled kernels are found.
    with tempfile.TemporaryDirectory(prefix="batchocr-warm-") as tmp, \
            tempfile.TemporaryDirectory(prefix="batchocr-compile-") as at:
        root, docs = Path(at), Path(tmp) / "docs"
        os.environ["XDG_CACHE_HOME"] = str(root)
        at_root(root)  # vLLM's, Triton's and Inductor's caches: this run's own, what it compiled and nothing older
        for sub in ("vllm", "triton", "inductor"):
            (root / sub).mkdir(exist_ok=True)
        pin_keys()  # the keys a run's root gives too
        made = _documents(docs, pages)
        options = {**spec.engine_options, "compile_cache": ""}
        run = dataclasses.replace(spec, source=str(docs), out=str(Path(tmp) / "out"), shard=Shard(), inventory=None,
                                  route="model", reprocess=False, storage_options={},
                                  engines={**spec.engines, "vllm": options})
        summary = run_job(run, progress=progress)
        about = what_built() | {"root": str(root), "pages": made, "job": spec_path, "processes": spec.processes,
                                "mode": options.get("mode", "page"), "preset": options.get("preset")}
        return publish(root, cache, about), summary


def _documents(folder: Path, pages: int, per_document: int = 16) -> int:
    """`pages` pages of generated text in PDFs of up to per_document pages each."""
    import pymupdf

    folder.mkdir(parents=True, exist_ok=True)
    done = 0
    for d in range((pages + per_document - 1) // per_document):
        with pymupdf.open() as pdf:
            for p in range(min(per_document, pages - done)):
                page = pdf.new_page()
                text = "\n".join(f"Warm-up document {d + 1}, page {p + 1}, line {i + 1}: the quick brown fox "
                                 f"jumps over the lazy dog {i * 7 + p}." for i in range(40))
                page.insert_textbox(page.rect + (54, 54, -54, -54), text, fontsize=10)
                done += 1
            pdf.save(folder / f"warm-{d + 1:04d}.pdf")
    return done
