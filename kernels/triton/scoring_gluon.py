"""Fused FP4 scoring + LiteTopK filter in Gluon (sm_90 only): scoring.py's kernel with explicit layouts.

Layer: backends (triton/; backend.py launches it on sm_90, compile/sm90.py builds it offline).

The math, the exact integer scheme, the float32 order and its bound are scoring.py's: per key step
    int_dot[j, (h, i)] = k_lo[j] . q_lo[i, h]                          (int8 wgmma -> int32, exact)
    score[i, j]        = fl32( fl32( sum_h fl32(wq[i,h] * bits_as_f32(relu(int_dot))) ) * rowfac[i] * kfac[j] )
where no live vector is wide (ANY_WIDE false, the common case). With ANY_WIDE the program stages q_hi
when one of its rows needs it and copies a tile's k_hi when the tile holds a wide key, into the ring's
other slot (no k_hi buffer of its own: 48 KiB of shared memory a program, so 4 programs share an SM as
in the common case; a separate 8 KiB buffer had put the wide variants at 56-56.5 KiB, over a quarter of
the SM's 228 KiB with the 2 KiB static and reserved a block: 3 programs). The k_hi copy and the next lo
copy around a wide tile are issued after the MMA of the step before them with cp.async (overlapping that
step's epilogue; no synchronous copy); the tiles' wide flags are loaded one step ahead and the keys'
factors before the MMA, so no load latency sits between a step's barrier and its MMA. The hi dots join
by Horner's rule in the same accumulator (_wide_int_dots), and relu(int_dot) is converted once and
scaled by 2^-149, as in scoring.py. A narrow step of the ANY_WIDE variant is the common case's step (the
same bits).
The head sum is reduced in the layout the Triton kernel gets for the same tile at BLOCK_ROWS = 2
(gl.sum over the same NVMMA layout), so the two kernels return the same bits (checked on the H200
by tests/kernels/test_triton_backend.py, tests/kernels/test_wide_scoring.py and bench/probes/gluon_probe.py).

What Gluon buys over the Triton kernel (bench/NOTES.md, session 4): the register budget. One warpgroup
(4 warps), BLOCK_ROWS = 2 rows x 64 heads = 128 MMA columns, BLOCK_KEYS = 64 keys per wgmma (m64n128k32,
4 k-steps): 64 int32 accumulators and 32 head weights per thread, so the kernel fits <= 128 registers
(ptxas cap, `maxnreg`) and 4 programs share an SM, where the Triton kernel needs ~250 registers and gets
2 (Nsight: latency-bound at 2 warps per scheduler). Key tiles are copied global -> shared with cp.async
into a ring of NUM_BUFFERS tiles (no registers; two CTA barriers per step, one after the copy wait and
one before the wgmma; the copy of step s + NUM_BUFFERS - 1 in flight during step s's MMA and epilogue).

Tiling: keys on the MMA's M side, column n = head * BLOCK_ROWS + row on the N side (scoring.py).
After the head sum each (key, row) score sits in 4 lanes (the reduction's replication); the dense
store is issued once per element (Triton's lowering masks the replicas). The scan first moves the
tile to the `flat` layout, one element per thread (each lane keeps one of the four it holds), so
that its returning slot atomic needs no shared-memory broadcast of the result; the window test,
the probe and the appends run there. Registers: dense 123-128, scan 128 with one register
spilled (one STL / LDL per step; without the cap the scan takes ~165 and was 7 % slower).

Scan epilogue as scoring.py: a score >= the row's threshold (float32 floor) takes a slot with one
relaxed atomic on the row's counter, its key ordered(score) << 32 | (2^32 - 1 - position) is stored
at buf[row, slot] if slot < capacity (one step later with DEFER_APPENDS, so the slot's round trip
overlaps the next step), the counter keeps counting (overflow certificate); passing
scores are counted in NUM_BINS linear bins; every REFRESH steps the threshold is raised to one bin
below the highest bin edge with >= TOPK keys at or above it (a lower bound of the K-th best).
A NaN or inf score inside a window makes the row's probe NaN (nonfinite flag).
Self-calibrating scan (SELF_CALIBRATE; scan_calibration.py): the key loop runs three times,
over the sample tiles, the tiles after them and the tiles before them (the long phase last, so that no
phase bound stays live through it), each the scan's own loop with its own ring prologue (the six other
variants compile to the same SASS as without the phases); after the first, _calibrate_in_scan_gluon
repeats _calibrate_in_scan's steps and arithmetic in a [2, 256] layout that gives every buffer
slot to one thread (no replicated atomics). The sample's phase never raises its threshold (the twin's
phase A: -inf, no histogram). The program sets up its rows itself (threshold, histogram range, zeroed
counters: no launch before the scan). Offline: its step loops 253 (the sample's: no raise, and no
histogram add, off by construction) / 347 / 341 instructions (the scan's 326), no stack (104 bytes with
ANY_WIDE, whose loops reload up to 10 registers a step against scan_wide's 5). Not yet run on an H200.
Limits: D = 128, 64 heads, BLOCK_ROWS = 2, sm_90 (wgmma); no interpreter (the Triton kernel is
the CI-tested twin). The ANY_WIDE variants spill up to 10 registers (compile/sm90.py's summary).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from ..keys import _ordering_keys
from .scan_calibration import _calibrate_in_scan_gluon, _ceiling_rank, _first_sample_tile, _phase_bounds, _sample_tiles
from .scoring import SUBNORMAL_UNIT

GLUON_BLOCK_ROWS = 2
GLUON_BLOCK_KEYS = 64
GLUON_NUM_WARPS = 4
GLUON_MAX_REGISTERS = 128  # 4 programs x 128 threads per SM
NUM_BUFFERS = 2  # key tiles in the cp.async ring (2 measured 2-3 % faster than 3 or 4: bench/NOTES.md)


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _key_rows(
    step,
    n_steps,
    lo,
    stride,
    k_base,
    hi,
    offs_k,
    offs_d,
    BLOCK_KEYS: gl.constexpr,
    D: gl.constexpr,
    STRIDED: gl.constexpr,
):
    """(element offsets [BLOCK_KEYS, D], row mask [BLOCK_KEYS, 1]) of key step `step`'s tile in a
    [B, s_pad, D] operand (nothing past the last step; contiguous tiles lie inside [0, s_pad))."""
    live = step < n_steps
    if STRIDED:
        pos = lo + (step * BLOCK_KEYS + offs_k) * stride
        rows = (k_base + pos).to(gl.int64)[:, None] * D + offs_d[None, :]
        mask = ((pos < hi) & live)[:, None]
    else:
        rows = ((k_base + lo + step * BLOCK_KEYS).to(gl.int64) + offs_k)[:, None] * D + offs_d[None, :]
        mask = gl.full([BLOCK_KEYS, 1], 1, gl.int1, rows.type.layout) & live
    return rows, mask


@gluon.jit
def _issue_key_tile(
    step,
    n_steps,
    lo,
    stride,
    k_base,
    k_ptr,
    hi,
    smem,
    offs_k,
    offs_d,
    BLOCK_KEYS: gl.constexpr,
    D: gl.constexpr,
    STRIDED: gl.constexpr,
):
    """Start the cp.async of key step `step`'s tile of operand k_ptr (k_lo or k_hi) into `smem`
    (nothing past the last step), then close the copy group (an empty group keeps the wait counts
    uniform)."""
    rows, mask = _key_rows(step, n_steps, lo, stride, k_base, hi, offs_k, offs_d, BLOCK_KEYS, D, STRIDED)
    async_copy.async_copy_global_to_shared(smem, k_ptr + rows, mask=mask)
    async_copy.commit_group()


@gluon.jit
def _tile_flag(flags_at, step, n_steps, STRIDED: gl.constexpr):
    """Whether key step `step` (< n_steps, else false) needs k_hi: its tile's flag, or in strided mode
    the sequence's (one flag at flags_at)."""
    return gl.load(flags_at + (0 if STRIDED else step), mask=step < n_steps, other=0) != 0


@gluon.jit
def _wide_int_dots(
    lo_tile,
    hi_tile,
    q_smem,
    q_hi_smem,
    q_wide,
    k_wide,
    acc_layout: gl.constexpr,
    BLOCK_KEYS: gl.constexpr,
    N: gl.constexpr,
):
    """int_dot = k_lo.q_lo + 16 (k_lo.q_hi + k_hi.q_lo) + 256 k_hi.q_hi of one key step (operands.py),
    as int32 by Horner's rule over the hi terms a tile or program holds: every wgmma accumulates
    into the same registers and a product by 16 rescales between them (exact: |int_dot| < 2^29).
    hi_tile: a wide tile's k_hi (the ring slot the score kernel gives it)."""
    acc = gl.zeros([BLOCK_KEYS, N], gl.int32, acc_layout)
    if k_wide:
        if q_wide:
            acc = warpgroup_mma(hi_tile, q_hi_smem.permute((1, 0)), acc, use_acc=False) * 16
        acc = warpgroup_mma(hi_tile, q_smem.permute((1, 0)), acc)
    if q_wide:
        acc = warpgroup_mma(lo_tile, q_hi_smem.permute((1, 0)), acc)
    return warpgroup_mma(lo_tile, q_smem.permute((1, 0)), acc * 16)


@gluon.jit
def _narrow_relu_bits(lo_tile, q_smem, acc_layout: gl.constexpr, BLOCK_KEYS: gl.constexpr, N: gl.constexpr):
    """relu(k_lo . q_lo) of one key step (no hi operand), as float32: the int8 wgmma's int32 dots,
    0 <= relu(x) < 2^21, whose bits read as float32 are relu(x) * 2^-149 exactly (scoring.py)."""
    acc = warpgroup_mma(
        lo_tile, q_smem.permute((1, 0)), gl.zeros([BLOCK_KEYS, N], gl.int32, acc_layout), use_acc=False, is_async=True
    )
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return gl.maximum(acc, 0).to(gl.float32, bitcast=True)


@gluon.jit
def _program_rows(prog_rows_ptr, starts_ptr, ends_ptr, pid, BLOCK_ROWS: gl.constexpr, layout: gl.constexpr):
    """(rows, row_ok, starts, ends) [BLOCK_ROWS] of program pid in `layout`: -1 pads a short program,
    whose padding lanes read row 0 with an empty window (their columns score but stay outside it)."""
    rows = gl.load(prog_rows_ptr + pid * BLOCK_ROWS + gl.arange(0, BLOCK_ROWS, layout=layout))
    row_ok = rows >= 0
    rows = gl.where(row_ok, rows, 0)
    starts = gl.where(row_ok, gl.load(starts_ptr + rows), 0)
    ends = gl.where(row_ok, gl.load(ends_ptr + rows), 0)
    return rows, row_ok, starts, ends


@gluon.jit
def _stage_query_operand(
    q_lo_ptr,
    prog_rows_ptr,
    pid,
    q_smem,
    offs_d,
    N: gl.constexpr,
    BLOCK_ROWS: gl.constexpr,
    H: gl.constexpr,
    D: gl.constexpr,
    layout: gl.constexpr,
):
    """Store the program's query operand [N, D] in q_smem (column n = head n // BLOCK_ROWS, row
    n % BLOCK_ROWS; padding lanes read row 0) and return each column's vector index (int64 [N])."""
    offs_qn = gl.arange(0, N, layout=gl.SliceLayout(1, layout))
    q_rows = gl.load(prog_rows_ptr + pid * BLOCK_ROWS + offs_qn % BLOCK_ROWS)
    q_vec = gl.where(q_rows >= 0, q_rows, 0).to(gl.int64) * H + offs_qn // BLOCK_ROWS
    q_smem.store(gl.load(q_lo_ptr + q_vec[:, None] * D + offs_d[None, :]))
    return q_vec


@gluon.jit
def _store_keys(buf_ptr, rows64, capacity, slot, scores, positions, passing):
    """buf[row, slot] = the ordering key of (score, position) (keys.make_keys) where the key
    passed and slot < capacity."""
    keys = _ordering_keys(scores, positions[:, None])
    gl.store(buf_ptr + rows64[None, :] * capacity + slot, keys, mask=passing & (slot < capacity))


@gluon.jit
def score_fp4_gluon_kernel(
    k_lo_ptr,
    k_hi_ptr,
    kfac_ptr,
    tile_wide_ptr,
    tile_cols,
    q_lo_ptr,
    q_hi_ptr,
    wq_ptr,
    rowfac_ptr,
    prog_rows_ptr,
    prog_batch_ptr,
    prog_span_ptr,
    prog_q_wide_ptr,
    starts_ptr,
    ends_ptr,
    s_pad,
    out_ptr,
    out_width,
    max_pos,
    position_stride,
    thr_ptr,
    hist_lo_ptr,
    hist_width_ptr,
    hist_ptr,
    buf_ptr,
    capacity,
    appended_ptr,
    thr_out_ptr,
    nonfinite_ptr,
    sample_tiles,
    sample_stride,
    TOPK: gl.constexpr,
    BLOCK_KEYS: gl.constexpr,
    BLOCK_ROWS: gl.constexpr,
    DENSE: gl.constexpr,
    STRIDED: gl.constexpr,
    ANY_WIDE: gl.constexpr,
    REFRESH: gl.constexpr,
    H: gl.constexpr,
    D: gl.constexpr,
    NB: gl.constexpr,
    NUM_BUFFERS: gl.constexpr,
    DEFER_APPENDS: gl.constexpr,
    num_warps: gl.constexpr,
    SELF_CALIBRATE: gl.constexpr = False,
):
    """scoring.score_fp4_kernel's arguments and outputs (the k_hi / q_hi / wide arguments unused)."""
    gl.static_assert((BLOCK_KEYS == 64) & (BLOCK_ROWS == 2) & (num_warps == 4), "the layouts below are for 64 x 2 x 4")
    N: gl.constexpr = BLOCK_ROWS * H
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, N, 32])
    # global -> shared copies of [*, 128] int8 tiles: 16 bytes per thread and row segment
    ld: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[num_warps, 1], order=[1, 0]
    )
    # the layout of a [BLOCK_KEYS, BLOCK_ROWS] tile after the head sum (a reduction the compiler drops)
    tile: gl.constexpr = gl.sum(
        gl.reshape(gl.zeros([BLOCK_KEYS, N], gl.float32, mma), [BLOCK_KEYS, H, BLOCK_ROWS]), axis=1
    ).type.layout
    # the same tile with each element in one lane only (lane bit 0: the row, lane bit 1: key + 8)
    flat: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[],
        lane_bases=[[0, 1], [8, 0], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]],
        block_bases=[],
        shape=[BLOCK_KEYS, BLOCK_ROWS],
    )
    key_of_tile: gl.constexpr = gl.SliceLayout(1, tile)
    row_of_tile: gl.constexpr = gl.SliceLayout(0, tile)
    pid = gl.program_id(0)

    ring = gl.allocate_shared_memory(
        gl.int8, [NUM_BUFFERS, BLOCK_KEYS, D], gl.NVMMASharedLayout.get_default_for([BLOCK_KEYS, D], gl.int8)
    )
    q_smem = gl.allocate_shared_memory(gl.int8, [N, D], gl.NVMMASharedLayout.get_default_for([N, D], gl.int8))

    rows, row_ok, starts, ends = _program_rows(prog_rows_ptr, starts_ptr, ends_ptr, pid, BLOCK_ROWS, row_of_tile)
    rows64 = rows.to(gl.int64)
    rowfac = gl.load(rowfac_ptr + rows, mask=row_ok, other=0.0)
    batch = gl.load(prog_batch_ptr + pid).to(gl.int64)
    k_base = batch * s_pad

    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    q_vec = _stage_query_operand(q_lo_ptr, prog_rows_ptr, pid, q_smem, offs_d, N, BLOCK_ROWS, H, D, ld)
    if ANY_WIDE:  # the hi operands (operands.py): q_hi staged where a row of the program needs it
        q_wide = gl.load(prog_q_wide_ptr + pid) != 0
        q_hi_smem = gl.allocate_shared_memory(gl.int8, [N, D], gl.NVMMASharedLayout.get_default_for([N, D], gl.int8))
        q_hi_smem.store(
            gl.load(q_hi_ptr + q_vec[:, None] * D + offs_d[None, :], mask=(offs_d[None, :] >= 0) & q_wide, other=0)
        )
    offs_n = gl.arange(0, N, layout=gl.SliceLayout(0, mma))
    n_rows = gl.load(prog_rows_ptr + pid * BLOCK_ROWS + offs_n % BLOCK_ROWS)
    wq = gl.load(
        wq_ptr + gl.where(n_rows >= 0, n_rows, 0).to(gl.int64) * H + offs_n // BLOCK_ROWS, mask=n_rows >= 0, other=0.0
    )

    if DENSE:
        lo = 0
        hi = max_pos
        stride = position_stride
        # a program without rows (span end 0: past the schedule's used programs) scores nothing
        n_steps = gl.where(gl.load(prog_span_ptr + 2 * pid + 1) > 0, gl.cdiv(out_width, BLOCK_KEYS), 0)
    else:
        lo = (gl.load(prog_span_ptr + 2 * pid) // BLOCK_KEYS) * BLOCK_KEYS
        hi = gl.load(prog_span_ptr + 2 * pid + 1)
        stride = 1
        n_steps = gl.cdiv(hi - lo, BLOCK_KEYS)
        hist_layout: gl.constexpr = gl.BlockedLayout(
            size_per_thread=[1, 1], threads_per_warp=[1, 32], warps_per_cta=[num_warps, 1], order=[1, 0]
        )
        h_rows = gl.load(
            prog_rows_ptr + pid * BLOCK_ROWS + gl.arange(0, BLOCK_ROWS, layout=gl.SliceLayout(1, hist_layout))
        )
        h_ok = h_rows >= 0
        h_rows64 = gl.where(h_ok, h_rows, 0).to(gl.int64)
        offs_bin = gl.arange(0, NB, layout=gl.SliceLayout(0, hist_layout))
        row_of_hist: gl.constexpr = gl.SliceLayout(1, hist_layout)
        if SELF_CALIBRATE:
            # The program sets up its own rows (scan_calibration.py: no launch before the scan): threshold
            # -inf, histogram off, counters zeroed; the barrier before phase A's first step orders the
            # zeroing before any thread counts.
            thr_h = gl.full([BLOCK_ROWS], float("-inf"), gl.float32, row_of_hist)
            hist_lo_h = gl.zeros([BLOCK_ROWS], gl.float32, row_of_hist)
            hist_width_h = gl.zeros([BLOCK_ROWS], gl.float32, row_of_hist)
            gl.store(appended_ptr + h_rows64, gl.zeros([BLOCK_ROWS], gl.int32, row_of_hist), mask=h_ok)
            gl.store(
                hist_ptr + h_rows64[:, None] * NB + offs_bin[None, :],
                gl.zeros([BLOCK_ROWS, NB], gl.int32, hist_layout),
                mask=h_ok[:, None],
            )
        else:
            thr_h = gl.load(thr_ptr + h_rows64, mask=h_ok, other=0.0)
            hist_lo_h = gl.load(hist_lo_ptr + h_rows64, mask=h_ok, other=0.0)
            hist_width_h = gl.load(hist_width_ptr + h_rows64, mask=h_ok, other=0.0)
        row_of_flat: gl.constexpr = gl.SliceLayout(0, flat)
        rows_f, ok_f, starts_f, ends_f = _program_rows(
            prog_rows_ptr, starts_ptr, ends_ptr, pid, BLOCK_ROWS, row_of_flat
        )
        rows64_f = rows_f.to(gl.int64)
        if SELF_CALIBRATE:
            hist_lo = gl.zeros([BLOCK_ROWS], gl.float32, row_of_flat)
            hist_width = gl.zeros([BLOCK_ROWS], gl.float32, row_of_flat)
        else:
            hist_lo = gl.load(hist_lo_ptr + rows64_f, mask=ok_f, other=0.0)
            hist_width = gl.load(hist_width_ptr + rows64_f, mask=ok_f, other=0.0)
        offs_fk = gl.arange(0, BLOCK_KEYS, layout=gl.SliceLayout(1, flat))
        hist_inv = gl.where(hist_width > 0, 1.0 / gl.where(hist_width > 0, hist_width, 1.0), 0.0)

    # One phase, or with SELF_CALIBRATE three: phase A over the n_sample tiles that end with the program's
    # earliest window end (the most recent keys every row sees; threshold -inf), the calibration, then
    # the tiles after them (few or none in a causal program) and the tiles before them (scoring.py,
    # _first_sample_tile).
    if SELF_CALIBRATE:
        gl.static_assert(not DENSE, "the self-calibrating variant is a scan")
        n_sample = _sample_tiles(n_steps, sample_tiles, sample_stride, capacity, TOPK, BLOCK_KEYS)
        first_sample = _first_sample_tile(lo, n_steps, n_sample, gl.min(gl.where(row_ok, ends, hi), axis=0), BLOCK_KEYS)
    for phase in gl.static_range(3 if SELF_CALIBRATE else 1):
        if SELF_CALIBRATE:  # (the long phase last: nothing of the phases stays live through it)
            phase_lo, phase_steps = _phase_bounds(phase, lo, n_steps, n_sample, first_sample, BLOCK_KEYS)
            if phase > 0:  # every warp is past the last phase's MMAs before the ring is refilled
                gl.thread_barrier()
        else:
            phase_lo = lo
            phase_steps = n_steps
        offs_k = gl.arange(0, BLOCK_KEYS, layout=gl.SliceLayout(1, ld))
        for s in gl.static_range(NUM_BUFFERS - 1):
            _issue_key_tile(
                s,
                phase_steps,
                phase_lo,
                stride,
                k_base,
                k_lo_ptr,
                hi,
                ring.index(s % NUM_BUFFERS),
                offs_k,
                offs_d,
                BLOCK_KEYS,
                D,
                STRIDED,
            )
        if ANY_WIDE:
            # A wide tile's k_hi takes the ring's other slot (no shared memory of its own: 4 programs
            # still fit an SM), so the next lo tile is copied after the wide tile's MMA instead of at
            # the top of its step. A copy into a slot is issued at the top of a step or after the MMA
            # of the step before, the slot's last reader (the compiler puts a CTA barrier before such
            # a copy: a write after the wgmma's read of the same buffer), and the ring of 2 waits for
            # every copy group at the top of each step. The flags run one step ahead (loaded before
            # the MMA of the step whose copies need them).
            gl.static_assert(NUM_BUFFERS == 2, "the wide tiles' copies are written for a ring of 2 key tiles")
            flags_at = tile_wide_ptr + batch * tile_cols + (0 if STRIDED else phase_lo // BLOCK_KEYS)
            k_wide = _tile_flag(flags_at, 0, phase_steps, STRIDED)
            if k_wide:
                _issue_key_tile(
                    0,
                    phase_steps,
                    phase_lo,
                    stride,
                    k_base,
                    k_hi_ptr,
                    hi,
                    ring.index(1),
                    offs_k,
                    offs_d,
                    BLOCK_KEYS,
                    D,
                    STRIDED,
                )
        gl.thread_barrier()
        fence_async_shared()  # the query operand, written by plain stores, is read by wgmma

        if phase == 0:
            offs_tk = gl.arange(0, BLOCK_KEYS, layout=key_of_tile)
            if DENSE:
                probe = gl.zeros([BLOCK_KEYS, BLOCK_ROWS], gl.float32, tile)
            else:  # the scan's per-key work is in the flat layout, its probe too
                probe = gl.zeros([BLOCK_KEYS, BLOCK_ROWS], gl.float32, flat)
                thr = gl.convert_layout(thr_h, row_of_flat)
                pending_slot = gl.zeros([BLOCK_KEYS, BLOCK_ROWS], gl.int32, flat)
                pending_score = gl.zeros([BLOCK_KEYS, BLOCK_ROWS], gl.float32, flat)
                pending = gl.zeros([BLOCK_KEYS, BLOCK_ROWS], gl.int1, flat)  # nothing pending

        for step in range(phase_steps):
            # The copy of this step's tile is the oldest of NUM_BUFFERS - 1 in flight; every thread's part
            # of it has landed after the wait, every thread's after the barrier. The barrier also orders
            # the previous step's wgmma (waited for by all four warps) before the overwrite issued next.
            async_copy.wait_group(NUM_BUFFERS - 2)
            fence_async_shared()
            if ANY_WIDE:
                if not k_wide:  # (a wide tile's k_hi holds the other slot until its MMA is done)
                    _issue_key_tile(
                        step + 1,
                        phase_steps,
                        phase_lo,
                        stride,
                        k_base,
                        k_lo_ptr,
                        hi,
                        ring.index((step + 1) % 2),
                        offs_k,
                        offs_d,
                        BLOCK_KEYS,
                        D,
                        STRIDED,
                    )
            else:
                _issue_key_tile(
                    step + NUM_BUFFERS - 1,
                    phase_steps,
                    phase_lo,
                    stride,
                    k_base,
                    k_lo_ptr,
                    hi,
                    ring.index((step + NUM_BUFFERS - 1) % NUM_BUFFERS),
                    offs_k,
                    offs_d,
                    BLOCK_KEYS,
                    D,
                    STRIDED,
                )
            gl.thread_barrier()
            # the keys' factors are loaded before the MMA, so that their latency overlaps it
            pos = phase_lo + (step * BLOCK_KEYS + offs_tk) * stride
            if STRIDED:
                kfac = gl.load(kfac_ptr + k_base + pos, mask=pos < hi, other=0.0)
            else:
                kfac = gl.load(kfac_ptr + k_base + pos)
            if ANY_WIDE:
                k_wide_next = _tile_flag(flags_at, step + 1, phase_steps, STRIDED)  # latency: overlaps the MMA below
                if k_wide | q_wide:
                    acc = _wide_int_dots(
                        ring.index(step % 2),
                        ring.index((step + 1) % 2),
                        q_smem,
                        q_hi_smem,
                        q_wide,
                        k_wide,
                        mma,
                        BLOCK_KEYS,
                        N,
                    )
                    # |int_dot| < 2^29: converted once (round to nearest even), then scaled by 2^-149 exactly
                    relu_sub = gl.maximum(acc.to(gl.float32), 0.0) * SUBNORMAL_UNIT
                else:  # a narrow tile of a narrow program: the common case's step, bit for bit the same value
                    relu_sub = _narrow_relu_bits(ring.index(step % NUM_BUFFERS), q_smem, mma, BLOCK_KEYS, N)
                # this step's MMA, the last reader of both slots, has completed
                if k_wide:  # the next phase_lo tile into the slot this tile's k_hi held
                    _issue_key_tile(
                        step + 1,
                        phase_steps,
                        phase_lo,
                        stride,
                        k_base,
                        k_lo_ptr,
                        hi,
                        ring.index((step + 1) % 2),
                        offs_k,
                        offs_d,
                        BLOCK_KEYS,
                        D,
                        STRIDED,
                    )
                if k_wide_next:  # the next tile's k_hi into this tile's phase_lo slot
                    _issue_key_tile(
                        step + 1,
                        phase_steps,
                        phase_lo,
                        stride,
                        k_base,
                        k_hi_ptr,
                        hi,
                        ring.index(step % 2),
                        offs_k,
                        offs_d,
                        BLOCK_KEYS,
                        D,
                        STRIDED,
                    )
                k_wide = k_wide_next
            else:
                relu_sub = _narrow_relu_bits(ring.index(step % NUM_BUFFERS), q_smem, mma, BLOCK_KEYS, N)
            terms = relu_sub * wq[None, :]
            scores = gl.sum(gl.reshape(terms, [BLOCK_KEYS, H, BLOCK_ROWS]), axis=1)
            scores = scores * rowfac[None, :] * kfac[:, None]
            if DENSE:
                in_window = (pos[:, None] >= starts[None, :]) & (pos[:, None] < ends[None, :])
                probe += gl.where(in_window, scores, 0.0) * 0.0
                column = step * BLOCK_KEYS + offs_tk
                gl.store(
                    out_ptr + rows64[None, :] * out_width + column[:, None],
                    gl.where(in_window, scores, float("-inf")),
                    mask=(column < out_width)[:, None] & row_ok[None, :],
                )
            else:
                # One element per thread (the flat layout picks, in each lane, one of the four elements the
                # lane already holds): no replicated atomics, so no shared-memory broadcast of their results.
                scores = gl.convert_layout(scores, flat)
                pos_f = phase_lo + step * BLOCK_KEYS + offs_fk
                in_window = (pos_f[:, None] >= starts_f[None, :]) & (pos_f[:, None] < ends_f[None, :])
                probe += gl.where(in_window, scores, 0.0) * 0.0
                windowed = gl.where(in_window, scores, float("nan"))
                passing = windowed >= thr[None, :]
                one = gl.full([BLOCK_KEYS, BLOCK_ROWS], 1, gl.int32, flat)
                slot = gl.atomic_add(
                    appended_ptr + rows64_f[None, :] + 0 * pos_f[:, None], one, mask=passing, sem="relaxed"
                )
                if DEFER_APPENDS:  # store the previous step's keys: the slot's round trip overlaps a step
                    # (the slot is first read there: no instruction of this step waits for the atomic)
                    _store_keys(buf_ptr, rows64_f, capacity, pending_slot, pending_score, pos_f - BLOCK_KEYS, pending)
                    pending_slot = slot
                    pending_score = windowed
                    pending = passing
                else:
                    _store_keys(buf_ptr, rows64_f, capacity, slot, windowed, pos_f, passing)
                bin_of = ((windowed - hist_lo[None, :]) * hist_inv[None, :]).to(gl.int32)
                bin_of = gl.minimum(gl.maximum(bin_of, 0), NB - 1)
                gl.atomic_add(
                    hist_ptr + rows64_f[None, :] * NB + bin_of,
                    one,
                    mask=passing & (hist_inv[None, :] > 0),
                    sem="relaxed",
                )
                if not (SELF_CALIBRATE and phase == 0):  # (no raise from the sample: the twin's phase A)
                    if ((step + 1) % REFRESH == 0) | (step + 1 == phase_steps):
                        gl.thread_barrier()
                        hist = gl.load(hist_ptr + h_rows64[:, None] * NB + offs_bin[None, :], volatile=True)
                        at_or_above = gl.associative_scan(hist, 1, _add, reverse=True)
                        best_bin = gl.max(gl.where(at_or_above >= TOPK, offs_bin[None, :], -1), axis=1)
                        edge = hist_lo_h + (best_bin - 1).to(gl.float32) * hist_width_h
                        thr_h = gl.where((best_bin >= 1) & (hist_width_h > 0), gl.maximum(thr_h, edge), thr_h)
                        thr = gl.convert_layout(thr_h, row_of_flat)
        async_copy.wait_group(0)
        if not DENSE:
            if DEFER_APPENDS:
                _store_keys(
                    buf_ptr,
                    rows64_f,
                    capacity,
                    pending_slot,
                    pending_score,
                    phase_lo + phase_steps * BLOCK_KEYS + offs_fk - BLOCK_KEYS,
                    pending,
                )
        if SELF_CALIBRATE:
            # Flushed: nothing is pending into the next phase (whose first step stores the pending keys
            # again, at positions it derives from its own tiles).
            pending = gl.zeros([BLOCK_KEYS, BLOCK_ROWS], gl.int1, flat)
            if phase == 0:  # end of phase A: thresholds from the sample (scan_calibration.py)
                thr_h, hist_lo_h, hist_width_h = _calibrate_in_scan_gluon(
                    buf_ptr,
                    appended_ptr,
                    hist_ptr,
                    prog_rows_ptr,
                    pid,
                    capacity,
                    thr_h,
                    hist_lo_h,
                    hist_width_h,
                    _ceiling_rank(n_sample, n_steps, TOPK),
                    TOPK,
                    BLOCK_ROWS,
                    NB,
                    num_warps,
                    gl.SliceLayout(1, hist_layout),
                )
                thr = gl.convert_layout(thr_h, row_of_flat)
                hist_lo = gl.convert_layout(hist_lo_h, row_of_flat)
                hist_width = gl.convert_layout(hist_width_h, row_of_flat)
                hist_inv = gl.where(hist_width > 0, 1.0 / gl.where(hist_width > 0, hist_width, 1.0), 0.0)
    nonfinite = gl.sum(probe, axis=0)
    if DENSE:
        gl.store(nonfinite_ptr + rows, (nonfinite != nonfinite).to(gl.int8), mask=row_ok)
    else:
        gl.store(nonfinite_ptr + rows64_f, (nonfinite != nonfinite).to(gl.int8), mask=ok_f)
        gl.store(thr_out_ptr + h_rows64, thr_h, mask=h_ok)
