#!/usr/bin/env bash
# On the H200 (one device call): install the carried FlashInfer wheels, JIT-compile its top_k once
# into a workspace kept for the call (~250 s the first time), then run the operator benchmark with
# both dense selectors. Carry `.whl` (bench/device/gpu_flashinfer_wheels.sh, bench/device/gpu_service_wheels.sh).
#   run(command="RAW='262144' PROCS=1 bash bench/device/gpu_flashinfer.sh", carry=[".whl"], timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/device/gpu_env.sh || exit 1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-fi .whl/flashinfer/*.whl || exit 1
export PYTHONPATH="$PYTHONPATH:/tmp/site-fi"
export FLASHINFER_CUDA_ARCH_LIST=9.0a FLASHINFER_WORKSPACE_BASE=/tmp/fi-ws
SITE=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
export CPATH="$(ls -d "$SITE"/nvidia/*/include 2>/dev/null | paste -sd:)${CPATH:+:$CPATH}"
RES=/tmp/fi-results; mkdir -p "$RES"
t0=$(date +%s)
timeout ${JIT_TIMEOUT:-330} python3 - <<'PY'
import time, torch, flashinfer
x = torch.randn(64, 65536, device="cuda")
t = time.time(); v, i = flashinfer.top_k(x, 513, sorted=True); torch.cuda.synchronize()
ref = torch.topk(x, 513, dim=1).values
print(f"flashinfer top_k JIT + first call {time.time() - t:.0f} s; values equal torch.topk: {torch.equal(v, ref)}")
PY
echo "jit step took $(( $(date +%s) - t0 )) s"
timeout ${BENCH_TIMEOUT:-240} python3 -m bench.operator --model all --raw-context ${RAW:-262144} --processes ${PROCS:-1} \
  --selectors torch flashinfer --out "$RES" --tag ${TAG:-h200-flashinfer} 2>&1 | tail -14
tar czf "$OUT/results.tgz" -C "$RES" .
