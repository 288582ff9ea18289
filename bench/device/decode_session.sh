#!/usr/bin/env bash
# The decode work's GPU session in ONE device call (<= 590 s): the Gluon paged kernel's variants timed
# side by side (bench.probes.paged_variants), Nsight Compute on the default one (gpu_ncu_paged.sh) while
# the paged mode's and the custom ops' GPU tests run beside it (correctness only: no timing then), the
# candidate selection at decode sizes (radix probe: one row with a one-row step's ~7x candidates, 64 rows),
# then the decode benchmark's goal shapes in what time is left. Logs and JSON in $OUT (results.tgz).
#   run(command="LITETOPK_COMMIT=<sha> bash bench/device/decode_session.sh", timeout_s=600)
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/device/gpu_env.sh || exit 1
RES=/tmp/decode-results
mkdir -p "$RES"
START=$(date +%s)
left() { echo $((${BUDGET:-585} - ($(date +%s) - START))); }
echo "== variants"; timeout ${VARIANTS_S:-180} python3 -m bench.probes.paged_variants --out "$RES" --reps 5 2>&1 | grep -v Warn | tail -12
T='-q -p no:cacheprovider -o addopts= -rf'
(timeout ${TESTS_S:-170} python3 -m pytest tests/kernels/test_paged_scoring.py tests/kernels/test_reference_operator.py \
   tests/kernels/test_adapters_decode.py tests/kernels/test_out_buffers.py tests/kernels/test_ops.py $T > "$RES/gputests.log" 2>&1) &
TESTS=$!
echo "== ncu"; OUT=$RES NCU_SHAPES=64x1x65536x512 NCU_TIMEOUT=${NCU_S:-110} bash bench/device/gpu_ncu_paged.sh 2>&1 | tail -30
wait $TESTS; echo "== tests"; tail -15 "$RES/gputests.log"
echo "== radix"
timeout 60 python3 -m bench.probes.radix_select_probe --out "$RES" --rows 1 --kept-factor 7 2>&1 | tail -22
timeout 60 python3 -m bench.probes.radix_select_probe --out "$RES" --rows 64 2>&1 | tail -22
T=$(( $(left) - 15 ))
if [ $T -gt 60 ]; then
  echo "== decode ($T s)"; timeout $T python3 -m bench.decode --out "$RES" --quick --time-limit $((T - 30)) 2>&1 | tail -14
fi
cp "$RES"/paged-variants-*.json "$OUT"/ 2>/dev/null
tar czf "$OUT/results.tgz" -C "$RES" .
echo "decode_session: $(( $(date +%s) - START )) s"
