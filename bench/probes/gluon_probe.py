"""One device call (H200): the Gluon scoring kernel against its Triton twin. For each shape: the dense
and strided score matrices of both kernels bit for bit, LiteTopK and dense results of both, and at
the production shape the time of dense scoring and of the scan for the Gluon kernel, the Triton
kernel at BLOCK_ROWS 2 (its twin) and at BLOCK_ROWS 4 (session 3's production tile), plus the
stage breakdown of a default ("triton" = auto) call. Writes $OUT/gluon-probe.json.
    source bench/device/gpu_env.sh && OUT=/tmp python3 -m bench.probes.gluon_probe
"""

from __future__ import annotations

import os
import time

import torch

from bench.common.problems import call_args, prefill_problem
from bench.common.timing import cuda_ms, json_logger
from litetopk.kernels import LiteTopKTuning, dense_topk_prefill, litetopk_prefill
from litetopk.kernels.calibration import calibrate
from litetopk.kernels.pipeline import run_dense, run_litetopk
from litetopk.kernels.selection import select_candidates
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.validation import validate_prefill


def main() -> None:
    OUT = os.environ.get("OUT", "/tmp")
    FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status")
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}

    log = json_logger(os.path.join(OUT, "gluon-probe.json"), report)

    def same_result(a, b) -> bool:
        return all(torch.equal(getattr(a, f), getattr(b, f)) for f in FIELDS)

    def kernels():
        return {
            "gluon": TritonBackend(scoring_kernel="gluon"),
            "triton_br2": TritonBackend(scoring_kernel="triton"),
            "triton_br4": TritonBackend(block_rows=4, scoring_kernel="triton"),
        }

    # 1. bit-for-bit agreement of the two kernels, and LiteTopK == dense for each
    for topk, rows, raw in ((512, 256, 65536), (1024, 130, 131072), (512, 8192, 262144), (1024, 8192, 262144)):
        t0 = time.time()
        p = prefill_problem(rows, raw, topk, seed=rows + raw + topk)
        args, kw = call_args(p)
        problem = validate_prefill(*args, **kw)
        found = {}
        backends = kernels()
        dense_scores = {name: be.score_dense(problem) for name, be in list(backends.items())[:2]}
        found["dense_scores_equal"] = all(
            torch.equal(x, y) for x, y in zip(dense_scores["gluon"], dense_scores["triton_br2"])
        )
        del dense_scores
        strided = {name: be.score_dense(problem, stride=13) for name, be in list(backends.items())[:2]}
        found["strided_scores_equal"] = all(torch.equal(x, y) for x, y in zip(strided["gluon"], strided["triton_br2"]))
        del strided
        tuning = LiteTopKTuning()
        lite = {name: run_litetopk(problem, be, repair=True, tuning=tuning) for name, be in list(backends.items())[:2]}
        dense = {name: run_dense(problem, be, selector="torch") for name, be in list(backends.items())[:2]}
        found["lite_gluon_eq_triton"] = same_result(lite["gluon"], lite["triton_br2"])
        found["lite_eq_dense"] = {n: same_result(lite[n], dense[n]) for n in lite}
        found["repaired"] = int(lite["gluon"].repaired.sum())
        found["status"] = int(lite["gluon"].status.abs().sum())
        found["cand_mean"] = float(lite["gluon"].candidates.float().mean())
        found["secs"] = time.time() - t0
        log(f"agree_k{topk}_rows{rows}_raw{raw}", found)
        del lite, dense

    # 2. production shape: kernel times, then the stage breakdown of a call with the calibration stage
    for topk in (512, 1024):
        p = prefill_problem(8192, 262144, topk, seed=7)
        args, kw = call_args(p)
        problem = validate_prefill(*args, **kw)
        tuning = LiteTopKTuning()
        res = {}
        for name, be in kernels().items():
            be.operands(problem)
            thr, ceil = calibrate(problem, be, tuning.sample_size)
            cap = tuning.capacity(topk)
            res[f"{name}_dense_score"] = cuda_ms(lambda: be.score_dense(problem))
            res[f"{name}_scan"] = cuda_ms(lambda: be.scan_candidates(problem, thr, cap, ceilings=ceil))
            res[f"{name}_scan_again"] = cuda_ms(lambda: be.scan_candidates(problem, thr, cap, ceilings=ceil))
            res[f"{name}_calibrate"] = cuda_ms(lambda: calibrate(problem, be, tuning.sample_size))
            scan = be.scan_candidates(problem, thr, cap, ceilings=ceil)
            kept = scan.appended.clamp(max=cap)
            res[f"{name}_select"] = cuda_ms(lambda: select_candidates(scan.keys, kept, scan.thresholds, topk))  # noqa: F821 (its `del` at the loop's end)
            res[f"{name}_cand_mean"] = float(scan.appended.float().mean())
            del scan
            log(f"prod_k{topk}", res)
        res["lite_total"] = cuda_ms(lambda: litetopk_prefill(*args, **kw, backend="triton"))
        res["dense_total"] = cuda_ms(lambda: dense_topk_prefill(*args, **kw, backend="triton"))
        res["validate"] = cuda_ms(lambda: validate_prefill(*args, **kw))
        be = TritonBackend()
        res["operands"] = cuda_ms(lambda: (setattr(be, "_prepared", None), be.operands(problem)))
        res["default_is_gluon"] = be.operands(problem).gluon
        log(f"prod_k{topk}", res)


if __name__ == "__main__":
    main()
