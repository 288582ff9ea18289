"""The dense baseline's selection: the exact top-K of a dense float32 score matrix (pipeline.run_dense).

Layer: stage (the dense path only). Reading order: the tie settlement's kernel, its launcher
(settle_ties_triton), the torch twin (settle_ties_torch) and `settle_ties`, the one line that picks
between them (devices.runs_triton_stages); then the library value top-k's (torch.topk, and
FlashInfer's radix top-k: flashinfer_topk) and `select_topk_dense`, the stage.

Math. `select_topk_dense` asks a selector for the k+1 largest values of each row, sorted descending,
with their column indices, and turns them into ordering keys (keys.make_keys). A value top-k returns,
among equal scores, any of their positions: where the k-th and (k+1)-th values are equal (v) and
finite, the row's exact answer (docs/contract.md §1: score descending, then position ascending) is
the `above` keys of scores > v (all of them are among the k: they rank before the k-th) and the
need = k - above smallest positions whose score equals v. settle_ties rewrites key slots [above, k)
of such a row with those positions' keys and slot k with NO_KEY (the value top-k's k+1-th key may
duplicate an exact one); every other row is left as it is. So every selector gives the same answer.
Scores compare as floats, so -0.0 equals +0.0, as the ordering keys fold them. A row holding a NaN is
NONFINITE and publishes nothing: its keys may differ between the twins (a value top-k ranks NaN
first, so "above" undercounts), which no published field shows.

Tiling (the kernel): one program per row. A row without a tie loads its two values and stops; a tied
row reads its scores once in BLOCK-column steps, ranking the matches of each step with one prefix sum.
No host synchronization, no data-dependent shape: capturable, so that `dense_topk_prefill` reads
nothing back on the host where the Triton stages run (the torch twin finds the tied rows on the host).

Selectors:
    "torch"       torch.topk
    "flashinfer"  FlashInfer's radix top-k (`flashinfer.top_k(input, k, sorted=True)`), from
                  flashinfer-python 0.6.18 (not a dependency: installed by hand with --no-deps; its
                  first call JIT-compiles for ~250 s, FLASHINFER_WORKSPACE_BASE keeps the build)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .devices import runs_triton_stages
from .errors import BackendUnavailableError, InputError
from .keys import NO_KEY, NO_KEY_C, _ordering_keys, make_keys, select_topk_keys

BLOCK = 1024  # score columns a tied row's program compares per step


@triton.jit
def settle_ties_kernel(
    scores_ptr,
    score_stride,
    width,  # float32 [rows, width] (row stride score_stride)
    values_ptr,
    keys_ptr,  # float32 / int64 [rows, TOPK + 1], contiguous: the value top-k and its keys
    TOPK: tl.constexpr,
    LANES: tl.constexpr,
    BLOCK: tl.constexpr,
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
            match = (
                tl.load(scores_ptr + row * score_stride + offs_c, mask=offs_c < width, other=float("-inf")) == kth
            ) & (offs_c < width)
            rank = found + tl.cumsum(match.to(tl.int32), axis=0) - 1  # among the row's matches so far
            take = match & (rank < need)
            tl.store(keys_row + above + rank, _ordering_keys(tl.zeros([BLOCK], tl.float32) + kth, offs_c), mask=take)
            found += tl.sum(match.to(tl.int32), axis=0)
        tl.store(keys_row + TOPK, NO_KEY_C)


def settle_ties_triton(scores: torch.Tensor, values: torch.Tensor, keys: torch.Tensor, k: int) -> None:
    """settle_ties_torch in one launch (module docstring): rewrites `keys` [rows, k + 1] in place."""
    rows, width = scores.shape
    if rows == 0:
        return
    if scores.stride(1) != 1 or not values.is_contiguous() or not keys.is_contiguous():
        raise ValueError("settle_ties_triton takes scores with unit column stride and contiguous values and keys")
    settle_ties_kernel[(rows,)](
        scores, scores.stride(0), width, values, keys, TOPK=k, LANES=triton.next_power_of_2(k), BLOCK=BLOCK
    )


def settle_ties_torch(scores: torch.Tensor, values: torch.Tensor, keys: torch.Tensor, k: int) -> None:
    """settle_ties in torch ops: the tied rows found on the host, each re-selected with ordering keys."""
    tied = (values[:, k - 1] == values[:, k]) & ~torch.isneginf(values[:, k])
    for row in torch.nonzero(tied).flatten().tolist():
        row_scores = scores[row]
        live = torch.nonzero(~torch.isneginf(row_scores)).flatten()
        keys[row, :k] = select_topk_keys(make_keys(row_scores[live], live)[None, :], k)[0]
        keys[row, k] = NO_KEY  # the value top-k's (k+1)-th key may duplicate or beat an exact one


def settle_ties(scores: torch.Tensor, values: torch.Tensor, keys: torch.Tensor, k: int) -> None:
    """Make the keys [rows, k + 1] of a value top-(k+1) `values` (sorted descending) of `scores` exact
    where the k-th and (k+1)-th values tie (finite): slots [0, k) then hold the row's exact top-k keys
    in some order, slot k NO_KEY; other rows are left as they are. In place. Runs the Triton twin
    (settle_ties_triton: no host sync) where devices.runs_triton_stages says so."""
    if runs_triton_stages(scores.device):
        settle_ties_triton(scores, values, keys, k)
        return
    settle_ties_torch(scores, values, keys, k)


def flashinfer_topk(scores: torch.Tensor, take: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values float32 [rows, take] sorted descending, positions int64 [rows, take]) by FlashInfer.

    Raises BackendUnavailableError when flashinfer is not installed or the tensor is not on CUDA
    (the dense baseline never falls back to another selector).
    """
    try:
        import flashinfer
    except ImportError as exc:
        raise BackendUnavailableError(
            "selector='flashinfer' needs the flashinfer-python package (0.6.18 was measured on the H200); "
            "use selector='torch' where it is not installed"
        ) from exc
    if scores.device.type != "cuda":
        raise BackendUnavailableError(f"selector='flashinfer' runs on CUDA tensors, got {scores.device}")
    values, positions = flashinfer.top_k(scores, take, sorted=True)
    return values, positions.long()


def _value_topk(scores: torch.Tensor, take: int, selector: str) -> tuple[torch.Tensor, torch.Tensor]:
    if selector == "torch":
        values, positions = torch.topk(scores, take, dim=1, largest=True, sorted=True)
        return values, positions
    if selector == "flashinfer":
        return flashinfer_topk(scores, take)
    raise InputError(f"selector={selector!r} is not known; use 'torch' or 'flashinfer'")


def select_topk_dense(scores: torch.Tensor, k: int, selector: str = "torch") -> torch.Tensor:
    """Exact top-k keys [rows, k] of a dense float32 score matrix whose column is the position.

    Entries outside a row's window must be -inf. `selector` names the value top-k that does the
    bulk of the work ("torch": torch.topk; "flashinfer": flashinfer.top_k); it is asked for k+1
    values so that a tie across the k-th place is detected, and such rows are settled exactly
    (settle_ties). The answer is the same for every selector. Every tensor here is a torch op's
    result or, for a matrix of no column, a new tensor from the allocator (not the workspace:
    scratch.py says why). Reads nothing back on the host where the Triton stages run.
    """
    rows, width = scores.shape
    take = min(k + 1, width)
    if take == 0:
        return torch.full((rows, k), NO_KEY, dtype=torch.int64, device=scores.device)
    values, positions = _value_topk(scores, take, selector)
    keys = make_keys(values, positions)
    keys = torch.where(torch.isneginf(values), NO_KEY, keys)
    if take == k + 1:
        settle_ties(scores, values.contiguous(), keys, k)
    return select_topk_keys(keys, k)
