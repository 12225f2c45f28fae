#!/usr/bin/env bash
# The GPU throughput suite (issue #5), all of it, into RESULTS_DIR:
#   7B layout bf16: a, c, b on 1,024 pages (max_num_seqs 256, the issue's settings),
#                   then a and b on 1,536 pages with max_num_seqs 512, b on 3,072 with 1024;
#   2B layout bf16: a, c, b on 1,280 pages;
#   7B layout FP8:  a, b on 1,024 pages, then b on 1,536 pages with max_num_seqs 512.
# With GPUS=2 (a machine of two GPUs) the two lanes run at once, one GPU each,
# else one after the other. Needs vLLM and the model folders of make_models.py.
#
#   GPUS=2 bash bench/gpu/suite.sh /tmp/res      # the run behind docs/BENCHMARKS.md
#   TP_ARGS="--fake --pages 16 --max-num-seqs 4 --chunk 8 --render-workers 1" bash bench/gpu/suite.sh /tmp/dry
#                                                # a dry run of the whole suite on the CPU
set -u
RES=${1:-/tmp/res}
MODELS=${MODELS:-/tmp/models}
mkdir -p "$RES"
export CUDA_DEVICE_ORDER=PCI_BUS_ID  # NVML and CUDA number the GPUs alike
cd "$(dirname "$0")/../.."

tp() {  # NAME GPU ARGS...: one throughput.py run, bounded in time, logged
  local name=$1 gpu=$2; shift 2
  echo "$(date +%T) start $name" >>"$RES/suite.log"
  CUDA_VISIBLE_DEVICES=$gpu timeout 1200 python3 bench/gpu/throughput.py "$@" ${TP_ARGS:-} --json "$RES/$name.json" \
    >"$RES/$name.log" 2>&1
  echo "$(date +%T) end $name rc=$?" >>"$RES/suite.log"
}

lane0() {
  local g=$1
  tp tp-7b-bf16 "$g" --model "$MODELS/qwen2.5-vl-7b" --pages 1024 --modes a,c,b
  tp tp-7b-bf16-seqs512 "$g" --model "$MODELS/qwen2.5-vl-7b" --pages 1536 --modes a,b --max-num-seqs 512
  # vLLM's own default for the LLM class on a GPU of >= 70 GiB (engine/arg_utils.py)
  tp tp-7b-bf16-seqs1024 "$g" --model "$MODELS/qwen2.5-vl-7b" --pages 3072 --modes b --max-num-seqs 1024
}

lane1() {
  local g=$1
  tp tp-2b-bf16 "$g" --model "$MODELS/qwen2-vl-2b" --pages 1280 --modes a,c,b
  tp tp-7b-fp8 "$g" --model "$MODELS/qwen2.5-vl-7b" --quantization fp8 --pages 1024 --modes a,b
  tp tp-7b-fp8-seqs512 "$g" --model "$MODELS/qwen2.5-vl-7b" --quantization fp8 --pages 1536 --modes b \
    --max-num-seqs 512
}

if [ "${GPUS:-1}" -ge 2 ]; then
  lane0 0 &
  lane1 1 &
  wait
else
  lane0 0
  lane1 0
fi
echo "$(date +%T) suite done" >>"$RES/suite.log"
