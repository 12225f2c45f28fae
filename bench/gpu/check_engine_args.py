"""batchocr's checks of engines.vllm.engine_args against the real vLLM (the tests use a stand-in).

    python bench/gpu/check_engine_args.py /tmp/models/qwen2-vl-2b --json args.json

1. Every key the benchmarks pass (`--engine-arg` in suite.sh and throughput.py) is taken.
2. A misspelt key stops with ConfigError (exit 2) naming it and the key meant.
3. vLLM refusing values while it builds its config, before any engine core starts: an
   unknown `mm_tensor_ipc` (pydantic), `torch_shm` without spawned workers (a ValueError),
   each a ConfigError of one line that names the field and holds no value given.
Exit 1 where any of it does not hold. Needs vLLM and a model folder (make_models.py); the
refused builds stop before the GPU is touched.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TAKEN = {"compilation_config": {"compile_mm_encoder": True}, "kv_cache_dtype": "fp8",
         "logits_processors": [], "mm_tensor_ipc": "torch_shm", "stream_interval": 8,
         "worker_extension_cls": "batchocr.engines.vllm.patches.vitpad.VisionMlpPadExtension", "profiler_config": None,
         "attention_config": None, "max_num_seqs": 4}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a model folder (bench/gpu/make_models.py)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    t0 = time.monotonic()
    import vllm
    from vllm import LLM

    from batchocr.engines.vllm.failures import build as _build, check_engine_args as _check_engine_args
    from batchocr.errors import ConfigError

    out: dict = {"vllm": vllm.__version__, "import_s": round(time.monotonic() - t0, 1), "failures": []}

    def expect_refusal(name: str, call, must: list[str], never: str = "SECRET") -> None:
        try:
            call()
        except ConfigError as exc:
            text = str(exc)
            out[name] = text
            if "\n" in text or never in text or not all(m in text for m in must) or exc.exit_code != 2:
                out["failures"].append(f"{name}: {text!r} (must hold {must}, one line, no value)")
            return
        except Exception as exc:  # noqa: BLE001 - the failure this checks for
            out[name] = f"{type(exc).__name__}: {exc}"
            out["failures"].append(f"{name}: not a ConfigError: {type(exc).__name__}")
            return
        out[name] = "no error"
        out["failures"].append(f"{name}: no error")

    try:
        _check_engine_args(LLM, TAKEN)
        out["taken"] = sorted(TAKEN)
    except ConfigError as exc:
        out["failures"].append(f"taken: {exc}")
    expect_refusal("misspelt", lambda: _check_engine_args(LLM, {"stream_intervl": 8}),
                   ["engines.vllm.engine_args.stream_intervl", "did you mean stream_interval"])
    base = {"model": args.model, "load_format": "dummy", "max_model_len": 8192, "enforce_eager": True}
    expect_refusal("bad_value", lambda: _build(LLM, base | {"mm_tensor_ipc": "SECRET"}), ["mm_tensor_ipc"])
    os.environ.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    expect_refusal("torch_shm_without_spawn", lambda: _build(LLM, base | {"mm_tensor_ipc": "torch_shm"}),
                   ["VLLM_WORKER_MULTIPROC_METHOD"])
    out["seconds"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 1 if out["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
