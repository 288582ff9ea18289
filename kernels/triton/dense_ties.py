"""The dense baseline's tie settlement on the device: the Triton twin of selection.settle_ties_torch
(CUDA devices and the interpreter; the same bits, tested), so that `dense_topk_prefill` reads nothing
back on the host.

Math. A value top-k (torch.topk, FlashInfer) returns the k+1 largest scores of a row sorted
descending, but among equal scores any of their positions. Where the k-th and (k+1)-th values are
equal (v) and finite, the row's exact answer (CONTRACT.md §1: score descending, then position
ascending) is the `above` keys of scores > v (all of them are among the k: they rank before the k-th)
and the need = k - above smallest positions whose score equals v. The kernel rewrites key slots
[above, k) of such a row with those positions' keys and slot k with NO_KEY (the value top-k's k+1-th
key may duplicate an exact one); every other row is left as it is. Scores compare as floats, so -0.0
equals +0.0, as the ordering keys fold them. A row holding a NaN is NONFINITE and publishes nothing:
its keys may differ from the torch twin's (a value top-k ranks NaN first, so "above" undercounts),
which no published field shows.

Tiling: one program per row. A row without a tie loads its two values and stops; a tied row reads its
scores once in BLOCK-column steps, ranking the matches of each step with one prefix sum. No host
synchronization, no data-dependent shape: capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .keys import NO_KEY_C, _ordering_keys

BLOCK = 1024  # score columns a tied row's program compares per step


@triton.jit
def settle_ties_kernel(
    scores_ptr, score_stride, width,     # float32 [rows, width] (row stride score_stride)
    values_ptr, keys_ptr,                # float32 / int64 [rows, TOPK + 1], contiguous: the value top-k and its keys
    TOPK: tl.constexpr, LANES: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    values_row = values_ptr + row * (TOPK + 1)
    kth = tl.load(values_row + TOPK - 1)
    after = tl.load(values_row + TOPK)
    if (kth == after) & (after != float("-inf")):
        offs_k = tl.arange(0, LANES)
        top = tl.load(values_row + offs_k, mask=offs_k < TOPK, other=float("-inf"))
        above = tl.sum((top > kth).to(tl.int32), axis=0)
        need = TOPK - above
        keys_row = keys_ptr + row * (TOPK + 1)
        found = 0
        for c0 in range(0, width, BLOCK):
            offs_c = c0 + tl.arange(0, BLOCK)
            match = (tl.load(scores_ptr + row * score_stride + offs_c, mask=offs_c < width, other=float("-inf"))
                     == kth) & (offs_c < width)
            rank = found + tl.cumsum(match.to(tl.int32), axis=0) - 1  # among the row's matches so far
            take = match & (rank < need)
            tl.store(keys_row + above + rank, _ordering_keys(tl.zeros([BLOCK], tl.float32) + kth, offs_c), mask=take)
            found += tl.sum(match.to(tl.int32), axis=0)
        tl.store(keys_row + TOPK, NO_KEY_C)


def settle_ties_triton(scores: torch.Tensor, values: torch.Tensor, keys: torch.Tensor, k: int) -> None:
    """selection.settle_ties_torch in one launch (module docstring): rewrites `keys` [rows, k + 1] in place."""
    rows, width = scores.shape
    if rows == 0:
        return
    if scores.stride(1) != 1 or not values.is_contiguous() or not keys.is_contiguous():
        raise ValueError("settle_ties_triton takes scores with unit column stride and contiguous values and keys")
    settle_ties_kernel[(rows,)](scores, scores.stride(0), width, values, keys, TOPK=k,
                                LANES=triton.next_power_of_2(k), BLOCK=BLOCK)
