#!/usr/bin/env bash
# One device call that runs every H200 measurement of a session within the 600 s limit, each
# step with its own time limit; all outputs are packed into $OUT/results.tgz (the device tool
# returns at most 8 files). Carry `.whl` (bench/gpu_service_wheels.sh) for the service step.
#   run(command="bash bench/h200_session.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/.."
RES=/tmp/h200-results
mkdir -p "$RES"
source bench/gpu_env.sh || exit 1
STEPS="${STEPS:-probe check bench gputests}"
for step in $STEPS; do
  case $step in
    probe) OUT=$RES timeout ${PROBE_TIMEOUT:-200} python3 bench/triton_probe.py 2>&1 | grep -v '^sweep\|^sass_mix' | tail -6 ;;
    gluon) OUT=$RES timeout ${GLUON_TIMEOUT:-300} python3 bench/gluon_probe.py 2>&1 | tail -12 ;;
    wide) OUT=$RES timeout ${WIDE_TIMEOUT:-200} python3 bench/gluon_wide_probe.py 2>&1 | tail -4 ;;
    glue) OUT=$RES timeout ${GLUE_TIMEOUT:-200} python3 bench/glue_probe.py 2>&1 | tail -6 ;;
    variants) OUT=$RES timeout ${VARIANTS_TIMEOUT:-200} python3 bench/gluon_variants.py 2>&1 | tail -3 ;;
    timeline) OUT=$RES TAG=${TAG:-new} timeout ${TIMELINE_TIMEOUT:-150} python3 bench/glue_timeline.py 2>&1 | tail -40 ;;
    split) OUT=$RES timeout 200 python3 bench/gluon_split_probe.py 2>&1 | tail -4 ;;
    select) OUT=$RES timeout 200 python3 bench/select_probe.py 2>&1 | tail -3 ;;
    schedule) OUT=$RES timeout 120 python3 bench/schedule_probe.py 2>&1 | tail -5 ;;
    tuning) OUT=$RES timeout ${TUNING_TIMEOUT:-200} python3 bench/scan_tuning.py 2>&1 | tail -16 ;;
    check) timeout 100 python3 bench/check_production.py --sample-rows 16 --out "$RES" 2>&1 | tail -6 ;;
    bench) timeout ${BENCH_TIMEOUT:-150} python3 bench/operator.py --model all --raw-context ${RAW:-262144} --processes ${PROCS:-3} \
             --selectors torch --out "$RES" --tag h200 2>&1 | tail -12 ;;
    service) OUT=$RES/service timeout ${SERVICE_TIMEOUT:-570} bash bench/gpu_service_check.sh 2>&1 | tail -25 ;;
    servicediag)  # the service alone on cuda:0: its own log up to readiness
      require_wheels
      (timeout 75 python3 -m litetopk.service --device cuda:0 --port 0 --uds /tmp/diag.sock --log-level info \
        > "$RES/service-diag.log" 2>&1 &)
      for i in $(seq 1 70); do sleep 1; python3 -m litetopk.service --check readyz --uds /tmp/diag.sock >/dev/null 2>&1 && break; done
      echo "ready after ${i}s"; tail -40 "$RES/service-diag.log" ;;
    servicecheck) timeout 150 python3 bench/gpu_service_check.py --backend auto --out "$RES/service" 2>&1 | tail -15 ;;
    gputests) timeout 120 python3 -m pytest tests/kernels/test_triton_backend.py tests/kernels/test_triton_selection.py -q -p no:cacheprovider -o addopts="" 2>&1 | tail -4 ;;
  esac
done
tar czf "$OUT/results.tgz" -C "$RES" .
