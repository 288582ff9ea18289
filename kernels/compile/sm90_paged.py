"""Compile the paged mode's scoring kernels (triton/paged_scoring.py and its Gluon twin) for sm_90 without
a GPU, as triton/paged.py launches them, and read back what ptxas made of them: CI runs the Triton kernel
under the interpreter only (with the tl twin of its PTX decode), and the Gluon kernel has no interpreter.

Layer: public face (compile/, an offline tool; imports triton/'s kernels).

    python -m litetopk.kernels.compile.sm90_paged OUT_DIR
writes OUT_DIR/<kernel>_<variant>.{cubin,ptx,ttgir,sass} (kernel: triton, gluon, as launched; a variant under
measurement, GLUON_PAGED_OPTIONS, gets a build of its own while it lasts) and
OUT_DIR/summary.json: per build its registers, stack, shared memory, the opcode counts of its innermost wgmma
loop, the loop's writes to the A operand of an MMA in flight (sm90.operand_writes_in_flight: none allowed) and
its MMAs of a register A operand, and its saturating float adds (the relu).
The page strides are declared multiples of 16, as the launches of a cache in words specialize them
(paged.cache_in_words).
"""

from __future__ import annotations

import json
import os
import sys

import torch
from triton.compiler import ASTSource

from ..cache_layout import describe_kv_cache
from ..triton.paged import paged_launch_options
from ..triton.paged_scoring import score_fp4_paged_kernel
from ..triton.paged_scoring_gluon import (
    GLUON_PAGED_MAX_REGISTERS,
    GLUON_PAGED_WARPS,
    gluon_paged_options,
    score_fp4_paged_gluon_kernel,
)
from .sm90 import (
    compile_sm90,
    innermost_mma_loop,
    mma_loops,
    opcode_mix,
    operand_writes_in_flight,
    register_operand_mmas,
    resource_usage,
)

#: Argument types of both paged kernels (the same signature).
PAGED_TYPES = dict(
    values_ptr="*u8",
    scales_ptr="*u8",
    value_page_stride="i64",
    scale_page_stride="i64",
    num_pages="i32",
    block_table_ptr="*i32",
    bt_stride="i32",
    rtb_ptr="*i32",
    q_lo_ptr="*i8",
    q_hi_ptr="*i8",
    wq_ptr="*fp32",
    rowfac_ptr="*fp32",
    q_wide_ptr="*i8",
    query_row_ptr="*i64",
    groups_ptr="*i32",
    group_row_ptr="*i32",
    group_count_ptr="*i32",
    group_span_ptr="*i32",
    tile_offset_ptr="*i32",
    starts_ptr="*i32",
    ends_ptr="*i32",
    out_ptr="*fp32",
    out_width="i32",
    position_stride="i32",
    thr_keys_ptr="*i64",
    ceil_keys_ptr="*i64",
    hist_ptr="*i32",
    buf_ptr="*i64",
    capacity="i32",
    appended_ptr="*i32",
    raised_ptr="*fp32",
    nonfinite_ptr="*i8",
    unsupported_ptr="*i8",
    num_programs="i32",
)
#: variant -> paged_launch_options' mode arguments (the launches of a call: the sample, the scan, the dense
#: path; one row a group and two)
PAGED_VARIANTS = {
    f"{mode}{rows}": dict(block_rows=rows, dense=mode != "scan", strided=mode == "strided", has_ceilings=mode == "scan")
    for mode in ("scan", "dense", "strided")
    for rows in (1, 2)
}


def _source(base):
    """An AST source that declares the page strides multiples of 16 (besides the pointers)."""

    def source(kernel, signature, constants, attrs):
        for name in ("value_page_stride", "scale_page_stride"):
            attrs[(kernel.arg_names.index(name),)] = [["tt.divisibility", 16]]
        return base(kernel, signature, constants, attrs)

    return source


def compile_paged_scoring(out_dir: str, topk: int = 512) -> dict[str, dict]:
    """Compile every variant of both paged kernels with the launcher's options; return (and write to
    out_dir/summary.json) each build's resources and its innermost wgmma loop's opcode counts."""
    from triton.experimental.gluon._runtime import GluonASTSource

    os.makedirs(out_dir, exist_ok=True)
    cache = describe_kv_cache(torch.zeros(1, 4352, dtype=torch.uint8), None)
    summary = {}
    for variant, mode in PAGED_VARIANTS.items():
        constants = paged_launch_options(cache, topk=topk, use_asm=True, **mode)
        gluon_constants = dict(constants, **gluon_paged_options(mode["strided"]), num_warps=GLUON_PAGED_WARPS)
        gluon_options = dict(num_warps=GLUON_PAGED_WARPS, maxnreg=GLUON_PAGED_MAX_REGISTERS[mode["block_rows"]])
        builds = {
            "triton": (score_fp4_paged_kernel, constants, dict(num_warps=4), ASTSource),
            "gluon": (score_fp4_paged_gluon_kernel, gluon_constants, gluon_options, GluonASTSource),
        }
        for kernel_name, (kernel, kernel_constants, options, base) in builds.items():
            name = f"{kernel_name}_{variant}"
            path = os.path.join(out_dir, name)
            sass = compile_sm90(kernel, PAGED_TYPES, kernel_constants, options, path, source=_source(base))
            loop = innermost_mma_loop(sass)
            summary[name] = dict(
                resource_usage(path),
                loop_instructions=len(loop),
                loop_opcodes=opcode_mix(loop),
                mma_loop_instructions=[len(body) for body in mma_loops(sass)],
                operand_writes_in_flight=operand_writes_in_flight(loop),
                register_operand_mmas=register_operand_mmas(loop),
                saturating_adds=sum("FADD.SAT" in line for line in loop),
            )
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    for build, info in compile_paged_scoring(sys.argv[1] if len(sys.argv) > 1 else "/tmp/litetopk-paged-sm90").items():
        print(build, {k: v for k, v in info.items() if k != "loop_opcodes"})
