"""One device call (H200): the candidate selection (select_topk_candidates_triton: one FULL-wide
tensor per row, up to 16 warps) against a variant that compacts the buffer in chunks (fewer
warps, no FULL-wide tensor), at several chunk sizes and warp counts, on the real scan output of
the production problems (Q = 8192, S = 65,536, K = 512 and 1024). Checks every variant returns the
same keys, counts the rows whose passing keys exceed SMALL, times each in the same process.
Session 5 (bench/results/probe-v9/select-probe.json): no variant faster; the cost is the top-K
over SMALL = 2 K keys. Writes $OUT/select-probe.json.
    source bench/gpu_env.sh && OUT=/tmp python3 bench/select_probe.py
"""

from __future__ import annotations

import json
import os

import torch
import triton
import triton.language as tl

from litetopk.kernels import LiteTopKTuning
from litetopk.kernels.pipeline import calibrate
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.triton.scoring import NO_KEY_C
from litetopk.kernels.triton.selection import select_topk_candidates_triton
from litetopk.kernels.validation import validate_prefill

from problems_gpu import call_args, cuda_ms, prefill_problem

OUT = os.environ.get("OUT", "/tmp")


@triton.jit
def select_chunked_kernel(keys_ptr, capacity, kept_ptr, thr_ptr, scratch_ptr, out_ptr,
                          TOPK: tl.constexpr, SMALL: tl.constexpr, CHUNK: tl.constexpr):
    """The variant measured in session 5: the keys >= thr compacted CHUNK at a time (no FULL-wide
    tensor), then the same top-K over SMALL keys (the probe's rows never pass more than SMALL)."""
    row = tl.program_id(0).to(tl.int64)
    kept = tl.load(kept_ptr + row)
    thr = tl.load(thr_ptr + row)
    offs = tl.arange(0, CHUNK)
    n_passing = 0
    for start in range(0, kept, CHUNK):
        live = start + offs < kept
        keys = tl.load(keys_ptr + row * capacity + start + offs, mask=live, other=NO_KEY_C)
        passing = live & (keys >= thr)
        slot = n_passing + tl.cumsum(passing.to(tl.int32), axis=0) - 1
        tl.store(scratch_ptr + row * SMALL + slot, keys, mask=passing & (slot < SMALL))
        n_passing += tl.sum(passing.to(tl.int32), axis=0)
    tl.debug_barrier()
    offs_small = tl.arange(0, SMALL)
    small = tl.load(scratch_ptr + row * SMALL + offs_small, mask=offs_small < n_passing, other=NO_KEY_C)
    tl.store(out_ptr + row * TOPK + tl.arange(0, TOPK), tl.topk(small, TOPK))


def select_with(chunk, warps):
    def run(keys, kept, thr, k):
        rows, capacity = keys.shape
        out = torch.empty(rows, k, dtype=torch.int64, device=keys.device)
        scratch = torch.empty(rows, 2 * k, dtype=torch.int64, device=keys.device)
        select_chunked_kernel[(rows,)](keys, capacity, kept.to(torch.int64), thr, scratch, out, TOPK=k,
                                       SMALL=2 * k, CHUNK=chunk, num_warps=warps)
        return out
    return run


VARIANTS = {"production": select_topk_candidates_triton, "chunk1024_w4": select_with(1024, 4),
            "chunk512_w4": select_with(512, 4), "chunk1024_w8": select_with(1024, 8),
            "chunk2048_w8": select_with(2048, 8)}
report = {"device": torch.cuda.get_device_name(0)}
for topk in (512, 1024):
    args, kw = call_args(prefill_problem(8192, 262144, topk, seed=7))
    problem = validate_prefill(*args, **kw)
    backend = TritonBackend()
    tuning = LiteTopKTuning()
    thr, ceil = calibrate(problem, backend, tuning)
    scan = backend.scan_candidates(problem, thr, tuning.capacity(topk), ceilings=ceil)
    kept = scan.appended.clamp(max=scan.keys.shape[1])
    passing = (scan.keys >= scan.thresholds[:, None]) & (torch.arange(scan.keys.shape[1], device="cuda") < kept[:, None])
    res = {"kept_mean": float(kept.float().mean()), "passing_mean": float(passing.sum(1).float().mean()),
           "rows_over_small": int((passing.sum(1) > 2 * topk).sum())}
    base = select_topk_candidates_triton(scan.keys, kept, scan.thresholds, topk)
    for name, fn in VARIANTS.items():
        res[f"{name}_equal_production"] = bool(torch.equal(fn(scan.keys, kept, scan.thresholds, topk), base))
    for _ in range(3):
        for name, fn in VARIANTS.items():
            res.setdefault(f"{name}_ms", []).append(cuda_ms(lambda: fn(scan.keys, kept, scan.thresholds, topk)))
    report[f"k{topk}"] = res
    print(topk, res, flush=True)
    with open(os.path.join(OUT, "select-probe.json"), "w") as f:
        json.dump(report, f, indent=1)
