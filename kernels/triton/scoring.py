"""Fused FP4 scoring + LiteTopK filter on tensor cores (Triton; sm_90 wgmma, and the interpreter).

Layer: backends (triton/; backend.py launches it).

Math (docs/contract.md §1) with the exact integer scheme of operands.py:
    int_dot[j, (i, h)] = k_lo[j].q_lo[i,h] + 16 (k_lo.q_hi + k_hi.q_lo) + 256 k_hi.q_hi   (int8 MMA -> int32)
    r                  = relu(int_dot) * 2^-149                 exact (see below)
    score[i, j]        = fl32( fl32( sum_h fl32(wq[i,h] * r) ) * rowfac[i] * kfac[j] )
with wq[i,h] = w[i,h] * 2^(mq[i,h] - 129 + shift_i), rowfac[i] = 2^(149 - shift_i) * weight_scale and
kfac[j] = 2^(mk[j] - 127) (operands.prepare_queries_fp4_triton: shift_i puts the row's largest |wq| in
[2^126, 2^127) and the launcher refuses rows whose nonzero |wq| fall below 2^23, so every product
wq * r with r != 0 is a normal float32). Every factor but w and weight_scale is an exact power of
two, and ReLU and the head sum commute with a positive power of two, so this is the contract's
    weight_scale * sum_h w[i,h] * relu(q[i,h].k[j])
computed in float32 with one rounding per product (or none where the compiler fuses a product
into the running sum), the head sum in the reduction's fixed order (each thread's heads in
sequence, then lane exchanges; see Tiling), and one rounding of the product with weight_scale. Bound
against exact arithmetic, per score:
    |score - exact| <= 70 * 2^-24 * |weight_scale| * sum_h |w[i,h]| relu(q.k)        (gamma_64 + 2 roundings)
Where no live vector is wide (ANY_WIDE false, the common case) 0 <= relu(int_dot) < 2^21, and its
int32 bits read as a float32 are exactly relu(int_dot) * 2^-149 (a subnormal): one integer max
per product, no conversion. In the wide branches int_dot (< 2^29) is converted once (RNE) and
scaled by 2^-149 exactly. The hi terms run only in programs (query side) or key tiles (key side)
that hold a wide vector.

Tiling (the fast orientation measured on the H200): keys on the MMA's M side
(BLOCK_KEYS keys per step), (head, query row) on the N side, column n = head * BLOCK_ROWS + row,
so that each thread's accumulator columns hold two rows x 16 heads (BLOCK_ROWS 2, the backend's
tile, the same layout and order as scoring_gluon.py; 32 heads at BLOCK_ROWS 4) and the head sum
needs two lane exchanges (one at 4). One program owns BLOCK_ROWS rows of one sequence and walks every key of their
windows (dense mode: every stride-th position from 0, one output column each; STRIDED false
means stride 1, whose key tiles are contiguous and need no bounds mask: s_pad covers them).

Scan epilogue: a score >= the row's threshold score (float32; thresholds are score floors, so
this admits every key at or above the threshold key, and possibly more keys of the same score)
takes a slot with one relaxed atomic on the row's counter; its key ordered(score) << 32 |
(2^32 - 1 - position) (keys.make_keys) is stored at buf[row, slot] (int64 addressing) if slot
< capacity; the counter keeps counting past it (the overflow certificate). Passing scores are also
counted in a per-row histogram of NUM_BINS linear bins over [hist_lo, hist_lo + NUM_BINS *
hist_width). The step loop runs in inner loops of REFRESH steps (loads, MMAs and predicated
appends only, so they software-pipeline); between them the program re-reads its rows'
histograms and raises each threshold to one bin below the highest bin edge with at least K
counted keys at or above it, a real lower bound of the K-th best score (float32 rounding of the
bin index is far below one bin; a stale count only delays the raise). A NaN or inf score inside
a window turns the row's probe (a running sum of in-window score * 0) into NaN: the row is flagged.
Self-calibration (SELF_CALIBRATE, LiteTopKTuning(calibration="scan")): the program sets up its own
rows (scan_buffers: no launch before the scan), scans a sample of its own tiles first, takes its
thresholds from them and scans the rest: scan_calibration.py says how, and holds the steps both
scoring kernels share.
Limits: D = 128, 64 heads, BLOCK_ROWS rows of one sequence per program; no [rows, S] tensor in
scan mode.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..cache_layout import HEAD_DIM, NUM_HEADS
from ..keys import NO_KEY_C, _ordering_keys, _scores_of_keys
from ..scratch import Scratch
from .scan_calibration import (
    _calibrate_in_scan,
    _ceiling_rank,
    _first_sample_tile,
    _phase_bounds,
    _sample_tiles,
)

HEADS = NUM_HEADS
NUM_BINS = 32
SUBNORMAL_UNIT = tl.constexpr(2.0**-149)  # the smallest positive float32


@triton.jit
def score_fp4_kernel(
    k_lo_ptr,
    k_hi_ptr,
    kfac_ptr,  # [B, s_pad, 128] int8 x2, [B, s_pad] float32
    tile_wide_ptr,
    tile_cols,  # int8 [B, tile_cols]: a key tile needs k_hi (see launcher)
    q_lo_ptr,
    q_hi_ptr,
    wq_ptr,
    rowfac_ptr,  # [rows, 64, 128] int8 x2, [rows, 64] float32, [rows] float32
    prog_rows_ptr,
    prog_batch_ptr,  # [programs, BLOCK_ROWS] int32 (-1 pad); [programs] int32
    prog_span_ptr,
    prog_q_wide_ptr,  # [programs, 2] int32: min start, max end of its rows;
    # [programs] int8: a row of the program needs q_hi
    starts_ptr,
    ends_ptr,  # [rows] int32 windows
    s_pad,
    out_ptr,
    out_width,
    max_pos,
    position_stride,  # dense: float32 [rows, out_width], column c = position
    # c * position_stride (< max_pos)
    thr_ptr,
    hist_lo_ptr,
    hist_width_ptr,  # scan: float32 [rows] x3 (threshold score; width <= 0: off)
    hist_ptr,
    buf_ptr,
    capacity,
    appended_ptr,  # scan: int32 [rows, NB], int64 [rows, capacity], int32 [rows]
    thr_out_ptr,
    nonfinite_ptr,  # scan: float32 [rows]; int8 [rows]
    sample_tiles,
    sample_stride,  # scan, SELF_CALIBRATE: the calibration sample (module docstring)
    TOPK: tl.constexpr,
    BLOCK_KEYS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    DENSE: tl.constexpr,
    STRIDED: tl.constexpr,
    ANY_WIDE: tl.constexpr,
    REFRESH: tl.constexpr = 16,
    H: tl.constexpr = HEADS,
    D: tl.constexpr = HEAD_DIM,
    NB: tl.constexpr = NUM_BINS,
    SELF_CALIBRATE: tl.constexpr = False,
    CHUNK: tl.constexpr = 256,
):
    pid = tl.program_id(0)
    N: tl.constexpr = BLOCK_ROWS * H
    offs_r = tl.arange(0, BLOCK_ROWS)
    offs_n = tl.arange(0, N)
    offs_d = tl.arange(0, D)
    offs_k = tl.arange(0, BLOCK_KEYS)
    rows = tl.load(prog_rows_ptr + pid * BLOCK_ROWS + offs_r)
    row_ok = rows >= 0
    rows = tl.where(row_ok, rows, 0)
    rows64 = rows.to(tl.int64)
    batch = tl.load(prog_batch_ptr + pid).to(tl.int64)
    starts = tl.where(row_ok, tl.load(starts_ptr + rows), 0)
    ends = tl.where(row_ok, tl.load(ends_ptr + rows), 0)
    rowfac = tl.load(rowfac_ptr + rows, mask=row_ok, other=0.0)

    # Query operand [D, N], column n = (head n // BLOCK_ROWS, row n % BLOCK_ROWS); loaded once per program.
    n_rows = tl.load(prog_rows_ptr + pid * BLOCK_ROWS + offs_n % BLOCK_ROWS)
    n_ok = n_rows >= 0
    n_vec = tl.where(n_ok, n_rows, 0).to(tl.int64) * H + offs_n // BLOCK_ROWS
    q_lo = tl.load(q_lo_ptr + n_vec[None, :] * D + offs_d[:, None])
    q_wide = tl.load(prog_q_wide_ptr + pid) != 0
    if ANY_WIDE:
        q_hi = tl.load(q_hi_ptr + n_vec[None, :] * D + offs_d[:, None], mask=q_wide, other=0)
    else:
        q_hi = q_lo  # unused
    wq = tl.load(wq_ptr + n_vec, mask=n_ok, other=0.0)

    if DENSE:
        lo = 0
        hi = max_pos
        # a program without rows (span end 0: past the schedule's used programs) scores nothing
        n_steps = tl.where(tl.load(prog_span_ptr + 2 * pid + 1) > 0, tl.cdiv(out_width, BLOCK_KEYS), 0)
    else:
        lo = (tl.load(prog_span_ptr + 2 * pid) // BLOCK_KEYS) * BLOCK_KEYS
        hi = tl.load(prog_span_ptr + 2 * pid + 1)
        n_steps = tl.cdiv(hi - lo, BLOCK_KEYS)
        offs_bin = tl.arange(0, NB)
        hist_rows = hist_ptr + rows64[:, None] * NB + offs_bin[None, :]
        if SELF_CALIBRATE:
            # The program sets up its own rows (scan_buffers: no preparing launch): threshold -inf,
            # histogram off, counters zeroed before any thread counts.
            thr = tl.full([BLOCK_ROWS], float("-inf"), tl.float32)
            hist_lo = tl.zeros([BLOCK_ROWS], tl.float32)
            hist_width = tl.zeros([BLOCK_ROWS], tl.float32)
            tl.store(appended_ptr + rows64, tl.zeros([BLOCK_ROWS], tl.int32), mask=row_ok)
            tl.store(hist_rows, tl.zeros([BLOCK_ROWS, NB], tl.int32), mask=row_ok[:, None])
            tl.debug_barrier()
        else:
            thr = tl.load(thr_ptr + rows, mask=row_ok, other=0.0)
            hist_lo = tl.load(hist_lo_ptr + rows, mask=row_ok, other=0.0)
            hist_width = tl.load(hist_width_ptr + rows, mask=row_ok, other=0.0)
        hist_inv = tl.where(hist_width > 0, 1.0 / tl.where(hist_width > 0, hist_width, 1.0), 0.0)
    probe = tl.zeros([BLOCK_KEYS, BLOCK_ROWS], dtype=tl.float32)
    k_base = batch * s_pad
    if DENSE:
        for step in range(0, n_steps):
            pos, scores, in_window = _score_tile(
                step,
                lo,
                hi,
                position_stride,
                batch,
                k_base,
                k_lo_ptr,
                k_hi_ptr,
                kfac_ptr,
                tile_wide_ptr,
                tile_cols,
                q_lo,
                q_hi,
                q_wide,
                wq,
                rowfac,
                starts,
                ends,
                BLOCK_KEYS,
                BLOCK_ROWS,
                STRIDED,
                ANY_WIDE,
                H,
                D,
            )
            probe += tl.where(in_window, scores, 0.0) * 0.0
            column = step * BLOCK_KEYS + offs_k
            out_off = rows64[None, :] * out_width + column[:, None]
            tl.store(
                out_ptr + out_off,
                tl.where(in_window, scores, float("-inf")),
                mask=(column < out_width)[:, None] & row_ok[None, :],
            )
    else:
        # Inner loops of REFRESH steps hold only loads, MMAs and predicated appends (so they pipeline);
        # the threshold is raised from the histogram between them. A step's appended keys are stored
        # one step later, so that the slot atomics' round trip overlaps the next step's MMAs.
        pending_slot = tl.zeros([BLOCK_KEYS, BLOCK_ROWS], dtype=tl.int32)
        pending_key = tl.zeros([BLOCK_KEYS, BLOCK_ROWS], dtype=tl.int64)
        pending = tl.zeros([BLOCK_KEYS, BLOCK_ROWS], dtype=tl.int1)
        if SELF_CALIBRATE:
            # Phase A: the n_sample tiles that end with the program's earliest window end (the most
            # recent keys every row sees, _first_sample_tile), every key of the windows appended (the
            # threshold is -inf and the histogram off); then the threshold from them
            # (_calibrate_in_scan). Phase B below scans the tiles after them (few or none in a causal
            # program), then those before them: the Gluon kernel's order.
            n_sample = _sample_tiles(n_steps, sample_tiles, sample_stride, capacity, TOPK, BLOCK_KEYS)
            first_sample = _first_sample_tile(lo, n_steps, n_sample, tl.min(tl.where(row_ok, ends, hi)), BLOCK_KEYS)
            sample_lo, _ = _phase_bounds(0, lo, n_steps, n_sample, first_sample, BLOCK_KEYS)
            for step in range(0, n_sample):
                probe, pending_slot, pending_key, pending = _scan_step(
                    step,
                    sample_lo,
                    probe,
                    pending_slot,
                    pending_key,
                    pending,
                    thr,
                    hist_lo,
                    hist_inv,
                    hist_width,
                    batch,
                    k_base,
                    k_lo_ptr,
                    k_hi_ptr,
                    kfac_ptr,
                    tile_wide_ptr,
                    tile_cols,
                    q_lo,
                    q_hi,
                    q_wide,
                    wq,
                    rowfac,
                    starts,
                    ends,
                    rows64,
                    buf_ptr,
                    capacity,
                    appended_ptr,
                    hist_ptr,
                    BLOCK_KEYS,
                    BLOCK_ROWS,
                    ANY_WIDE,
                    H,
                    D,
                    NB,
                )
            _store_pending(buf_ptr, rows64, capacity, pending_slot, pending_key, pending)
            pending = tl.zeros([BLOCK_KEYS, BLOCK_ROWS], dtype=tl.int1)
            thr, hist_lo, hist_width, hist_inv = _calibrate_in_scan(
                buf_ptr,
                appended_ptr,
                hist_ptr,
                rows64,
                row_ok,
                capacity,
                thr,
                hist_lo,
                hist_width,
                _ceiling_rank(n_sample, n_steps, TOPK),
                TOPK,
                BLOCK_ROWS,
                NB,
                CHUNK,
            )
        for part in tl.static_range(2 if SELF_CALIBRATE else 1):
            if SELF_CALIBRATE:  # phases 1 and 2 (_phase_bounds)
                part_lo, part_steps = _phase_bounds(part + 1, lo, n_steps, n_sample, first_sample, BLOCK_KEYS)
            else:
                part_lo = lo
                part_steps = n_steps
            for chunk_start in range(0, part_steps, REFRESH):
                for step in range(chunk_start, tl.minimum(chunk_start + REFRESH, part_steps)):
                    probe, pending_slot, pending_key, pending = _scan_step(
                        step,
                        part_lo,
                        probe,
                        pending_slot,
                        pending_key,
                        pending,
                        thr,
                        hist_lo,
                        hist_inv,
                        hist_width,
                        batch,
                        k_base,
                        k_lo_ptr,
                        k_hi_ptr,
                        kfac_ptr,
                        tile_wide_ptr,
                        tile_cols,
                        q_lo,
                        q_hi,
                        q_wide,
                        wq,
                        rowfac,
                        starts,
                        ends,
                        rows64,
                        buf_ptr,
                        capacity,
                        appended_ptr,
                        hist_ptr,
                        BLOCK_KEYS,
                        BLOCK_ROWS,
                        ANY_WIDE,
                        H,
                        D,
                        NB,
                    )
                thr = _raised_threshold(hist_rows, thr, hist_lo, hist_width, TOPK, NB)
    if not DENSE:
        _store_pending(buf_ptr, rows64, capacity, pending_slot, pending_key, pending)
    nonfinite = tl.sum(probe, axis=0)
    tl.store(nonfinite_ptr + rows, (nonfinite != nonfinite).to(tl.int8), mask=row_ok)
    if not DENSE:
        tl.store(thr_out_ptr + rows, thr, mask=row_ok)


@triton.jit
def _store_pending(buf_ptr, rows64, capacity, pending_slot, pending_key, pending):
    """Store the pending appended keys at their slots of the rows' buffers (those below capacity)."""
    tl.store(buf_ptr + rows64[None, :] * capacity + pending_slot, pending_key, mask=pending & (pending_slot < capacity))


@triton.jit
def _scan_step(
    step,
    lo,
    probe,
    pending_slot,
    pending_key,
    pending,
    thr,
    hist_lo,
    hist_inv,
    hist_width,
    batch,
    k_base,
    k_lo_ptr,
    k_hi_ptr,
    kfac_ptr,
    tile_wide_ptr,
    tile_cols,
    q_lo,
    q_hi,
    q_wide,
    wq,
    rowfac,
    starts,
    ends,
    rows64,
    buf_ptr,
    capacity,
    appended_ptr,
    hist_ptr,
    BLOCK_KEYS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    ANY_WIDE: tl.constexpr,
    H: tl.constexpr,
    D: tl.constexpr,
    NB: tl.constexpr,
):
    """One step of the scan over the tiles from position `lo` (module docstring): score the step's
    tile, store the previous step's appended keys, append this step's passing keys (their stores
    pending) and count them in the histogram. Returns (probe, pending_slot, pending_key, pending)."""
    pos, scores, in_window = _score_tile(
        step,
        lo,
        0,
        1,
        batch,
        k_base,
        k_lo_ptr,
        k_hi_ptr,
        kfac_ptr,
        tile_wide_ptr,
        tile_cols,
        q_lo,
        q_hi,
        q_wide,
        wq,
        rowfac,
        starts,
        ends,
        BLOCK_KEYS,
        BLOCK_ROWS,
        False,
        ANY_WIDE,
        H,
        D,
    )
    probe += tl.where(in_window, scores, 0.0) * 0.0
    _store_pending(buf_ptr, rows64, capacity, pending_slot, pending_key, pending)
    # Everything below derives from one [BLOCK_KEYS, BLOCK_ROWS] float tile (NaN outside the
    # window never passes), so the compiler moves one tile to the atomics' layout.
    windowed = tl.where(in_window, scores, float("nan"))
    passing = windowed >= thr[None, :]
    # One relaxed atomic per passing key (rare once the threshold is tight): no block-wide sync.
    slot = tl.atomic_add(appended_ptr + rows64[None, :] + 0 * pos[:, None], 1, mask=passing, sem="relaxed")
    bin_of = ((windowed - hist_lo[None, :]) * hist_inv[None, :]).to(tl.int32)
    bin_of = tl.minimum(tl.maximum(bin_of, 0), NB - 1)
    tl.atomic_add(hist_ptr + rows64[None, :] * NB + bin_of, 1, mask=passing & (hist_width[None, :] > 0), sem="relaxed")
    return probe, slot, _ordering_keys(windowed, pos[:, None]), passing


@triton.jit
def _raised_threshold(hist_rows, thr, hist_lo, hist_width, TOPK: tl.constexpr, NB: tl.constexpr):
    """The threshold raised to one bin below the highest bin edge with >= K counted keys at or above
    it: every counted score lies >= that edge minus float rounding, far less than a bin. A count read
    before some atomics land is only smaller: the threshold stays safe."""
    tl.debug_barrier()
    hist = tl.load(hist_rows, volatile=True)
    at_or_above = tl.cumsum(hist, axis=1, reverse=True)
    best_bin = tl.max(tl.where(at_or_above >= TOPK, tl.arange(0, NB)[None, :], -1), axis=1)
    edge = hist_lo + (best_bin - 1).to(tl.float32) * hist_width
    raise_ok = (best_bin >= 1) & (hist_width > 0)
    return tl.where(raise_ok, tl.maximum(thr, edge), thr)


@triton.jit
def _score_tile(
    step,
    lo,
    hi,
    stride,
    batch,
    k_base,
    k_lo_ptr,
    k_hi_ptr,
    kfac_ptr,
    tile_wide_ptr,
    tile_cols,
    q_lo,
    q_hi,
    q_wide,
    wq,
    rowfac,
    starts,
    ends,
    BLOCK_KEYS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    STRIDED: tl.constexpr,
    ANY_WIDE: tl.constexpr,
    H: tl.constexpr,
    D: tl.constexpr,
):
    """Scores float32 [BLOCK_KEYS, BLOCK_ROWS] of key step `step` (module docstring), with the
    positions and the in-window mask."""
    offs_k = tl.arange(0, BLOCK_KEYS)
    offs_d = tl.arange(0, D)
    if STRIDED:
        pos = lo + (step * BLOCK_KEYS + offs_k) * stride
        k_live = pos < hi
        k_off = (k_base + pos).to(tl.int64) * D
        k_lo = tl.load(k_lo_ptr + k_off[:, None] + offs_d[None, :], mask=k_live[:, None], other=0)
        kfac = tl.load(kfac_ptr + k_base + pos, mask=k_live, other=0.0)
    else:  # contiguous and inside [0, s_pad): no mask
        pos = lo + step * BLOCK_KEYS + offs_k
        k_off = (k_base + lo + step * BLOCK_KEYS) * D
        k_lo = tl.load(k_lo_ptr + k_off + offs_k[:, None] * D + offs_d[None, :])
        kfac = tl.load(kfac_ptr + k_base + pos)
    acc = tl.dot(k_lo, q_lo, out_dtype=tl.int32)
    if ANY_WIDE:  # rare: run-time branches, taken only by programs / key tiles that hold wide vectors
        if q_wide:
            acc += 16 * tl.dot(k_lo, q_hi, out_dtype=tl.int32)
        tile = tl.where(STRIDED, 0, lo // BLOCK_KEYS + step)
        if tl.load(tile_wide_ptr + batch * tile_cols + tile) != 0:
            if STRIDED:
                k_hi = tl.load(k_hi_ptr + k_off[:, None] + offs_d[None, :], mask=k_live[:, None], other=0)
            else:
                k_hi = tl.load(k_hi_ptr + k_off + offs_k[:, None] * D + offs_d[None, :])
            acc += 16 * tl.dot(k_hi, q_lo, out_dtype=tl.int32)
            if q_wide:
                acc += 256 * tl.dot(k_hi, q_hi, out_dtype=tl.int32)
        relu_sub = tl.maximum(acc.to(tl.float32), 0.0) * SUBNORMAL_UNIT
    else:
        # 0 <= relu(x) < 2^21 (one int8 dot): its bits read as float32 are relu(x) * 2^-149 exactly,
        # with no conversion instruction.
        relu_sub = tl.maximum(acc, 0).to(tl.float32, bitcast=True)
    terms = relu_sub * wq[None, :]  # = w' * relu(x) * 2^(shift - 149), normal (launcher's range check)
    scores = tl.sum(tl.reshape(terms, [BLOCK_KEYS, H, BLOCK_ROWS]), axis=1)
    scores = scores * rowfac[None, :] * kfac[:, None]
    in_window = (pos[:, None] >= starts[None, :]) & (pos[:, None] < ends[None, :])
    return pos, scores, in_window


@triton.jit
def _histogram_range(thr_keys, ceil_keys, NB: tl.constexpr, HAS_CEILINGS: tl.constexpr):
    """(thr, hist_lo, hist_width) float32 of threshold and ceiling keys (prepare_scan_triton's docstring):
    the threshold key's score, and NB linear bins from it to the ceiling's score, or none (width 0)."""
    lo = _scores_of_keys(thr_keys)
    if HAS_CEILINGS:
        hi = _scores_of_keys(ceil_keys)
        # (NB as a tensor of lo's shape and layout, built from lo: this helper also runs in Gluon kernels;
        # where lo is -inf the width is not finite either way, so the range is unusable)
        width = tl.div_rn(hi - lo, lo * 0.0 + NB)
        usable = (
            (width == width) & (tl.abs(width) != float("inf")) & (width > 2.0**-16 * tl.maximum(tl.abs(lo), tl.abs(hi)))
        )
        hist_lo = tl.where(usable, lo, 0.0)
        hist_width = tl.where(usable, width, 0.0)
    else:
        hist_lo = tl.where(lo == float("-inf"), 0.0, lo)
        hist_width = tl.abs(hist_lo) * 0.0  # +0.0 (hist_lo is finite)
    return lo, hist_lo, hist_width


@triton.jit
def prepare_scan_kernel(
    thr_keys_ptr,
    ceil_keys_ptr,
    rows,  # int64 [rows] x2 (ceilings unused without HAS_CEILINGS)
    thr_ptr,
    hist_lo_ptr,
    hist_width_ptr,
    raised_ptr,  # float32 [rows] x4
    appended_ptr,
    hist_ptr,
    nonfinite_ptr,  # int32 [rows], int32 [rows, NB], int8 [rows]: zeroed
    NB: tl.constexpr,
    HAS_CEILINGS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = offs < rows
    keys = tl.load(thr_keys_ptr + offs, mask=live, other=NO_KEY_C)
    ceil_keys = tl.load(ceil_keys_ptr + offs, mask=live & HAS_CEILINGS, other=NO_KEY_C)
    lo, hist_lo, hist_width = _histogram_range(keys, ceil_keys, NB, HAS_CEILINGS)
    tl.store(thr_ptr + offs, lo, mask=live)
    tl.store(raised_ptr + offs, lo, mask=live)
    tl.store(hist_lo_ptr + offs, hist_lo, mask=live)
    tl.store(hist_width_ptr + offs, hist_width, mask=live)
    tl.store(appended_ptr + offs, tl.zeros([BLOCK], tl.int32), mask=live)
    tl.store(nonfinite_ptr + offs, tl.zeros([BLOCK], tl.int8), mask=live)
    offs_bin = tl.arange(0, NB)
    tl.store(
        hist_ptr + offs.to(tl.int64)[:, None] * NB + offs_bin[None, :],
        tl.zeros([BLOCK, NB], tl.int32),
        mask=live[:, None],
    )


def scan_buffers(rows: int, num_bins: int, scratch: Scratch, *, self_calibrating: bool) -> dict:
    """The scan's per-row buffers, from `scratch` (the problem's: the caller's workspace, or the
    allocator), not initialized: raised (float32: the threshold score the scan ends with), appended
    (int32 count), hist (int32 [rows, num_bins]), nonfinite (int8), and unless `self_calibrating` the
    inputs thr, hist_lo and hist_width (float32; prepare_scan_triton). A self-calibrating scan sets
    up its rows itself (scan_calibration.py): no launch before it."""
    names = ("raised",) if self_calibrating else ("thr", "raised", "hist_lo", "hist_width")
    made = {name: scratch.empty(rows, torch.float32) for name in names}
    made.update(
        appended=scratch.empty(rows, torch.int32),
        hist=scratch.empty((rows, num_bins), torch.int32),
        nonfinite=scratch.empty(rows, torch.int8),
    )
    return made


def prepare_scan_triton(
    thresholds: torch.Tensor, ceilings: torch.Tensor | None, num_bins: int = NUM_BINS, scratch: Scratch | None = None
) -> dict:
    """scan_buffers, set up from the calibration's int64 keys in one launch: thr (float32: the
    threshold key's score, -inf for NO_KEY: the kernel admits every score >= it), raised (its copy,
    which the scan raises), hist_lo and hist_width (float32: NUM_BINS linear bins from the threshold's
    score to the ceiling's; both 0 (no histogram) without a ceiling, where the width is not finite, or
    where the bins would be too narrow for float32 to place a score in its bin reliably, < 2^-16 of
    the scores), and appended, hist and nonfinite zeroed. All from `scratch` (None: the allocator)."""
    rows = thresholds.shape[0]
    scratch = scratch if scratch is not None else Scratch(thresholds.device)
    made = scan_buffers(rows, num_bins, scratch, self_calibrating=False)
    if rows:
        block = 128
        keys = thresholds.contiguous()
        prepare_scan_kernel[(triton.cdiv(rows, block),)](
            keys,
            (ceilings.contiguous() if ceilings is not None else keys),
            rows,
            made["thr"],
            made["hist_lo"],
            made["hist_width"],
            made["raised"],
            made["appended"],
            made["hist"],
            made["nonfinite"],
            NB=num_bins,
            HAS_CEILINGS=ceilings is not None,
            BLOCK=block,
            num_warps=4,
        )
    return made
