#!/usr/bin/env bash
# The GPU throughput suite (issue #12) on one GPU, into RESULTS_DIR, in order of priority
# (what a lease cuts short is the end):
#   1. 7B layout bf16, 512 pages: a, c, b, a' (vLLM's defaults) at equal work (b's repetition
#      guard off), then b with max_num_seqs 512 (its own engine);
#   2. 2B layout bf16, 768 pages: a, c, b, a', then b on two engine processes sharing the GPU;
#   3. 7B layout FP8 weights, 512 pages: b, then b with the FP8 KV cache too.
# Named only (RUNS=...): route-7b, issue 14's routing figure (bench/route.py, route auto against
# model, 7B layout, 1000 tokens a model page); tp-7b-fp8vs, b bf16 against b FP8 weights in one run.
# Issue 20 (Unlimited-OCR's layout, by name): uocr-check, uocr-page, uocr-doc, uocr-page-ngram,
# uocr-doc-ngram (b with batchocr's n-gram logits processor, the preset's, against vLLM's, which
# bans the same tokens, and against none), uocr-ngram (their cost a step, on the GPU), uocr-seqs512,
# uocr-runner (b with the processor, with the bans in the V2 sampler, without bans on vLLM's V2
# model runner, without on V1), uocr-page-s, uocr-doc-s, uocr-seqs-s (the sampler's bans in a and
# b), uocr-admit-s (b with them, admitting 16 pages at a time against as vLLM admits), uocr-levers
# (b against batchocr's batched encoder, vLLM's encoder CUDA graphs, torch_shm pixels and the
# sampler's bans), uocr-encoder (the batched encoder against vLLM's, bench/gpu/check_encoder_batch.py; uocr-encoder-prof
# with its profile and torch.compile),
# uocr-seqs-be (b with the batched encoder at 256, 512 and 1,024 sequences), uocr-prof, uocr-prof-be
# (torch profiles of b's steps, without and with it), uocr-prof-stack (the host's time by Python function), uocr-doc-be (document mode a and b with it),
# uocr-bans (the sampler's bans checked end to end, bench/gpu/check_sampler_bans.py),
# uocr-doc-sampler (document mode a, b and b with the sampler's bans), uocr-modes (page b against the
# batched encoder, document mode a and b, vLLM's encoder CUDA graphs: both of issue 20's open goals),
# uocr-engines (b on one engine process against two on the one GPU), uocr-be-doc (page b against the
# batched encoder, document mode a and b with it in groups of 4), uocr-ban-sync (the n-gram processor's
# write of a step's bans, bench/gpu/check_ban_sync.py), uocr-waves (page b against document b over
# several waves of groups), uocr-rswa-check, uocr-tiles and uocr-tiles-doc (R-SWA's attention over the
# tiles it sees), uocr-decode (page b against rswa_tiles, the sampler's bans on V2 with the batched encoder
# and two engine processes, one run), uocr-goal (4,096 pages: b against two engine processes and instances 2),
# uocr-inst2 (b against instances 2 at 2,048 pages), uocr-processes (batchocr run --processes 2 against 1),
# uocr-start (a command's start: cold caches, then seeded from the first run's; engines in turn and at once);
# issue 21: uocr-kill (vLLM's engine core killed mid-run, then the rerun: bench/gpu/e2e.py), uocr-memory
# (host memory against the queue depth; uocr-memory-1024 its last run alone); tp21-7b-admit (b, b admitting 16,
# a, then FP8 KV + 512 sequences + 16: one lease), tp21-7b-levers, tp21-7b-s512 (b at 512 sequences in bf16
# against b held to 256 on that engine, and a at 512), tp21-7b-prof (a one-page prefill step, kernel by
# kernel), tp21-2b-admit (the 2B at 16 against 0), tp21-2b (its goals at 2,048 pages); tp21-vitpad-check
# (batchocr.engines.vllm.patches.vitpad on the real vision tower); tp21-7b-a0 (b against a' over 2,048 pages; tp21-7b-a0-1k over 1,024); tp21-2b-prof (the
# 2B's engine core, a step's host time by function); tp21-first (a process's first requests, bench/gpu/first_requests.py;
# tp21-first-prewarm: after transformers' processor ran before the build, which hung);
# tp21-7b-enc (the encoder's levers: compile, CUDA graphs, the padded vision MLPs), tp21-7b-enc2 (padding
# and compile apart and together), tp21-vitpad-cache (the padded compile after an unpadded one on one
# machine), tp21-7b-enc3 (b, compiled since the sixteenth lease, against padded and uncompiled),
# tp21-2b-stream (stream_interval, torch_shm on the 2B), tp21-2b-inst2 (the 2B on two engine instances),
# tp21-2b-stream8 (stream_interval 8 alone, 1,024 pages), tp21-2b-stream2 (8, 32 and torch_shm beside a control),
# tp21-2b-stream3 (1, 128 and torch_shm beside the default 32's control).
# Each run is one throughput.py process: its modes and variants share the pages and the
# output lengths, and its JSON holds their ratios. Needs vLLM and make_models.py's folders.
#
#   bash bench/gpu/suite.sh /tmp/res
#   RUNS=tp-7b-fp8w bash bench/gpu/suite.sh /tmp/res   # named runs only
#   TP_ARGS="--fake --pages 16 --max-num-seqs 4 --chunk 8 --render-workers 1" bash bench/gpu/suite.sh /tmp/dry
#                                                # a dry run of the whole suite on the CPU
#   RUNS=route-7b ROUTE_ARGS="--fake --docs 2" MODELS=/tmp bash bench/gpu/suite.sh /tmp/dry   # the same
# rebuild, rebuild-uocr, rebuild-7b (issue 49) need the tree before the rebuild in .old/ (git-ignored
# through the common info/exclude, carried to the device with `carry: [".old"]`):
#   git archive a1979f6 batchocr bench pyproject.toml tests/corpus.py tests/fake_vllm.py | tar -x -C .old
set -u
RES=${1:-/tmp/res}
MODELS=${MODELS:-/tmp/models}
UOCR_ATTN=${UOCR_ATTN:-attention_config={\"backend\": \"TRITON_ATTN\"}}
# vLLM's own n-gram processor (the recipe's) in the place of batchocr.engines.vllm.patches.ngram's, which bans the same tokens
VLLM_NGRAM='vllmngram=--engine-arg logits_processors=["vllm.model_executor.models.unlimited_ocr:NGramPerReqLogitsProcessor"]'
NO_LOGITS_PROCESSOR='noproc=--engine-arg logits_processors=[] --ngram off'  # no processor, vLLM's choice of runner: V1 here
V1_NO_PROCESSOR='v1noproc=--engine-arg logits_processors=[] --ngram off --env VLLM_USE_V2_MODEL_RUNNER=0'
# no bans on V2: batchocr's extension (which asks for V2 and pads R-SWA's prompt lengths for its CUDA
# graphs: vLLM 0.26's V2 runner fails this layout without) with no n-gram arguments in the requests
V2_NO_BANS='v2nobans=--ngram-bans sampler --ngram off'
# the same bans on the GPU in vLLM's V2 sampler (batchocr.engines.vllm.patches.ngram_sampler: engines.vllm.ngram_bans: sampler)
SAMPLER_BANS='sampler=--ngram-bans sampler'
# the encoder's host cost (a page's prefill ~62 ms of engine-core time, the GPU idle: docs/history/GPU.md, fourth
# lease): vLLM's encoder CUDA graphs (V1 runner only; DeepSeek-OCR's encoder supports them), and its
# pixels to the engine core through shared memory rather than serialized (no spaces: split on them)
ENC_GRAPHS='encgraphs=--engine-arg compilation_config={"cudagraph_mm_encoder":true}'
# vLLM 0.26 refuses torch_shm unless its workers are spawned (config/vllm.py:1139-1148)
TORCH_SHM='shm=--engine-arg mm_tensor_ipc=torch_shm --env VLLM_WORKER_MULTIPROC_METHOD=spawn'
ENC_COMPILE='enccompile=--engine-arg compilation_config={"compile_mm_encoder":true}'  # qwen2.5-vl's default since the sixteenth lease
NO_ENC_COMPILE='nocompile=--engine-arg compilation_config={"compile_mm_encoder":false}'
# Qwen2.5-VL's vision MLPs padded to an aligned inner size (batchocr.engines.vllm.patches.vitpad: 3,420 -> 3,456, the same
# products), so that cuBLAS leaves its Ampere GEMM (8.4 ms of a page's prefill, fourteenth lease)
# (engines.vllm.vit_pad; until the sixteenth lease `--engine-arg worker_extension_cls=batchocr.vitpad.
# VisionMlpPadExtension`, which names the same extension)
VIT_PAD='vitpad=--vit-pad'
VIT_PAD_COMPILE='vitpadcompile=--vit-pad --engine-arg compilation_config={"compile_mm_encoder":true}'
# batchocr's batched encoder (engines.vllm.batch_encoder: batchocr.engines.vllm.patches.deepencoder), on V1 with the processor;
# unlimited-ocr's default since the sixth lease, so the runs that compare it with vLLM's encoder say --no-batch-encoder
BATCH_ENCODER='batchenc=--batch-encoder'
mkdir -p "$RES" && RES=$(cd "$RES" && pwd)  # absolute: the old tree's runs start in .old/
cd "$(dirname "$0")/../.."

old_path() {  # PYTHONPATH for the old tree: this checkout's entry in it becomes .old/'s
  python3 - "${PYTHONPATH:-}" <<'PY'
import os, sys
root, old = os.getcwd(), os.path.join(os.getcwd(), ".old")
parts = [old if os.path.realpath(p) == os.path.realpath(root) else p for p in sys.argv[1].split(os.pathsep) if p]
print(os.pathsep.join(parts if old in parts else [old, *parts]))
PY
}

tp() {  # NAME ARGS...: one throughput.py run, bounded in time, logged
  # TREE=old: the old tree's throughput.py and batchocr (.old/), started in .old/ so that what the run
  # starts (the render workers' fork server, vLLM's engine core) imports that batchocr too
  local name=$1; shift
  if [ "${TREE:-}" = old ]; then
    if [ ! -f .old/bench/gpu/throughput.py ]; then
      echo "$(date +%T) skip $name: no .old/ (the head of this file says how to make it)" >>"$RES/suite.log"
      return 1
    fi
    local path; path=$(old_path)
    echo "$(date +%T) start $name (the old tree, .old/)" >>"$RES/suite.log"
    (cd .old && export PYTHONPATH=$path && python3 -c 'import batchocr; print("batchocr from", batchocr.__path__[0])' &&
       timeout "${TP_TIMEOUT:-1500}" python3 bench/gpu/throughput.py "$@" ${TP_ARGS:-} --json "$RES/$name.json") \
      >"$RES/$name.log" 2>&1
  else
    echo "$(date +%T) start $name" >>"$RES/suite.log"
    timeout "${TP_TIMEOUT:-1500}" python3 bench/gpu/throughput.py "$@" ${TP_ARGS:-} --json "$RES/$name.json" >"$RES/$name.log" 2>&1
  fi
  local rc=$?  # before $(date) sets its own
  echo "$(date +%T) end $name rc=$rc" >>"$RES/suite.log"
}

gpu_free() {  # until the last process's GPU memory is back (an engine sizes its KV cache from what is free)
  command -v nvidia-smi >/dev/null || return 0
  local used
  for _ in $(seq 120); do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1 | tr -cd 0-9)
    [ "${used:-0}" -lt 4096 ] && return 0
    sleep 1
  done
}

trees() {  # NAME RUNNER ARGS...: a and b with the old tree, b with this one, each its own process; compared
  # REBUILD_ORDER=new-first: this tree's b before the old tree's (a still first: it pays the cold caches)
  local name=$1 runner=$2; shift 2
  gpu_free; TREE=old TP_TIMEOUT=${REBUILD_TIMEOUT:-600} "$runner" "$name-a" "$@" --modes a
  if [ "${REBUILD_ORDER:-old-first}" = new-first ]; then
    gpu_free; TP_TIMEOUT=${REBUILD_TIMEOUT:-600} "$runner" "$name-new" "$@" --modes b
    gpu_free; TREE=old TP_TIMEOUT=${REBUILD_TIMEOUT:-600} "$runner" "$name-old" "$@" --modes b
  else
    gpu_free; TREE=old TP_TIMEOUT=${REBUILD_TIMEOUT:-600} "$runner" "$name-old" "$@" --modes b
    gpu_free; TP_TIMEOUT=${REBUILD_TIMEOUT:-600} "$runner" "$name-new" "$@" --modes b
  fi
  python3 bench/gpu/compare_trees.py "$RES/$name-old.json" "$RES/$name-new.json" "$RES/$name-a.json" \
    --json "$RES/$name-compare.json" >"$RES/$name-compare.txt" 2>&1
  local rc=$?
  { echo "$(date +%T) $name compared rc=$rc"; cat "$RES/$name-compare.txt"; } >>"$RES/suite.log"
}

uocr() {  # NAME ARGS...: a throughput.py run on Unlimited-OCR's layout, 16-page documents, the kit's R-SWA backend
  local name=$1; shift
  tp "$name" "--model=$MODELS/unlimited-ocr" --preset unlimited-ocr --per-doc 16 --engine-arg "$UOCR_ATTN" \
    ${UOCR_CG:+--engine-arg "$UOCR_CG"} "$@"
}

# vLLM's V2 runner under full CUDA graphs failed R-SWA (the third lease; batchocr.engines.vllm.patches.ngram_sampler pads
# around it). Where a V2 run still ends without b, it runs again with piecewise graphs only (the V2
# runner then builds attention metadata unpadded), and so do the V2 runs after it: one lease, no round trip.
PIECEWISE='compilation_config={"cudagraph_mode": "PIECEWISE"}'
said() {  # NAME EXPR: run NAME's JSON (as d) exists and EXPR holds of it
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); sys.exit(not eval(sys.argv[2]))" "$RES/$1.json" "$2" 2>/dev/null
}
has_b() { said "$1" "'b_batchocr' in d"; }
uocr_v2() {  # NAME ARGS...: uocr, and once more with piecewise graphs where it gave no b
  uocr "$@"
  if [ -z "${UOCR_CG:-}" ] && ! has_b "$1"; then
    echo "$(date +%T) $1 gave no b: piecewise CUDA graphs from here on" >>"$RES/suite.log"
    UOCR_CG=$PIECEWISE
    local name=$1; shift
    uocr "$name-pw" "$@"
  fi
}

tiles_pick() {  # "SIZES GAIN": uocr-prefill-tiles' fastest launch sizes on the mixed step with the same output,
  # as BATCHOCR_PREFILL_TILES reads them, and vLLM's sizes' ms over theirs ("64,64,8 0" where it has not run)
  python3 -c "import json, sys
try:
    d = json.load(open(sys.argv[1]))['prefill_tiles']
    ok = {k: v['ms'] for k, v in d.items() if k.startswith('mixed_') and 'ms' in v and v['max_abs_diff'] <= 2e-2}
    best = min(ok, key=ok.get)
    m, t, w = best[len('mixed_'):].split('_')
    print(','.join([m[1:], t[1:]] + ([w[1:]] if w[1:] != 'auto' else [])), round(ok['mixed_m16_t32_wauto'] / ok[best], 3))
except Exception:
    print('64,64,8 0')" "$RES/uocr-prefill-tiles.json"
}

moe_pick() {  # "FOLDER SPEEDUP": uocr-moe-tune's config file's folder (VLLM_TUNED_CONFIG_FOLDER reads it) and
  # the tuned tiles' speedup over vLLM's default at a decode step's token counts (128-512: the geometric
  # mean), "- 0" where it has not run
  python3 -c "import json, math, os, sys
try:
    d = json.load(open(sys.argv[1]))
    assert d.get('config_file')
    s = [d['by_m'][str(m)]['speedup'] for m in (128, 256, 512)]
    print(os.path.dirname(sys.argv[1]), round(math.prod(s) ** (1 / len(s)), 3))
except Exception:
    print('- 0')" "$RES/uocr-moe-tune.json"
}

gains() {  # SPEEDUP: whether a kernel check's speedup is one worth an end-to-end run (>= 1.05x)
  python3 -c "import sys; sys.exit(float(sys.argv[1]) < 1.05)" "$1"
}

py() {  # NAME SCRIPT ARGS...: a script's run, its JSON and log
  local name=$1; shift
  echo "$(date +%T) start $name" >>"$RES/suite.log"
  timeout "${PY_TIMEOUT:-600}" python3 "$@" --json "$RES/$name.json" >"$RES/$name.log" 2>&1
  local rc=$?  # before $(date) sets its own
  echo "$(date +%T) end $name rc=$rc" >>"$RES/suite.log"
}

rt() {  # NAME ARGS...: one bench/route.py run, bounded in time, logged
  local name=$1; shift
  echo "$(date +%T) start $name" >>"$RES/suite.log"
  timeout 1500 python3 bench/route.py "$@" ${ROUTE_ARGS:-} --json "$RES/$name.json" >"$RES/$name.log" 2>&1
  local rc=$?  # before $(date) sets its own
  echo "$(date +%T) end $name rc=$rc" >>"$RES/suite.log"
}

auto() {  # NAME WORK ARGS...: processes.py over uocr-auto's documents (/tmp/proc/src: a page's length follows
  # its path, so runs reading them do equal work), each run's caches under WORK
  local name=$1 work=$2; shift 2
  PY_TIMEOUT=1700 py "$name" bench/gpu/processes.py --models "$MODELS" --work "$work" --src /tmp/proc/src \
    --pages "${UOCR_AUTO_PAGES:-4096}" --lengths B --timeout 900 --processes "${UOCR_AUTO_PROCS:-1,auto}" "$@" ${AUTO_ARGS:-}
}

run() {  # one named run of the suite
  case $1 in
    tp-7b) tp tp-7b "--model=$MODELS/qwen2.5-vl-7b" --pages 512 --modes a,c,b,a0 --variant "seqs512=--max-num-seqs 512" ;;
    tp-2b) tp tp-2b "--model=$MODELS/qwen2-vl-2b" --pages 768 --modes a,c,b,a0 \
             --variant "engines2=--engines 2 --gpu-memory-utilization 0.44 --render-workers 4" ;;
    tp-7b-fp8) tp tp-7b-fp8 "--model=$MODELS/qwen2.5-vl-7b" --pages 512 --quantization fp8 --modes b \
                 --variant "kvfp8=--engine-arg kv_cache_dtype=fp8" ;;
    tp-7b-fp8w) tp tp-7b-fp8w "--model=$MODELS/qwen2.5-vl-7b" --pages 512 --quantization fp8 --modes b ;;  # weights only: a short lease
    tp-7b-fp8vs) tp tp-7b-fp8vs "--model=$MODELS/qwen2.5-vl-7b" --pages 512 --modes b --variant "fp8w=--quantization fp8" ;;
    # issue 21's goals (at least 2,048 pages, 4x max_num_seqs: a steady state), the thirteenth lease's
    # run (~22 min; it replaced tp21-7b, which the earlier leases planned): b as vLLM admits (explicitly,
    # since 16 is the preset's default now), b admitting 16 at a time, a; then in its own engine the
    # levers together (FP8 KV, 512 sequences, admitting 16)
    tp21-7b-admit) tp tp21-7b-admit "--model=$MODELS/qwen2.5-vl-7b" --pages 2048 --modes b,a --admit-pages 0 \
                     --b-variants "admit_pages=16" \
                     --variant "kvfp8s512=--engine-arg kv_cache_dtype=fp8 --max-num-seqs 512 --admit-pages 16" ;;
    # the levers apart (b admits 16 by default): FP8 KV at 256 and 512 sequences, bf16 at 512 (~21 min)
    tp21-7b-levers) tp tp21-7b-levers "--model=$MODELS/qwen2.5-vl-7b" --pages 2048 --modes b \
                      --variant "kvfp8=--engine-arg kv_cache_dtype=fp8" \
                      --variant "seqs512kvfp8=--max-num-seqs 512 --engine-arg kv_cache_dtype=fp8" \
                      --variant "seqs512=--max-num-seqs 512" ;;
    # 512 sequences in bf16 (the KV holds 810 at these lengths) on one engine: b at 512, then b that
    # admits no more than 256 on the same engine (the default's batch, nothing else changed), then a at
    # 512 (vLLM alone with batchocr's engine arguments); 64 pages' warm-up first, off the clock (~17 min)
    tp21-7b-s512) tp tp21-7b-s512 "--model=$MODELS/qwen2.5-vl-7b" --pages 2048 --modes b,a --max-num-seqs 512 \
                    --warmup 64 --b-variants "max_num_seqs=256" ;;
    # where a step that admits one page spends its ~100 ms (vLLM admitting pages, the old default): 60
    # steps of b's steady state torch-profiled with Python calls traced, each kernel to the step and phase
    # (encoder, forward, sample) that launched it; the tracer slows the host, not the kernels (~4 min)
    tp21-7b-prof) tp tp21-7b-prof "--model=$MODELS/qwen2.5-vl-7b" --pages 512 --modes b --admit-pages 0 \
                    --profile 700,60 --profile-stack ;;
    # the 2B's admission (the layout runs under qwen2.5-vl's preset: 16 by default), 1,024 pages (4x 256):
    # b at 16 first (it pays the process's first steps), then as vLLM admits (~4 min)
    tp21-2b-admit) tp tp21-2b-admit "--model=$MODELS/qwen2-vl-2b" --pages 1024 --modes b --b-variants "admit_pages=0" ;;
    # issue 21's encoder levers on the 7B (1,024 pages each, b at the preset's admission; Qwen2.5-VL's encoder has
    # vLLM's compile and CUDA-graph support), and the 2B's CPU-bound engine core (fewer outputs a step)
    # (~16 min; torch_shm, which moves pixels, not kernels, is in tp21-2b-stream and uocr-levers)
    tp21-7b-enc) tp tp21-7b-enc "--model=$MODELS/qwen2.5-vl-7b" --pages 1024 --modes b --variant "$VIT_PAD" \
                   --variant "$ENC_COMPILE" --variant "$ENC_GRAPHS" ;;
    # the fifteenth lease's two winners apart and together (the vision MLPs now padded at load, before
    # compile_mm_encoder traces them), b with the renderer's warm-up (first_request_s), 1,024 pages (~16 min)
    tp21-7b-enc2) tp tp21-7b-enc2 "--model=$MODELS/qwen2.5-vl-7b" --pages 1024 --modes b --variant "$VIT_PAD" \
                    --variant "$ENC_COMPILE" --variant "$VIT_PAD_COMPILE" ;;
    # the compile cache across engines on one machine: b compiles the vision tower unpadded, then the
    # padded one must compile its own (in tp21-7b-enc2 it reloaded b's graph and died); 64 pages (~4 min)
    tp21-vitpad-cache) tp tp21-vitpad-cache "--model=$MODELS/qwen2.5-vl-7b" --pages 64 --modes b \
                         --engine-arg 'compilation_config={"compile_mm_encoder":true}' --variant "$VIT_PAD_COMPILE" ;;
    # the padded vision MLPs over the compiled vision blocks (the qwen2.5-vl default since the sixteenth
    # lease), and the blocks uncompiled: b, vitpad, nocompile, 1,024 pages each (~13 min)
    tp21-7b-enc3) tp tp21-7b-enc3 "--model=$MODELS/qwen2.5-vl-7b" --pages 1024 --modes b --variant "$VIT_PAD" \
                    --variant "$NO_ENC_COMPILE" ;;
    # b/a' at issue 21's length: b (the defaults) and a' (vLLM's own defaults, `generate` in chunks of
    # 256, its own process) over 2,048 pages (~13 min)
    tp21-7b-a0) tp tp21-7b-a0 "--model=$MODELS/qwen2.5-vl-7b" --pages 2048 --modes b,a0 ;;
    # the same on half the pages, for a lease with ~1,300 s left after the 2B's levers (~7.5 min)
    tp21-7b-a0-1k) tp tp21-7b-a0-1k "--model=$MODELS/qwen2.5-vl-7b" --pages 1024 --modes b,a0 ;;
    # where the 2B's engine core spends a step (9.7 ms for 246 sequences, GPU 80% busy): 30 steps of
    # b's steady state profiled with Python calls traced (~3 min)
    tp21-2b-prof) tp tp21-2b-prof "--model=$MODELS/qwen2-vl-2b" --pages 768 --modes b --profile 900,30 --profile-stack ;;
    # a process's first requests (~15 s before the first reached vLLM, fourteenth lease): the renderer's
    # first call alone, four threads' first calls at once; two fresh processes on the 2B (~3 min)
    tp21-first) py tp21-first-one bench/gpu/first_requests.py "$MODELS/qwen2-vl-2b"
                py tp21-first-threads bench/gpu/first_requests.py "$MODELS/qwen2-vl-2b" --fresh-threads ;;
    # transformers' processor run before vLLM's build: the engine core hung in the fifteenth lease
    # (vLLM forks it), so a short limit; only to find out why (docs/history/GPU.md, fifteenth lease)
    tp21-first-prewarm) PY_TIMEOUT=240 py tp21-first-prewarm bench/gpu/first_requests.py "$MODELS/qwen2-vl-2b" \
                          --pre-warm --fresh-threads ;;
    # the padded vision MLPs on vLLM's real vision tower alone: the same output, ms a page, the kernels (~1 min)
    tp21-vitpad-check) py tp21-vitpad-check bench/gpu/check_vit_pad.py "$MODELS/qwen2.5-vl-7b" --pages 4 ;;
    # batchocr's engine_args checks against the real vLLM: the benchmarks' keys taken, a misspelt one
    # named, refused values in one line (no engine core starts; ~40 s, mostly vLLM's import)
    vllm-args) py vllm-args bench/gpu/check_engine_args.py "$MODELS/qwen2-vl-2b" ;;
    tp21-2b-stream) tp tp21-2b-stream "--model=$MODELS/qwen2-vl-2b" --pages 2048 --modes b \
                      --variant "stream8=--engine-arg stream_interval=8" --variant "$TORCH_SHM" ;;
    # the same lever alone on half the pages, for the end of a lease (~6 min with the install)
    tp21-2b-stream8) tp tp21-2b-stream8 "--model=$MODELS/qwen2-vl-2b" --pages 1024 --modes b \
                       --variant "stream8=--engine-arg stream_interval=8" ;;
    # stream_interval again beside a control: `same` is b's own arguments in a child process, as every
    # variant runs (stream8 gained 1.054/1.040 in the seventeenth lease, partly a quicker start in its
    # child); 32 matches the repetition guard's look every 32 tokens; and torch_shm (the pages' pixels
    # to the engine core through shared memory, not its input socket); 1,024 pages (~11.5 min)
    tp21-2b-stream2) tp tp21-2b-stream2 "--model=$MODELS/qwen2-vl-2b" --pages 1024 --modes b --variant "same=" \
                       --variant "stream8=--engine-arg stream_interval=8" \
                       --variant "stream32=--engine-arg stream_interval=32" --variant "$TORCH_SHM" ;;
    # stream_interval beyond the default (32 since the nineteenth lease): b, the control in a child, vLLM's 1
    # (the default's gain again), 128 (the repetition check then looks every 128 tokens), and torch_shm over
    # 32 (1.051 end to end but 0.989 steady over 1 in the nineteenth lease); 1,024 pages (~11.5 min)
    tp21-2b-stream3) tp tp21-2b-stream3 "--model=$MODELS/qwen2-vl-2b" --pages 1024 --modes b --variant "same=" \
                       --variant "stream1=--engine-arg stream_interval=1" \
                       --variant "stream128=--engine-arg stream_interval=128" --variant "$TORCH_SHM" ;;
    # the 2B's host-bound engine core split in two (engines.vllm.instances 2: two engine cores in batchocr's
    # one process, 0.45 of the GPU each; Unlimited-OCR's host-bound layout gained 1.39x steady, issue 20's ninth
    # lease): b against b with two instances, 2,048 pages (~8 min)
    tp21-2b-inst2) TP_TIMEOUT=1100 tp tp21-2b-inst2 "--model=$MODELS/qwen2-vl-2b" --pages 2048 --modes b \
                     --variant "inst2=--instances 2" ;;
    tp21-2b) tp tp21-2b "--model=$MODELS/qwen2-vl-2b" --pages 2048 --modes a,b --b-variants "admit_pages=0;admit_pages=8" ;;
    # issue 14: 128 mixed documents (512 pages, half born-digital), auto and model twice, orders alternating
    route-7b) rt route-7b --engine vllm "--model=$MODELS/qwen2.5-vl-7b" --preset qwen2.5-vl --dummy 1000 \
                --docs 128 --repeat 2 --modes auto,model ;;
    # issue 20: Unlimited-OCR (its dummy layout), 1,024 pages of 16-page documents, lognormal lengths;
    # R-SWA needs an attention backend the kit carries (FA4, vLLM's choice, is not: bench/gpu/README.md)
    uocr-page) uocr uocr-page --pages 1024 --modes a,b --b-variants "admit_pages=16;prepare_threads=8" ;;
    uocr-seqs512) uocr uocr-seqs512 --pages 2048 --modes b --max-num-seqs 512 ;;
    uocr-doc) uocr uocr-doc --mode document --pages 1024 --modes a,b ;;
    # the n-gram logits processor's cost: b with batchocr's, vLLM's and none in one run (their cost a
    # step alone: uocr-ngram, on the GPU, seconds); uocr-check: vLLM's classes load the layout, tokens counted
    uocr-page-ngram) uocr uocr-page-ngram --pages 512 --modes b --variant "$VLLM_NGRAM" --variant "$NO_LOGITS_PROCESSOR" ;;
    uocr-doc-ngram) uocr uocr-doc-ngram --mode document --pages 1024 --modes b --variant "$VLLM_NGRAM" ;;
    uocr-ngram) py uocr-ngram bench/gpu/ngram_cost.py --device cuda ;;
    # the engine core's host time is the limit and the GPU ~60% idle: two engine processes, each
    # half the documents, their host work overlapping (for the GPU-bound 2B two time-sliced: 0.87x)
    uocr-engines) uocr uocr-engines --pages 1024 --modes b \
                    --variant "engines2=--engines 2 --gpu-memory-utilization 0.44 --render-workers 4" ;;
    # issue 21: a run's host memory against its queue depth, b alone in each process (rss by process)
    uocr-memory) uocr uocr-memory --pages 1024 --modes b --variant "queue64=--queue-pages 64" \
                   --variant "queue1024=--queue-pages 1024" ;;
    # the run the twelfth lease cut short: b at the default queue against 1,024 (~6 min)
    uocr-memory-1024) uocr uocr-memory-1024 --pages 1024 --modes b --variant "queue1024=--queue-pages 1024" ;;
    # what a custom logits processor costs vLLM (docs/history/GPU.md, "Issue 20, second lease"): b with
    # batchocr's processor (V1 runner, output tokens synced to the host a step), with none on V2,
    # and with none on V1; 512 pages, equal work in tokens (the bans change tokens, not counts)
    # and with the bans in the V2 sampler (uocr-bans first: it checks those bans end to end, and their runner)
    uocr-runner) uocr uocr-runner --pages 512 --modes b --variant "$SAMPLER_BANS" --variant "$V2_NO_BANS" \
                   --variant "$V1_NO_PROCESSOR" ;;
    uocr-bans) py uocr-bans bench/gpu/check_sampler_bans.py "$MODELS/unlimited-ocr" --tokens 512 \
                 ${UOCR_CG:+--engine-arg "$UOCR_CG"} ;;
    # with the sampler's bans (engines.vllm.ngram_bans: sampler) in a and b alike: page mode a and b;
    # document mode a and b; then b against b with 512 sequences
    uocr-page-s) uocr_v2 uocr-page-s --pages 1024 --modes a,b --ngram-bans sampler ;;
    uocr-doc-s) uocr_v2 uocr-doc-s --mode document --pages 1024 --modes a,b --ngram-bans sampler ;;
    uocr-seqs-s) uocr_v2 uocr-seqs-s --pages 1024 --modes b --ngram-bans sampler --variant "seqs512=--max-num-seqs 512" ;;
    # steps that admit a page cost ~120 ms against ~20 for a decode step (the fourth lease's uocr-page-s a):
    # b with the sampler's bans 16 at a time (the preset's admit_pages since the fourth lease, which
    # measured it as b_admit_pages_16 against b at 0), and as vLLM admits pages
    uocr-admit-s) uocr_v2 uocr-admit-s --pages 1024 --modes b --ngram-bans sampler --b-variants "admit_pages=0" ;;
    # b (batchocr's processor, V1, the preset's admit_pages 16) against the encoder's levers and the
    # sampler's bans on V2, each its own engine, 1,024 pages: which runner, and what the prefill gives back
    uocr-levers) uocr uocr-levers --pages 1024 --modes b --no-batch-encoder --variant "$BATCH_ENCODER" \
                   --variant "$ENC_GRAPHS" --variant "$SAMPLER_BANS" --variant "$TORCH_SHM" ;;
    # the decode share of a page (256 sequences' steps, 61 ms of its ~123): b with the batched encoder
    # at 256, 512 and 1,024 sequences (the KV holds ~1,900 of R-SWA's requests)
    uocr-seqs-be) uocr uocr-seqs-be --pages 2048 --modes b --batch-encoder --variant "seqs512=--max-num-seqs 512" \
                    --variant "seqs1024=--max-num-seqs 1024" ;;
    # where a step's time goes (vLLM's torch profiler, 150 steps of b's steady state; the profile
    # perturbs b, so these are runs of their own): vLLM's encoder, then the batched one
    # (1,024 pages: the sixth lease's 512 with a delay of 1,500 steps profiled the tail, 120-144 running)
    uocr-prof) uocr uocr-prof --pages 1024 --modes b --no-batch-encoder --profile 1000,150 ;;
    # where the GPU's time goes at today's defaults (the engines' host no longer the limit with two of
    # them: the card 94% busy, 2026-12-06): 150 steps of b's steady state, GPU time by kernel
    uocr-prof-now) uocr uocr-prof-now --pages 1024 --modes b --profile 1000,150 ;;
    uocr-prof-be) uocr uocr-prof-be --pages 1024 --modes b --batch-encoder --profile 1000,150 ;;
    # the decode step's host time by Python function (the sixth lease's profile: 12.6 ms of host work a step
    # against 6.5 ms of kernels, unattributed): Python calls traced too, 30 steps (the tracer slows the host)
    uocr-prof-stack) uocr uocr-prof-stack --pages 1024 --modes b --profile 1000,30 --profile-stack ;;
    # the batched encoder against vLLM's, on the real modules (random weights): equal embeddings, ms a page
    uocr-encoder) py uocr-encoder bench/gpu/check_encoder_batch.py --pages 16 ;;
    # where the batched encoder's ~20 ms a page go (its kernels, the GPU's busy share of a call), and the same
    # under torch.compile (equal embeddings, ms a page, the compile's seconds): a prefill is ~28 ms a page
    uocr-encoder-prof) py uocr-encoder-prof bench/gpu/check_encoder_batch.py --pages 16 --profile --compile ;;
    # SAM's attention with its relative-position bias folded into the dot products (patches.samattn), values as
    # they are and padded, against the bias made in full for PyTorch's memory-efficient kernel: 18% of a page's
    # GPU time (uocr-prof-now). (FlexAttention adding the bias in its kernel made 0.151x, 2026-12-06: gone)
    uocr-samfold) py uocr-samfold bench/gpu/check_encoder_batch.py --pages 16 --sam-attn fold,fold-pad --profile ;;
    # the prefill step's attention (~7 ms a page of kernels, uocr-prof-now) under larger launch sizes than vLLM's
    # 16-row query blocks and 32-key tiles: the same output, ms a call (bench/gpu/check_rswa_tiles.py)
    uocr-prefill-tiles) py uocr-prefill-tiles bench/gpu/check_rswa_tiles.py --prefill-tiles 50 ;;
    # the fastest of those sizes on the mixed step (64,64,8 where uocr-prefill-tiles has not run) in the engine
    # (BATCHOCR_PREFILL_TILES: rswa_tiles' install rewrites the launcher too): page b against it, equal work
    uocr-prefill-e2e) sizes=$(tiles_pick); sizes=${sizes% *}
      uocr uocr-prefill-e2e --pages "${UOCR_PREFILL_PAGES:-1024}" --lengths B --modes b \
        --variant "tiles=--env BATCHOCR_PREFILL_TILES=$sizes" ;;
    # the image views handed to the engine as bytes (patches.pixels) against vLLM's floats on vLLM's real processor
    # and real pages: the same model input, value for value (exit 1 if not), the bytes a page hands over
    # (and through the model's half, vLLM's embed_multimodal with the batched encoder: the same embeddings)
    uocr-pixels) py uocr-pixels bench/gpu/check_pixels.py
                 py uocr-pixels-embed bench/gpu/check_encoder_batch.py --pages 4 --repeats 1 --pixels-u8 ;;
    # the same in the engine (engines.vllm.pixel_bytes, on in the unlimited-ocr preset: the engine installs the
    # processor's half, the batched encoder the model's): page b against b with vLLM's floats, equal work; the
    # engine core's host time and the host's memory are what it saves. --warmup 32 in each process (here and in
    # uocr-samfold-e2e, uocr-cg): the first process on a fresh machine pays cold compiles in its first steps
    uocr-pixels-e2e) uocr uocr-pixels-e2e --pages "${UOCR_PIXELS_PAGES:-1024}" --lengths B --modes b --warmup 32 \
                       --variant "floats=--no-pixel-bytes" ;;
    # engines.vllm.sam_fold (on in the unlimited-ocr preset: SAM's bias folded into its attention, fold-pad):
    # page b against b with vLLM's SAM attention, equal work
    uocr-samfold-e2e) uocr uocr-samfold-e2e --pages "${UOCR_SAMFOLD_PAGES:-1024}" --lengths B --modes b --warmup 32 \
                        --variant "vllmsam=--no-sam-fold" ;;
    # the n-gram processor's write of a step's bans: the host no longer waits out the forward (seconds, torch only)
    uocr-ban-sync) py uocr-ban-sync bench/gpu/check_ban_sync.py ;;
    # vLLM 0.26 has no fused-MoE config for Unlimited-OCR's experts (E=64, N=896): the default's tiles
    # against a grid's at each token count a step has, the best written as vLLM's config file
    uocr-moe-tune) py uocr-moe-tune bench/gpu/moe_tune.py --model "$MODELS/unlimited-ocr" ;;
    # document mode sends 8 pages' base views a request, which vLLM's encoder takes one at a time: a and b
    # with the batched encoder (a's engine too: batchocr's engine arguments), then b in page mode on the
    # same pages and output tokens (a group's max_tokens is its pages' lengths): the issue's mode goal
    uocr-doc-be) uocr uocr-doc-be --mode document --pages 1024 --modes a,b --batch-encoder \
                   --variant "pagemode=--mode page" ;;
    # one run for both goals (5 engines; the fifth lease measured 5-8 min each: too long for one lease):
    # page b (processor, V1, admit 16) against page b with the batched encoder, document mode a and b (with it, where uocr-encoder did
    # not find it unequal on the GPU: then without), page b with it at 512 sequences (the decode
    # share), and page b with vLLM's encoder CUDA graphs
    uocr-modes) local be=--batch-encoder; said uocr-encoder "d['same'] is False" && be=""
                TP_TIMEOUT=2700 uocr uocr-modes --pages 1024 --modes b --no-batch-encoder \
                  --variant "$BATCH_ENCODER" --variant "doc${be:+be}=--mode document --modes a,b $be" \
                  --variant "seqs512${be:+be}=--max-num-seqs 512 $be" --variant "$ENC_GRAPHS" ;;
    # the sixth lease's run (3 engines, ~17 min): page b (processor, V1, admit 16) against page b with the
    # batched encoder at equal work, then document mode a and b with it in groups of 4 pages (1,024 pages in
    # 256 requests fill the 256 sequences; in groups of 8, 128 requests filled half: the fifth lease's a)
    uocr-be-doc) TP_TIMEOUT=1700 uocr uocr-be-doc --pages 1024 --modes b --no-batch-encoder \
                   --variant "$BATCH_ENCODER" --variant "docbe4=--mode document --group-pages 4 --modes a,b --batch-encoder" ;;
    # document mode against page mode over several waves (the sixth lease's 256 groups were one wave that
    # drained): 4,096 pages, page b and document b in groups of 4 (1,024 requests), both with the
    # batched encoder (the default); equal output tokens (2 engines, ~17 min)
    uocr-waves) TP_TIMEOUT=1700 uocr uocr-waves --pages 4096 --modes b --variant "doc4=--mode document --group-pages 4" ;;
    # issue 53: document mode's default group size at equal work, 2,048 pages of 16-page documents: page b
    # against document b in groups of 4 (512 requests: two waves of 256 sequences); UOCR_DOC_GROUPS adds
    # more sizes (e.g. "4 8"; 8 is as many as fit, the default before: 256 requests, one wave). ~9 min
    uocr-docgroup) set -- ; for g in ${UOCR_DOC_GROUPS:-4}; do set -- "$@" --variant "doc$g=--mode document --group-pages $g"; done
                   TP_TIMEOUT=1700 uocr uocr-docgroup --pages "${UOCR_DOC_PAGES:-2048}" --modes b "$@" ;;
    # R-SWA's attention reading only the tiles it can see (batchocr.engines.vllm.patches.rswa_tiles): the kernels compared on the
    # GPU (seconds, no model); page b against page b with it, 1,024 pages (2 engines, ~9 min); document b
    # in groups of 4 against the same with it (2 engines, ~7 min; longer outputs: more tiles skipped)
    uocr-rswa-check) py uocr-rswa-check bench/gpu/check_rswa_tiles.py --time 20 ;;
    # (page mode's default since the seventh lease: its b says --no-rswa-tiles)
    uocr-tiles) uocr uocr-tiles --pages 1024 --modes b --no-rswa-tiles --variant "tiles=--rswa-tiles" ;;
    uocr-tiles-doc) uocr uocr-tiles-doc --mode document --group-pages 4 --pages 1024 --modes b \
                      --variant "tiles=--rswa-tiles" ;;
    # the decode step's levers against one b (the defaults: processor on V1, batched encoder, admit 16),
    # each its own engine, 1,024 pages, equal work: rswa_tiles, the sampler's bans on V2 (which runner, now
    # that the batched encoder is the default: the fourth lease's V2 b was faster across machines, with
    # vLLM's encoder), and two engine processes sharing the GPU (host-bound steps: one's host work over the
    # other's GPU work). uocr-tiles and uocr-engines in one run, one baseline (4 engines, ~18 min)
    # (ran in the seventh lease, before rswa_tiles was page mode's default: its b says --no-rswa-tiles)
    uocr-decode) TP_TIMEOUT=1700 uocr uocr-decode --pages 1024 --modes b --no-rswa-tiles --variant "tiles=--rswa-tiles" \
                   --variant "$SAMPLER_BANS" \
                   --variant "engines2=--engines 2 --gpu-memory-utilization 0.44 --render-workers 4" ;;
    # the issue's page-mode goal where a shard's start and drain weigh less: 4,096 pages, b at the defaults
    # (rswa_tiles on since the seventh lease) against two engine processes sharing the GPU and against
    # batchocr's own engines.vllm.instances 2 (two engines in its one process; ~22 min). inst2 first: the
    # eighth lease measured b and engines2 (1.399x at 4,096 pages) and lost inst2 with the machine
    uocr-goal) TP_TIMEOUT=1700 uocr uocr-goal --pages 4096 --modes b \
                 --variant "inst2=--instances 2" \
                 --variant "engines2=--engines 2 --gpu-memory-utilization 0.44 --render-workers 4" ;;
    # the half of uocr-goal that two leases lost (each machine went back mid-run): b against instances 2,
    # 2,048 pages, to fit what device time a session has left (~11 min)
    uocr-inst2) TP_TIMEOUT=1100 uocr uocr-inst2 --pages 2048 --modes b --variant "inst2=--instances 2" ;;
    uocr-doc-sampler) uocr uocr-doc-sampler --mode document --pages 1024 --modes a,b --variant "$SAMPLER_BANS" ;;
    # batchocr run --processes 2 against 1, the whole command at equal work (bench/gpu/processes.py):
    # the product form of uocr-goal's engines2 (~17 min: two loads, 4,096 pages twice)
    # PROC_ARGS: e.g. "--processes 2 --lengths B" (lognormal lengths), "--mode document" (groups of 4)
    uocr-processes) PY_TIMEOUT=1700 py uocr-processes bench/gpu/processes.py --models "$MODELS" --work /tmp/proc \
                      --pages 4096 --timeout 900 ${PROC_ARGS:-} ;;
    # issue 53's throughput goal: jobs/aks-vllm.yaml's `processes: auto` (2 on an 80 GB card, 3 on a 141 GB one)
    # against one process, 4,096 pages, lognormal lengths, whole commands at equal work; the goal's measure is
    # each run's engine_span_output_tokens_per_s (first page handed to an engine to the last row) and
    # gpu_busy_pct_steady (~15 min on an H100)
    uocr-auto) auto uocr-auto /tmp/proc ;;
    # the same without NVIDIA's MPS (engines.vllm.mps false; the product starts a daemon of the run's own
    # where nvidia-cuda-mps-control is on PATH, so uocr-auto has it there): what MPS gives at the product
    # level (the thirty-third lease, 1,536 pages: 1.208x over the engines' span, the daemon started by the
    # suite). Equal work with uocr-auto (--src); its own caches
    uocr-auto-nomps) auto uocr-auto-nomps /tmp/proc-nomps --vllm mps=false ;;
    # the same with vLLM's SAM attention (engines.vllm.sam_fold false; the preset's default folds its bias in):
    # what sam_fold gives at the product level. Equal work with uocr-auto: its documents' folder (a page's
    # length follows its path); its own caches
    uocr-auto-nofold) auto uocr-auto-nofold /tmp/proc-nofold --vllm sam_fold=false ;;
    # issue 53's baseline beside uocr-auto: vLLM alone (throughput.py's mode c: batchocr's engine arguments, the pages
    # rendered beforehand, `generate` over 2,048 of them at a time; one call over 4,096 would hold every page's
    # processed inputs, ~64 GB at 2,048), over uocr-auto's documents and lengths (--src /tmp/proc/src, made where
    # absent): equal work with uocr-auto (~17 min on an H100)
    uocr-alone) TP_TIMEOUT=1700 uocr uocr-alone --pages "${UOCR_AUTO_PAGES:-4096}" --lengths B --modes c \
                  --chunk "${UOCR_ALONE_CHUNK:-2048}" --src /tmp/proc/src ;;
    # the same with the GPU-time levers that won at kernel level in this suite's earlier runs, in every
    # engine's environment: the prefill's larger launch sizes (uocr-prefill-tiles: >= 1.05x on the mixed step)
    # and the MoE's tuned tiles (uocr-moe-tune: >= 1.05x at 128-512 tokens); their names in the log. Equal
    # work with uocr-auto: its documents' folder (a page's length follows its path); its own caches
    uocr-auto-fast) local levers="" tiles moe; tiles=$(tiles_pick); moe=$(moe_pick)
      gains "${tiles#* }" && levers="BATCHOCR_PREFILL_TILES=${tiles% *}"
      gains "${moe#* }" && levers="$levers VLLM_TUNED_CONFIG_FOLDER=${moe% *}"
      echo "$(date +%T) uocr-auto-fast levers: ${levers:-none}" >>"$RES/suite.log"
      [ -n "$levers" ] && (export $levers; auto uocr-auto-fast /tmp/proc-fast) ;;
    # the parts' builds at once (auto: each the KV its share leaves, given) against in turn with the same KV each
    # (2%GIB: vLLM's kv_cache_memory_bytes, so the parts take turns), then at once again: each from `batchocr
    # warm`'s compile cache, 256 pages; first_request_s (the issue's "first page") and the runs' wall_s. The
    # twenty-seventh lease's at once came 9 s later than the twenty-sixth's in turn, on another machine (~6 min)
    # UOCR_TURNS_PROCS: the runs in order, for a short lease (e.g. 2%21.84,auto: ~90 s less). UOCR_TURNS_ROOT
    # (processes.py --warm-root): warm (batchocr's way: the compile cache at the path `batchocr warm` compiled in)
    # or own (a copy of it without that path: into the run's own root), e.g. warm,own,own,warm
    uocr-turns) PY_TIMEOUT=1700 py uocr-turns bench/gpu/processes.py --models "$MODELS" --work /tmp/turns \
                  --pages "${UOCR_TURNS_PAGES:-256}" --lengths B --timeout 900 \
                  --processes "${UOCR_TURNS_PROCS:-auto,2%${UOCR_TURNS_KV:-21.84},auto}" \
                  --caches warm --no-cold --warm-pages 16 --warm-root "${UOCR_TURNS_ROOT:-warm}" ${TURNS_ARGS:-} ;;
    # a command's start (docs/history/GPU.md, twelfth lease: first row ~200 s from cold caches, 83 s warm): in turn cold
    # (the seed), then at once and in turn again each from a copy of the first run's caches (a pod whose
    # $HOME/.cache comes from a volume); 3,072 pages, the lognormal lengths (~19 min)
    # UOCR_START_PAGES: fewer pages for a short lease (a command's start does not depend on them)
    # UOCR_START_PROCS: the commands in turn (processes.py --processes), e.g. 2,2: cold, then seeded
    # UOCR_START_CACHES=warm: `batchocr warm` fills a compile cache first; the first command cold, the next from it
    uocr-start) PY_TIMEOUT=1700 py uocr-start bench/gpu/processes.py --models "$MODELS" --work /tmp/start \
                  --pages "${UOCR_START_PAGES:-3072}" --lengths B --timeout 900 --processes "${UOCR_START_PROCS:-2,2@48,2}" --caches "${UOCR_START_CACHES:-seeded}" \
                  ${START_ARGS:-} ;;
    uocr-kill) py uocr-kill bench/gpu/e2e.py --skip full,sigterm --documents 32 --pages-per-doc 8 ;;
    # the run's own process killed (SIGKILL) with its two parts under the run's MPS daemon: the parts
    # follow it, the daemon is left, the rerun reaps it and completes every page once (e2e.py's step 4)
    uocr-mpskill) py uocr-mpskill bench/gpu/e2e.py --skip full,sigterm,kill --documents 32 --pages-per-doc 8 ;;
    uocr-check) py uocr-check bench/gpu/check_layout.py "$MODELS/unlimited-ocr" ;;
    # issue 49: the rebuild kept the speed. Each layout at equal work, on the same pages and output
    # lengths: a (vLLM alone) with the old tree, whose process pays the cold compile caches; b with the
    # old tree; b with this one; each its own process (one process imports one batchocr), then
    # compare_trees.py (equal work, new/old and b/a). Unlimited-OCR's page mode first (the headline:
    # a lease cut short still has it), then the 7B layout; ~16 min on an H100 (REBUILD_CALLS.txt)
    rebuild) run rebuild-uocr; run rebuild-7b ;;
    rebuild-uocr) trees rebuild-uocr uocr --pages "${REBUILD_UOCR_PAGES:-512}" ;;
    # issue 53's start: batchocr's engines build with the preset's max_model_len (unlimited-ocr's 32,768, which
    # document mode needs), throughput.py's page mode with 8,192; page b against b at 32,768, 512 pages at equal
    # work: each engine's build (vLLM's "init engine" and "Graph capturing finished" in the logs beside the JSON)
    # and pages/s, from the machine's warm caches (after another uocr run); 32,768 twice, since its first build
    # compiles for its own config (a cold compile captured slowly in the thirtieth lease) and the second does not
    uocr-mml) uocr uocr-mml --pages "${UOCR_MML_PAGES:-512}" --lengths B --modes b --warmup 32 \
                --variant "mml32k=--max-model-len 32768" --variant "mml32k_again=--max-model-len 32768" ;;
    # issue 53's tokens: at ~95% busy the GPU's time a token is what is left, and a decode step's attention reads
    # each request's KV (~78% of the card's bandwidth, history/GPU.md 26th lease): page b against b with an FP8
    # KV cache (half the bytes; its effect on the text is not measured with random weights), 512 pages
    uocr-kvfp8) uocr uocr-kvfp8 --pages "${UOCR_KVFP8_PAGES:-512}" --lengths B --modes b --warmup 32 \
                  --variant "kvfp8=--engine-arg kv_cache_dtype=fp8" ;;
    # issue 53's start: fewer CUDA graphs to capture (vLLM 0.26 captures 51 piecewise sizes up to 512 and 35
    # full ones up to 256 for 256 sequences: ~15 s of an engine's build on the H200); page b against b with 13
    # sizes up to 256, 512 pages at equal work: llm_init_s of each (b's in the JSON's top level, the
    # variants' in b_cg13, b_cg13_again) and pages/s (a decode batch pads up to the next size: at most 31 rows of 256)
    # (twice: the first build with 13 sizes compiles for its own config, the second from the cache)
    uocr-cg) cg13='--engine-arg compilation_config={"cudagraph_capture_sizes":[1,2,4,8,16,32,64,96,128,160,192,224,256]}'
             uocr uocr-cg --pages "${UOCR_CG_PAGES:-512}" --lengths B --modes b --warmup 32 \
               --variant "cg13=$cg13" --variant "cg13_again=$cg13" ;;  # no spaces in $cg13: a variant splits on them
    # vLLM's encoder CUDA graphs (DeepSeek-OCR's global and local paths, V1 runner) against the batched
    # encoder's eager calls, which took 15.7% of the engine core's thread (uocr-spy, 2026-12-06); at most 4
    # global views and 48 crops a graph, what vLLM's start-up profile encodes at once; 0.85 for both (the
    # graphs' memory is taken after the KV cache's)
    uocr-encgraphs) uocr uocr-encgraphs --pages "${UOCR_ENCG_PAGES:-1024}" --lengths B --modes b --gpu-memory-utilization 0.85 \
               --variant 'encg=--engine-arg compilation_config={"cudagraph_mm_encoder":true,"encoder_cudagraph_token_budgets":[1200,2400,4800],"encoder_cudagraph_max_vision_items_per_batch":4}' ;;
    # issue 53: where the engine core's host time goes, sampled (bench/gpu/pyspy.py): page b at the preset's
    # defaults, 1,024 pages, lognormal lengths, py-spy on the engine core from 30 s in for 30 s (the steady
    # state: 256 running); by thread and function in b_batchocr.py_spy, the raw samples beside the JSON (~3 min)
    uocr-spy) uocr uocr-spy --pages "${UOCR_SPY_PAGES:-1024}" --lengths B --modes b --py-spy "${UOCR_SPY:-30,30}" ;;
    # issue 53: the 7B layout's b/a at equal work, a and b in one process (no regression elsewhere: 1.07 end to end)
    qwen7b-ab) tp qwen7b-ab "--model=$MODELS/qwen2.5-vl-7b" --pages "${QWEN7B_PAGES:-512}" --modes a,b ;;
    rebuild-7b) trees rebuild-7b tp "--model=$MODELS/qwen2.5-vl-7b" --pages "${REBUILD_7B_PAGES:-256}" ;;
    *) echo "unknown run $1" >>"$RES/suite.log" ;;
  esac
}
for r in ${RUNS:-tp-7b tp-2b tp-7b-fp8}; do run "$r"; done
echo "$(date +%T) suite done" >>"$RES/suite.log"
