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
has two digits, bits 31-21 and 20-10 of its ordered bits (keys._ordered_bits, as an unsigned order: a larger
digit, a larger score; a first digit spans a quarter of a binade). From the row's first-digit histogram the
boundary b1 is the largest digit with at least K keys at or above it (-1: fewer than K keys in all); among the
keys of b1, from their second-digit histogram, b2 is the largest with at least K - (keys above b1) at or above
it. The keys above (b1, b2) number fewer than K and are all answers ("sure"); the K-th best key has digits (b1,
b2), and need = K - sure best of that boundary complete the answer. Sure keys rank above every boundary key, so
the row is the sure keys sorted, then the boundary's best `need` sorted: no merge. Exact for any data: keys are
(score, then position), distinct.
The floor: the row's columns fall into K strided groups (the column modulo K); the largest score of each group
is a key, so K distinct keys score at or above the smallest of those K maxima: the K-th best key does too, and
a key below the floor is no answer. On normal scores ~K ln K keys of a row reach it (~5 % of 65,536 at K = 512);
a group without a key (fewer than K keys in the row) leaves no floor. The histograms count only keys at or above
the floor, which changes neither b1 nor b2 (the counts above the floor's digits are exact, and at its digits
still reach the rank), and the boundary list keeps only those.
Launches (rows x programs a row for the first four, each program a span of the row; RADIX_CONFIG): (1) each
program's K group maxima (their smallest over the row's programs is read by the next launches), and the row's
counters zeroed (no memset); (2) count the first digits of the keys at or above the floor into the row's histogram
in global memory (on a GPU one atomic a digit a warp: match.any.sync and popc in inline PTX; RADIX_CONFIG
"aggregate" False: one a key); (3) count the second digits of those keys in b1 (each program finds b1 from the
histogram itself: a suffix sum over 2,048 counters); (4) append the sure keys and the boundary keys to the row's two
scratch lists (a 2,048-column block's slots in both by one atomic on the row's packed list lengths, then a prefix
sum; RADIX_CONFIG "warp_slots": a warp's, by one atomic a list, _warp_append; boundary keys past CAP are counted, not
stored); (5) a program a row: one tl.sort of the sure keys (K) and one of the boundary keys (256 or CAP = 2,048, the
smaller that holds them). More than CAP boundary keys agree in 22 bits of their scores (equal or near-equal scores);
then the need-th best of them is found by radix narrowing over the 10 bits left (_select_in_range: two narrowing passes
over the row and one to collect), and the keys above it plus the first ones at it in column order complete the row. GPU
time on an H100 (bench/JOURNAL.md 22a, the loops pipelined): 64 x 65,536 scores (K = 512) 84 us (floor 10, counts 24,
collect 44, finish 6), one row of 65,536 27 us; tests/kernels/test_selection.py has its GPU tests; CI runs the
kernels under the interpreter.
The candidates form (RADIX_CONFIG "candidates"; four launches, two passes over the scores; K up to RADIX_BLOCK / 2):
the floor launch takes 2K strided groups (CANDIDATE_GROUPS), and the row's floor is the K-th largest of
their maxima (radix_threshold_kernel, a program a row, by radix narrowing): the groups of the K largest maxima hold
K distinct keys at or above it, so the K-th best key does, and on any data without ties ~1.35 K keys reach it (K
ln K-ish for the smallest of K maxima; simulated on normal scores: 708 of 65,536 at K = 512, 1,389 at K = 1024,
independent of the scores' spread, as the floor is a rank). The collect launch appends every key at or above the
floor to one list of 2K slots; the finishing launch sorts the list (K or 2K keys) and writes the first K. More than
2K keys at or above the floor (many equal scores at the top, a row of one value) take the row's best K by radix
narrowing between the floor and the row's best score (_select_in_range: at most 4 passes over the row, none where
they are equal, then one to collect). The collect's list is the digits form's first (_append: its second unused).
The column loops are software-pipelined (RADIX_CONFIG "stages": the next blocks load by cp.async while one is
counted). Measured on an H100 and deleted (bench/JOURNAL.md 22a): the five launches' work in one, a program a row
(the phases in turn with a barrier between them): 165 against 84 us at 64 x 65,536, 162 against 27 at one row; a row's
passes on one SM wait out the L2's latency, where five launches spread it over up to 32 programs a row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .devices import runs_triton_stages
from .errors import BackendUnavailableError, InputError
from .keys import NO_KEY, NO_KEY_C, _ordered_bits, _ordering_keys, make_keys, select_topk_keys
from .scratch import Scratch

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

RADIX_BITS = (11, 11)  # the two digits counted: bits 31-21 and 20-10 of the ordered score (10 bits remain)
RADIX_BINS = 1 << 11
RADIX_BLOCK = 2048  # columns a program reads a step
#: the launches' shape: `programs` the floor's, counting and collecting launches aim at in a call (rows x programs a
#: row); `warps` every launch's (offline sm_90 at 8 warps, 4 stages: floor 59, count 48, collect 114, finish 116
#: registers);
#: `aggregate` whether a warp's equal digits are counted with one atomic (match.any and popc in inline PTX; CUDA only),
#: else one atomic a key. Measured on an H100 (bench/JOURNAL.md 21a-b): on normal scores one a key is faster (counts 23
#: against 27 us at 64 x 65,536), but where a row's keys share a digit they contend for one counter: rows of equal
#: scores (a padded decode row with a zeroed query is one) take 815 against 543 us at 64 x 65,536, 1,106 against 674 at
#: 128 x 65,536 (K = 1024). The bounded worst case wins. `stages`: the column loops' software pipelining (tl.range
#: num_stages: the next blocks load by cp.async while one is counted); measured on an H100 (bench/JOURNAL.md 22a, GPU
#: busy of a dense-route call): 4 stages against 1, 64 x 65,536 (K = 512) 319.2 against 325.1 us (collect 44 / 48,
#: counts 24 / 27), 32 x 4 x 65,536 (K = 1024) 460.5 against 479.1, 128 x 2 x 32,768 477.1 against 494.6, one row 46.2
#: against 46.8. A dict, so that a probe can set it (bench.probes.paged_variants); read at each call.
#: `warp_slots`: the collect launch's list slots (either form's) a warp at a time (_warp_append: on CUDA one atomic a
#: list for a warp's keys of one register, inline PTX, no barrier; elsewhere one atomic a key), where the default takes
#: them a block at a time (two block sums, an atomic, two block prefix sums: barriers across the program's warps a
#: block). Not yet measured. `candidates`: the candidates form (module docstring; K up to RADIX_BLOCK / 2, where its 2K
#: groups fit a block: the digits form above that), offline sm_90 threshold 59, collect 114 (80 with warp slots), finish
#: 64 registers. Not yet measured; a workspace is measured under the form in force (workspace.workspace_bytes).
RADIX_CONFIG = dict(programs=512, warps=8, aggregate=True, stages=4, warp_slots=False, candidates=False)
CANDIDATE_GROUPS = 2  # the candidates form's floor groups a K (module docstring)
# loads of the programs' maxima in flight in radix_threshold_kernel (16 KB each; 32 of them at one row of 65,536)
THRESHOLD_STAGES = 3


DEAD = -(2**31)  # the ordered bits of no key: below every score's (-inf's are -2,139,095,041)
DEAD_C = tl.constexpr(DEAD)
RANGE_DIGIT = tl.constexpr(8)  # bits a pass of the radix narrowing (_narrowed)
RANGE_RADIX = tl.constexpr(256)  # its digits: 1 << RANGE_DIGIT
# columns a step of the narrowing's passes (one program a row; 2,048 spilled a register in the finishing kernels)
RANGE_BLOCK = tl.constexpr(1024)
# boundary keys one sort ranks (the smallest tier that holds them); more: radix narrowing (_select_in_range)
BOUNDARY_TIERS = (256, 2048)

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


# The warp's sure and boundary keys of one register appended to their lists (one instance for the 32 lanes; $1 the
# key's list: 0 none, 1 the sure keys, 2 the boundary keys; $2 the address of the row's packed lengths, sure keys in
# bits 0-31, boundary keys in 32-63; $3 the key; $4, $5 the lists; $6, $7 their sizes, TOPK and CAP). match.any.sync
# finds the lanes of the same list, the lowest of them adds their number to the list's length by one atomic, shfl.sync
# hands the length it found to the others, each lane adds its rank (the lanes below it in the list) and stores its key
# there when the slot lies inside the list ($0: the slot). The slots are taken and used in one asm block: Triton
# copies an elementwise asm whose result it needs in several layouts, which must not happen to an atomic or split the
# lanes that take slots from those that read them.
_WARP_APPEND_ASM = tl.constexpr("""
{
.reg .b32 m, lt, rank, count, low, leader, lo, hi, slot;
.reg .b64 step, old, at;
.reg .pred is_leader, is_listed, is_boundary, keep;
match.any.sync.b32 m, $1, 0xffffffff;
mov.u32 lt, %lanemask_lt;
and.b32 lt, lt, m;
popc.b32 rank, lt;
popc.b32 count, m;
neg.s32 low, m;
and.b32 low, low, m;
bfind.u32 leader, low;
mov.u32 lt, %laneid;
setp.eq.u32 is_leader, leader, lt;
setp.ne.u32 is_listed, $1, 0;
and.pred is_leader, is_leader, is_listed;
setp.eq.u32 is_boundary, $1, 2;
cvt.u64.u32 step, count;
@is_boundary shl.b64 step, step, 32;
mov.b64 old, 0;
@is_leader atom.global.relaxed.gpu.add.u64 old, [$2], step;
mov.b64 {lo, hi}, old;
@is_boundary mov.b32 lo, hi;
shfl.sync.idx.b32 lo, lo, leader, 0x1f, 0xffffffff;
add.u32 slot, lo, rank;
setp.eq.u32 keep, $1, 1;
setp.lt.and.u32 keep, slot, $6, keep;
mul.wide.u32 at, slot, 8;
add.u64 at, at, $4;
@keep st.global.u64 [at], $3;
setp.lt.and.u32 keep, slot, $7, is_boundary;
mul.wide.u32 at, slot, 8;
add.u64 at, at, $5;
@keep st.global.u64 [at], $3;
mov.u32 $0, slot;
}
""")


@triton.jit
def _warp_append(count_ptr, sure_row, boundary_row, keys, sure, tied, TOPK: tl.constexpr, CAP: tl.constexpr):
    """Append the `sure` and `tied` (boundary) ones of int64 `keys` to the row's two lists (sure_row: TOPK slots,
    boundary_row: CAP, the count past it kept only) by the row's packed lengths at count_ptr (sure keys bits 0-31,
    boundary keys 32-63): one atomic for each list of a warp's keys of one register (_WARP_APPEND_ASM, inline PTX,
    CUDA only)."""
    which = tl.where(sure, 1, tl.where(tied, 2, 0))
    zero = 0 * which
    tl.inline_asm_elementwise(
        _WARP_APPEND_ASM,
        "=r,r,l,l,l,l,r,r",
        [
            which,
            (count_ptr + zero).to(tl.int64, bitcast=True),
            keys,
            (sure_row + zero).to(tl.int64, bitcast=True),
            (boundary_row + zero).to(tl.int64, bitcast=True),
            zero + TOPK,
            zero + CAP,
        ],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _key_append(count_ptr, sure_row, boundary_row, keys, sure, tied, TOPK: tl.constexpr, CAP: tl.constexpr):
    """_warp_append by one atomic a key (the interpreter's: no inline PTX)."""
    taken = tl.atomic_add(count_ptr + 0 * keys, tl.where(sure, 1, 4294967296), mask=sure | tied, sem="relaxed")
    tl.store(sure_row + (taken & 0xFFFFFFFF), keys, mask=sure & ((taken & 0xFFFFFFFF) < TOPK))
    tl.store(boundary_row + (taken >> 32), keys, mask=tied & ((taken >> 32) < CAP))


@triton.jit
def _digits(scores):
    """(live, ordered, first, second) of float32 scores: live (not -inf, not NaN: a key), the int32 ordered bits
    (keys._ordered_bits) and their first and second digits, bits 31-21 and 20-10 as an unsigned order (a larger
    digit, a larger score), each in [0, 2048)."""
    ordered = _ordered_bits(scores).to(tl.int32)
    first = (ordered >> 21) + 1024
    second = (ordered >> 10) & 2047
    return scores > float("-inf"), ordered, first, second


@triton.jit
def _count_digits(hist_row, digit, counted, AGGREGATE: tl.constexpr):
    """Add the `counted` ones of `digit` to the row's histogram (global memory): an atomic a digit a warp where
    AGGREGATE (inline PTX: match.any and popc), else one a key."""
    if AGGREGATE:
        count = tl.inline_asm_elementwise(
            _WARP_COUNT_ASM, "=r,r", [tl.where(counted, digit, 4096)], dtype=tl.int32, is_pure=False, pack=1
        )
        tl.atomic_add(hist_row + digit, count, mask=counted & (count > 0), sem="relaxed")
    else:
        tl.atomic_add(hist_row + digit, 1, mask=counted, sem="relaxed")


@triton.jit
def _largest_reaching(counts, rank):
    """The largest digit of a 2,048-digit histogram `counts` with at least `rank` keys at or above it (-1 where the
    histogram holds fewer than `rank`)."""
    offs_b = tl.arange(0, 2048)
    at_or_above = tl.cumsum(counts, axis=0, reverse=True)
    return tl.max(tl.where(at_or_above >= rank, offs_b, -1), axis=0)


@triton.jit
def _boundary(hist_row, TOPK: tl.constexpr):
    """b1, the first digit of the K-th best key, from a row's first histogram (hist_row: [2, 2048], its two
    histograms): _largest_reaching K (-1 where the row holds fewer than K)."""
    return _largest_reaching(tl.load(hist_row + tl.arange(0, 2048)), TOPK)


@triton.jit
def _boundaries(hist_row, TOPK: tl.constexpr):
    """(b1, b2), both digits of the K-th best key, from a row's two histograms, read side by side: b1 as _boundary;
    b2 the largest second digit with at least K - (keys above b1) keys of b1 at or above it (-1 where b1 is: then
    the second histogram is empty)."""
    offs_b = tl.arange(0, 2048)
    first = tl.load(hist_row + offs_b)
    second = tl.load(hist_row + 2048 + offs_b)
    b1 = _largest_reaching(first, TOPK)
    above1 = tl.sum(tl.where(offs_b > b1, first, 0), axis=0)
    return b1, _largest_reaching(second, TOPK - above1)


@triton.jit
def _group_maxima(partial_row, per_row, GROUPS: tl.constexpr, STAGES: tl.constexpr):
    """A row's GROUPS group maxima (ordered bits; DEAD: a group without a key), each the largest over the row's
    programs' (radix_floor_kernel). The programs' maxima are read 4,096 at a time (a load each, not one a program: a
    row of one call can have hundreds of programs), STAGES loads in flight (cp.async)."""
    CHUNK: tl.constexpr = 4096 // GROUPS
    offs_p = tl.arange(0, CHUNK)[:, None]
    offs_g = tl.arange(0, GROUPS)[None, :]
    best = tl.full([GROUPS], DEAD_C, tl.int32)
    for p0 in tl.range(0, per_row, CHUNK, num_stages=STAGES):
        maxima = tl.load(partial_row + (p0 + offs_p) * GROUPS + offs_g, mask=p0 + offs_p < per_row, other=DEAD_C)
        best = tl.maximum(best, tl.max(maxima, axis=0))
    return best


@triton.jit
def _floor(partial_row, per_row, GROUPS: tl.constexpr):
    """A row's floor (ordered bits): the smallest of its GROUPS group maxima (_group_maxima). GROUPS >= K distinct
    keys score at or above it, so the K-th best key does: a key below it is no answer. DEAD where a group holds no
    key (then every key counts)."""
    return tl.min(_group_maxima(partial_row, per_row, GROUPS, 1), axis=0)


@triton.jit
def radix_floor_kernel(
    scores_ptr,
    score_stride,
    width,
    span,  # float32 [rows, width]; columns a program reads
    partial_ptr,  # int32 [rows, programs a row, GROUPS]: each program's group maxima (ordered bits; DEAD: no key)
    hist_ptr,  # int32 [rows, 2, 2048] (HISTOGRAMS) and
    counts_ptr,  # int64 [rows]: zeroed here, by each row's first program
    GROUPS: tl.constexpr,
    BLOCK: tl.constexpr,
    STAGES: tl.constexpr,
    HISTOGRAMS: tl.constexpr,
):
    """The row's keys in GROUPS strided groups (the column modulo GROUPS), each program's largest of each (_floor
    takes the smallest of their maxima, radix_threshold_kernel the K-th largest); and the counters of the launches
    after it zeroed (the digits' histograms where HISTOGRAMS)."""
    row = tl.program_id(0).to(tl.int64)
    program = tl.program_id(1)
    first_col = program * span
    last = tl.minimum(first_col + span, width)
    row_scores = scores_ptr + row * score_stride
    offs = tl.arange(0, BLOCK // GROUPS)[:, None] * GROUPS + tl.arange(0, GROUPS)[None, :]
    best = tl.full([GROUPS], DEAD_C, tl.int32)
    # (span and BLOCK are multiples of GROUPS: a column's group is c % GROUPS)
    for c0 in tl.range(first_col, last, BLOCK, num_stages=STAGES):
        cols = c0 + offs
        scores = tl.load(row_scores + cols, mask=cols < last, other=float("-inf"))
        live, ordered, _, _ = _digits(scores)
        best = tl.maximum(best, tl.max(tl.where(live, ordered, DEAD_C), axis=0))
    tl.store(partial_ptr + (row * tl.num_programs(1) + program) * GROUPS + tl.arange(0, GROUPS), best)
    if program == 0:
        if HISTOGRAMS:
            offs_h = tl.arange(0, 4096)
            tl.store(hist_ptr + row * 4096 + offs_h, tl.zeros([4096], tl.int32))
        tl.store(counts_ptr + row, tl.zeros([], tl.int64))


@triton.jit
def radix_count_kernel(
    scores_ptr,
    score_stride,
    width,
    span,  # float32 [rows, width]; columns a program counts
    partial_ptr,  # radix_floor_kernel's group maxima
    hist_ptr,  # int32 [rows, 2, 2048], zeroed: each row's first digits' counts, then its second's
    TOPK: tl.constexpr,
    GROUPS: tl.constexpr,
    BLOCK: tl.constexpr,
    AGGREGATE: tl.constexpr,
    SECOND: tl.constexpr,
    STAGES: tl.constexpr,
):
    """SECOND = False: count the first digits of the program's keys at or above the row's floor. SECOND: the second
    digits of those in the boundary's first digit (_boundary of the first counts)."""
    row = tl.program_id(0).to(tl.int64)
    first_col = tl.program_id(1) * span
    last = tl.minimum(first_col + span, width)
    floor = _floor(partial_ptr + row * tl.num_programs(1) * GROUPS, tl.num_programs(1), GROUPS)
    hist_row = hist_ptr + row * 4096
    if SECOND:
        b1 = _boundary(hist_row, TOPK)
    for c0 in tl.range(first_col, last, BLOCK, num_stages=STAGES):
        offs_c = c0 + tl.arange(0, BLOCK)
        scores = tl.load(scores_ptr + row * score_stride + offs_c, mask=offs_c < last, other=float("-inf"))
        live, ordered, first, second = _digits(scores)
        counted = live & (ordered >= floor)
        if SECOND:
            _count_digits(hist_row + 2048, second, counted & (first == b1), AGGREGATE)
        else:
            _count_digits(hist_row, first, counted, AGGREGATE)


@triton.jit
def _sure_and_tied(row_scores, c0, last, floor, b1, b2, BLOCK: tl.constexpr):
    """(scores, columns, sure, tied) of the row's BLOCK columns from c0: the keys above the boundary (b1, b2) and
    those in it at or above the floor."""
    offs_c = c0 + tl.arange(0, BLOCK)
    scores = tl.load(row_scores + offs_c, mask=offs_c < last, other=float("-inf"))
    live, ordered, first, second = _digits(scores)
    sure = live & ((first > b1) | ((first == b1) & (second > b2)))  # fewer than K: slots < TOPK
    tied = live & (first == b1) & (second == b2) & (ordered >= floor)
    return scores, offs_c, sure, tied


@triton.jit
def _append(
    count_ptr,
    sure_row,
    boundary_row,
    scores,
    offs_c,
    sure,
    tied,
    SURE: tl.constexpr,
    CAP: tl.constexpr,
    TIED: tl.constexpr,
    WARP_SLOTS: tl.constexpr,
    AGGREGATE: tl.constexpr,
):
    """Append the keys of a block's `sure` and `tied` scores (at columns offs_c) to the row's two lists (sure_row:
    SURE slots, boundary_row: CAP) by the row's packed lengths at count_ptr (the first list's in bits 0-31, the
    second's in 32-63: every key counted, those past a list's size not stored; TIED False: no `tied` key, the second
    list unused): the block's slots in both lists by one atomic, then a prefix sum; WARP_SLOTS: a warp's keys of one
    register by one atomic a list (_warp_append where AGGREGATE, else one atomic a key, the interpreter's: no block
    sum, no barrier)."""
    if WARP_SLOTS:
        keys = _ordering_keys(scores, offs_c)
        if AGGREGATE:
            _warp_append(count_ptr, sure_row, boundary_row, keys, sure, tied, SURE, CAP)
        else:
            _key_append(count_ptr, sure_row, boundary_row, keys, sure, tied, SURE, CAP)
    else:
        n_sure = tl.sum(sure.to(tl.int32), axis=0)
        n_tied = tl.sum(tied.to(tl.int32), axis=0) if TIED else 0
        if n_sure + n_tied > 0:
            taken = tl.atomic_add(count_ptr, n_sure.to(tl.int64) + (n_tied.to(tl.int64) << 32), sem="relaxed")
            next_sure = (taken & 0xFFFFFFFF).to(tl.int32)
            next_tied = (taken >> 32).to(tl.int32)
            keys = _ordering_keys(scores, offs_c)
            slot = next_sure + tl.cumsum(sure.to(tl.int32), 0) - 1
            tl.store(sure_row + slot, keys, mask=sure & (slot < SURE))
            if TIED:
                slot = next_tied + tl.cumsum(tied.to(tl.int32), 0) - 1  # past CAP: counted, not stored
                tl.store(boundary_row + slot, keys, mask=tied & (slot < CAP))


@triton.jit
def radix_collect_kernel(
    scores_ptr,
    score_stride,
    width,
    span,
    partial_ptr,
    hist_ptr,
    sure_ptr,  # int64 [rows, TOPK]: keys above the boundary (fewer than K), unordered
    boundary_ptr,  # int64 [rows, CAP]: keys of the boundary (both digits the K-th best key's) at or above the floor
    counts_ptr,  # int64 [rows], zeroed: each row's sure keys (bits 0-31) and boundary keys (bits 32-63)
    TOPK: tl.constexpr,
    GROUPS: tl.constexpr,
    CAP: tl.constexpr,
    BLOCK: tl.constexpr,
    STAGES: tl.constexpr,
    WARP_SLOTS: tl.constexpr,
    AGGREGATE: tl.constexpr,
):
    """Append the program's sure and boundary keys to the row's two lists (_append: a block's slots or a warp's;
    measured on an H100, bench/JOURNAL.md 21a: one atomic a program after a counting pass was slower than a block's,
    53 against 48 us at 64 x 65,536)."""
    row = tl.program_id(0).to(tl.int64)
    first_col = tl.program_id(1) * span
    last = tl.minimum(first_col + span, width)
    floor = _floor(partial_ptr + row * tl.num_programs(1) * GROUPS, tl.num_programs(1), GROUPS)
    b1, b2 = _boundaries(hist_ptr + row * 4096, TOPK)
    row_scores = scores_ptr + row * score_stride
    sure_row = sure_ptr + row * TOPK
    boundary_row = boundary_ptr + row * CAP
    count_ptr = counts_ptr + row
    for c0 in tl.range(first_col, last, BLOCK, num_stages=STAGES):
        scores, offs_c, sure, tied = _sure_and_tied(row_scores, c0, last, floor, b1, b2, BLOCK)
        _append(count_ptr, sure_row, boundary_row, scores, offs_c, sure, tied, TOPK, CAP, True, WARP_SLOTS, AGGREGATE)


@triton.jit
def _store_sorted(keys_ptr, count, out_ptr, limit, SIZE: tl.constexpr, BY_RANK: tl.constexpr):
    """The first `count` (<= SIZE) of keys_ptr[0, SIZE), distinct keys, sorted descending (NO_KEY beyond) into
    out_ptr[0, limit): one tl.sort, or BY_RANK (Triton's interpreter, where tl.sort's network of 2,048 keys takes ~7 s
    of Python) each key stored at its rank, the count of the keys above it."""
    offs = tl.arange(0, SIZE)
    keys = tl.load(keys_ptr + offs, mask=offs < count, other=NO_KEY_C)
    if BY_RANK:  # (compared a chunk of keys at a time: the interpreter takes tensors of up to 2^20 elements)
        CHUNK: tl.constexpr = min(SIZE, 1048576 // SIZE)
        rank = tl.zeros([SIZE], tl.int32)
        for j0 in tl.static_range(0, SIZE, CHUNK):
            offs_j = j0 + tl.arange(0, CHUNK)
            others = tl.load(keys_ptr + offs_j, mask=offs_j < count, other=NO_KEY_C)
            rank += tl.sum((others[None, :] > keys[:, None]).to(tl.int32), axis=1)
        tl.store(out_ptr + rank, keys, mask=(offs < count) & (rank < limit))
        tl.store(out_ptr + offs, NO_KEY_C, mask=(offs >= count) & (offs < limit))
    else:
        tl.store(out_ptr + offs, tl.sort(keys, descending=True), mask=offs < limit)


@triton.jit
def _first_shift(base, end):
    """The narrowing's first shift (a multiple of RANGE_DIGIT) over the window [base, end] (int64): the smallest with
    at most RANGE_RADIX digits in the window ((end - base) >> shift < RANGE_RADIX)."""
    shift = tl.zeros([], tl.int64)
    while ((end - base) >> shift) >= RANGE_RADIX:
        shift += RANGE_DIGIT
    return shift


@triton.jit
def _digit_of(values, base, end, shift):
    """(digit int32, inside) of int64 `values` in the window [base, end]: (value - base) >> shift, 0 outside."""
    inside = (values >= base) & (values <= end)
    return tl.where(inside, (values - base) >> shift, 0).to(tl.int32), inside


@triton.jit
def _narrowed(hist, need, base, end, shift):
    """One radix-narrowing step: from `hist`, the histogram of the window [base, end]'s values by digit (_digit_of),
    the digit that holds the need-th largest of them; returns that digit's window, the need-th's rank among its
    values (the larger digits' values counted out) and the next shift. The window is one value once base == end."""
    bins = tl.arange(0, RANGE_RADIX)
    chosen = tl.max(tl.where(tl.cumsum(hist, axis=0, reverse=True) >= need, bins, 0), axis=0)
    need -= tl.sum(tl.where(bins > chosen, hist, 0), axis=0)
    base += chosen.to(tl.int64) << shift
    end = tl.minimum(end, base + (1 << shift) - 1)
    return need, base, end, tl.maximum(shift - RANGE_DIGIT, 0)


@triton.jit
def _select_in_range(row_scores, width, lo, hi, need, out_ptr):
    """Store into out_ptr[0, need), unordered, the best `need` keys of a row's keys whose ordered scores lie in
    [lo, hi] (int32; at least `need` keys do), one program: the need-th best score v of the range by radix narrowing
    (RANGE_DIGIT bits a pass over the row: a histogram of the window's keys by digit, the window narrowed to the
    digit of the need-th best, at most 4 passes), then the range's keys above v and, of those at v, the first in
    column order (keys of equal scores rank by column): one pass more; RANGE_BLOCK columns a step."""
    need = tl.zeros([], tl.int32) + need
    top = hi.to(tl.int64)
    base = lo.to(tl.int64)  # the window [base, end] holds the need-th best; the keys above it are counted out
    end = top
    shift = _first_shift(base, end)
    while base < end:
        hist = tl.zeros([RANGE_RADIX], tl.int32)
        for c0 in range(0, width, RANGE_BLOCK):
            offs_c = c0 + tl.arange(0, RANGE_BLOCK)
            scores = tl.load(row_scores + offs_c, mask=offs_c < width, other=float("-inf"))
            live, ordered, _, _ = _digits(scores)
            digit, inside = _digit_of(ordered.to(tl.int64), base, end, shift)
            hist += tl.histogram(digit, RANGE_RADIX, mask=live & inside)
        need, base, end, shift = _narrowed(hist, need, base, end, shift)
    # the range's keys above v are all taken (counted out above), then `need` of those at v, in column order
    at_seen = tl.zeros([], tl.int32)
    slots = tl.zeros([], tl.int32)
    for c0 in range(0, width, RANGE_BLOCK):
        offs_c = c0 + tl.arange(0, RANGE_BLOCK)
        scores = tl.load(row_scores + offs_c, mask=offs_c < width, other=float("-inf"))
        live, ordered, _, _ = _digits(scores)
        at = live & (ordered == base)
        keep = (live & (ordered > base) & (ordered <= top)) | (
            at & (at_seen + tl.cumsum(at.to(tl.int32), axis=0) <= need)
        )
        slot = slots + tl.cumsum(keep.to(tl.int32), axis=0) - 1
        tl.store(out_ptr + slot, _ordering_keys(scores, offs_c), mask=keep)  # exactly the `need` asked for
        at_seen += tl.sum(at.to(tl.int32), axis=0)
        slots += tl.sum(keep.to(tl.int32), axis=0)


@triton.jit
def radix_finish_kernel(
    scores_ptr,
    score_stride,
    width,
    hist_ptr,
    sure_ptr,
    boundary_ptr,
    counts_ptr,
    out_ptr,
    out_stride,  # int64 [rows, TOPK] (row stride out_stride): the answer, every slot written here
    TOPK: tl.constexpr,
    CAP: tl.constexpr,
    SMALL: tl.constexpr,
    BY_RANK: tl.constexpr,
):
    """Write a row's answer (every one of its TOPK slots; a program a row) from its lists: the sure keys sorted, then
    the best `need` of the boundary keys (the lists' lengths at counts_ptr: the keys appended to each list, those
    past CAP counted only)."""
    row = tl.program_id(0).to(tl.int64)
    counts = tl.load(counts_ptr + row)
    seen_sure = (counts & 0xFFFFFFFF).to(tl.int32)
    n_tied = (counts >> 32).to(tl.int32)
    row_scores = scores_ptr + row * score_stride
    hist_row = hist_ptr + row * 4096
    sure_row = sure_ptr + row * TOPK
    boundary_row = boundary_ptr + row * CAP
    out_row = out_ptr + row * out_stride
    n_sure = tl.minimum(seen_sure, TOPK)
    need = TOPK - n_sure
    # the sure keys rank above every boundary key: sorted, they lead the row
    _store_sorted(sure_row, n_sure, out_row, n_sure, TOPK, BY_RANK)
    # Fewer than K keys in the row (no boundary digit): NO_KEY after them (the sorts below write at most SMALL)
    offs_k = tl.arange(0, TOPK)
    tl.store(out_row + offs_k, NO_KEY_C, mask=offs_k >= n_sure + tl.minimum(n_tied, need))
    if n_tied <= SMALL:
        _store_sorted(boundary_row, n_tied, out_row + n_sure, need, SMALL, BY_RANK)
    elif n_tied <= CAP:
        _store_sorted(boundary_row, n_tied, out_row + n_sure, need, CAP, BY_RANK)
    else:
        # More boundary keys than CAP (their scores agree in 22 bits: near-equal or equal scores): the need-th best
        # of them by radix narrowing over the 10 bits left (_select_in_range), then ranked.
        b1, b2 = _boundaries(hist_row, TOPK)
        lo = ((b1 - 1024) << 21) | (b2 << 10)  # the boundary's smallest ordered score
        _select_in_range(row_scores, width, lo, lo + 1023, need, boundary_row)
        tl.debug_barrier()  # the keys stored there are read back below
        _store_sorted(boundary_row, need, out_row + n_sure, need, TOPK, BY_RANK)


# The candidates form (RADIX_CONFIG "candidates"): a sharper floor and one list, no digits.


@triton.jit
def radix_threshold_kernel(
    partial_ptr,  # radix_floor_kernel's group maxima: int32 [rows, per_row, GROUPS]
    per_row,
    bounds_ptr,  # int32 [rows, 2]: each row's floor and its best score (ordered bits)
    TOPK: tl.constexpr,
    GROUPS: tl.constexpr,
    STAGES: tl.constexpr,
):
    """A row's floor (a program a row): the TOPK-th largest of its GROUPS group maxima (_group_maxima), by radix
    narrowing (_narrowed; DEAD where fewer than TOPK groups hold a key); and its best score, the largest. The groups
    of the TOPK largest maxima hold TOPK distinct keys at or above the floor, so the K-th best key scores at or above
    it: a key below it is no answer."""
    row = tl.program_id(0).to(tl.int64)
    maxima = _group_maxima(partial_ptr + row * per_row * GROUPS, per_row, GROUPS, STAGES).to(tl.int64)
    best = tl.max(maxima, axis=0)
    need = tl.zeros([], tl.int32) + TOPK
    lo = tl.min(maxima, axis=0)  # the window [lo, end] holds the TOPK-th largest (_narrowed)
    end = best
    shift = _first_shift(lo, end)
    while lo < end:
        digit, inside = _digit_of(maxima, lo, end, shift)
        need, lo, end, shift = _narrowed(tl.histogram(digit, RANGE_RADIX, mask=inside), need, lo, end, shift)
    tl.store(bounds_ptr + row * 2, lo.to(tl.int32))
    tl.store(bounds_ptr + row * 2 + 1, best.to(tl.int32))


@triton.jit
def radix_candidates_kernel(
    scores_ptr,
    score_stride,
    width,
    span,
    bounds_ptr,
    list_ptr,  # int64 [rows, CAP]: the keys at or above the row's floor, unordered (those past CAP counted only)
    counts_ptr,  # int64 [rows], zeroed: each row's keys at or above its floor (bits 0-31)
    CAP: tl.constexpr,
    BLOCK: tl.constexpr,
    STAGES: tl.constexpr,
    WARP_SLOTS: tl.constexpr,
    AGGREGATE: tl.constexpr,
):
    """Append the program's keys at or above the row's floor (radix_threshold_kernel) to the row's list (_append)."""
    row = tl.program_id(0).to(tl.int64)
    first_col = tl.program_id(1) * span
    last = tl.minimum(first_col + span, width)
    floor = tl.load(bounds_ptr + row * 2)
    row_scores = scores_ptr + row * score_stride
    list_row = list_ptr + row * CAP
    for c0 in tl.range(first_col, last, BLOCK, num_stages=STAGES):
        offs_c = c0 + tl.arange(0, BLOCK)
        scores = tl.load(row_scores + offs_c, mask=offs_c < last, other=float("-inf"))
        live, ordered, _, _ = _digits(scores)
        taken = live & (ordered >= floor)
        _append(
            counts_ptr + row,
            list_row,
            list_row,
            scores,
            offs_c,
            taken,
            offs_c < 0,
            CAP,
            CAP,
            False,
            WARP_SLOTS,
            AGGREGATE,
        )


@triton.jit
def radix_finish_candidates_kernel(
    scores_ptr,
    score_stride,
    width,
    bounds_ptr,
    list_ptr,
    counts_ptr,
    out_ptr,
    out_stride,  # int64 [rows, TOPK] (row stride out_stride): the answer, every slot written here
    TOPK: tl.constexpr,
    CAP: tl.constexpr,
    BY_RANK: tl.constexpr,
):
    """Write a row's answer (every one of its TOPK slots; a program a row): its listed keys sorted (NO_KEY after them
    where fewer than TOPK); where more than CAP keys reach the floor (equal or near-equal scores), the best TOPK of
    the row's keys between the floor and its best score (_select_in_range), sorted."""
    row = tl.program_id(0).to(tl.int64)
    count = (tl.load(counts_ptr + row) & 0xFFFFFFFF).to(tl.int32)
    list_row = list_ptr + row * CAP
    out_row = out_ptr + row * out_stride
    if count <= TOPK:
        _store_sorted(list_row, count, out_row, TOPK, TOPK, BY_RANK)
    elif count <= CAP:
        _store_sorted(list_row, count, out_row, TOPK, CAP, BY_RANK)
    else:
        floor = tl.load(bounds_ptr + row * 2)
        best = tl.load(bounds_ptr + row * 2 + 1)
        _select_in_range(scores_ptr + row * score_stride, width, floor, best, TOPK, list_row)
        tl.debug_barrier()  # the keys stored there are read back below
        _store_sorted(list_row, TOPK, out_row, TOPK, TOPK, BY_RANK)


def radix_spans(rows: int, width: int) -> tuple[int, int]:
    """(programs a row, columns each reads: a multiple of RADIX_BLOCK) of the floor's, counting and collecting
    launches over a [rows, width] score matrix: RADIX_CONFIG["programs"] in all where the rows are few."""
    per_row = max(1, min(triton.cdiv(width, RADIX_BLOCK), triton.cdiv(RADIX_CONFIG["programs"], rows)))
    span = triton.cdiv(triton.cdiv(width, per_row), RADIX_BLOCK) * RADIX_BLOCK
    return triton.cdiv(width, span), span


def select_topk_radix(
    scores: torch.Tensor,
    k: int,
    *,
    aggregate: bool | None = None,
    cap: int | None = None,
    scratch: Scratch | None = None,
):
    """int64 [rows, k]: the exact top-k ordering keys of each row of a dense score matrix (float32; other float dtypes
    are converted) whose column is the position (-inf and NaN entries are no key), sorted descending, NO_KEY padded;
    the answer of select_topk_dense's torch selector, bit for bit, on every row without a NaN (a row with one
    publishes nothing, module docstring). Five launches (four in the candidates form) and no memset, no host
    synchronization (module docstring, "The radix selector"). k a power of two; `aggregate` (default: on CUDA) counts a
    warp's equal digits with one atomic (inline PTX, no interpreter; in either form the warp slots' append); `cap`
    (default BOUNDARY_TIERS[-1], in the candidates form 2k; raised to k) bounds the keys one sort ranks (tests force the
    narrowing with cap = k). The answer and the scratch lists come from `scratch` (a scratch.Scratch: the call's
    workspace in LiteTopK's dense route; None: the allocator)."""
    rows, width = scores.shape
    if k <= 0 or k & (k - 1) or k > RADIX_BLOCK:
        raise ValueError(f"k={k} must be a power of two up to {RADIX_BLOCK} (SUPPORTED_TOPK)")
    config = RADIX_CONFIG
    # (RADIX_CONFIG: the candidates form where its 2K groups fit a block; K = 2,048 takes the digits form)
    candidates = config["candidates"] and CANDIDATE_GROUPS * k <= RADIX_BLOCK
    groups = CANDIDATE_GROUPS * k if candidates else k  # the floor's groups (the candidates form's list slots too)
    cap = max(cap or (groups if candidates else BOUNDARY_TIERS[-1]), k)
    if cap & (cap - 1):
        raise ValueError(f"cap={cap} must be a power of two")
    scratch = Scratch(scores.device) if scratch is None else scratch
    if rows == 0 or width == 0:
        return scratch.full((rows, k), NO_KEY, torch.int64)
    out = scratch.empty((rows, k), torch.int64)  # every slot written by the finishing launch
    if scores.dtype != torch.float32 or scores.stride(1) != 1:
        scores = scores.float().contiguous()
    aggregate = config["aggregate"] and scores.device.type == "cuda" if aggregate is None else aggregate
    per_row, span = radix_spans(rows, width)
    grid = (rows, per_row)
    stride = scores.stride(0)
    warps, stages = config["warps"], config["stages"]
    # no memset: the first launch zeroes the counters, the finishing part writes every slot of the answer
    hist = None if candidates else scratch.empty((rows, 2, RADIX_BINS), torch.int32)
    # the floor's maxima: rows x per_row < programs + rows (radix_spans), a bound that grows with the rows alone, so
    # that a workspace sized at its most rows (workspace.workspace_bytes) holds every call of fewer rows or keys
    partial = scratch.empty(((config["programs"] + rows) * groups,), torch.int32)[: rows * per_row * groups]
    partial = partial.view(rows, per_row, groups)
    counts = scratch.empty((rows,), torch.int64)
    radix_floor_kernel[grid](
        scores,
        stride,
        width,
        span,
        partial,
        hist,  # (None in the candidates form: HISTOGRAMS off)
        counts,
        GROUPS=groups,
        BLOCK=RADIX_BLOCK,
        STAGES=stages,
        HISTOGRAMS=not candidates,
        num_warps=warps,
    )
    slots = dict(BLOCK=RADIX_BLOCK, STAGES=stages, WARP_SLOTS=config["warp_slots"], AGGREGATE=aggregate)
    by_rank = scores.device.type != "cuda"  # Triton's interpreter: the finish ranks by comparison (_store_sorted)
    if candidates:
        bounds = scratch.empty((rows, 2), torch.int32)
        listed = scratch.empty((rows, cap), torch.int64)
        radix_threshold_kernel[(rows,)](
            partial, per_row, bounds, TOPK=k, GROUPS=groups, STAGES=THRESHOLD_STAGES, num_warps=warps
        )
        radix_candidates_kernel[grid](
            scores, stride, width, span, bounds, listed, counts, CAP=cap, **slots, num_warps=warps
        )
        radix_finish_candidates_kernel[(rows,)](
            scores,
            stride,
            width,
            bounds,
            listed,
            counts,
            out,
            out.stride(0),
            TOPK=k,
            CAP=cap,
            BY_RANK=by_rank,
            num_warps=warps,
        )
        return out
    sure = scratch.empty((rows, k), torch.int64)
    boundary = scratch.empty((rows, cap), torch.int64)
    for second in (False, True):
        radix_count_kernel[grid](
            scores,
            stride,
            width,
            span,
            partial,
            hist,
            TOPK=k,
            GROUPS=k,
            BLOCK=RADIX_BLOCK,
            AGGREGATE=aggregate,
            SECOND=second,
            STAGES=stages,
            num_warps=warps,
        )
    radix_collect_kernel[grid](
        scores,
        stride,
        width,
        span,
        partial,
        hist,
        sure,
        boundary,
        counts,
        TOPK=k,
        GROUPS=k,
        CAP=cap,
        **slots,
        num_warps=warps,
    )
    radix_finish_kernel[(rows,)](
        scores,
        stride,
        width,
        hist,
        sure,
        boundary,
        counts,
        out,
        out.stride(0),
        TOPK=k,
        CAP=cap,
        SMALL=min(BOUNDARY_TIERS[0], cap),
        BY_RANK=by_rank,
        num_warps=warps,
    )
    return out


def select_topk_exact(scores: torch.Tensor, k: int, scratch: Scratch | None = None) -> torch.Tensor:
    """select_topk_dense's keys by the stage's exact selector: the radix selector (select_topk_radix, its buffers
    from `scratch`) where devices.runs_triton_stages says so, the torch selector elsewhere; the same keys
    (LiteTopK's dense route, pipeline.run_litetopk)."""
    if runs_triton_stages(scores.device):
        return select_topk_radix(scores, k, scratch=scratch)
    return select_topk_dense(scores, k, "torch")


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
