#!/usr/bin/env bash
# Nsight Compute on the paged scoring kernel (bench/probes/ncu_paged.py) at decode shapes: the full section
# set in $OUT/ncu-paged-<shape>.txt and each report's per-instruction SASS page (stall samples) as CSV.
#   run(command="bash bench/device/gpu_ncu_paged.sh", timeout_s=400); NCU_SHAPES="64x1x65536x512 ..."
# NCU_SKIP (default 2) picks the third call's launch of a routed shape (one launch a call); a shape the scan takes
# (over LiteTopKTuning.dense_route_bytes: two launches a call) needs NCU_SKIP=5, so run such shapes on their own.
# NCU_RADIX=1 also profiles a routed shape's radix selector in its default form, the digits form (the third call's five
# launches: floor, two counts, collect, finish; the candidates form makes four), into $OUT/ncu-radix-<shape>.txt, and
# prints each launch's duration, issue and stall lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/device/gpu_env.sh || exit 1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
[ -n "$NCU" ] || exit 0
for shape in ${NCU_SHAPES:-64x1x65536x512}; do
  rep=/tmp/ncu-paged-$shape
  timeout ${NCU_TIMEOUT:-200} "$NCU" --kernel-name regex:score_fp4_paged --launch-skip ${NCU_SKIP:-2} --launch-count 1 --set full \
    --import-source no -f -o "$rep" python3 -m bench.probes.ncu_paged --shape "$shape" ${NCU_PROBE_ARGS:-} 2>&1 | tail -3
  "$NCU" -i "$rep.ncu-rep" --print-details all > "$OUT/ncu-paged-$shape.txt" 2>&1
  "$NCU" -i "$rep.ncu-rep" --page source --print-source sass --csv > "$OUT/ncu-paged-sass-$shape.csv" 2>&1
  grep -E "score_fp4|Duration|Memory Throughput|DRAM Throughput|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Executed Ipc A|Eligible Warps|Achieved Occupancy|Registers Per|Stall" "$OUT/ncu-paged-$shape.txt" | head -40
  if [ "${NCU_RADIX:-0}" = 1 ]; then
    rep=/tmp/ncu-radix-$shape
    timeout ${NCU_RADIX_TIMEOUT:-150} "$NCU" --kernel-name regex:radix_ --launch-skip 10 --launch-count 5 --set full \
      --import-source no -f -o "$rep" python3 -m bench.probes.ncu_paged --shape "$shape" ${NCU_PROBE_ARGS:-} 2>&1 | tail -2
    "$NCU" -i "$rep.ncu-rep" --print-details all > "$OUT/ncu-radix-$shape.txt" 2>&1
    grep -E "radix_.*kernel|Duration|Issue Slots Busy|No Eligible|Achieved Occupancy|Warp Cycles Per Issued|L2 Hit Rate|Registers Per" \
      "$OUT/ncu-radix-$shape.txt" | head -45
  fi
done
