"""One device call (H200): problems that hold wide MXFP4 vectors (block scales over 3 binades, so
some vectors need the hi operands) at the production shape. The Gluon kernel's ANY_WIDE variant
against the Triton kernel's: dense scores bit for bit, LiteTopK results equal, and the time of
dense scoring and of the scan for both (and the Gluon kernel on the same shape without wide
vectors). Writes $OUT/gluon-wide.json.
    source bench/device/gpu_env.sh && OUT=/tmp python3 -m bench.probes.gluon_wide_probe
"""

from __future__ import annotations

import json
import os

import torch

from litetopk.kernels import LiteTopKTuning
from litetopk.kernels.pipeline import calibrate, run_litetopk
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.triton.decode import FLAG_WIDE
from litetopk.kernels.validation import validate_prefill

from bench.common.problems import call_args, prefill_problem
from bench.common.timing import cuda_ms

def main() -> None:
    OUT = os.environ.get("OUT", "/tmp")
    FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status")
    report = {"device": torch.cuda.get_device_name(0)}
    tuning = LiteTopKTuning()
    for topk, spread in ((512, 1), (1024, 1), (512, 0)):
        args, kw = call_args(prefill_problem(8192, 262144, topk, seed=11, spread=spread))
        problem = validate_prefill(*args, **kw)
        res = {}
        backends = {"gluon": TritonBackend(scoring_kernel="gluon"), "triton": TritonBackend(scoring_kernel="triton")}
        ops = backends["gluon"].operands(problem)
        res["any_wide"] = bool((ops.keys.flags & FLAG_WIDE).any())
        res["wide_tiles"] = int((ops.keys.tile_wide != 0).sum())
        res["tiles"] = int(ops.keys.tile_wide.numel())
        res["wide_programs"] = int((ops.schedule.q_wide != 0).sum())
        res["programs"] = int(ops.schedule.q_wide.numel())
        if spread:
            scores = {n: b.score_dense(problem) for n, b in backends.items()}
            res["dense_equal"] = all(torch.equal(x, y) for x, y in zip(scores["gluon"], scores["triton"]))
            del scores
            lite = {n: run_litetopk(problem, b, repair=True, tuning=tuning) for n, b in backends.items()}
            res["lite_equal"] = all(torch.equal(getattr(lite["gluon"], f), getattr(lite["triton"], f)) for f in FIELDS)
            del lite
        for name, be in backends.items() if spread else (("gluon", backends["gluon"]),):
            thr, ceil = calibrate(problem, be, tuning.sample_size)
            res[f"{name}_dense"] = cuda_ms(lambda: be.score_dense(problem), reps=5, warm=1)
            res[f"{name}_scan"] = cuda_ms(lambda: be.scan_candidates(problem, thr, tuning.capacity(topk), ceilings=ceil),
                                          reps=5, warm=1)
        report[f"k{topk}_spread{spread}"] = res
        print(f"k{topk}_spread{spread}", res, flush=True)
        with open(os.path.join(OUT, "gluon-wide.json"), "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
