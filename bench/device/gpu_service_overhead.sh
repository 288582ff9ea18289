#!/usr/bin/env bash
# The service's own cost on the H200, phase by phase (bench/NOTES-service.md says why). Run from
# the repository root through the device tool, carrying `.whl` (bench/device/gpu_service_wheels.sh):
#   run(command="bash bench/device/gpu_service_overhead.sh", carry=[".whl"], timeout_s=600)
# 1. bench/service_overhead.py with the operator mocked (8192 rows, K=512): every other cost of a
#    request on the GPU (IPC regions, D2D/D2H result writes, syncs, hand-offs, transport);
# 2. the same with the real Triton operator at the prefill shape (65,536 keys);
# 3. bench/service.py --shapes prefill (the table of bench/results/service-h200.json, now with
#    each mode's Server-Timing phases in the JSON).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
source bench/device/gpu_env.sh || exit 1
require_wheels
status=0
step() {  # step SECONDS COMMAND...: run with a time limit, log to $OUT/overhead.log
  local limit=$1; shift
  echo "== $*" | tee -a "$OUT/overhead.log"
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT/overhead.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}
step 150 python3 -m bench.service_overhead --device cuda:0 --rows 8192 --keys 65536 --iters 30
step 180 python3 -m bench.service_overhead --device cuda:0 --rows 8192 --keys 65536 --iters 20 --real --modes ipc,uds,tcp
step 240 python3 -m bench.service --shapes prefill --out "$OUT"
echo "gpu_service_overhead: exit $status" | tee -a "$OUT/overhead.log"
exit $status
