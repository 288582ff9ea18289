"""One device call (H200): A/B of compile-time variants of the Gluon scoring kernel in one process
(the only fair comparison, bench/NOTES.md), at the production shape (Q = 8192, S = 65,536, K = 512):
dense scoring and scan times per variant, rounds interleaved, and each variant's LiteTopK result
checked equal to the default's. Writes $OUT/gluon-variants.json.
    source bench/gpu_env.sh && OUT=/tmp python3 bench/gluon_variants.py     (STAGES=0: the variants only)
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

from problems_gpu import call_args, cuda_ms, prefill_problem, profile_call

OUT = os.environ.get("OUT", "/tmp")
VARIANTS = {  # overrides of gluon_launch_options' constexprs and compiler options (session 4 also
    # measured NUM_BUFFERS 3 and no register cap: both slower, bench/NOTES.md)
    "default": {},
    "no_defer": {"DEFER_APPENDS": False},
    "refresh32": {"REFRESH": 32},
    "refresh8": {"REFRESH": 8},
}
STAGES = os.environ.get("STAGES", "1") == "1"  # also time the whole call's stages per scoring kernel
launch_options = triton_backend.gluon_launch_options


def with_overrides(overrides):
    def options(**kw):
        constants, compiler = launch_options(**kw)
        constants = dict(constants, **{k: v for k, v in overrides.items() if k != "maxnreg"})
        if "maxnreg" in overrides:
            compiler = {k: v for k, v in dict(compiler, maxnreg=overrides["maxnreg"]).items() if v is not None}
        return constants, compiler
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
triton_backend.gluon_launch_options = launch_options
with open(os.path.join(OUT, "gluon-variants.json"), "w") as f:
    json.dump(report, f, indent=1)
if not STAGES:
    raise SystemExit(0)

# The whole LiteTopK call (validation, operands, calibration, scan, selection, assembly) per scoring
# kernel, and its stages, in the same process: where the time outside the scan goes.
stages = {}
for name, make in (("gluon", lambda: TritonBackend(scoring_kernel="gluon")),
                   ("triton_br4", lambda: TritonBackend(block_rows=4, scoring_kernel="triton")),
                   ("triton_br2", lambda: TritonBackend(scoring_kernel="triton"))):
    be = make()
    res = {"total": cuda_ms(lambda: run_litetopk(validate_prefill(*args, **kw), be, repair=True, tuning=tuning))}
    res["validate"] = cuda_ms(lambda: validate_prefill(*args, **kw))
    res["operands"] = cuda_ms(lambda: (setattr(be, "_prepared", None), be.operands(problem)))
    res["schedule"] = cuda_ms(lambda: be.schedule(problem))
    res["calibrate"] = cuda_ms(lambda: calibrate(problem, be, tuning))
    res["scan"] = cuda_ms(lambda: be.scan_candidates(problem, thr, cap, ceilings=ceil))
    scan = be.scan_candidates(problem, thr, cap, ceilings=ceil)
    res["select"] = cuda_ms(lambda: be.select_candidates(scan, 512))
    stages[name] = res
    print(name, res, flush=True)
report["pipeline"] = stages
with open(os.path.join(OUT, "gluon-variants.json"), "w") as f:
    json.dump(report, f, indent=1)

# One profiled LiteTopK call (Gluon): host and device time per op, to find the glue's cost.
be = TritonBackend(scoring_kernel="gluon")
profile_call(lambda: run_litetopk(validate_prefill(*args, **kw), be, repair=True, tuning=tuning), OUT, "gluon-lite")
