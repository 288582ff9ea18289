#!/usr/bin/env bash
# The kernels' test suite on the GPU (compiled kernels; `gpu`-marked tests run too), in parallel pytest
# workers (pytest-xdist, in the image) sharing the one GPU: `make test-gpu` without the virtual environment.
# Its log, junit XML and the slowest tests land in $OUT (or bench/results). Time limit: TESTS_S (default 300 s);
# GPU_WORKERS (default 12); TEST_PATHS (default tests/kernels; add tests/service/test_gpu.py with the wheels);
# SHARD=i/n runs the i-th of n shares of the kernels' test files (every n-th file by name, from the i-th): the
# whole suite took more than one call's 590 s with 12 workers on an H100 (63 % in 400 s, 2026-12-06).
# The offline compile tests (test_*_compile.py, FlyDSL's: no GPU, CI runs them) are left out. Each test's
# outcome is logged as it ends (-v), so a run cut by its time limit still names its failures.
#   run(command="bash bench/device/gpu_tests.sh", timeout_s=400)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-bench/results}"
mkdir -p "$OUT"
source bench/device/gpu_env.sh || exit 1
IGNORE=$(ls tests/kernels/test_*compile*.py tests/kernels/test_flydsl_*.py | sed 's/^/--ignore=/')
PATHS=${TEST_PATHS:-tests/kernels}
if [ -n "${SHARD:-}" ]; then  # tests/kernels -> its files of share i of n (other paths stay)
  i=${SHARD%/*}; n=${SHARD#*/}
  files=$(ls tests/kernels/test_*.py | grep -v -e compile -e flydsl_ | awk -v i="$i" -v n="$n" '(NR - i) % n == 0')
  PATHS=$(echo "$PATHS" | sed "s#tests/kernels\b#$(echo $files)#")
fi
timeout --kill-after=10 "${TESTS_S:-300}" python3 -m pytest $PATHS $IGNORE -v -p no:cacheprovider \
  -o addopts= -n "${GPU_WORKERS:-12}" -rfE --durations=12 \
  --junitxml="$OUT/gpu-tests.xml" > "$OUT/gpu-tests.log" 2>&1
rc=$?
echo "passed $(grep -c ' PASSED ' "$OUT/gpu-tests.log"), skipped $(grep -c ' SKIPPED ' "$OUT/gpu-tests.log")"
grep -E " (FAILED|ERROR) |^(FAILED|ERROR) |[0-9]+ (passed|failed)" "$OUT/gpu-tests.log" | head -30
echo "gpu_tests: exit $rc"
exit $rc
