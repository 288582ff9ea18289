"""Offline experiment (no device): the dense scoring loop of kernels/triton/scoring.py written in Gluon
with BLOCK_ROWS = 2 (N = 128 (head, row) columns), shaped like the loop of bench/gluon_ws_sass.py that
reached 1,169 int8 TOP/s at 122 registers on the H200 (bench/NOTES.md, session 3). It adds what that
loop lacked: the head sum per (key, row), the row and key power-of-two factors, the window mask and
the store of the [64 keys, 2 rows] score tile, all in the layouts the MMA and the reduction give
(no conversion); and the scan (threshold test, slot atomics, key stores, histogram, raise) likewise.
Prints registers (the goal: <= 128, so 4 CTAs fit an SM) and each loop's mix.
Not run, not checked for exactness: a starting point for the Gluon scoring kernel (next step 0).
    python bench/gluon_scoring_sass.py
"""

from __future__ import annotations

import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from sass_offline import compile_sm90, innermost_mma_loop, opcode_mix, resources

BK, BR, H, D = 64, 2, 64, 128


@gluon.jit
def _add(a, b):
    return a + b


LD = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[4, 1],
                                   order=[1, 0]))  # global loads of [*, 128] int8 tiles


@gluon.jit
def _stage_queries(q_ptr, wq_ptr, b_smem, pid, MMA: gl.constexpr, BR: gl.constexpr, H: gl.constexpr,
                   D: gl.constexpr):
    """The query operand into b_smem (column n = (head n // BR, row n % BR) of rows pid * BR + (0, 1),
    K-major) and the scaled head weights of those columns, in the MMA's column layout."""
    N: gl.constexpr = BR * H
    offs_qn = gl.arange(0, N, layout=gl.SliceLayout(1, LD))
    offs_qd = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
    q_vec = (pid * BR + offs_qn % BR).to(gl.int64) * H + offs_qn // BR
    b_smem.store(gl.load(q_ptr + q_vec[:, None] * D + offs_qd[None, :]))
    offs_n = gl.arange(0, N, layout=gl.SliceLayout(0, MMA))
    return gl.load(wq_ptr + (pid * BR + offs_n % BR).to(gl.int64) * H + offs_n // BR)


@gluon.jit
def _score_step(step, pid, k_ptr, kfac_ptr, rowfac_ptr, starts_ptr, ends_ptr, a_smem, b_smem, wq, MMA: gl.constexpr,
                BK: gl.constexpr, BR: gl.constexpr, H: gl.constexpr, D: gl.constexpr):
    """(positions, rows, float32 scores [BK keys, BR rows], in-window mask) of key step `step`, in
    the layout the head sum gives (scoring.py's _score_tile)."""
    N: gl.constexpr = BR * H
    offs_k = gl.arange(0, BK, layout=gl.SliceLayout(1, LD))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, LD))
    tile = gl.load(k_ptr + (step * BK + offs_k[:, None]).to(gl.int64) * D + offs_d[None, :])
    gl.thread_barrier()
    a_smem.store(tile)
    fence_async_shared()
    gl.thread_barrier()
    acc = warpgroup_mma(a_smem, b_smem.permute((1, 0)), gl.zeros([BK, N], gl.int32, MMA), use_acc=False,
                        is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    terms = gl.maximum(acc, 0).to(gl.float32, bitcast=True) * wq[None, :]
    scores = gl.sum(gl.reshape(terms, [BK, H, BR]), axis=1)
    tile_layout: gl.constexpr = scores.type.layout
    pos = step * BK + gl.arange(0, BK, layout=gl.SliceLayout(1, tile_layout))
    rows = pid * BR + gl.arange(0, BR, layout=gl.SliceLayout(0, tile_layout))
    scores = scores * gl.load(rowfac_ptr + rows)[None, :] * gl.load(kfac_ptr + pos)[:, None]
    in_window = (pos[:, None] >= gl.load(starts_ptr + rows)[None, :]) & (pos[:, None] < gl.load(ends_ptr + rows)[None, :])
    return pos, rows, scores, in_window


@gluon.jit
def dense_scoring_kernel(k_ptr, kfac_ptr, q_ptr, wq_ptr, rowfac_ptr, starts_ptr, ends_ptr, out_ptr, out_width,
                         n_steps, BK: gl.constexpr, BR: gl.constexpr, H: gl.constexpr, D: gl.constexpr,
                         num_warps: gl.constexpr):
    pid = gl.program_id(0)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BR * H, 32])
    a_smem = gl.allocate_shared_memory(gl.int8, [BK, D], gl.NVMMASharedLayout.get_default_for([BK, D], gl.int8))
    b_smem = gl.allocate_shared_memory(gl.int8, [BR * H, D], gl.NVMMASharedLayout.get_default_for([BR * H, D], gl.int8))
    wq = _stage_queries(q_ptr, wq_ptr, b_smem, pid, mma, BR, H, D)
    for step in range(n_steps):
        pos, rows, scores, in_window = _score_step(step, pid, k_ptr, kfac_ptr, rowfac_ptr, starts_ptr, ends_ptr,
                                                   a_smem, b_smem, wq, mma, BK, BR, H, D)
        gl.store(out_ptr + rows.to(gl.int64)[None, :] * out_width + pos[:, None],
                 gl.where(in_window, scores, float("-inf")))


@gluon.jit
def scan_scoring_kernel(k_ptr, kfac_ptr, q_ptr, wq_ptr, rowfac_ptr, starts_ptr, ends_ptr, thr_ptr, hist_lo_ptr,
                        hist_inv_ptr, hist_ptr, buf_ptr, capacity, appended_ptr, n_steps, BK: gl.constexpr,
                        BR: gl.constexpr, H: gl.constexpr, D: gl.constexpr, TOPK: gl.constexpr, NB: gl.constexpr,
                        REFRESH: gl.constexpr, num_warps: gl.constexpr):
    """The scan of scoring.py (threshold test, one relaxed atomic per passing key for its slot, the key
    stored at buf[row, slot], a histogram atomic, the raise every REFRESH steps), every per-step
    operation in the layout the reduction gives."""
    N: gl.constexpr = BR * H
    pid = gl.program_id(0)
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 32])
    hist_layout: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[1, 32],
                                                 warps_per_cta=[4, 1], order=[1, 0])
    a_smem = gl.allocate_shared_memory(gl.int8, [BK, D], gl.NVMMASharedLayout.get_default_for([BK, D], gl.int8))
    b_smem = gl.allocate_shared_memory(gl.int8, [N, D], gl.NVMMASharedLayout.get_default_for([N, D], gl.int8))
    wq = _stage_queries(q_ptr, wq_ptr, b_smem, pid, mma, BR, H, D)
    hist_rows = pid * BR + gl.arange(0, BR, layout=gl.SliceLayout(1, hist_layout))
    offs_bin = gl.arange(0, NB, layout=gl.SliceLayout(0, hist_layout))
    thr_h = gl.load(thr_ptr + hist_rows)
    # The layout the head sum gives (a dummy reduction, removed by the compiler), for the threshold.
    tile_layout: gl.constexpr = gl.sum(gl.reshape(gl.zeros([BK, N], gl.float32, mma), [BK, H, BR]),
                                       axis=1).type.layout
    for chunk in range(0, n_steps, REFRESH):
        thr = gl.convert_layout(thr_h, gl.SliceLayout(0, tile_layout))  # once per REFRESH steps
        for step in range(chunk, gl.minimum(chunk + REFRESH, n_steps)):
            pos, rows, scores, in_window = _score_step(step, pid, k_ptr, kfac_ptr, rowfac_ptr, starts_ptr, ends_ptr,
                                                       a_smem, b_smem, wq, mma, BK, BR, H, D)
            passing = in_window & (scores >= thr[None, :])
            rows64 = rows.to(gl.int64)
            one = gl.full([BK, BR], 1, gl.int32, tile_layout)
            slot = gl.atomic_add(appended_ptr + rows64[None, :] + 0 * pos[:, None], one, mask=passing, sem="relaxed")
            bits = scores.to(gl.int32, bitcast=True)
            bits = gl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(gl.int64)
            keys = (bits << 32) + (4294967295 - pos.to(gl.int64)[:, None])
            gl.store(buf_ptr + rows64[None, :] * capacity + slot, keys, mask=passing & (slot < capacity))
            bin_of = ((scores - gl.load(hist_lo_ptr + rows)[None, :]) * gl.load(hist_inv_ptr + rows)[None, :]).to(gl.int32)
            bin_of = gl.minimum(gl.maximum(bin_of, 0), NB - 1)
            gl.atomic_add(hist_ptr + rows64[None, :] * NB + bin_of, one, mask=passing, sem="relaxed")
        gl.thread_barrier()
        hist = gl.load(hist_ptr + hist_rows.to(gl.int64)[:, None] * NB + offs_bin[None, :], volatile=True)
        at_or_above = gl.associative_scan(hist, 1, _add, reverse=True)
        best_bin = gl.max(gl.where(at_or_above >= TOPK, offs_bin[None, :], -1), axis=1)
        edge = gl.load(hist_lo_ptr + hist_rows) + (best_bin - 1).to(gl.float32) / gl.load(hist_inv_ptr + hist_rows)
        thr_h = gl.where(best_bin >= 1, gl.maximum(thr_h, edge), thr_h)


def main():
    out = os.environ.get("OUT", "/tmp/litetopk-sass")
    os.makedirs(out, exist_ok=True)
    types = dict(k_ptr="*i8", kfac_ptr="*fp32", q_ptr="*i8", wq_ptr="*fp32", rowfac_ptr="*fp32", starts_ptr="*i32",
                 ends_ptr="*i32", out_ptr="*fp32", out_width="i32", n_steps="i32")
    path = os.path.join(out, "gluon_dense_scoring")
    sass = compile_sm90(dense_scoring_kernel, types, dict(BK=BK, BR=BR, H=H, D=D, num_warps=4), 4, 1, path,
                        source=GluonASTSource)
    loop = innermost_mma_loop(sass)
    mix = opcode_mix(loop)
    print(f"gluon dense scoring (BLOCK_ROWS {BR}): {resources(path)}; loop {len(loop)} instructions per warp and "
          f"step, {mix['BAR']} BAR; {dict(mix.most_common(12))}")
    types = dict(k_ptr="*i8", kfac_ptr="*fp32", q_ptr="*i8", wq_ptr="*fp32", rowfac_ptr="*fp32", starts_ptr="*i32",
                 ends_ptr="*i32", thr_ptr="*fp32", hist_lo_ptr="*fp32", hist_inv_ptr="*fp32", hist_ptr="*i32",
                 buf_ptr="*i64", capacity="i32", appended_ptr="*i32", n_steps="i32")
    path = os.path.join(out, "gluon_scan_scoring")
    sass = compile_sm90(scan_scoring_kernel, types, dict(BK=BK, BR=BR, H=H, D=D, TOPK=512, NB=32, REFRESH=16,
                                                         num_warps=4), 4, 1, path, source=GluonASTSource)
    loop = innermost_mma_loop(sass)
    mix = opcode_mix(loop)
    print(f"gluon scan scoring (BLOCK_ROWS {BR}): {resources(path)}; loop {len(loop)} instructions per warp and "
          f"step, {mix['BAR']} BAR; {dict(mix.most_common(12))}")


if __name__ == "__main__":
    main()
