"""Self-calibration inside the scan (LiteTopKTuning(calibration="scan")): the steps both scoring kernels
take (score_fp4_kernel with SELF_CALIBRATE in scoring.py; its Gluon twin in scoring_gluon.py), the
Triton helpers and _calibrate_in_scan_gluon side by side, with the same arithmetic.

Layer: backends (triton/; scoring.py and scoring_gluon.py call its steps).

The program sets up its own rows, with no launch before the scan (scoring.scan_buffers): threshold
-inf, histogram off, count and histogram zeroed. Phase A scans n_sample contiguous tiles (_sample_tiles)
that end with the program's earliest window end (_first_sample_tile: the most recent keys every row sees where the
windows overlap) and appends every key of the windows (n_sample tiles fit the buffer: none is lost);
then _calibrate_in_scan, per row with n >= K sampled keys: thr = the lower end lo of a
BISECTION_STEPS-step bisection of [min, max] of the sampled scores that keeps count(score >= lo) >= K
(counted exactly against the float lo, so at least K keys of the window score >= thr: a lower bound of
the row's K-th best, whatever the float rounding of the midpoints), the histogram ranged from thr to
the same bracket of the sample's max(1, K n_sample / (2 n_tiles))-th best (prepare_scan_kernel's rule),
and the buffer compacted in place to the sampled keys >= thr (chunk by chunk: every thread reads a
chunk before any survivor is written, and survivors only take slots below the chunk's end), counted
in the histogram. Phase B scans the tiles after the sample (few or none in a causal program), then those
before it, as above. Every phase is contiguous, so the step loop's addresses stay affine (the Gluon
twin's loops are the scan's within 4-16 instructions a step).
Rows with fewer than K sampled keys, a nonfinite sampled score or an overflowed counter keep -inf and
their buffer (a capacity event if the window does not fit).
The calibration stage's rules (kernels/calibration.py, "In the scan") are the same: any subset's K-th
best is a lower bound of the window's K-th best, so the certificate and the answer do not change.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..keys import NO_KEY_C, _scores_of_keys

BISECTION_STEPS = tl.constexpr(12)  # each bracket ends at 2^-12 of the sample's range
CALIBRATION_CHUNK = gl.constexpr(256)  # buffer slots of a row read at a time by _calibrate_in_scan_gluon


@triton.jit
def _sample_tiles(n_steps, sample_tiles, sample_stride, capacity, TOPK: tl.constexpr, BLOCK_KEYS: tl.constexpr):
    """The sample of a self-calibrating scan over n_steps key tiles, in tiles: max(sample_tiles,
    ceil(n_steps / sample_stride), ceil(2 K / BLOCK_KEYS)) (at least 2 K keys: a K-th best of fewer
    would be the sample's bottom), at most n_steps and at most the tiles the candidate buffer holds
    whole (capacity // BLOCK_KEYS: phase A appends every key of its tiles)."""
    wanted = tl.maximum(
        tl.maximum(sample_tiles, tl.cdiv(n_steps, sample_stride)), (2 * TOPK + BLOCK_KEYS - 1) // BLOCK_KEYS
    )
    return tl.minimum(tl.minimum(wanted, n_steps), capacity // BLOCK_KEYS)


@triton.jit
def _phase_bounds(phase: tl.constexpr, lo, n_steps, n_sample, first_sample, BLOCK_KEYS: tl.constexpr):
    """(first position, steps) of phase `phase` of a self-calibrating scan, in the order both kernels
    run them: 0 the sample tiles, 1 the tiles after them (few or none in a causal program), 2 the
    tiles before them."""
    if phase == 0:
        return lo + first_sample * BLOCK_KEYS, n_sample
    elif phase == 1:
        return lo + (first_sample + n_sample) * BLOCK_KEYS, n_steps - first_sample - n_sample
    else:
        return lo, first_sample


@triton.jit
def _ceiling_rank(n_sample, n_steps, TOPK: tl.constexpr):
    """The rank in the sample of the histogram's ceiling: max(1, K n_sample / (2 n_steps)), about the
    K / 2-th best of the span (calibration.py's max(1, K / (2 stride)) for a sample of n_sample tiles)."""
    return tl.maximum((TOPK * n_sample) // (2 * tl.maximum(n_steps, 1)), 1)


@triton.jit
def _first_sample_tile(lo, n_steps, n_sample, earliest_end, BLOCK_KEYS: tl.constexpr):
    """The first of the n_sample contiguous sample tiles of a self-calibrating scan over n_steps tiles
    from position lo: the sample ends with the tile that holds earliest_end - 1 (the program's earliest
    window end: a causal program's most recent keys, inside every row's window where the windows
    overlap there), or at the span's start when that is fewer than n_sample tiles in."""
    return tl.minimum(tl.maximum(tl.cdiv(earliest_end - lo, BLOCK_KEYS), n_sample), n_steps) - n_sample


@triton.jit
def _calibrate_in_scan(
    buf_ptr,
    appended_ptr,
    hist_ptr,
    rows64,
    row_ok,
    capacity,
    thr,
    hist_lo,
    hist_width,
    ceiling_rank,
    TOPK: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    NB: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """A self-calibrating scan's threshold from phase A (module docstring): the
    n <= capacity keys of each row's buffer are every in-window key of the sample tiles. Where n >= K
    and the scores are finite: thr = the lower end of a bisection bracket [lo, hi] of the K-th best
    sampled score (count(score >= lo) >= K, so at least K keys of the window score >= thr: a lower
    bound of the row's K-th best), the histogram's range from thr to the same bracket of the
    ceiling_rank-th best (prepare_scan_kernel's rule), and the buffer compacted to the keys >= thr
    (counted in the histogram). Other rows keep their threshold (-inf) and histogram (off) and their
    buffer. Returns (thr, hist_lo, hist_width, hist_inv) [BLOCK_ROWS]."""
    tl.debug_barrier()  # phase A's appends and stores, by every thread, are read below
    count = tl.load(appended_ptr + rows64, mask=row_ok, other=0, volatile=True)
    n = tl.where(row_ok & (count <= capacity), count, 0)
    offs = tl.arange(0, CHUNK)
    row_keys = buf_ptr + rows64[:, None] * capacity
    # Every pass over the sample accumulates per-lane partials and reduces them once (one block-wide
    # reduction a pass, none a chunk).
    least_lanes = tl.full([BLOCK_ROWS, CHUNK], float("inf"), tl.float32)
    most_lanes = tl.full([BLOCK_ROWS, CHUNK], float("-inf"), tl.float32)
    for start in range(0, tl.max(n), CHUNK):
        valid = (start + offs)[None, :] < n[:, None]
        scores = _scores_of_keys(tl.load(row_keys + start + offs[None, :], mask=valid, other=NO_KEY_C))
        least_lanes = tl.minimum(least_lanes, tl.where(valid, scores, float("inf")))
        most_lanes = tl.maximum(most_lanes, scores)
    least = tl.min(least_lanes, axis=1)
    most = tl.max(most_lanes, axis=1)
    # Brackets [lo, hi] of the K-th (k) and the ceiling_rank-th (c) best: count(>= lo) >= rank.
    lo_k, hi_k, lo_c, hi_c = least, most, least, most
    for _ in range(BISECTION_STEPS):
        mid_k = lo_k + (hi_k - lo_k) * 0.5
        mid_c = lo_c + (hi_c - lo_c) * 0.5
        lanes_k = tl.zeros([BLOCK_ROWS, CHUNK], tl.int32)
        lanes_c = tl.zeros([BLOCK_ROWS, CHUNK], tl.int32)
        for start in range(0, tl.max(n), CHUNK):
            valid = (start + offs)[None, :] < n[:, None]
            scores = _scores_of_keys(tl.load(row_keys + start + offs[None, :], mask=valid, other=NO_KEY_C))
            lanes_k += (valid & (scores >= mid_k[:, None])).to(tl.int32)
            lanes_c += (valid & (scores >= mid_c[:, None])).to(tl.int32)
        count_k = tl.sum(lanes_k, axis=1)
        count_c = tl.sum(lanes_c, axis=1)
        lo_k, hi_k = _bracket_step(lo_k, hi_k, mid_k, count_k, TOPK)
        lo_c, hi_c = _bracket_step(lo_c, hi_c, mid_c, count_c, ceiling_rank)
    calibrated, ranged, thr, hist_lo, hist_width, hist_inv = _calibration(
        n, least, most, lo_k, lo_c, thr, hist_lo, hist_width, TOPK, NB
    )
    tl.debug_barrier()  # every thread has read the counts (n) before one of them resets its row's
    # Compaction in place, chunk by chunk: every thread reads a chunk before any survivor is written,
    # and survivors only take slots below the chunk's end (fewer survivors than keys read so far).
    tl.atomic_xchg(appended_ptr + rows64, 0, mask=calibrated)
    for start in range(0, tl.max(n), CHUNK):
        slots = start + offs[None, :] + 0 * rows64[:, None]
        valid = slots < n[:, None]
        keys = tl.load(row_keys + slots, mask=valid, other=NO_KEY_C)
        tl.debug_barrier()
        scores = _scores_of_keys(keys)
        kept = valid & calibrated[:, None] & (scores >= thr[:, None])
        slot = tl.atomic_add(appended_ptr + rows64[:, None] + 0 * slots, 1, mask=kept, sem="relaxed")
        tl.store(row_keys + slot, keys, mask=kept)
        bin_of = tl.minimum(tl.maximum(((scores - hist_lo[:, None]) * hist_inv[:, None]).to(tl.int32), 0), NB - 1)
        tl.atomic_add(hist_ptr + rows64[:, None] * NB + bin_of, 1, mask=kept & ranged[:, None], sem="relaxed")
        tl.debug_barrier()
    return thr, hist_lo, hist_width, hist_inv


@triton.jit
def _bracket_step(lo, hi, mid, count, rank):
    """The bisection bracket [lo, hi] after counting `count` sampled scores >= mid: the upper half
    while it still holds rank of them (count(>= lo) >= rank stays true), else the lower half."""
    return tl.where(count >= rank, mid, lo), tl.where(count >= rank, hi, mid)


@triton.jit
def _calibration(n, least, most, lo_k, lo_c, thr, hist_lo, hist_width, TOPK: tl.constexpr, NB: tl.constexpr):
    """(calibrated, ranged, thr, hist_lo, hist_width, hist_inv) of the rows (_calibrate_in_scan): a row
    is calibrated when its n sampled scores hold K and are finite; then thr = lo_k, and its histogram
    ranges NB bins from lo_k to lo_c where they are wide enough (prepare_scan_kernel's rule); the
    other rows keep thr, hist_lo, hist_width as given. Elementwise: the Gluon twin calls it too."""
    calibrated = (n >= TOPK) & (least == least) & (tl.abs(least) != float("inf")) & (tl.abs(most) != float("inf"))
    width = tl.div_rn(lo_c - lo_k, lo_k * 0.0 + NB)
    ranged = calibrated & (width > 2.0**-16 * tl.maximum(tl.abs(lo_k), tl.abs(lo_c)))
    hist_inv = tl.where(ranged, 1.0 / tl.where(ranged, width, 1.0), 0.0)
    return (
        calibrated,
        ranged,
        tl.where(calibrated, lo_k, thr),
        tl.where(ranged, lo_k, hist_lo),
        tl.where(ranged, width, hist_width),
        hist_inv,
    )


@gluon.jit
def _calibrate_in_scan_gluon(
    buf_ptr,
    appended_ptr,
    hist_ptr,
    prog_rows_ptr,
    pid,
    capacity,
    thr_h,
    hist_lo_h,
    hist_width_h,
    ceiling_rank,
    TOPK: gl.constexpr,
    BLOCK_ROWS: gl.constexpr,
    NB: gl.constexpr,
    num_warps: gl.constexpr,
    row_layout: gl.constexpr,
):
    """_calibrate_in_scan (the same steps and arithmetic, so the same calibrated thresholds) over the
    program's rows, in a [BLOCK_ROWS, CALIBRATION_CHUNK] layout without replicas (each buffer slot
    read by one thread, so no atomic of the compaction is repeated); inputs and results
    [BLOCK_ROWS] in `row_layout`."""
    gl.static_assert((BLOCK_ROWS == 2) & (num_warps == 4), "the chunk layout below is for 2 rows x 4 warps")
    CHUNK: gl.constexpr = CALIBRATION_CHUNK
    cal: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, CHUNK // 64], threads_per_warp=[1, 32], warps_per_cta=[2, 2], order=[1, 0]
    )
    rows_of: gl.constexpr = gl.SliceLayout(1, cal)
    rows = gl.load(prog_rows_ptr + pid * BLOCK_ROWS + gl.arange(0, BLOCK_ROWS, layout=rows_of))
    row_ok = rows >= 0
    rows64 = gl.where(row_ok, rows, 0).to(gl.int64)
    thr = gl.convert_layout(thr_h, rows_of)
    hist_lo = gl.convert_layout(hist_lo_h, rows_of)
    hist_width = gl.convert_layout(hist_width_h, rows_of)
    gl.thread_barrier()  # phase A's appends and stores, by every thread, are read below
    count = gl.load(appended_ptr + rows64, mask=row_ok, other=0, volatile=True)
    n = gl.where(row_ok & (count <= capacity), count, 0)
    n_max = gl.max(n, axis=0)
    offs = gl.arange(0, CHUNK, layout=gl.SliceLayout(0, cal))
    row_keys = buf_ptr + rows64[:, None] * capacity
    # Per-lane partials over the chunks, one block-wide reduction a pass (_calibrate_in_scan).
    least_lanes = gl.full([BLOCK_ROWS, CHUNK], float("inf"), gl.float32, cal)
    most_lanes = gl.full([BLOCK_ROWS, CHUNK], float("-inf"), gl.float32, cal)
    for start in range(0, n_max, CHUNK):
        valid = (start + offs)[None, :] < n[:, None]
        scores = _scores_of_keys(gl.load(row_keys + start + offs[None, :], mask=valid, other=NO_KEY_C))
        least_lanes = gl.minimum(least_lanes, gl.where(valid, scores, float("inf")))
        most_lanes = gl.maximum(most_lanes, scores)
    least = gl.min(least_lanes, axis=1)
    most = gl.max(most_lanes, axis=1)
    lo_k = least
    hi_k = most
    lo_c = least
    hi_c = most
    for _ in range(BISECTION_STEPS):
        mid_k = lo_k + (hi_k - lo_k) * 0.5
        mid_c = lo_c + (hi_c - lo_c) * 0.5
        lanes_k = gl.zeros([BLOCK_ROWS, CHUNK], gl.int32, cal)
        lanes_c = gl.zeros([BLOCK_ROWS, CHUNK], gl.int32, cal)
        for start in range(0, n_max, CHUNK):
            valid = (start + offs)[None, :] < n[:, None]
            scores = _scores_of_keys(gl.load(row_keys + start + offs[None, :], mask=valid, other=NO_KEY_C))
            lanes_k += (valid & (scores >= mid_k[:, None])).to(gl.int32)
            lanes_c += (valid & (scores >= mid_c[:, None])).to(gl.int32)
        count_k = gl.sum(lanes_k, axis=1)
        count_c = gl.sum(lanes_c, axis=1)
        lo_k, hi_k = _bracket_step(lo_k, hi_k, mid_k, count_k, TOPK)
        lo_c, hi_c = _bracket_step(lo_c, hi_c, mid_c, count_c, ceiling_rank)
    calibrated, ranged, thr, hist_lo, hist_width, hist_inv = _calibration(
        n, least, most, lo_k, lo_c, thr, hist_lo, hist_width, TOPK, NB
    )
    gl.thread_barrier()  # every thread has read the counts (n) before one of them resets its row's
    # Compaction in place, chunk by chunk (_calibrate_in_scan).
    gl.atomic_xchg(appended_ptr + rows64, gl.zeros([BLOCK_ROWS], gl.int32, rows_of), mask=calibrated)
    one = gl.full([BLOCK_ROWS, CHUNK], 1, gl.int32, cal)
    for start in range(0, n_max, CHUNK):
        slots = start + offs[None, :] + 0 * rows64[:, None]
        valid = slots < n[:, None]
        keys = gl.load(row_keys + slots, mask=valid, other=NO_KEY_C)
        gl.thread_barrier()  # every thread holds this chunk before a survivor is written into it
        scores = _scores_of_keys(keys)
        kept = valid & calibrated[:, None] & (scores >= thr[:, None])
        slot = gl.atomic_add(appended_ptr + rows64[:, None] + 0 * slots, one, mask=kept, sem="relaxed")
        gl.store(row_keys + slot, keys, mask=kept)
        bin_of = gl.minimum(gl.maximum(((scores - hist_lo[:, None]) * hist_inv[:, None]).to(gl.int32), 0), NB - 1)
        gl.atomic_add(hist_ptr + rows64[:, None] * NB + bin_of, one, mask=kept & ranged[:, None], sem="relaxed")
        gl.thread_barrier()
    return (
        gl.convert_layout(thr, row_layout),
        gl.convert_layout(hist_lo, row_layout),
        gl.convert_layout(hist_width, row_layout),
    )
