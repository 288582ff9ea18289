"""One device call (H200): the candidate selection (select_topk_candidates_triton) against variants
that compact the buffer in chunks (no FULL-wide tensor, fewer warps), on the real scan output of
the production problems (Q = 8192, S = 65,536, K = 512 and 1024). Checks every variant returns
the kernel's keys bit for bit, counts the rows whose passing keys exceed SMALL, times each in the
same process. Writes $OUT/select-probe.json.
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
def select_chunked_kernel(keys_ptr, capacity, kept_ptr, thr_ptr, scratch_ptr, n_ptr, out_ptr,
                          TOPK: tl.constexpr, SMALL: tl.constexpr, CHUNK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    kept = tl.load(kept_ptr + row)
    thr = tl.load(thr_ptr + row)
    offs = tl.arange(0, CHUNK)
    n = 0
    for start in range(0, kept, CHUNK):
        live = start + offs < kept
        keys = tl.load(keys_ptr + row * capacity + start + offs, mask=live, other=NO_KEY_C)
        passing = live & (keys >= thr)
        slot = n + tl.cumsum(passing.to(tl.int32), axis=0) - 1
        tl.store(scratch_ptr + row * SMALL + slot, keys, mask=passing & (slot < SMALL))
        n += tl.sum(passing.to(tl.int32), axis=0)
    tl.store(n_ptr + row, n)
    tl.debug_barrier()
    offs_small = tl.arange(0, SMALL)
    small = tl.load(scratch_ptr + row * SMALL + offs_small, mask=offs_small < n, other=NO_KEY_C)
    tl.store(out_ptr + row * TOPK + tl.arange(0, TOPK), tl.topk(small, TOPK))


def select_chunked(keys, kept, thr, k, chunk, warps):
    rows, capacity = keys.shape
    small = 2 * k
    out = torch.empty(rows, k, dtype=torch.int64, device=keys.device)
    scratch = torch.empty(rows, small, dtype=torch.int64, device=keys.device)
    n = torch.empty(rows, dtype=torch.int32, device=keys.device)
    select_chunked_kernel[(rows,)](keys, capacity, kept.to(torch.int64), thr, scratch, n, out,
                                   TOPK=k, SMALL=small, CHUNK=chunk, num_warps=warps)
    return out, n


report = {"device": torch.cuda.get_device_name(0)}
for topk in (512, 1024):
    args, kw = call_args(prefill_problem(8192, 262144, topk, seed=7))
    problem = validate_prefill(*args, **kw)
    backend = TritonBackend()
    tuning = LiteTopKTuning()
    thr, ceil = calibrate(problem, backend, tuning)
    scan = backend.scan_candidates(problem, thr, tuning.capacity(topk), ceilings=ceil)
    kept = scan.appended.clamp(max=scan.keys.shape[1])
    base = select_topk_candidates_triton(scan.keys, kept, scan.thresholds, topk)
    res = {"kept_mean": float(kept.float().mean()), "kernel_ms": []}
    variants = {f"chunk{c}_w{w}": (c, w) for c in (512, 1024) for w in (4, 8)}
    for name, (c, w) in variants.items():
        got, n = select_chunked(scan.keys, kept, scan.thresholds, topk, c, w)
        res[f"{name}_equal"] = bool(torch.equal(got, base))
        res["passing_mean"] = float(n.float().mean())
        res["rows_over_small"] = int((n > 2 * topk).sum())
    for _ in range(3):
        res["kernel_ms"].append(cuda_ms(lambda: select_topk_candidates_triton(scan.keys, kept, scan.thresholds, topk)))
        for name, (c, w) in variants.items():
            res.setdefault(f"{name}_ms", []).append(cuda_ms(lambda: select_chunked(scan.keys, kept, scan.thresholds,
                                                                                      topk, c, w)))
    report[f"k{topk}"] = res
    print(topk, res, flush=True)
    with open(os.path.join(OUT, "select-probe.json"), "w") as f:
        json.dump(report, f, indent=1)
