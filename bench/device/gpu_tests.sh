#!/usr/bin/env bash
# The kernels' test suite on the GPU (compiled kernels; `gpu`-marked tests run too), in parallel pytest
# workers (pytest-xdist, in the image) sharing the one GPU: `make test-gpu` without the virtual environment.
# Its log, junit XML and the slowest tests land in $OUT (or bench/results). Time limit: TESTS_S (default 300 s);
# GPU_WORKERS (default 8); TEST_PATHS (default tests/kernels; add tests/service/test_gpu.py with the wheels).
#   run(command="bash bench/device/gpu_tests.sh", timeout_s=400)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
source bench/device/gpu_env.sh || exit 1
timeout --kill-after=10 "${TESTS_S:-300}" python3 -m pytest ${TEST_PATHS:-tests/kernels} -q -p no:cacheprovider -o addopts= \
  -n "${GPU_WORKERS:-8}" -rfE --durations=12 --junitxml="$OUT/gpu-tests.xml" > "$OUT/gpu-tests.log" 2>&1
rc=$?
grep -E "passed|failed|error" "$OUT/gpu-tests.log" | tail -3
grep -E "^(FAILED|ERROR)" "$OUT/gpu-tests.log" | head -20
echo "gpu_tests: exit $rc"
exit $rc
