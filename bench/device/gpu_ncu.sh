#!/usr/bin/env bash
# On the H200: Nsight Compute sections of the dense and scan scoring kernels (bench/probes/ncu_scoring.py).
#   run(command="bash bench/device/gpu_ncu.sh", timeout_s=400)
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/device/gpu_env.sh || exit 1
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
[ -n "$NCU" ] || { ls /usr/local/ 2>/dev/null; exit 0; }
timeout ${NCU_TIMEOUT:-300} "$NCU" --kernel-name regex:score_fp4 --launch-skip 3 --launch-count 2 \
  --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy \
  --section ComputeWorkloadAnalysis python3 -m bench.probes.ncu_scoring > "$OUT/ncu-scoring.txt" 2>&1
echo "rc $?"; grep -E "score_fp4|Duration|Issue Slots Busy|No Eligible|Stall|Warp Cycles Per Issued|SM Busy|Compute \(SM\) Throughput|Executed Ipc|Eligible Warps" "$OUT/ncu-scoring.txt" | head -60
