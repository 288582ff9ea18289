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
    "radix"       select_topk_radix below: exact by itself (ordering keys, no tie settlement), Triton, CUDA only

The radix selector (select_topk_radix; for decode-sized score rows, where torch.topk costs ~90-120 us on an
H100 and the score matrix is small: bench/NOTES.md, next steps 0). Math: each live score (not -inf, not NaN)
has a first digit, the top RADIX_BITS = 11 bits of its ordered bits (keys._ordered_bits, as an unsigned order:
a larger digit, a larger score). From the row's digit histogram, the boundary digit b is the largest with at
least K keys at or above it (-1: fewer than K keys in all); the keys of digits above b (fewer than K) are
answers, the K-th best key has digit b, and the rest of the answer is the need = K - (keys above b) largest
keys of digit b. Those rank below every key above b, so the row is the sure keys sorted, then the boundary's
best `need` sorted: no merge. Exact for any data: ties are ordering keys (score, then position), distinct.
Launches: (1) radix_count_kernel, (rows, programs a row): each program counts its span of the row into the
row's histogram in global memory (on a GPU one atomic a digit a warp: match.any and popc in inline PTX); (2)
radix_collect_kernel, the same grid: each program finds b from the histogram itself (a suffix sum over 2,048
counters) and appends its sure keys and boundary keys to the row's two scratch rows (an atomic slot a key;
boundary keys past CAP are counted, not stored); (3) radix_finish_kernel, a program a row: one tl.sort of the
sure keys (K) and one of the boundary keys (256 or CAP = 2,048, the smaller that holds them); a boundary
digit with more than CAP keys (one eighth of a binade holding them: all-equal or clustered scores) is
finished by bisection over its keys' range, one pass over the row a step (up to 53), then its keys at or
above the need-th largest stored in column order and sorted. Not yet run on a GPU (tests/kernels/
test_selection.py has its GPU test; CI runs the kernels under the interpreter, one atomic a key).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .devices import runs_triton_stages
from .errors import BackendUnavailableError, InputError
from .keys import NO_KEY, NO_KEY_C, _ordered_bits, _ordering_keys, make_keys, select_topk_keys

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


# ------------------------------------------------------------------ the radix selector (exact by itself)

RADIX_BITS = 11  # the first digit: the top 11 bits of the ordered score
RADIX_BINS = 1 << RADIX_BITS
RADIX_BLOCK = 2048  # columns a program reads a step
RADIX_PROGRAMS = 512  # programs of the counting and collecting launches a call aims at (rows x programs a row)
BOUNDARY_TIERS = (256, 2048)  # boundary keys one sort ranks (the smallest tier that holds them); more: bisection

# The warp's count of each digit, given to one lane (the lowest with it), 0 to the others: match.any.sync finds the
# lanes holding the same value, popc counts them. Dead lanes carry a digit no live lane has.
_WARP_COUNT_ASM = tl.constexpr("""
{
.reg .b32 m, l, low;
.reg .pred p;
match.any.sync.b32 m, $1, 0xffffffff;
mov.u32 l, %laneid;
neg.s32 low, m;
and.b32 low, low, m;
shr.b32 low, low, l;
setp.eq.u32 p, low, 1;
popc.b32 $0, m;
selp.b32 $0, $0, 0, p;
}
""")


@triton.jit
def _top_digit(scores, BITS: tl.constexpr):
    """int32 in [0, 2^BITS): the top BITS bits of each score's ordered bits (keys._ordered_bits), as an
    unsigned order (a larger digit, a larger score)."""
    return ((_ordered_bits(scores) >> (32 - BITS)) + (1 << (BITS - 1))).to(tl.int32)


@triton.jit
def radix_count_kernel(
    scores_ptr,
    score_stride,
    width,
    span,  # float32 [rows, width]; columns a program counts
    hist_ptr,  # int32 [rows, BINS], zeroed: the count of each first digit
    BITS: tl.constexpr,
    BLOCK: tl.constexpr,
    AGGREGATE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * span
    last = tl.minimum(first + span, width)
    hist_row = hist_ptr + row * (1 << BITS)
    for c0 in range(first, last, BLOCK):
        offs_c = c0 + tl.arange(0, BLOCK)
        scores = tl.load(scores_ptr + row * score_stride + offs_c, mask=offs_c < last, other=float("-inf"))
        live = scores > float("-inf")  # -inf (outside the window) and NaN are no key
        digit = _top_digit(scores, BITS)
        if AGGREGATE:  # one atomic a digit a warp
            count = tl.inline_asm_elementwise(
                _WARP_COUNT_ASM,
                "=r,r",
                [tl.where(live, digit, 1 << BITS)],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )
            tl.atomic_add(hist_row + digit, count, mask=live & (count > 0), sem="relaxed")
        else:
            tl.atomic_add(hist_row + digit, 1, mask=live, sem="relaxed")


@triton.jit
def _boundary_digit(hist_row, TOPK: tl.constexpr, BITS: tl.constexpr):
    """The first digit of the row's K-th best key (-1 where the row holds fewer than K keys), from its
    histogram: the largest digit with at least K keys at or above it."""
    offs_b = tl.arange(0, 1 << BITS)
    at_or_above = tl.cumsum(tl.load(hist_row + offs_b), axis=0, reverse=True)
    return tl.max(tl.where(at_or_above >= TOPK, offs_b, -1), axis=0)


@triton.jit
def radix_collect_kernel(
    scores_ptr,
    score_stride,
    width,
    span,
    hist_ptr,
    sure_ptr,  # int64 [rows, TOPK]: keys above the boundary digit (fewer than K), unordered
    boundary_ptr,  # int64 [rows, CAP]: keys of the boundary digit, unordered (the first CAP)
    counts_ptr,  # int32 [2, rows], zeroed: sure and boundary keys of each row
    rows,
    TOPK: tl.constexpr,
    CAP: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * span
    last = tl.minimum(first + span, width)
    boundary = _boundary_digit(hist_ptr + row * (1 << BITS), TOPK, BITS)
    for c0 in range(first, last, BLOCK):
        offs_c = c0 + tl.arange(0, BLOCK)
        scores = tl.load(scores_ptr + row * score_stride + offs_c, mask=offs_c < last, other=float("-inf"))
        live = scores > float("-inf")
        digit = _top_digit(scores, BITS)
        keys = _ordering_keys(scores, offs_c)
        sure = live & (digit > boundary)
        tied = live & (digit == boundary)
        zeros = tl.zeros([BLOCK], tl.int64)
        slot = tl.atomic_add(counts_ptr + row + zeros, 1, mask=sure, sem="relaxed")
        tl.store(sure_ptr + row * TOPK + slot, keys, mask=sure)  # fewer than K sure keys: slot < TOPK
        slot = tl.atomic_add(counts_ptr + rows + row + zeros, 1, mask=tied, sem="relaxed")
        tl.store(boundary_ptr + row * CAP + slot, keys, mask=tied & (slot < CAP))


@triton.jit
def _store_sorted(keys_ptr, count, out_ptr, limit, SIZE: tl.constexpr):
    """The first `count` of keys_ptr[0, SIZE) sorted descending (NO_KEY beyond) into out_ptr[0, limit)."""
    offs = tl.arange(0, SIZE)
    ranked = tl.sort(tl.load(keys_ptr + offs, mask=offs < count, other=NO_KEY_C), descending=True)
    tl.store(out_ptr + offs, ranked, mask=offs < limit)


@triton.jit
def radix_finish_kernel(
    scores_ptr,
    score_stride,
    width,
    hist_ptr,
    sure_ptr,
    boundary_ptr,
    counts_ptr,
    rows,
    out_ptr,
    out_stride,  # int64 [rows, TOPK] (row stride out_stride): the answer
    TOPK: tl.constexpr,
    CAP: tl.constexpr,
    SMALL: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    out_row = out_ptr + row * out_stride
    n_sure = tl.load(counts_ptr + row)
    n_tied = tl.load(counts_ptr + rows + row)
    need = TOPK - n_sure
    # the sure keys rank above every boundary key (a larger first digit): sorted, they lead the row
    _store_sorted(sure_ptr + row * TOPK, n_sure, out_row, n_sure, TOPK)
    if n_tied <= SMALL:
        _store_sorted(boundary_ptr + row * CAP, n_tied, out_row + n_sure, need, SMALL)
    elif n_tied <= CAP:
        _store_sorted(boundary_ptr + row * CAP, n_tied, out_row + n_sure, need, CAP)
    else:
        # More boundary keys than CAP (many scores in one 1/8 binade): the need-th largest of them by bisection
        # over their keys, one pass over the row a step, then the keys at or above it in column order.
        boundary = _boundary_digit(hist_ptr + row * (1 << BITS), TOPK, BITS)
        ordered_lo = (boundary - (1 << (BITS - 1))).to(tl.int64) << (32 - BITS)
        lo = ordered_lo << 32  # the bucket's smallest key
        hi = lo + (((1 << (32 - BITS)) << 32) - 1)  # its largest (no overflow at the top bucket)
        while lo < hi:  # invariant: >= need keys at or above lo, < need above hi
            mid = lo + (hi - lo + 1) // 2
            count = tl.zeros([], tl.int32)
            for c0 in range(0, width, BLOCK):
                offs_c = c0 + tl.arange(0, BLOCK)
                scores = tl.load(scores_ptr + row * score_stride + offs_c, mask=offs_c < width, other=float("-inf"))
                keys = _ordering_keys(scores, offs_c)
                hit = (scores > float("-inf")) & (_top_digit(scores, BITS) == boundary) & (keys >= mid)
                count += tl.sum(hit.to(tl.int32), axis=0)
            if count >= need:
                lo = mid
            else:
                hi = mid - 1
        taken = tl.zeros([], tl.int32)
        for c0 in range(0, width, BLOCK):
            offs_c = c0 + tl.arange(0, BLOCK)
            scores = tl.load(scores_ptr + row * score_stride + offs_c, mask=offs_c < width, other=float("-inf"))
            keys = _ordering_keys(scores, offs_c)
            hit = (scores > float("-inf")) & (_top_digit(scores, BITS) == boundary) & (keys >= lo)
            slot = taken + tl.cumsum(hit.to(tl.int32), axis=0) - 1
            tl.store(sure_ptr + row * TOPK + slot, keys, mask=hit)  # exactly `need` keys: slots < need <= TOPK
            taken += tl.sum(hit.to(tl.int32), axis=0)
        tl.debug_barrier()  # the keys stored above are read back below
        _store_sorted(sure_ptr + row * TOPK, need, out_row + n_sure, need, TOPK)


def select_topk_radix(scores: torch.Tensor, k: int, *, aggregate: bool | None = None, cap: int | None = None):
    """int64 [rows, k]: the exact top-k ordering keys of each row of a dense float32 score matrix whose column is
    the position (-inf and NaN entries are no key), sorted descending, NO_KEY padded; the answer of
    select_topk_dense's torch selector, bit for bit, on every row without a NaN (a row with one publishes nothing,
    module docstring). Three launches, no host synchronization (module docstring, "The radix selector"). k a power
    of two; `aggregate` (default: on CUDA) counts a warp's equal digits with one atomic (inline PTX, no interpreter);
    `cap` (default BOUNDARY_TIERS[-1], a power of two >= k) bounds the boundary keys one sort ranks (tests force the
    bisection with a small one)."""
    rows, width = scores.shape
    if k <= 0 or k & (k - 1):
        raise ValueError(f"k={k} must be a power of two (SUPPORTED_TOPK)")
    cap = cap or BOUNDARY_TIERS[-1]
    small = min(BOUNDARY_TIERS[0], cap)
    if cap & (cap - 1) or cap < k:
        raise ValueError(f"cap={cap} must be a power of two >= k={k}")
    out = torch.full((rows, k), NO_KEY, dtype=torch.int64, device=scores.device)
    if rows == 0 or width == 0:
        return out
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    aggregate = scores.device.type == "cuda" if aggregate is None else aggregate
    per_row = max(1, min(triton.cdiv(width, RADIX_BLOCK), triton.cdiv(RADIX_PROGRAMS, rows)))
    span = triton.cdiv(triton.cdiv(width, per_row), RADIX_BLOCK) * RADIX_BLOCK
    per_row = triton.cdiv(width, span)
    hist = torch.zeros((rows, RADIX_BINS), dtype=torch.int32, device=scores.device)
    counts = torch.zeros((2, rows), dtype=torch.int32, device=scores.device)
    sure = torch.empty((rows, k), dtype=torch.int64, device=scores.device)
    boundary = torch.empty((rows, cap), dtype=torch.int64, device=scores.device)
    radix_count_kernel[(rows, per_row)](
        scores, scores.stride(0), width, span, hist, BITS=RADIX_BITS, BLOCK=RADIX_BLOCK, AGGREGATE=aggregate
    )
    radix_collect_kernel[(rows, per_row)](
        scores,
        scores.stride(0),
        width,
        span,
        hist,
        sure,
        boundary,
        counts,
        rows,
        TOPK=k,
        CAP=cap,
        BITS=RADIX_BITS,
        BLOCK=RADIX_BLOCK,
    )
    radix_finish_kernel[(rows,)](
        scores,
        scores.stride(0),
        width,
        hist,
        sure,
        boundary,
        counts,
        rows,
        out,
        out.stride(0),
        TOPK=k,
        CAP=cap,
        SMALL=small,
        BITS=RADIX_BITS,
        BLOCK=RADIX_BLOCK,
    )
    return out


def _value_topk(scores: torch.Tensor, take: int, selector: str) -> tuple[torch.Tensor, torch.Tensor]:
    if selector == "torch":
        values, positions = torch.topk(scores, take, dim=1, largest=True, sorted=True)
        return values, positions
    if selector == "flashinfer":
        return flashinfer_topk(scores, take)
    raise InputError(f"selector={selector!r} is not known; use 'torch', 'flashinfer' or 'radix'")


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
    if selector == "radix":
        if not runs_triton_stages(scores.device):
            raise BackendUnavailableError(
                f"selector='radix' runs its Triton kernels on CUDA, got {scores.device}; use selector='torch' there"
            )
        return select_topk_radix(scores, k)
    take = min(k + 1, width)
    if take == 0:
        return torch.full((rows, k), NO_KEY, dtype=torch.int64, device=scores.device)
    values, positions = _value_topk(scores, take, selector)
    keys = make_keys(values, positions)
    keys = torch.where(torch.isneginf(values), NO_KEY, keys)
    if take == k + 1:
        settle_ties(scores, values.contiguous(), keys, k)
    return select_topk_keys(keys, k)
