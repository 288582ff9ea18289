"""The Triton scoring kernel's tile / register-cap sweep (scoring_kernel="triton") at the production shape (Q = 8192, S = 65,536, K = 512):
dense and scan milliseconds per configuration, in one process (A/B). Writes $OUT/occupancy-sweep.json.
Nsight Compute (bench/gpu_ncu.sh) showed both kernels latency-bound at 2 CTAs (8 warps) per SM;
BLOCK_ROWS = 2 fits 3 CTAs at its natural 147-168 registers and 4 under a 128-register cap.
    OUT=/tmp python3 bench/occupancy_sweep.py   # on the device, with bench/gpu_env.sh sourced, from bench/
"""

from __future__ import annotations

import json
import os

import torch

from litetopk.kernels import LiteTopKTuning
from litetopk.kernels.pipeline import calibrate
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.validation import validate_prefill

from problems_gpu import call_args, cuda_ms, prefill_problem

args, kw = call_args(prefill_problem(8192, 262144, 512, seed=7))
problem = validate_prefill(*args, **kw)
capacity = LiteTopKTuning().capacity(512)
report = {"device": torch.cuda.get_device_name(0), "shape": "Q=8192 S=65536 K=512", "configs": {}}
baseline_top = None
for block_rows, max_registers in ((4, None), (2, None), (2, 128), (4, None)):
    backend = TritonBackend(block_rows=block_rows, max_registers=max_registers, scoring_kernel="triton")
    backend.operands(problem)
    thresholds, ceilings = calibrate(problem, backend, LiteTopKTuning())
    scan = backend.scan_candidates(problem, thresholds, capacity, ceilings=ceilings)
    top = backend.select_candidates(scan, 512)
    baseline_top = top if baseline_top is None else baseline_top
    name = f"rows{block_rows}_maxnreg{max_registers}"
    report["configs"][name + ("_again" if name in report["configs"] else "")] = dict(
        dense_ms=cuda_ms(lambda: backend.score_dense(problem)),
        scan_ms=cuda_ms(lambda: backend.scan_candidates(problem, thresholds, capacity, ceilings=ceilings)),
        same_top_as_first=bool(torch.equal(top, baseline_top)))
    print(name, report["configs"], flush=True)
with open(os.path.join(os.environ.get("OUT", "/tmp"), "occupancy-sweep.json"), "w") as f:
    json.dump(report, f, indent=1)
