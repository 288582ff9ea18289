#!/usr/bin/env bash
# The service's GPU session in ONE device call (<= 550 s): the GPU service tests, the acceptance
# check (bench/checks/service_gpu.py), the benchmark (bench/service.py: decode 64x1x65,536 K=512,
# decode 128x2x32,768 K=1024, prefill 8,192x65,536 K=512; in-process graph runner, ipc, HTTP over
# UDS with out regions, HTTP over TCP) and the service's own cost (bench/service_overhead.py,
# operator mocked, 64 rows), then the host's own floor of a Unix-socket round trip (bench/probes/uds_pingpong.py).
# No network there: torch/triton come with the image, the service's
# other wheels are carried in .whl (bench/device/gpu_service_wheels.sh, here, once), and the
# project is imported from the work tree (bench/device/gpu_env.sh). The lead runs:
#   bash bench/device/gpu_service_wheels.sh     # here, once (needs the package index)
#   run(command="bash bench/device/service_session.sh", carry=[".whl"], timeout_s=600)
# Every step has its own time limit (env: TESTS_S, CHECK_S, BENCH_S, OVERHEAD_S; SHAPES picks the
# benchmark's shapes); JSON, PNG and logs land in $OUT (service-session.log is the whole log).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
LOG="$OUT/service-session.log"
: > "$LOG"
source bench/device/gpu_env.sh || exit 1
require_wheels
status=0
step() {  # step SECONDS COMMAND...: run with a time limit, log, remember failures
  local limit=$1; shift
  echo "== [$(date +%T)] $* (limit ${limit}s)" | tee -a "$LOG"
  # SIGINT first: pytest then reports where it stopped and writes its junit XML, and a service start it interrupts
  # prints the service's log (bench/common/service_process.py)
  timeout -s INT --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "== exit $rc" | tee -a "$LOG"
  [ "$rc" -eq 0 ] || status=1
}
step 10 nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv
step 30 python3 -c 'import torch, triton, msgspec, fastapi, uvicorn, pydantic, httptools; print("torch", torch.__version__, "triton", triton.__version__, "msgspec", msgspec.__version__, "fastapi", fastapi.__version__, "uvicorn", uvicorn.__version__, "httptools", httptools.__version__)'
step "${TESTS_S:-150}" python3 -m pytest tests/service/test_gpu.py -v -rs -p no:cacheprovider -o addopts="" --durations=0 --junitxml="$OUT/service-gpu-tests.xml"
step "${CHECK_S:-120}" python3 -m bench.checks.service_gpu --backend auto --rows 256 --keys 4096 --out "$OUT"
step "${BENCH_S:-200}" python3 -m bench.service --shapes "${SHAPES:-decode64,decode128,prefill}" --out "$OUT"
step "${OVERHEAD_S:-50}" python3 -m bench.service_overhead --device cuda:0 --rows 64 --iters 300 --out "$OUT"
step 30 python3 -m bench.probes.uds_pingpong --iters 5000 --out "$OUT"
echo "service_session: exit $status" | tee -a "$LOG"
exit $status
