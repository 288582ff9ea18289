"""One device call (H200): A/B of compile-time variants of the Gluon scoring kernel in one process
(the only fair comparison, bench/NOTES.md), at the production shape (Q = 8192, S = 65,536, K = 512):
dense scoring and scan times per variant, rounds interleaved, and each variant's LiteTopK result
checked equal to the default's. Writes $OUT/gluon-variants.json.
    source bench/gpu_env.sh && OUT=/tmp python3 bench/gluon_variants.py
"""

from __future__ import annotations

import json
import os

import torch

import litetopk.kernels.triton.backend as triton_backend
from litetopk.kernels import LiteTopKTuning
from litetopk.kernels.pipeline import calibrate, run_litetopk
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.validation import validate_prefill

from problems_gpu import call_args, cuda_ms, prefill_problem

OUT = os.environ.get("OUT", "/tmp")
VARIANTS = {  # constexpr overrides of gluon_launch_options
    "default": {},
    "no_defer": {"DEFER_APPENDS": False},
    "buffers2": {"NUM_BUFFERS": 2},
    "buffers4": {"NUM_BUFFERS": 4},
}
launch_options = triton_backend.gluon_launch_options


def with_overrides(overrides):
    def options(**kw):
        constants, compiler = launch_options(**kw)
        return dict(constants, **overrides), compiler
    return options


p = prefill_problem(8192, 262144, 512, seed=7)
args, kw = call_args(p)
problem = validate_prefill(*args, **kw)
tuning = LiteTopKTuning()
backend = TritonBackend(scoring_kernel="gluon")
thr, ceil = calibrate(problem, backend, tuning)
cap = tuning.capacity(512)
report = {"device": torch.cuda.get_device_name(0), "variants": VARIANTS, "rounds": []}
baseline = run_litetopk(problem, backend, repair=True, tuning=tuning)
for name, overrides in VARIANTS.items():
    triton_backend.gluon_launch_options = with_overrides(overrides)
    result = run_litetopk(problem, backend, repair=True, tuning=tuning)
    report[f"{name}_equal_default"] = all(torch.equal(getattr(result, f), getattr(baseline, f))
                                          for f in ("values", "raw_indices", "physical_indices", "status"))
for _ in range(3):
    times = {}
    for name, overrides in VARIANTS.items():
        triton_backend.gluon_launch_options = with_overrides(overrides)
        times[f"{name}_dense"] = cuda_ms(lambda: backend.score_dense(problem), reps=5, warm=1)
        times[f"{name}_scan"] = cuda_ms(lambda: backend.scan_candidates(problem, thr, cap, ceilings=ceil), reps=5, warm=1)
    report["rounds"].append(times)
    print(times, flush=True)
report["median"] = {k: sorted(r[k] for r in report["rounds"])[1] for k in report["rounds"][0]}
print(report["median"], {k: v for k, v in report.items() if k.endswith("equal_default")})
with open(os.path.join(OUT, "gluon-variants.json"), "w") as f:
    json.dump(report, f, indent=1)
