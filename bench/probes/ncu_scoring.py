"""Nsight Compute view of the two scoring kernels (the Gluon kernel on sm_90: TritonBackend()'s choice) at the
production shape (Q = 8192, S = 65,536,
K = 512): one dense launch and one scan launch, after a warm-up of each. Run it under ncu:

    ncu --kernel-name regex:score_fp4 --launch-skip 3 --launch-count 2 \\
        --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy \\
        python3 -m bench.probes.ncu_scoring

(launch order: calibration sample, dense, scan, then again: the 4th and 5th launches are the
measured dense and scan). bench/device/gpu_ncu.sh runs it on the device and keeps the report.
"""

from __future__ import annotations

import torch

from bench.common.problems import call_args, prefill_problem
from litetopk.kernels import LiteTopKTuning
from litetopk.kernels.calibration import calibrate
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.validation import validate_prefill


def main() -> None:
    args, kw = call_args(prefill_problem(8192, 262144, 512, seed=7))
    problem = validate_prefill(*args, **kw)
    backend = TritonBackend()
    thresholds, ceilings = calibrate(problem, backend, LiteTopKTuning().sample_size)  # launch 1 (sample)
    capacity = LiteTopKTuning().capacity(512)
    for _ in range(2):  # launches 2, 3 (warm-up) and 4, 5 (measured)
        backend.score_dense(problem)
        backend.scan_candidates(problem, thresholds, capacity, ceilings=ceilings)
    torch.cuda.synchronize()
    print("done")


if __name__ == "__main__":
    main()
