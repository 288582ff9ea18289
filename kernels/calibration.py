"""Stage 2, calibration: a safe threshold for every row's fused scan from a strided sample, its order
statistics in one Triton launch (CUDA) or torch ops (elsewhere), the same bits (tested in
tests/kernels/test_calibration_order.py).

Layer: stage (pipeline.run_litetopk runs `calibrate` with the call's `sample_size_for`; workspace.py
reads `sample_size_changes` and `shape_changes`). Reading order: the order statistics' kernel, its
launchers (calibration_keys_triton, kth_largest_scores_triton), the torch twin (calibration_keys_torch),
`calibration_keys`, the one line that picks between them (devices.runs_triton_stages); then the stage:
`calibrate`, `sample_size_for`, `sample_size_changes`, `sample_stride`, `shape_changes`.


Math. The sample is every stride-th position of the window (stride = min(max_end // sample_size,
backend.MAX_SAMPLE_STRIDE), from a static bound: no host round trip; sample_size the call's,
sample_size_for), scored densely by the backend into [rows, ceil(max_end / stride)].
With T = the K-th best sampled score, at least K keys of the window score >= T, so every true top-K
key does: "score >= T" is a safe threshold (its score-floor key, keys.score_floor_keys). NO_KEY
where a row has fewer than K sampled keys or a NaN among them (the scan flags the row). The ceiling
is the key of the sample's max(1, K / (2 stride))-th best score, an estimate above the true K-th
best, which ranges the scan's threshold histogram (None without a sample).

Cost. The scan raises its threshold itself as it goes (scoring.py), so the sample only sets where it
starts: a sparser sample costs less to score and order but starts the scan looser, so it appends
more candidates (about K x stride before the first raise). Measured on the H200 at Q = 8192
(bench/results/scan-tuning-h200-v12*.json): 2,048 samples instead of 4,096 save 0.45 ms a call at
65,536 keys (calibration 0.68 vs 1.15 ms; candidates 2,781 vs 2,228 of 4,096 for K = 512); at
196,608 keys a stride above 64 overflows the buffer of some rows (2,048 samples, stride 96: 4 rows
repaired, +1.7 ms), hence the cap: stride 64 (3,072 samples) saves 0.86 ms there.
Decode calls (a candidate buffer that holds every window: the Triton backend's paged mode, where several
programs scan one row and raise its threshold later) weigh it the other way at few rows: there the
sample's scoring is cheap and the looser start costs the selection more. They take max(sample_size,
min(DECODE_SAMPLE_KEYS, DECODE_SAMPLE_BUDGET / rows rounded up to a power of two)) keys (sample_size_for:
8,192 up to 32 rows, 4,096 up to 64, the default 2,048 from 65; measured: the constants' comment). Prefill
calls keep sample_size.

The two parts (bench/probes/calibration_probe.py times them apart): the sample's scoring is tensor-core
work (~0.28 ms for 8,192 rows x 2,048 samples on the H200, in proportion to the samples); the order
statistics (calibration_keys: the Triton twin bisects each row only until ~128 values remain in its
bracket, then sorts those, ~50 us by its instruction count, where the previous 32-step bisection over
the whole row needed >= 0.18 ms) are the small part (below: "The order statistics").

In the scan (LiteTopKTuning(calibration="scan"); pipeline.run_litetopk skips this stage). The same
lower bound from a subset, taken by the scan itself (triton/scan_calibration.py):
each program first scores n_sample contiguous key tiles (max(sample_size / 64, tiles /
MAX_SAMPLE_STRIDE) tiles, at most the candidate buffer) ending with its rows' earliest window end
(the most recent keys all of them see where the windows overlap), keeping every key, bisects a threshold with
at least K of them at or above it and the histogram's range from them, drops the sampled keys below
it and scans the rest. Nothing is scored twice and nothing is launched for it: the sample's scoring
and the order statistics above leave the call. A contiguous sample of the most recent keys and not a
spread one: a permuted tile order cost the Gluon scan loop 62-135 more instructions a step (its
addresses stop being affine, offline SASS), and real indexer scores lean to recent keys (the
benchmark's Gaussian data has no such lean). bench/probes/candidate_model.py models the candidates
of both: within 2 % of each other from 65,536 to 262,144 keys. Only the Triton backend has it.

The order statistics (calibration_order_kernel).

Math. Each float32 score maps to an order-preserving int32 o (keys._ordered_bits: -0.0 ties +0.0).
The rank-th largest of a row is the largest t with count(o >= t) >= rank. A bracket [lo, hi] of int32
values holds it while c_lo = count(o >= lo) >= rank and c_hi = count(o > hi) < rank (start: the whole
int32 range, c_lo = width, c_hi = 0); a bisection step counts the row at the bracket's middle and keeps
the half that still brackets it (_step). The bracket holds c_lo - c_hi values: once they are at most
BAND, the rest of the search needs only them: they are compacted into a band of BAND slots (a prefix
sum of the in-bracket flags) and sorted, and the rank-th largest is the band's (rank - c_hi)-th. Where
the bracket shrinks to one value first (ties: many equal values), that value is the answer and no band
is built. Exact on any data (ties, infinities, signed zeros, rows of one value). The two ranks (K and
the ceiling's) share the steps while their brackets are the same (one count moves both: the first
ones, sign and high exponent bits, usually agree), then go on one after the other through the same
code. With KEYS the program turns them into the calibration's keys: the score-floor key (ordered bits
<< 32) of the K-th best plus `offset` and of the ceiling; NO_KEY where that K-th best is not finite or
the row holds a NaN, and for a ceiling that is not finite (calibration_keys_torch, bit for bit).

Tiling: one program per row, the whole row in registers as a [ROWS, LANES] tile (LANES = 32 x num_warps;
ROW_PER_THREAD = 64 values a thread: one warp for 2,048 values, two for 3,072 padded to 4,096), read
once from memory; the band is a row of BAND = BAND_PER_THREAD x LANES int32 in scratch (L1/L2), used
by one rank after the other.

Passes, replayed in torch on 16 rows of the benchmark's sample (65,536 keys, stride 32, 2,048 values,
BAND 128): ~10.8 steps over the row for K = 512 and ~8.8 for its ceiling (8th), 7.6 of them shared;
~9.7 and ~9.1 for K = 1024 and its 16th, 4.7 shared: ~12 to 14 counting steps over the row per row,
where the previous kernel ran 32 steps for each rank over the whole row. Then per rank one
compaction and one sort of BAND values (every row here builds its band).

What bounds its time. Bytes: the sample once (4 B a value: 64 / 96 MB at 8,192 rows of 2,048 / 3,072,
~15 / ~22 us at the H200's ~4.4 TB/s); the band stays in L1/L2. Instructions are the bound. SASS
compiled offline for sm_90 (compile/sm90.py), 2,048 values, one warp: a step over the row is ~255 warp
instructions (shared, both ranks' updates) or ~234 (one rank): ~3.7 a value (compare, select, add);
the compaction ~870 (two compares, the scan, a 64-bit address and a predicated store a value) and the
band's sort and pick ~460: ~13 x 245 + 2 x 1,330 + ~500 ~ 6,300 warp instructions a row, against
~22,600 for the previous kernel (32 steps x 2 ranks over the row, four warps, ~177 instructions a
thread a step, four barriers a step). At 8,192 rows ~52 M warp instructions, ~50 us at 132 SMs x 4
issues a clock; the previous one needs >= 0.18 ms (and twice that for 3,072 values padded to 4,096).
Registers: 236 at 64 values a thread (8 resident warps an SM: the bisection's dependent reductions
may then leave issue slots idle), 147 at 32 (2 warps, one barrier a step), 96 at 16 (4 warps); the
probe (bench/probes/calibration_probe.py) times all three. Not done: counting a step by the sign of
mid - 1 - o (an add and a shift-add a value: 2.4 instructions instead of 3.4 in an offline SASS test
kernel) needs the row clamped into a bracket of at most 2^31 values first, so that the difference
cannot overflow; that would save ~1/6 of the instructions.

The sample's scoring, the stage's other part (backend.score_dense at stride s, ceil(window / s)
columns), is bounded by tensor-core work, not bytes: 8,192 rows x 2,048 keys x 64 heads x 128 x 2 =
275 G int8 operations, ~0.22 ms at the H200's 1,260 TOP/s, ~0.28 ms at the ~79 % that dense scoring
reaches (8.7 ms where 95 % of the int8 rate is 7.23 ms); its bytes (the sampled keys, 2,048 x 64 B;
the queries, 8,192 x 4 KB; the scores out, 64 MB) take ~20 us. So a sample of n keys costs ~n / 2,048
x 0.28 ms wherever it is scored: a cheaper sample is a smaller one, and the scan then starts looser
(about K x stride keys pass before its first raise; "Cost" above: 2,048
instead of 4,096 samples saved 0.45 ms a call for ~550 more candidates a row; 1,024 and below
overflow some rows' buffers, bench/probes/scan_tuning.py). A lower bound of each sampled score would
serve as well as the score (the K-th of lower bounds is still at or below the row's K-th best), but
the cheap bounds (dropping heads) need nonnegative weights, which the indexer's are not. Any subset
gives a safe bound, so a subset that scores high (the most recent keys, where real attention
concentrates) would start the scan tighter for the same samples; the benchmark's Gaussian data has no
such locality, so nothing here measures it. With a separate sample the stage therefore stays at
~0.28 ms + this kernel; below that, the scan has to calibrate itself (issue 15 item 1: it visits a
spread-out subset of its key tiles first and takes its threshold from what it has scored).

Limits: width >= max(ranks) >= 1 (the launcher checks); rows of more than ~32 K values would hold over
64 values a thread in 16 warps (registers). No host synchronization and no data-dependent shape:
CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .backend import MAX_SAMPLE_STRIDE, ScoringBackend
from .devices import runs_triton_stages
from .keys import NO_KEY, NO_KEY_C, _ordered_bits, _scores_of_ordered, score_floor_keys
from .problem import PrefillProblem
from .scratch import Scratch
from .selection import _exclusive_slots, _scatter

# The sample of a call whose candidate buffer holds every window (sample_size_for): few rows take a denser
# one. Measured on an H100 (paged mode, Gluon scoring kernel, GPU busy time of one eager call, the median of
# 5; bench/probes/paged_variants.py, bench/results/paged-variants-h100-v17*.json), samples 2,048 / 4,096 /
# 8,192 keys a row: 1 row x 65,536 keys K = 512 98 / 85 / 75 us (15,281 / 8,256 / 4,098 candidates; the
# selection 41 / 30 / 23 us, calibration 13 / 19 / 20); 64 rows 409 / 394 / 398 us (an earlier run 418 /
# 407 / 416); 32 x 4 = 128 rows K = 1024 609 / 590 / 615 us; 16,384 samples were no faster at one row and
# slower at 64 and 128 rows. At few rows the sample's scoring is cheap and cuts the candidates and the
# selection's time; at many rows it does not pay.
DECODE_SAMPLE_KEYS = 8192  # at most this many keys a row
DECODE_SAMPLE_BUDGET = 262144  # sampled keys of a call (rows rounded up to a power of two)

ROW_PER_THREAD = 64  # row values a thread holds in registers: num_warps = 2,048-value chunks of the row
BAND_PER_THREAD = 4  # band slots a thread: BAND = 4 x LANES values are bisected once compacted
MAX_WARPS = 16
INT32_MIN_C = tl.constexpr(-(2**31))
INT32_MAX_C = tl.constexpr(2**31 - 1)


@triton.jit
def _bisect(ordered, lo, hi, c_lo, c_hi, rank, LIMIT: tl.constexpr):
    """Bisection steps for the rank-th largest of the int32 ordered row `ordered` (padding INT32_MIN,
    never counted: every middle is above lo > INT32_MIN) while the bracket [lo, hi] (int64) holds more
    than LIMIT of the row's values and more than one int32 value: c_lo = count(row >= lo) >= rank,
    c_hi = count(row > hi) < rank, before and after."""
    while (c_lo - c_hi > LIMIT) & (lo < hi):
        mid = lo + (hi - lo + 1) // 2
        count = tl.sum((ordered >= mid.to(tl.int32)).to(tl.int32))
        lo, hi, c_lo, c_hi = _step(mid, count, lo, hi, c_lo, c_hi, rank)
    return lo, hi, c_lo, c_hi


@triton.jit
def _step(mid, count, lo, hi, c_lo, c_hi, rank):
    """The bracket (lo, hi, c_lo, c_hi) after counting `count` row values >= mid (lo < mid <= hi): the
    upper part [mid, hi] where it still holds the rank-th largest, else the lower part [lo, mid - 1]."""
    keep_upper = count >= rank
    return (
        tl.where(keep_upper, mid, lo),
        tl.where(keep_upper, hi, mid - 1),
        tl.where(keep_upper, count, c_lo),
        tl.where(keep_upper, c_hi, count),
    )


# The ranks are runtime values, unspecialized: they follow the sample's stride (K / (2 stride) and its ceiling's
# rank), so as constexprs every stride of a new window length compiled the kernel anew (~90 builds in a GPU
# service's workspace sizing).
@triton.jit(do_not_specialize=["rank_a", "rank_b"])
def calibration_order_kernel(
    scores_ptr,
    width,
    out_ptr,
    offset,  # float32 [rows, width]; float32 or int64 [2, rows]
    band_ptr,  # int32 [rows, BAND]: the bracket's values, compacted
    rank_a,
    rank_b,  # int32: the two ranks (1-based) a row is ordered for
    ROWS: tl.constexpr,
    LANES: tl.constexpr,
    BAND: tl.constexpr,
    KEYS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    rows = tl.num_programs(0)
    offs = tl.arange(0, ROWS)[:, None] * LANES + tl.arange(0, LANES)[None, :]
    valid = offs < width
    scores = tl.load(scores_ptr + row * width + offs, mask=valid, other=0.0)
    # Padding INT32_MIN, below every value (the one NaN there, 0xFFFFFFFF, is raised to INT32_MIN + 1)
    # and below every bracket (lo starts at INT32_MIN + 1): it is never counted nor compacted.
    ordered = tl.where(valid, tl.maximum(_ordered_bits(scores).to(tl.int32), INT32_MIN_C + 1), INT32_MIN_C)
    nans = tl.sum((scores != scores).to(tl.int32))
    row_band = band_ptr + row * BAND
    offs_band = tl.arange(0, BAND)
    # Shared steps: while both ranks' brackets are the same, one count moves both.
    lo_a = tl.full([], INT32_MIN_C + 1, tl.int64)
    hi_a = tl.full([], INT32_MAX_C, tl.int64)
    c_lo_a = tl.full([], 0, tl.int32) + width
    c_hi_a = tl.full([], 0, tl.int32)
    lo_b, hi_b, c_lo_b, c_hi_b = lo_a, hi_a, c_lo_a, c_hi_a
    while (lo_a == lo_b) & (hi_a == hi_b) & (c_lo_a - c_hi_a > BAND) & (lo_a < hi_a):
        mid = lo_a + (hi_a - lo_a + 1) // 2
        count = tl.sum((ordered >= mid.to(tl.int32)).to(tl.int32))
        lo_a, hi_a, c_lo_a, c_hi_a = _step(mid, count, lo_a, hi_a, c_lo_a, c_hi_a, rank_a)
        lo_b, hi_b, c_lo_b, c_hi_b = _step(mid, count, lo_b, hi_b, c_lo_b, c_hi_b, rank_b)
    found_a = tl.full([], 0, tl.int64)
    found_b = tl.full([], 0, tl.int64)
    for which in range(2):  # a runtime loop: one copy of the code for both ranks
        first = which == 0
        rank = tl.where(first, rank_a, rank_b)
        lo, hi = tl.where(first, lo_a, lo_b), tl.where(first, hi_a, hi_b)
        c_lo, c_hi = tl.where(first, c_lo_a, c_lo_b), tl.where(first, c_hi_a, c_hi_b)
        lo, hi, c_lo, c_hi = _bisect(ordered, lo, hi, c_lo, c_hi, rank, BAND)
        if lo < hi:  # at most BAND values in the bracket: compact them, go on over the band
            in_band = (ordered >= lo.to(tl.int32)) & (ordered <= hi.to(tl.int32))
            slot, n_band = _exclusive_slots(in_band.to(tl.int32))
            _scatter(row_band + slot, ordered, in_band)
            tl.debug_barrier()  # the band, written by every thread, is read below
            band = tl.load(row_band + offs_band, mask=offs_band < n_band, other=INT32_MIN_C)
            tl.debug_barrier()  # read before the next rank's compaction overwrites it
            ranked = tl.sort(band, descending=True)  # the rank-th largest is the band's (rank - c_hi)-th
            lo = tl.sum(tl.where(offs_band == rank - 1 - c_hi, ranked, 0)).to(tl.int64)
        found_a = tl.where(which == 0, lo, found_a)
        found_b = tl.where(which == 0, found_b, lo)
    kth = _scores_of_ordered(found_a.to(tl.int32))
    ceiling = _scores_of_ordered(found_b.to(tl.int32))
    pair = tl.arange(0, 2)
    if KEYS:  # calibration_keys_torch, per row
        kth = kth + offset
        usable = (kth == kth) & (tl.abs(kth) != float("inf")) & (nans == 0)  # the row gets a threshold
        has_ceiling = usable & (ceiling == ceiling) & (tl.abs(ceiling) != float("inf"))
        keys = tl.where(
            pair == 0,
            tl.where(usable, _ordered_bits(kth) << 32, NO_KEY_C),
            tl.where(has_ceiling, _ordered_bits(ceiling) << 32, NO_KEY_C),
        )
        tl.store(out_ptr + pair * rows + row, keys)
    else:
        tl.store(out_ptr + pair * rows + row, tl.where(pair == 0, kth, ceiling))


def order_tiling(width: int, per_thread: int = ROW_PER_THREAD) -> tuple[int, int, int]:
    """(ROWS, LANES, num_warps) of the kernel's register tile for rows of `width` values (module
    docstring: `per_thread` values a thread, a power of two, at most MAX_WARPS warps)."""
    block = triton.next_power_of_2(max(width, 32))
    num_warps = min(MAX_WARPS, max(1, block // (32 * per_thread)))
    lanes = 32 * num_warps
    return block // lanes, lanes, num_warps


def _order_statistics(
    scores: torch.Tensor,
    ranks: tuple[int, int],
    offset: float,
    keys: bool,
    scratch: Scratch | None = None,
    band: int | None = None,
    per_thread: int = ROW_PER_THREAD,
) -> torch.Tensor:
    rows, width = scores.shape
    if width < max(ranks) or min(ranks) < 1:
        raise ValueError(f"ranks {ranks} of rows of {width} values (1 <= rank <= width)")
    scratch = scratch if scratch is not None else Scratch(scores.device)
    out = scratch.empty((2, rows), torch.int64 if keys else torch.float32)  # two contiguous rows: no copies after
    tile_rows, lanes, num_warps = order_tiling(width, per_thread)
    band = band or BAND_PER_THREAD * lanes
    band_rows = scratch.empty((rows, band), torch.int32)
    if rows:
        calibration_order_kernel[(rows,)](
            scores.contiguous(),
            width,
            out,
            offset,
            band_rows,
            ranks[0],
            ranks[1],
            ROWS=tile_rows,
            LANES=lanes,
            BAND=band,
            KEYS=keys,
            num_warps=num_warps,
        )
    return out


def kth_largest_scores_triton(
    scores: torch.Tensor, ranks: tuple[int, int], band: int | None = None, per_thread: int = ROW_PER_THREAD
) -> torch.Tensor:
    """float32 [rows, 2]: the ranks[i]-th largest value of each row of float32 `scores` [rows, n]
    (1-based, n >= max(ranks)), exactly, as torch.topk orders finite values and infinities (-0.0
    and +0.0 tie and come back as +0.0). NaN orders above +inf (positive sign bit) or below -inf:
    callers that care check for NaN themselves. `band` (a power of two): the compacted bracket's
    size instead of BAND_PER_THREAD x LANES, and `per_thread` the row values a thread instead of
    ROW_PER_THREAD (tests, the probe's variants)."""
    return _order_statistics(scores, ranks, 0.0, keys=False, band=band, per_thread=per_thread).t()


def calibration_keys_triton(
    sample: torch.Tensor,
    k: int,
    ceiling_rank: int,
    offset: float,
    scratch: Scratch | None = None,
    band: int | None = None,
    per_thread: int = ROW_PER_THREAD,
) -> tuple[torch.Tensor, torch.Tensor]:
    """calibration_keys_torch in one kernel: (thresholds, ceilings) int64 [rows] of the calibration
    sample float32 [rows, n] (the K-th best plus `offset`, and the ceiling_rank-th best, as
    score-floor keys; NO_KEY where the K-th best is not finite or the row holds a NaN, and for a
    ceiling that is not finite), bit for bit. The output and the band rows (int32 [rows, band]) come
    from `scratch` (None: the allocator); `band` as in kth_largest_scores_triton; `per_thread` (a
    power of two) overrides ROW_PER_THREAD (the probe's variants). No host synchronization."""
    keys = _order_statistics(
        sample, (k, ceiling_rank), offset, keys=True, scratch=scratch, band=band, per_thread=per_thread
    )
    return keys[0], keys[1]


def calibration_keys_torch(
    sample: torch.Tensor, k: int, ceiling_rank: int, offset: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """calibration_keys in torch ops (any device)."""
    best = torch.topk(sample, max(k, ceiling_rank), dim=1, largest=True, sorted=True).values
    kth, ceiling = best[:, k - 1], best[:, ceiling_rank - 1]
    kth = kth + offset
    usable = torch.isfinite(kth) & ~torch.isnan(sample).any(dim=1)
    return (
        torch.where(usable, score_floor_keys(kth), NO_KEY),
        torch.where(usable & torch.isfinite(ceiling), score_floor_keys(ceiling), NO_KEY),
    )


def calibration_keys(
    sample: torch.Tensor, k: int, ceiling_rank: int, offset: float = 0.0, scratch: Scratch | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(thresholds, ceilings) int64 keys [rows] of the calibration sample float32 [rows, n]: the
    score-floor key of the sample's k-th best score plus `offset`, and of its ceiling_rank-th best;
    NO_KEY where that k-th best is not finite or the sample row holds a NaN, and for a ceiling that is
    not finite. `scratch`: where the Triton twin's output comes from (None: the allocator)."""
    if runs_triton_stages(sample.device):
        return calibration_keys_triton(sample, k, ceiling_rank, offset, scratch=scratch)
    return calibration_keys_torch(sample, k, ceiling_rank, offset)


def calibrate(
    problem: PrefillProblem, backend: ScoringBackend, sample_size: int, offset: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(thresholds, ceilings) int64 keys [rows] (module docstring) from a sample of `sample_size` keys a
    row: the call's, sample_size_for(tuning.sample_size, rows, backend.buffers_hold_windows(problem)), as
    pipeline.run_litetopk gives it (a probe may ask for any size); `offset` is added to every
    calibrated threshold score (fault injection for tests; 0.0 in production)."""
    k = problem.topk
    stride = sample_stride(problem.max_end, sample_size, k)
    if stride == 0:
        return problem.scratch.full(problem.num_rows, NO_KEY, torch.int64), None
    sample, _ = backend.score_dense(problem, stride)
    return calibration_keys(sample, k, max(1, k // (2 * stride)), offset, scratch=problem.scratch)


def sample_size_for(sample_size: int, rows: int, holds_windows: bool) -> int:
    """The calibration sample's size (keys a row) of a call of `rows` rows, for LiteTopKTuning.sample_size
    `sample_size`: `sample_size` itself, except in a call whose candidate buffer holds every window
    (`holds_windows`: ScoringBackend.buffers_hold_windows, the Triton backend's paged mode for decode-shaped
    calls), which takes max(sample_size, min(DECODE_SAMPLE_KEYS, DECODE_SAMPLE_BUDGET // next power of two
    of rows)): at the default 2,048, 8,192 keys up to 32 rows, 4,096 up to 64, 2,048 from 65 ("Cost").
    sample_size <= 0 (no sample) stays. Every stage and the workspace's sizing (sample_size_changes)
    take a call's size from here."""
    if not holds_windows or sample_size <= 0:
        return sample_size
    rows_pow2 = 1 << max(rows - 1, 0).bit_length()
    return max(sample_size, min(DECODE_SAMPLE_KEYS, DECODE_SAMPLE_BUDGET // rows_pow2))


def sample_size_changes(max_rows: int, sample_size: int, holds_windows: bool) -> list[tuple[int, int]]:
    """(rows, sample size) for each sample size that sample_size_for gives a call of at most `max_rows`
    rows, with the most rows that take it (sorted by rows; max_rows included). At one sample size every
    buffer of a call grows with its rows, so the largest call of any rows <= max_rows is the largest of
    these, each run at its shape_changes (workspace.workspace_bytes)."""
    # sample_size_for changes with the rows only where their next power of two does: the rows in
    # (2^(j-1), 2^j] take one size, the most of them min(2^j, max_rows)
    most = {}
    for rows in [max_rows] + [1 << j for j in range(max_rows.bit_length()) if 1 << j < max_rows]:
        size = sample_size_for(sample_size, rows, holds_windows)
        most[size] = max(most.get(size, rows), rows)
    return sorted((rows, size) for size, rows in most.items())


def sample_stride(max_end: int, sample_size: int, k: int) -> int:
    """The stride of the calibration sample for the window bound `max_end`: max_end // sample_size,
    at most MAX_SAMPLE_STRIDE; 0: no sample (the sample would be (nearly) the whole window, stride
    < 2, or hold fewer than K keys)."""
    stride = min(max_end // sample_size, MAX_SAMPLE_STRIDE) if sample_size > 0 else 0
    return 0 if stride < 2 or -(-max_end // stride) < k else stride


def shape_changes(max_end: int, sample_size: int, k: int) -> list[int]:
    """The window bounds e <= max_end after which the calibration's shapes jump (sorted, max_end
    included): the largest e without a sample, and for each stride the largest e sampled with it.
    Between two of them every buffer of a call grows with e (the sample has ceil(e / stride)
    columns; without a sample the candidate buffer holds max(capacity, e) keys), so the largest
    call at any e <= max_end is the largest at one of these. `sample_size` is the calls' own
    (sample_size_for: it depends on their rows and mode, so workspace.workspace_bytes runs these
    bounds for each size of sample_size_changes)."""
    if sample_size <= 0:
        return [max_end]
    ends = {max_end}
    unsampled = min(max_end, 2 * sample_size - 1)  # stride < 2
    for stride in range(2, min(max_end // sample_size, MAX_SAMPLE_STRIDE) + 1):
        # the last e of this stride (the capped stride holds every e from its first to max_end)
        last = max_end if stride == MAX_SAMPLE_STRIDE else min(max_end, (stride + 1) * sample_size - 1)
        if sample_stride(last, sample_size, k):
            ends.add(last)
        if sample_size < k:  # e in [stride * sample_size, last] goes without a sample while ceil(e / stride) < k
            unsampled = max(unsampled, min(last, stride * (k - 1)))
    ends.add(unsampled)
    return sorted(ends)
