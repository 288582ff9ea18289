#!/usr/bin/env bash
# The service on the H200, end to end. The lead runs this through the device tool from the
# repository root, carrying `.whl` (made here by bench/device/gpu_service_wheels.sh):
#   run(command="bash bench/device/gpu_service_check.sh", carry=[".whl"], timeout_s=600)
# It installs the wheels the image lacks, runs the GPU-marked service tests, starts the service
# pinned to cuda:0 and has a worker process register its CUDA cache by IPC handle and check the
# answers against in-process (bench/checks/service_gpu.py), then benchmarks bench/service.py at the
# decode and the Q=8192 x S=65,536 prefill shapes. Everything lands under $OUT (at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-bench/results}"
BACKEND="${BACKEND:-auto}"  # e.g. BACKEND=reference to check the service path without the Triton kernels
mkdir -p "$OUT"
source bench/device/gpu_env.sh || exit 1
require_wheels
status=0
step() {  # step SECONDS COMMAND...: run with a time limit, log to $OUT/check.log, remember failures
  local limit=$1; shift
  echo "== $*" | tee -a "$OUT/check.log"
  timeout "$limit" "$@" 2>&1 | tee -a "$OUT/check.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
}
# Budget: the device tool allows 600 s a command; the three steps stay under ~560 s.
step 10 nvidia-smi --query-gpu=name,uuid,driver_version,memory.total --format=csv
step 30 python3 -c 'import torch, triton, fastapi, uvicorn, pydantic; print("torch", torch.__version__, "triton", triton.__version__, "fastapi", fastapi.__version__, "uvicorn", uvicorn.__version__, "pydantic", pydantic.__version__)'
step 200 python3 -m bench.checks.service_gpu --backend "$BACKEND" --out "$OUT"
echo "== python3 -m bench.service" | tee -a "$OUT/check.log"
timeout 240 python3 -m bench.service --backend "$BACKEND" --shapes decode64,prefill --out "$OUT" 2>&1 | tee "$OUT/bench.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1
step 90 python3 -m pytest tests/service/test_gpu.py -q -rs -p no:cacheprovider -o addopts=""
echo "gpu_service_check: exit $status" | tee -a "$OUT/check.log"
exit $status
