#!/usr/bin/env bash
# The decode work's GPU session in ONE device call (<= 590 s): the kernels' suite on the GPU
# (gpu_tests.sh, parallel workers; correctness only, nothing timed meanwhile), then the paged mode's
# tuning variants side by side (bench.probes.paged_variants), then the decode benchmark's goal shapes in
# what time is left. Logs and JSON in $OUT (results.tgz and the variants' JSON).
#   run(command="LITETOPK_COMMIT=<sha> bash bench/device/decode_session.sh", timeout_s=600)
# STEPS picks steps (default "tests variants decode"); TESTS_S, VARIANTS_S their limits; SHARD (default 1/2) the
# share of the kernels' test files (gpu_tests.sh; SHARD= with TEST_PATHS: those files alone); DECODE_ARGS more
# bench.decode arguments (e.g. "--dense-route-bytes 268435456 --dense-selector radix"). The step "service" runs
# service_session.sh (carry .whl) in the time left, shortened: SVC_SHAPES (default decode64), its log and JSON in
# results.tgz under service/.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/device/gpu_env.sh || exit 1
RES=/tmp/decode-results
mkdir -p "$RES"
START=$(date +%s)
left() { echo $((${BUDGET:-585} - ($(date +%s) - START))); }
for step in ${STEPS:-tests variants decode}; do
  case $step in
    tests) echo "== tests"; OUT=$RES TESTS_S=${TESTS_S:-270} SHARD=${SHARD-1/2} bash bench/device/gpu_tests.sh ;;
    variants) echo "== variants"
      timeout ${VARIANTS_S:-170} python3 -m bench.probes.paged_variants --out "$RES" --reps 5 2>&1 | grep -v Warn | tail -16 ;;
    decode) T=$(( $(left) - 15 ))
      if [ $T -gt 60 ]; then
        echo "== decode ($T s)"; timeout $T python3 -m bench.decode --out "$RES" --quick --time-limit $((T - 30)) ${DECODE_ARGS:-} 2>&1 | tail -14
      fi ;;
    service) T=$(( $(left) - 10 ))
      if [ $T -gt 90 ]; then
        echo "== service ($T s)"
        U=$(( T - 45 ))  # nvidia-smi, the imports and the socket probe: ~45 s
        # shares from session 20's H100 run (tests 26 s, check 26, decode64's benchmark 89 with its service's start)
        OUT=$RES/service TESTS_S=$(( U * 25 / 100 )) CHECK_S=$(( U * 20 / 100 )) BENCH_S=$(( U * 47 / 100 )) \
          OVERHEAD_S=$(( U * 8 / 100 )) SHAPES=${SVC_SHAPES:-decode64} bash bench/device/service_session.sh 2>&1 \
          | grep -E "^== |passed|failed|ipc|uds|tcp|in-process|block|spin|exit" | tail -40
      fi ;;
    *) echo "unknown step $step (tests variants decode service)" ;;
  esac
done
cp "$RES"/paged-variants-*.json "$OUT"/ 2>/dev/null
tar czf "$OUT/results.tgz" -C "$RES" .
echo "decode_session: $(( $(date +%s) - START )) s"
