"""One device call (H200): the LiteTopK call's glue (everything but the scan) in one process.
Times the whole call and its stages with the glue kernels (row checks, calibration keys, scan
preparation) and, as A/Bs in the same process, with validation's torch checks and the torch
calibration keys instead; checks the results are equal; profiles one call (GPU busy vs wall).
Writes $OUT/glue-probe.json, $OUT/glue-profile.txt and $OUT/glue-trace.json.
    source bench/gpu_env.sh && OUT=/tmp python3 bench/glue_probe.py
"""

from __future__ import annotations

import json
import os

import torch

import litetopk.kernels.validation as validation
from litetopk.kernels import LiteTopKTuning, dense_topk_prefill, litetopk_prefill
from litetopk.kernels.backend import ScoringBackend
from litetopk.kernels.pipeline import calibrate
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.validation import validate_prefill

from problems_gpu import call_args, cuda_ms, prefill_problem, profile_call

OUT = os.environ.get("OUT", "/tmp")
FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status")
report = {"device": torch.cuda.get_device_name(0)}
tuning = LiteTopKTuning()
kernel_checks = validation.row_checks_run_as_kernel
kernel_keys = TritonBackend.calibration_keys


def glue(variant: str):
    """Switch the glue to `variant`: "kernels" (production), "torch_validation", "torch_calibration_keys"."""
    validation.row_checks_run_as_kernel = (lambda device: False) if variant == "torch_validation" else kernel_checks
    TritonBackend.calibration_keys = (ScoringBackend.calibration_keys if variant == "torch_calibration_keys"
                                      else kernel_keys)


for topk, raw in ((512, 262144), (1024, 262144), (512, 786432)):
    args, kw = call_args(prefill_problem(8192, raw, topk, seed=7))
    res = {}
    baseline = litetopk_prefill(*args, **kw, backend="triton")
    for variant in ("kernels", "torch_validation", "torch_calibration_keys"):
        glue(variant)
        got = litetopk_prefill(*args, **kw, backend="triton")
        res[f"{variant}_equal"] = all(torch.equal(getattr(got, f), getattr(baseline, f)) for f in FIELDS)
    for _ in range(2):  # two interleaved rounds
        for variant in ("kernels", "torch_validation", "torch_calibration_keys"):
            glue(variant)
            res.setdefault(f"{variant}_total", []).append(cuda_ms(lambda: litetopk_prefill(*args, **kw, backend="triton")))
            res.setdefault(f"{variant}_validate", []).append(cuda_ms(lambda: validate_prefill(*args, **kw)))
    glue("kernels")
    problem = validate_prefill(*args, **kw)
    be = TritonBackend()
    res["operands"] = cuda_ms(lambda: (setattr(be, "_prepared", None), be.operands(problem)))
    res["calibrate"] = cuda_ms(lambda: calibrate(problem, be, tuning))
    thr, ceil = calibrate(problem, be, tuning)
    res["scan"] = cuda_ms(lambda: be.scan_candidates(problem, thr, tuning.capacity(topk), ceilings=ceil))
    res["dense_total"] = cuda_ms(lambda: dense_topk_prefill(*args, **kw, backend="triton"))
    report[f"k{topk}_raw{raw}"] = res
    print(f"k{topk}_raw{raw}", res, flush=True)
    with open(os.path.join(OUT, "glue-probe.json"), "w") as f:
        json.dump(report, f, indent=1)

args, kw = call_args(prefill_problem(8192, 262144, 512, seed=7))
profile_call(lambda: litetopk_prefill(*args, **kw, backend="triton"), OUT, "glue")
print("profiled")
