"""The selection stage's candidate top-K in one kernel per row: the Triton twin of
kernels/selection.py's select_candidates (CUDA devices and the interpreter; the same bits, tested).

Math. The buffer row holds `kept` ordering keys (selection.make_keys: integer order = the
contract's total order, all distinct) followed by NO_KEY; the answer is its K largest keys, sorted
descending, NO_KEY padded. The scan's final threshold key T is at or below the row's K-th best
key, so the answer lies among the keys >= T (every kept key when the row has no threshold).
Where at most SMALL keys pass T (the common case: a few bins of the scan's histogram above K),
the program compacts them (a prefix sum gives each its slot in a per-row scratch row) and runs a
bitonic top-K (tl.topk) over SMALL keys; otherwise over the whole row (FULL keys). Both give the
same keys: the order is total, so there is nothing to break.

Tiling: one program per row; FULL = the buffer width rounded up to a power of two (>= K), SMALL =
2 K. Work per row grows with the candidate count's power of two, never with the window. Limits:
K a power of two (SUPPORTED_TOPK); keys int64 as selection.py makes them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..workspace import Scratch
from .scoring import NO_KEY_C


@triton.jit
def select_topk_candidates_kernel(
    keys_ptr, capacity, kept_ptr, thr_ptr,          # int64 [rows, capacity]; int64 [rows] x2
    scratch_ptr, out_ptr,                           # int64 [rows, SMALL]; int64 [rows, TOPK]
    TOPK: tl.constexpr, FULL: tl.constexpr, SMALL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, FULL)
    kept = tl.load(kept_ptr + row)
    live = offs < kept
    keys = tl.load(keys_ptr + row * capacity + offs, mask=live, other=NO_KEY_C)
    offs_top = tl.arange(0, TOPK)
    if SMALL < FULL:
        passing = live & (keys >= tl.load(thr_ptr + row))
        n_passing = tl.sum(passing.to(tl.int32), axis=0)
        if n_passing <= SMALL:
            slot = tl.cumsum(passing.to(tl.int32), axis=0) - 1
            tl.store(scratch_ptr + row * SMALL + slot, keys, mask=passing)
            tl.debug_barrier()  # the row's scratch, written above by every thread, is read below
            offs_small = tl.arange(0, SMALL)
            small = tl.load(scratch_ptr + row * SMALL + offs_small, mask=offs_small < n_passing, other=NO_KEY_C)
            tl.store(out_ptr + row * TOPK + offs_top, tl.topk(small, TOPK))
        else:
            tl.store(out_ptr + row * TOPK + offs_top, tl.topk(keys, TOPK))
    else:
        tl.store(out_ptr + row * TOPK + offs_top, tl.topk(keys, TOPK))


def select_topk_candidates_triton(keys: torch.Tensor, kept: torch.Tensor, thresholds: torch.Tensor,
                                  k: int, out: torch.Tensor | None = None,
                                  scratch: Scratch | None = None) -> torch.Tensor:
    """int64 [rows, k]: the k largest of the first kept[r] keys of each row of `keys` [rows, capacity]
    (selection.make_keys), sorted descending, NO_KEY padded. thresholds int64 [rows] must be at or
    below each row's k-th best kept key (NO_KEY: none), as the LiteTopK scan's final thresholds are.
    `out` (when not given) and the compaction rows come from `scratch` (None: the allocator)."""
    rows, capacity = keys.shape
    scratch = scratch if scratch is not None else Scratch(keys.device)
    out = scratch.empty((rows, k), torch.int64) if out is None else out
    if rows == 0:
        return out
    full = triton.next_power_of_2(max(capacity, k))
    small = min(2 * k, full)
    compacted = scratch.empty((rows if small < full else 1, small), torch.int64)
    select_topk_candidates_kernel[(rows,)](
        keys.contiguous(), capacity, kept.to(torch.int64).contiguous(), thresholds.contiguous(), compacted, out,
        TOPK=k, FULL=full, SMALL=small, num_warps=max(4, min(16, full // 512)),
    )
    return out


