"""Next step 2 of bench/NOTES.md, session 5: the Gluon scoring kernel with its wgmma split in two N = 64
halves (heads 0-31 and 32-63), so one half's MMA runs during the other half's epilogue inside a CTA.
A prototype of the dense, non-strided, non-wide variant only; not used by the backend.

Per key step s:
1. A(s) and B(s) issued back to back.
2. Wait for A(s). A's in-thread head sum runs while B(s) is in flight and is parked in shared memory.
3. Wait for B(s). B's head sum, plus A's loaded back; the lanes' sum; the dense epilogue. (A ring of 3 key
tiles, so the copy of tile s + 2 never lands in a slot a wgmma still reads.) The accumulators are still
64 registers. The head sum's float order differs from score_fp4_gluon_kernel's: each thread folds 8 + 8
heads, then adds the two. So the scores agree to float32 rounding, not bit for bit. A landed version
would move the Triton twin to the same order.

Offline findings (session 5; no device time was left to time it). Every version: 128 registers, nothing
spilled.
- First version, A(s + 1) issued during B(s)'s epilogue, so a wgmma is pending across the loop's back
  edge. ptxas serialized every wgmma (C7514: "non wgmma instructions reading accumulator registers of a
  wgmma between start and end of the pipeline stage").
- Both halves issued and waited within a step (wait 1, then wait 0): ptxas accepts it, one DEPBAR.LE 1
  and one DEPBAR.LE 0. But it schedules all except ~23 of A's 64 head-sum instructions after the second
  wait. A CTA barrier before that wait, or the head sum as the wait's dependency, did not change it.
- This version stores A's partial sums to shared memory before the second wait and loads them back
  after. That pins the order: 69 instructions between the two waits (A's whole head sum). The cost is
  2 STS.64, 2 LDS.64 and one CTA barrier per step, and a loop of 312 instructions vs 257 for the
  backend's kernel.
- A further risk: m64n64k32 reads 128 B of shared memory per tensor cycle, the SM's limit.

    python3 -m bench.probes.gluon_split_probe          # offline: sm_90 registers, spills, the loop's opcodes
    source bench/device/gpu_env.sh && OUT=/tmp python3 -m bench.probes.gluon_split_probe   # H200: also checks and times
                                                                             # against the backend's kernel
"""

from __future__ import annotations

import json
import os
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from litetopk.kernels.triton.scoring_gluon import _issue_key_tile, _program_rows, _stage_query_operand

HALF = gl.constexpr(64)  # MMA columns per half: 32 heads x 2 rows
SPLIT_BUFFERS = 3


@gluon.jit
def _half_partial(acc, wq_half, BLOCK_KEYS: gl.constexpr, BLOCK_ROWS: gl.constexpr):
    """In-thread head sum of one half: [BLOCK_KEYS, 4 lanes, BLOCK_ROWS] (column n = 8 j + 2 l + r)."""
    terms = gl.maximum(acc, 0).to(gl.float32, bitcast=True) * wq_half[None, :]
    return gl.sum(gl.reshape(terms, [BLOCK_KEYS, HALF // 8, 4, BLOCK_ROWS]), axis=1)


@gluon.jit
def score_split_dense_kernel(
    k_lo_ptr,
    kfac_ptr,
    q_lo_ptr,
    wq_ptr,
    rowfac_ptr,
    prog_rows_ptr,
    prog_batch_ptr,
    starts_ptr,
    ends_ptr,
    s_pad,
    out_ptr,
    out_width,
    max_pos,
    nonfinite_ptr,
    BLOCK_KEYS: gl.constexpr,
    BLOCK_ROWS: gl.constexpr,
    H: gl.constexpr,
    D: gl.constexpr,
    NUM_BUFFERS: gl.constexpr,
    num_warps: gl.constexpr,
):
    N: gl.constexpr = BLOCK_ROWS * H
    mma: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, HALF, 32]
    )
    ld: gl.constexpr = gl.BlockedLayout(
        size_per_thread=[1, 16], threads_per_warp=[4, 8], warps_per_cta=[num_warps, 1], order=[1, 0]
    )
    partial: gl.constexpr = gl.sum(
        gl.reshape(gl.zeros([BLOCK_KEYS, HALF], gl.float32, mma), [BLOCK_KEYS, HALF // 8, 4, BLOCK_ROWS]), axis=1
    ).type.layout
    tile: gl.constexpr = gl.sum(gl.zeros([BLOCK_KEYS, 4, BLOCK_ROWS], gl.float32, partial), axis=1).type.layout
    key_of_tile: gl.constexpr = gl.SliceLayout(1, tile)
    row_of_tile: gl.constexpr = gl.SliceLayout(0, tile)
    pid = gl.program_id(0)
    ring = gl.allocate_shared_memory(
        gl.int8, [NUM_BUFFERS, BLOCK_KEYS, D], gl.NVMMASharedLayout.get_default_for([BLOCK_KEYS, D], gl.int8)
    )
    q_smem = gl.allocate_shared_memory(gl.int8, [N, D], gl.NVMMASharedLayout.get_default_for([N, D], gl.int8))

    rows, row_ok, starts, ends = _program_rows(prog_rows_ptr, starts_ptr, ends_ptr, pid, BLOCK_ROWS, row_of_tile)
    rowfac = gl.load(rowfac_ptr + rows, mask=row_ok, other=0.0)
    k_base = gl.load(prog_batch_ptr + pid).to(gl.int64) * s_pad

    offs_d = gl.arange(0, D, layout=gl.SliceLayout(0, ld))
    _stage_query_operand(q_lo_ptr, prog_rows_ptr, pid, q_smem, offs_d, N, BLOCK_ROWS, H, D, ld)
    q_a = q_smem.slice(0, HALF).permute((1, 0))
    q_b = q_smem.slice(HALF, HALF).permute((1, 0))
    offs_n = gl.arange(0, HALF, layout=gl.SliceLayout(0, mma))
    n_rows = gl.load(prog_rows_ptr + pid * BLOCK_ROWS + offs_n % BLOCK_ROWS)
    w_base = gl.where(n_rows >= 0, n_rows, 0).to(gl.int64) * H + offs_n // BLOCK_ROWS
    wq_a = gl.load(wq_ptr + w_base, mask=n_rows >= 0, other=0.0)
    wq_b = gl.load(wq_ptr + w_base + HALF // BLOCK_ROWS, mask=n_rows >= 0, other=0.0)

    lo = 0
    n_steps = gl.cdiv(out_width, BLOCK_KEYS)
    offs_k = gl.arange(0, BLOCK_KEYS, layout=gl.SliceLayout(1, ld))
    for s in gl.static_range(NUM_BUFFERS - 1):
        _issue_key_tile(
            s, n_steps, lo, 1, k_base, k_lo_ptr, max_pos, ring, offs_k, offs_d, BLOCK_KEYS, D, False, NUM_BUFFERS
        )
    async_copy.wait_group(NUM_BUFFERS - 2)
    fence_async_shared()
    gl.thread_barrier()
    zeros = gl.zeros([BLOCK_KEYS, HALF], gl.int32, mma)
    part_smem = gl.allocate_shared_memory(
        gl.float32, [BLOCK_KEYS, 4, BLOCK_ROWS], gl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0])
    )
    offs_tk = gl.arange(0, BLOCK_KEYS, layout=key_of_tile)
    probe = gl.zeros([BLOCK_KEYS, BLOCK_ROWS], gl.float32, tile)
    for step in range(n_steps):
        if step > 0:  # tile `step` has landed for every thread (its copy was issued one step earlier)
            async_copy.wait_group(NUM_BUFFERS - 3)
            fence_async_shared()
            gl.thread_barrier()
        acc_a = warpgroup_mma(ring.index(step % NUM_BUFFERS), q_a, zeros, use_acc=False, is_async=True)
        acc_b = warpgroup_mma(ring.index(step % NUM_BUFFERS), q_b, zeros, use_acc=False, is_async=True)
        # The copy of tile step + NUM_BUFFERS - 1 reuses the slot of tile step - 1, whose wgmmas completed.
        _issue_key_tile(
            step + NUM_BUFFERS - 1,
            n_steps,
            lo,
            1,
            k_base,
            k_lo_ptr,
            max_pos,
            ring,
            offs_k,
            offs_d,
            BLOCK_KEYS,
            D,
            False,
            NUM_BUFFERS,
        )
        acc_a = warpgroup_mma_wait(num_outstanding=1, deps=(acc_a,))
        part_smem.store(_half_partial(acc_a, wq_a, BLOCK_KEYS, BLOCK_ROWS))  # while B runs
        acc_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_b,))
        part = part_smem.load(partial) + _half_partial(acc_b, wq_b, BLOCK_KEYS, BLOCK_ROWS)
        scores = gl.convert_layout(gl.sum(part, axis=1), tile)
        pos = lo + step * BLOCK_KEYS + offs_tk
        scores = scores * rowfac[None, :] * gl.load(kfac_ptr + k_base + pos)[:, None]
        in_window = (pos[:, None] >= starts[None, :]) & (pos[:, None] < ends[None, :])
        probe += gl.where(in_window, scores, 0.0) * 0.0
        gl.store(
            out_ptr + rows.to(gl.int64)[None, :] * out_width + pos[:, None],
            gl.where(in_window, scores, float("-inf")),
            mask=(pos < out_width)[:, None] & row_ok[None, :],
        )
    async_copy.wait_group(0)
    nonfinite = gl.sum(probe, axis=0)
    gl.store(nonfinite_ptr + rows, (nonfinite != nonfinite).to(gl.int8), mask=row_ok)


TYPES = dict(
    k_lo_ptr="*i8",
    kfac_ptr="*fp32",
    q_lo_ptr="*i8",
    wq_ptr="*fp32",
    rowfac_ptr="*fp32",
    prog_rows_ptr="*i32",
    prog_batch_ptr="*i32",
    starts_ptr="*i32",
    ends_ptr="*i32",
    s_pad="i32",
    out_ptr="*fp32",
    out_width="i32",
    max_pos="i32",
    nonfinite_ptr="*i8",
)
CONSTANTS = dict(BLOCK_KEYS=64, BLOCK_ROWS=2, H=64, D=128, NUM_BUFFERS=SPLIT_BUFFERS)
OPTIONS = dict(num_warps=4, maxnreg=128)


def offline(out_dir: str) -> dict:
    """Compile for sm_90 here (no GPU): resources and the innermost wgmma loop's opcode mix."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from litetopk.kernels.compile import sm90

    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "split_dense")
    sass = sm90.compile_sm90(score_split_dense_kernel, TYPES, CONSTANTS, OPTIONS, path, source=GluonASTSource)
    loop = sm90.innermost_mma_loop(sass)
    return dict(
        sm90.resource_usage(path), loop_instructions=len(loop), loop_opcodes=dict(sm90.opcode_mix(loop).most_common(16))
    )


def on_device(out_dir: str) -> dict:
    """On the H200: scores against the backend's dense scores (float32 rounding), then times both."""
    from bench.common.problems import call_args, prefill_problem
    from bench.common.timing import cuda_ms
    from litetopk.kernels.triton import TritonBackend
    from litetopk.kernels.validation import validate_prefill

    args, kw = call_args(prefill_problem(8192, 262144, 512, seed=7))
    problem = validate_prefill(*args, **kw)
    backend = TritonBackend(scoring_kernel="gluon")
    ops = backend.operands(problem)
    rows_, batch_ = ops.schedule.rows, ops.schedule.batch

    def split():
        width = problem.max_end
        out = torch.empty(problem.num_rows, width, dtype=torch.float32, device="cuda")
        nonfinite = torch.zeros(problem.num_rows, dtype=torch.int8, device="cuda")
        score_split_dense_kernel[(rows_.shape[0],)](
            ops.keys.k_lo,
            ops.keys.kfac,
            ops.q_lo,
            ops.wq,
            ops.rowfac,
            rows_,
            batch_,
            problem.starts,
            problem.ends,
            ops.keys.s_pad,
            out,
            width,
            problem.max_end,
            nonfinite,
            **CONSTANTS,
            **OPTIONS,
        )
        return out

    want, _ = backend.score_dense(problem)
    got = split()
    live = torch.isfinite(want)
    report = {
        "same_window": bool(torch.equal(live, torch.isfinite(got))),
        "max_rel_diff": float(((got - want).abs()[live] / want.abs()[live].clamp_min(1e-30)).max()),
        "split_ms": [],
        "gluon_ms": [],
    }
    for _ in range(3):
        report["split_ms"].append(cuda_ms(split))
        report["gluon_ms"].append(cuda_ms(lambda: backend.score_dense(problem)))
    return report


if __name__ == "__main__":
    out = os.environ.get("OUT", "/tmp/litetopk-split")
    report = {"offline": offline(out)}
    print("offline", report["offline"], flush=True)
    if torch.cuda.is_available() and len(sys.argv) == 1:
        report["device"] = on_device(out)
        print("device", report["device"], flush=True)
    with open(os.path.join(out, "gluon-split-probe.json"), "w") as f:
        json.dump(report, f, indent=1)
