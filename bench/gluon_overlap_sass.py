"""Offline experiment (no device): can Gluon (Triton 3.6) keep an int8 wgmma in flight while the
previous step's epilogue runs, i.e. overlap MMA and epilogue inside one warpgroup?

Compiles a reduced scoring loop for sm_90 twice, plain (wait after every MMA) and ping-pong (two
accumulators, the next MMA issued before the previous one is read), prints the wgmma / wait
structure of the loop, and runs ptxas on the PTX to show its serialization diagnostics.
    python bench/gluon_overlap_sass.py
Findings (bench/NOTES.md, session 2): int8 wgmma wants B K-major (an [N, K] shared tile, permuted)
and N <= 224 (256 is refused for int8); the ping-pong compiles, but ptxas serializes every wgmma
(C7514: non-wgmma instructions reading accumulator registers inside the pipeline stage).
"""

from __future__ import annotations

import os
import re
import subprocess

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from sass_offline import BIN, compile_sm90, innermost_mma_loop, resources


@gluon.jit
def overlap_kernel(k_ptr, q_ptr, w_ptr, out_ptr, n_steps, BK: gl.constexpr, N: gl.constexpr, D: gl.constexpr,
                   OVERLAP: gl.constexpr, num_warps: gl.constexpr):
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 32])
    ld: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[4, 1],
                                        order=[1, 0])
    a_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BK, D], gl.int8)
    b_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([N, D], gl.int8)  # K-major (int8 wgmma)
    a_smem = gl.allocate_shared_memory(gl.int8, [2, BK, D], a_sl)
    b_smem = gl.allocate_shared_memory(gl.int8, [N, D], b_sl)
    offs_qn = gl.arange(0, N, layout=gl.SliceLayout(1, ld))
    offs_qd = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    b_smem.store(gl.load(q_ptr + offs_qn[:, None] * D + offs_qd[None, :]))
    b_op = b_smem.permute((1, 0))
    offs_k = gl.arange(0, BK, layout=gl.SliceLayout(1, ld))
    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    w = gl.load(w_ptr + gl.arange(0, N, layout=gl.SliceLayout(0, mma)))
    zero = gl.zeros([BK, N], gl.int32, mma)
    total = gl.zeros([BK], gl.float32, gl.SliceLayout(1, mma))
    a_smem.index(0).store(gl.load(k_ptr + offs_k[:, None] * D + offs_d[None, :]))
    gl.thread_barrier()
    fence_async_shared()
    acc = warpgroup_mma(a_smem.index(0), b_op, zero, use_acc=False, is_async=True)
    if OVERLAP:  # ping-pong: two accumulators that are never copied into each other
        for step in range(1, n_steps - 1, 2):
            a_smem.index(1).store(gl.load(k_ptr + (step * BK + offs_k[:, None]) * D + offs_d[None, :]))
            gl.thread_barrier()
            fence_async_shared()
            other = warpgroup_mma(a_smem.index(1), b_op, zero, use_acc=False, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
            total += gl.sum(gl.maximum(acc, 0).to(gl.float32, bitcast=True) * w[None, :], axis=1)
            a_smem.index(0).store(gl.load(k_ptr + ((step + 1) * BK + offs_k[:, None]) * D + offs_d[None, :]))
            gl.thread_barrier()
            fence_async_shared()
            acc = warpgroup_mma(a_smem.index(0), b_op, zero, use_acc=False, is_async=True)
            other = warpgroup_mma_wait(num_outstanding=1, deps=(other,))
            total += gl.sum(gl.maximum(other, 0).to(gl.float32, bitcast=True) * w[None, :], axis=1)
    else:
        for step in range(1, n_steps):
            tile = gl.load(k_ptr + (step * BK + offs_k[:, None]) * D + offs_d[None, :])
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            total += gl.sum(gl.maximum(acc, 0).to(gl.float32, bitcast=True) * w[None, :], axis=1)
            a_smem.index(0).store(tile)
            gl.thread_barrier()
            fence_async_shared()
            acc = warpgroup_mma(a_smem.index(0), b_op, zero, use_acc=False, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    total += gl.sum(gl.maximum(acc, 0).to(gl.float32, bitcast=True) * w[None, :], axis=1)
    gl.store(out_ptr + gl.arange(0, BK, layout=gl.SliceLayout(1, mma)), total)



def main():
    out = os.environ.get("OUT", "/tmp/litetopk-sass")
    os.makedirs(out, exist_ok=True)
    types = dict(k_ptr="*i8", q_ptr="*i8", w_ptr="*fp32", out_ptr="*fp32", n_steps="i32")
    for overlap in (False, True):
        path = os.path.join(out, f"gluon_overlap{int(overlap)}")
        sass = compile_sm90(overlap_kernel, types, dict(BK=64, N=128, D=128, OVERLAP=overlap, num_warps=4), 4, 1,
                            path, source=GluonASTSource)
        loop = innermost_mma_loop(sass)
        print(f"overlap={overlap}: {resources(path)}; loop {len(loop)} instructions")
        for line in loop:
            if re.search(r"GMMA|DEPBAR|ARRIVE", line):
                print("   ", line)
        ptxas = subprocess.run([os.path.join(BIN, "ptxas"), "-arch=sm_90a", "-v", path + ".ptx", "-o", os.devnull],
                               capture_output=True, text=True)
        for line in (ptxas.stdout + ptxas.stderr).splitlines():
            if "C75" in line:
                print("    ptxas:", line.split(":", 1)[1].strip())


if __name__ == "__main__":
    main()
