#!/usr/bin/env bash
# One device call that runs every H200 measurement of a session within the 600 s limit, each
# step with its own time limit; all outputs are packed into $OUT/results.tgz (the device tool
# returns at most 8 files). Carry `.whl` (bench/device/gpu_service_wheels.sh) for the service step.
#   run(command="bash bench/device/h200_session.sh", carry=[".whl"], timeout_s=600)
# CALIBRATION=scan makes the bench, timeline and embed steps run LiteTopKTuning(calibration="scan").
# decode: the decode benchmark, its JSON and PNG also copied into $OUT; DECODE_ARGS="--quick" for the goal shapes,
# DECODE_TIMEOUT (default 560 s) its limit (the benchmark starts no case after DECODE_TIMEOUT - 40 s, then writes
# what it measured); LITETOPK_COMMIT=<sha> names the commit in its JSON (the copy there has no .git: write
# the sha of `git rev-parse HEAD` here into the command); DECODE_ARGS="--batch 1 8 --tag h100-a" and the like
# split the full grid over several calls. paged: bench.probes.paged_probe (PAGED_ARGS="--shapes ..."); pagedtests:
# the paged mode's GPU tests (log kept):
#   run(command="STEPS=decode DECODE_ARGS=--quick LITETOPK_COMMIT=<sha> bash bench/device/h200_session.sh")
set -uo pipefail
cd "$(dirname "$0")/../.."
RES=/tmp/h200-results
mkdir -p "$RES"
source bench/device/gpu_env.sh || exit 1
STEPS="${STEPS:-check bench gputests}"
for step in $STEPS; do
  case $step in
    timeline) OUT=$RES TAG=${TAG:-new} timeout ${TIMELINE_TIMEOUT:-150} python3 -m bench.probes.stage_timeline 2>&1 | tail -30 ;;
    gluon) OUT=$RES timeout ${GLUON_TIMEOUT:-300} python3 -m bench.probes.gluon_probe 2>&1 | tail -12 ;;
    wide) OUT=$RES timeout ${WIDE_TIMEOUT:-200} python3 -m bench.probes.gluon_wide_probe 2>&1 | tail -4 ;;
    split) OUT=$RES timeout 200 python3 -m bench.probes.gluon_split_probe 2>&1 | tail -4 ;;
    tuning) OUT=$RES timeout ${TUNING_TIMEOUT:-200} python3 -m bench.probes.scan_tuning --keys ${TUNING_KEYS:-65536} 2>&1 | grep -v "^results" | tail -30 ;;
    check) timeout 100 python3 -m bench.checks.production --sample-rows 16 --out "$RES" 2>&1 | tail -6 ;;
    bench) timeout ${BENCH_TIMEOUT:-150} python3 -m bench.operator --model all --raw-context ${RAW:-262144} --processes ${PROCS:-3} \
             --selectors ${SELECTORS:-torch} --spread ${SPREADS:-0} --calibration ${CALIBRATION:-sample} --out "$RES" \
             --tag ${BENCH_TAG:-h200} 2>&1 | tail -16 ;;
    service) OUT=$RES/service timeout ${SERVICE_TIMEOUT:-570} bash bench/device/gpu_service_check.sh 2>&1 | tail -25 ;;
    servicediag)  # the service alone on cuda:0: its own log up to readiness
      require_wheels
      (timeout 75 python3 -m litetopk.service --device cuda:0 --port 0 --uds /tmp/diag.sock --log-level info \
        > "$RES/service-diag.log" 2>&1 &)
      for i in $(seq 1 70); do sleep 1; python3 -m litetopk.service --check readyz --uds /tmp/diag.sock >/dev/null 2>&1 && break; done
      echo "ready after ${i}s"; tail -40 "$RES/service-diag.log" ;;
    servicecheck) timeout 150 python3 -m bench.checks.service_gpu --backend auto --out "$RES/service" 2>&1 | tail -15 ;;
    gputests) timeout ${GPUTESTS_TIMEOUT:-150} python3 -m pytest tests/kernels/test_triton_backend.py tests/kernels/test_triton_selection.py tests/kernels/test_self_calibration.py \
                tests/kernels/test_embedding_gpu.py tests/kernels/test_graphs_gpu.py tests/kernels/test_radix_select.py tests/kernels/test_workspace.py tests/kernels/test_out_buffers.py -q -p no:cacheprovider -o addopts="" 2>&1 | tail -8 ;;
    gputests2)  # the same files in two pytest processes side by side (the GPU holds both), logs kept
      T=${GPUTESTS_TIMEOUT:-200}; O='-q -p no:cacheprovider -o addopts= -rf'
      timeout $T python3 -m pytest tests/kernels/test_triton_backend.py tests/kernels/test_triton_selection.py tests/kernels/test_wide_scoring.py \
        tests/kernels/test_self_calibration.py $O > "$RES/gputests-a.log" 2>&1 &
      timeout $T python3 -m pytest tests/kernels/test_embedding_gpu.py tests/kernels/test_graphs_gpu.py tests/kernels/test_radix_select.py tests/kernels/test_workspace.py \
        tests/kernels/test_out_buffers.py tests/kernels/test_validation.py $O > "$RES/gputests-b.log" 2>&1 &
      wait; tail -6 "$RES/gputests-a.log"; tail -6 "$RES/gputests-b.log" ;;
    embed) timeout ${EMBED_TIMEOUT:-200} python3 -m bench.embedding --calibration ${CALIBRATION:-sample} --out "$RES" ${EMBED_ARGS:-} 2>&1 | tail -16 ;;
    layouts) timeout ${LAYOUTS_TIMEOUT:-120} python3 -m bench.checks.layouts --rows 8192 --out "$RES" 2>&1 | tail -4 ;;
    hosttime) OUT=$RES timeout ${HOSTTIME_TIMEOUT:-100} python3 -m bench.probes.host_time 2>&1 | tail -12 ;;
    cprofile) OUT=$RES timeout ${CPROFILE_TIMEOUT:-120} python3 -m bench.probes.host_time --cprofile --keys ${CPROFILE_KEYS:-65536} 2>&1 | tail -4; head -c 9000 $RES/host-cprofile-h200.txt ;;
    glue) TRITON_INTERPRET=1 OUT=$RES timeout ${GLUE_TIMEOUT:-120} python3 -m bench.probes.host_time --glue --out "$RES" 2>&1 | head -3 ;;  # this host's Python, launches as no-ops
    runnertime) OUT=$RES timeout ${RUNNERTIME_TIMEOUT:-100} python3 -m bench.probes.host_time --runner 2>&1 | tail -30 ;;
    graphtests) timeout ${GRAPHTESTS_TIMEOUT:-120} python3 -m pytest tests/kernels/test_graphs_gpu.py tests/kernels/test_embedding_gpu.py -q -p no:cacheprovider -o addopts="" -rf 2>&1 | tail -8 ;;
    radix) timeout ${RADIX_TIMEOUT:-100} python3 -m bench.probes.radix_select_probe --out "$RES" ${RADIX_ARGS:-} 2>&1 | tail -${RADIX_TAIL:-12} ;;
    calib) timeout ${CALIB_TIMEOUT:-100} python3 -m bench.probes.calibration_probe --out "$RES" 2>&1 | tail -8 ;;
    selfcal) timeout ${SELFCAL_TIMEOUT:-240} python3 -m bench.probes.self_calibration_probe --out "$RES" ${SELFCAL_ARGS:-} 2>&1 | tail -12 ;;
    paged) timeout ${PAGED_TIMEOUT:-240} python3 -m bench.probes.paged_probe --out "$RES" ${PAGED_ARGS:-} 2>&1 | tail -${PAGED_TAIL:-24}
      cp "$RES"/paged-probe-*.json "$OUT"/ ;;
    pagedtests)  # the paged mode's tests (interpreter-marked ones run compiled here) and the operator suites on decode shapes
      timeout ${PAGEDTESTS_TIMEOUT:-200} python3 -m pytest tests/kernels/test_paged_scoring.py tests/kernels/test_reference_operator.py \
        tests/kernels/test_adapters_decode.py tests/kernels/test_out_buffers.py -q -p no:cacheprovider -o addopts= -rf -x \
        > "$RES/pagedtests.log" 2>&1; tail -12 "$RES/pagedtests.log" ;;
    decode) T=${DECODE_TIMEOUT:-560}
      timeout $T python3 -m bench.decode --out "$RES" --time-limit $((T - 40)) ${DECODE_ARGS:-} 2>&1 | tail -${DECODE_TAIL:-60}
      cp "$RES"/decode-*.json "$RES"/decode-*.png "$OUT"/ ;;
    *) echo "unknown step '$step' (timeline gluon wide split tuning check bench service servicediag servicecheck gputests gputests2 embed radix calib selfcal layouts hosttime cprofile glue runnertime graphtests decode paged pagedtests)" >&2 ;;
  esac
done
tar czf "$OUT/results.tgz" -C "$RES" .
