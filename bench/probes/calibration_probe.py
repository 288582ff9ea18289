"""Device probe (H200): the calibration stage split into its parts, in one process: the sample's dense
scoring (backend.score_dense(problem, stride)), the order statistics (kernels/calibration.py:
bisection until the bracket holds <= BAND values, one compaction, a sort of the band) against the
previous kernel (a copy below: calibration_keys_bisection, 32 bisection steps per rank over the
whole row) and torch (calibration_keys_torch, the contract), and the whole calibrate().

Input per (keys, K) in {65,536, 196,608} x {512, 1024}: the benchmark's problem (bench.common.problems:
Q = 8192 causal rows ending the sequence, one sequence, Gaussian MXFP4 data, seed 11) and the
operator's default sample size (LiteTopKTuning().sample_size): stride = sample_stride(max_end, ...),
ceil(max_end / stride) columns, ceiling rank max(1, K / (2 stride)). Both kernels' keys are checked
bit for bit against torch's before they are timed (the band kernel also in the launch shapes of
PER_THREAD_VARIANTS). `steps/shared`: the mean number of counting steps over the whole row a row
takes before both brackets hold <= BAND values, and how many of them serve both ranks (replayed in
torch from the same sample); `band A/B`: the share of rows that build a band per rank. Timing: CUDA
events, 5 warm-up calls, the median of 30 (calibrate: 15). Prints a table, writes
DIR/calibration-probe.json (the command in it).

    python -m bench.probes.calibration_probe --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

from bench.common.problems import call_args, prefill_problem
from bench.common.timing import cuda_ms
from litetopk.kernels.calibration import (
    BAND_PER_THREAD,
    calibrate,
    calibration_keys_torch,
    calibration_keys_triton,
    order_tiling,
    sample_stride,
)
from litetopk.kernels.keys import NO_KEY, NO_KEY_C, _ordered_bits, _scores_of_ordered
from litetopk.kernels.pipeline import LiteTopKTuning
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.validation import validate_prefill

DEVICE = "cuda"
ROWS = 8192
KEYS = (65536, 196608)
TOPKS = (512, 1024)
WARM, REPS = 5, 30
PER_THREAD_VARIANTS = (32, 16)  # row values a thread (the default is ROW_PER_THREAD = 64)


@triton.jit
def calibration_keys_bisection_kernel(
    scores_ptr,
    width,
    out_ptr,
    offset,
    RANK_A: tl.constexpr,
    RANK_B: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """The previous order-statistics kernel (commit 07dcceb, KEYS=True), kept to be timed beside the
    new one: a 32-step bisection over the int32 ordered bits of the whole row, for both ranks at once."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    scores = tl.load(scores_ptr + row * width + offs, mask=offs < width, other=0.0)
    ordered = tl.where(offs < width, _ordered_bits(scores).to(tl.int32), -2147483648)
    rank = tl.where(tl.arange(0, 2) == 0, RANK_A, RANK_B)
    lo = tl.full([2], -2147483648, dtype=tl.int64)
    hi = tl.full([2], 2147483647, dtype=tl.int64)
    for _ in range(32):
        mid = lo + (hi - lo + 1) // 2
        count = tl.sum((ordered[None, :] >= mid.to(tl.int32)[:, None]).to(tl.int32), axis=1)
        lo = tl.where(count >= rank, mid, lo)
        hi = tl.where(count >= rank, hi, mid - 1)
    found = _scores_of_ordered(lo.to(tl.int32))
    nans = tl.sum((scores != scores).to(tl.int32), axis=0)
    first = tl.arange(0, 2) == 0
    found = tl.where(first, found + offset, found)
    kth = tl.zeros([2], dtype=tl.float32) + tl.sum(tl.where(first, found, 0.0), axis=0)
    usable = (kth == kth) & (tl.abs(kth) != float("inf")) & (nans == 0)
    finite = (found == found) & (tl.abs(found) != float("inf"))
    tl.store(out_ptr + row * 2 + tl.arange(0, 2), tl.where(finite & usable, _ordered_bits(found) << 32, NO_KEY_C))


def calibration_keys_bisection(sample: torch.Tensor, k: int, ceiling_rank: int, out: torch.Tensor):
    """The previous kernel's launcher (its launch shape), writing `out` int64 [rows, 2]."""
    rows, width = sample.shape
    block = triton.next_power_of_2(width)
    calibration_keys_bisection_kernel[(rows,)](
        sample.contiguous(),
        width,
        out,
        0.0,
        RANK_A=k,
        RANK_B=ceiling_rank,
        BLOCK=block,
        num_warps=max(4, min(16, block // 1024)),
    )
    return out[:, 0], out[:, 1]


def ordered_bits(sample: torch.Tensor) -> torch.Tensor:
    """int64 order-preserving bits of float32 `sample` (keys._ordered_bits in torch)."""
    bits = (sample + 0.0).view(torch.int32).long()
    return torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


def row_steps(sample: torch.Tensor, ranks: tuple[int, int], band: int) -> dict:
    """The kernel's steps over the row replayed in torch on every row: each rank's bisection until its
    bracket holds <= band values or one value; the steps both ranks share (their brackets still equal:
    one count serves both); means over rows of the counting steps over the row (shared + each rank's
    own), the shared ones, and per rank the share of rows that then build a band."""
    ordered = ordered_bits(sample).clamp(min=-(2**31) + 1)
    rows, width = ordered.shape
    paths, banded = [], []
    for rank in ranks:
        lo = torch.full((rows,), -(2**31) + 1, dtype=torch.int64, device=sample.device)
        hi = torch.full_like(lo, 2**31 - 1)
        c_lo = torch.full_like(lo, width)
        c_hi = torch.zeros_like(lo)
        path = []
        for _ in range(32):
            going = (c_lo - c_hi > band) & (lo < hi)
            mid = lo + (hi - lo + 1) // 2
            count = (ordered >= mid[:, None]).sum(1)
            upper = count >= rank
            lo = torch.where(going & upper, mid, lo)
            c_lo = torch.where(going & upper, count, c_lo)
            hi = torch.where(going & ~upper, mid - 1, hi)
            c_hi = torch.where(going & ~upper, count, c_hi)
            path.append((going, lo.clone(), hi.clone()))
        paths.append(path)
        banded.append(float((lo < hi).float().mean()))
    same = torch.ones(rows, dtype=torch.bool, device=sample.device)
    shared = torch.zeros(rows, device=sample.device)
    for (going_a, lo_a, hi_a), (going_b, lo_b, hi_b) in zip(*paths):
        shared += same & going_a & going_b
        same &= (lo_a == lo_b) & (hi_a == hi_b)
    own = [sum(going.float() for going, _, _ in path) for path in paths]
    return {
        "row_steps": float((own[0] + own[1] - shared).mean()),
        "shared_steps": float(shared.mean()),
        "band_rows": banded,
    }


def band_variants(sample, k, ceiling_rank, want) -> dict:
    """{values a thread: {"ms", "equal"}} of the band kernel's launch shapes besides ROW_PER_THREAD."""
    variants = {}
    for per_thread in PER_THREAD_VARIANTS:
        got = calibration_keys_triton(sample, k, ceiling_rank, 0.0, per_thread=per_thread)
        variants[per_thread] = {
            "equal": all(torch.equal(g, w) for g, w in zip(got, want)),
            "ms": cuda_ms(
                lambda: calibration_keys_triton(sample, k, ceiling_rank, 0.0, per_thread=per_thread),
                reps=REPS,
                warm=WARM,
            ),
        }
    return variants


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder for calibration-probe.json")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sample_size = LiteTopKTuning().sample_size
    report = {
        "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else DEVICE,
        "rows": ROWS,
        "sample_size": sample_size,
        "warm": WARM,
        "reps": REPS,
        "command": "python -m bench.probes.calibration_probe " + " ".join(sys.argv[1:]),
        "cases": [],
    }
    backend = TritonBackend()
    header = (
        f"{'keys':>7} {'K':>5} {'width':>5} {'stride':>6} {'score ms':>8} {'bisect ms':>9} {'band ms':>8} "
        f"{'torch ms':>8} {'calib ms':>8} {'equal':>5} {'steps/shared':>13} {'band A/B':>9}"
    )
    print(header)
    for keys in KEYS:
        for k in TOPKS:
            args_, kw = call_args(prefill_problem(ROWS, keys * 4, k, seed=11, device=DEVICE))
            problem = validate_prefill(*args_, **kw)
            stride = sample_stride(problem.max_end, sample_size, k)
            ceiling_rank = max(1, k // (2 * stride))
            sample, _ = backend.score_dense(problem, stride)
            width = sample.shape[1]
            want = calibration_keys_torch(sample, k, ceiling_rank)
            out = torch.empty(ROWS, 2, dtype=torch.int64, device=DEVICE)
            got_old = calibration_keys_bisection(sample, k, ceiling_rank, out)
            equal_old = all(torch.equal(g, w) for g, w in zip(got_old, want))
            got_new = calibration_keys_triton(sample, k, ceiling_rank, 0.0)
            equal_new = all(torch.equal(g, w) for g, w in zip(got_new, want))
            band = BAND_PER_THREAD * order_tiling(width)[1]
            steps = row_steps(sample, (k, ceiling_rank), band)
            case = {
                "keys": keys,
                "k": k,
                "width": width,
                "stride": stride,
                "ceiling_rank": ceiling_rank,
                "band": band,
                "score_dense_ms": cuda_ms(lambda: backend.score_dense(problem, stride), reps=REPS, warm=WARM),  # noqa: F821 (its `del` at the loop's end)
                "order_bisection_ms": cuda_ms(
                    lambda: calibration_keys_bisection(sample, k, ceiling_rank, out),  # noqa: F821 (its `del` at the loop's end)
                    reps=REPS,
                    warm=WARM,
                ),
                "order_band_ms": cuda_ms(
                    lambda: calibration_keys_triton(sample, k, ceiling_rank, 0.0),  # noqa: F821 (its `del` at the loop's end)
                    reps=REPS,
                    warm=WARM,
                ),
                "order_band_variants": band_variants(sample, k, ceiling_rank, want),
                "order_torch_ms": cuda_ms(
                    lambda: calibration_keys_torch(sample, k, ceiling_rank),  # noqa: F821 (its `del` at the loop's end)
                    reps=REPS,
                    warm=WARM,
                ),
                "calibrate_ms": cuda_ms(lambda: calibrate(problem, backend, sample_size), reps=15, warm=WARM),  # noqa: F821 (its `del` at the loop's end)
                "equal_bisection": equal_old,
                "equal_band": equal_new,
                **steps,
                "no_threshold_rows": int((want[0] == NO_KEY).sum()),
            }
            report["cases"].append(case)
            with open(os.path.join(args.out, "calibration-probe.json"), "w") as f:
                json.dump(report, f, indent=1)
            print(
                f"{keys:>7} {k:>5} {width:>5} {stride:>6} {case['score_dense_ms']:>8.4f} "
                f"{case['order_bisection_ms']:>9.4f} {case['order_band_ms']:>8.4f} {case['order_torch_ms']:>8.4f} "
                f"{case['calibrate_ms']:>8.4f} {str(equal_old and equal_new):>5} "
                f"{steps['row_steps']:>6.1f}/{steps['shared_steps']:<6.1f} "
                f"{steps['band_rows'][0]:>4.2f}/{steps['band_rows'][1]:<4.2f}",
                flush=True,
            )
            print(
                "        band kernel by values a thread: "
                + ", ".join(
                    f"{n}: {v['ms']:.4f} ms{'' if v['equal'] else ' NOT EQUAL'}"
                    for n, v in case["order_band_variants"].items()
                ),
                flush=True,
            )
            del sample, problem, args_, kw
            if DEVICE == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
