"""vLLM 0.26.0: batchocr's rewrites of vLLM internals, each where only speed is at stake and the
output stays the same.

Each patch installs in vLLM's worker (engine-core) process when vLLM resolves the worker
extension that names it (workerext.py); importing a patch patches nothing. engines.vllm's
options choose them (options.py: VLLMOptions.llm_args):

- rswa_tiles.py: R-SWA attention reads only the KV tiles it can see (Unlimited-OCR).
- deepencoder.py: DeepSeek-OCR's vision encoder over a step's images at once.
- vitpad.py: Qwen2.5-VL's vision MLPs padded to an aligned inner size.
- ngram.py: the no-repeat n-gram bans as a logits processor, cheap at 256+ requests a step.
- ngram_sampler.py: the same bans on the GPU, in the V2 model runner's sampler.
- workerext.py: how the patches reach vLLM's worker, and key its compile cache.

Each module's first line names the vLLM version it was written against. Where a patch can tell
that another vLLM's code moved, that vLLM runs its own code instead (rswa_tiles where the preset
asked for it, vitpad, each with a warning) or is refused before it is built (rswa_tiles asked for).
"""
