#!/usr/bin/env bash
# On the lent GPU machine (no network), after the kit's parts are in /tmp/kit
# (../shared/gpu/README.md: calls c0 and c1 copy them, the last call brings c2):
#
#   bash bench/gpu/device.sh start   # install vLLM + PyMuPDF, build the model folders,
#                                    # start suite.sh in its own session (it outlives the call)
#   bash bench/gpu/device.sh poll    # progress; results packed into $OUT/res.tar.xz
#
# Each call must come within 30 s of the last (the machine goes back when idle);
# a poll that sleeps (`sleep 500; bash bench/gpu/device.sh poll`) keeps it warm.
set -u
RES=/tmp/res
REPO=/tmp/repo
env_setup() {
  export PYTHONPATH=/tmp/site:/tmp/site2:$REPO VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
}
case "${1:-}" in
  start)
    set -e
    bash /tmp/kit/device_install.sh /tmp/kit /tmp/site >/tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 .whl/*.whl
    rm -rf "$REPO" && mkdir -p "$REPO" && cp -r batchocr bench tests "$REPO"/  # a copy the next call cannot touch
    env_setup
    python3 "$REPO/bench/gpu/make_models.py" /tmp/models
    nvidia-smi --query-gpu=index,name,memory.total --format=csv
    GPUS=$(nvidia-smi -L | wc -l) setsid nohup bash "$REPO/bench/gpu/suite.sh" "$RES" >/tmp/suite.out 2>&1 < /dev/null &
    sleep 3
    cat "$RES/suite.log" 2>/dev/null
    ;;
  poll)
    cat "$RES/suite.log" 2>/dev/null
    for f in "$RES"/*.log; do
      [ "$(basename "$f")" = suite.log ] && continue
      echo "== $(basename "$f")"; grep -E '^(a_|b_|c_|\{)' "$f" | cut -c1-400; tail -2 "$f" | cut -c1-300
    done
    nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
    [ -n "${OUT:-}" ] && tar -C "$RES" -cJf "$OUT/res.tar.xz" . 2>/dev/null
    ;;
  *)
    echo "usage: bash bench/gpu/device.sh start|poll" >&2; exit 2 ;;
esac
