"""Offline experiment (no device): does a warp-specialized int8 wgmma loop compile for sm_90 with
Gluon (Triton 3.6), and does it drop the per-step CTA barriers that Nsight Compute blamed for a
third of the scoring kernels' stalls (bench/NOTES.md, session 3)?

A reduced scoring loop (the epilogue of scoring.py: relu(int32) bits as float32 x head weight, summed
over the 256 (head, row) columns into one number per key) in two forms:
- plain: one warpgroup loads each key tile into shared memory, syncs (bar.sync), runs the wgmma;
- ws: a 1-warp producer partition fills a STAGES-deep shared ring and signals an mbarrier per
  stage; the 4-warp consumer waits on the mbarrier, runs the wgmma and the epilogue, and frees the
  stage with another mbarrier; no CTA-wide barrier in the steady state.
    python bench/gluon_ws_sass.py      # prints registers and the barrier / wgmma structure of each loop
"""

from __future__ import annotations

import collections
import os

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait

from sass_offline import compile_sm90, resources

BK, N, D = 64, 128, 128  # keys per step, (head, row) columns (int8 wgmma allows N <= 224), head dim


@gluon.jit
def _epilogue(acc, w, total):
    return total + gl.sum(gl.maximum(acc, 0).to(gl.float32, bitcast=True) * w[None, :], axis=1)


@gluon.jit
def _consumer(a_smem, b_op, ready, empty, w_ptr, out_ptr, n_steps, BK: gl.constexpr, N: gl.constexpr,
              STAGES: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 32])
    w = gl.load(w_ptr + gl.arange(0, N, layout=gl.SliceLayout(0, mma)))
    zero = gl.zeros([BK, N], gl.int32, mma)
    total = gl.zeros([BK], gl.float32, gl.SliceLayout(1, mma))
    for step in range(n_steps):
        stage = step % STAGES
        mbarrier.wait(ready.index(stage), (step // STAGES) & 1)
        acc = warpgroup_mma(a_smem.index(stage), b_op, zero, use_acc=False, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        mbarrier.arrive(empty.index(stage))
        total = _epilogue(acc, w, total)
    gl.store(out_ptr + gl.arange(0, BK, layout=gl.SliceLayout(1, mma)), total)


@gluon.jit
def _producer(k_ptr, a_smem, ready, empty, n_steps, BK: gl.constexpr, D: gl.constexpr, STAGES: gl.constexpr):
    ld: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[1, 1],
                                        order=[1, 0])
    offs_k = gl.arange(0, BK, layout=gl.SliceLayout(1, ld))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    for step in range(n_steps):
        stage = step % STAGES
        mbarrier.wait(empty.index(stage), ((step // STAGES) & 1) ^ 1)  # a fresh stage counts as freed
        a_smem.index(stage).store(gl.load(k_ptr + (step * BK + offs_k[:, None]) * D + offs_d[None, :]))
        fence_async_shared()
        mbarrier.arrive(ready.index(stage))


@gluon.jit
def ws_kernel(k_ptr, q_ptr, w_ptr, out_ptr, n_steps, BK: gl.constexpr, N: gl.constexpr, D: gl.constexpr,
              STAGES: gl.constexpr, num_warps: gl.constexpr):
    ld: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[4, 1],
                                        order=[1, 0])
    a_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BK, D], gl.int8)
    b_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([N, D], gl.int8)  # K-major (int8 wgmma)
    a_smem = gl.allocate_shared_memory(gl.int8, [STAGES, BK, D], a_sl)
    b_smem = gl.allocate_shared_memory(gl.int8, [N, D], b_sl)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=1)
    offs_qn = gl.arange(0, N, layout=gl.SliceLayout(1, ld))
    offs_qd = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    b_smem.store(gl.load(q_ptr + offs_qn[:, None] * D + offs_qd[None, :]))
    fence_async_shared()
    gl.thread_barrier()
    gl.warp_specialize([(_consumer, (a_smem, b_smem.permute((1, 0)), ready, empty, w_ptr, out_ptr, n_steps, BK, N,
                                     STAGES)),
                        (_producer, (k_ptr, a_smem, ready, empty, n_steps, BK, D, STAGES))],
                       [1], [48])


@gluon.jit
def plain_kernel(k_ptr, q_ptr, w_ptr, out_ptr, n_steps, BK: gl.constexpr, N: gl.constexpr, D: gl.constexpr,
                 STAGES: gl.constexpr, num_warps: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 32])
    ld: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[4, 1],
                                        order=[1, 0])
    a_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BK, D], gl.int8)
    b_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([N, D], gl.int8)
    a_smem = gl.allocate_shared_memory(gl.int8, [BK, D], a_sl)
    b_smem = gl.allocate_shared_memory(gl.int8, [N, D], b_sl)
    offs_qn = gl.arange(0, N, layout=gl.SliceLayout(1, ld))
    offs_qd = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    b_smem.store(gl.load(q_ptr + offs_qn[:, None] * D + offs_qd[None, :]))
    offs_k = gl.arange(0, BK, layout=gl.SliceLayout(1, ld))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    w = gl.load(w_ptr + gl.arange(0, N, layout=gl.SliceLayout(0, mma)))
    zero = gl.zeros([BK, N], gl.int32, mma)
    total = gl.zeros([BK], gl.float32, gl.SliceLayout(1, mma))
    for step in range(n_steps):
        tile = gl.load(k_ptr + (step * BK + offs_k[:, None]) * D + offs_d[None, :])
        gl.thread_barrier()
        a_smem.store(tile)
        fence_async_shared()
        gl.thread_barrier()
        acc = warpgroup_mma(a_smem, b_smem.permute((1, 0)), zero, use_acc=False, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        total = _epilogue(acc, w, total)
    gl.store(out_ptr + gl.arange(0, BK, layout=gl.SliceLayout(1, mma)), total)


def loop_structure(sass: str) -> str:
    ops = collections.Counter()
    for line in sass.splitlines():
        for op in ("BAR.SYNC", "BAR.ARV", "SYNCS", "WARPGROUP.DEPBAR", "HGMMA", "IGMMA", "WARPSYNC", "USETMAXREG"):
            if op in line:
                ops[op] += 1
    return ", ".join(f"{k} {v}" for k, v in sorted(ops.items()))


def main():
    out = os.environ.get("OUT", "/tmp/litetopk-sass")
    os.makedirs(out, exist_ok=True)
    types = dict(k_ptr="*i8", q_ptr="*i8", w_ptr="*fp32", out_ptr="*fp32", n_steps="i32")
    for name, kernel in (("plain", plain_kernel), ("ws", ws_kernel)):
        path = os.path.join(out, f"gluon_{name}")
        try:
            sass = compile_sm90(kernel, types, dict(BK=BK, N=N, D=D, STAGES=3, num_warps=4), 4, 1, path,
                                source=GluonASTSource)
        except Exception as exc:  # the finding is the error
            print(f"{name}: does not compile: {str(exc).splitlines()[-1][:300]}")
            continue
        print(f"{name}: {resources(path)}; whole kernel: {loop_structure(sass)}")


if __name__ == "__main__":
    main()
