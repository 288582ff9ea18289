"""Compile the Triton scoring kernel for sm_90 on this (GPU-less) machine and print the instruction
mix of its innermost wgmma loop: registers, stack, shared memory, instructions per warp and step.
No device time: Triton's wheel carries ptxas and cuobjdump. The loop's instruction count per warp
tracked the H200's scan / dense times while the kernel was issue-bound (bench/NOTES.md, session 2).

    python bench/sass_offline.py              # the production configuration, dense and scan
    python bench/sass_offline.py --warps 8    # another tile configuration
Writes the SASS, PTX and TTGIR under $OUT (default /tmp/litetopk-sass).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SCORE_TYPES = dict(
    k_lo_ptr="*i8", k_hi_ptr="*i8", kfac_ptr="*fp32", tile_wide_ptr="*i8", tile_cols="i32", q_lo_ptr="*i8",
    q_hi_ptr="*i8", wq_ptr="*fp32", rowfac_ptr="*fp32", prog_rows_ptr="*i32", prog_batch_ptr="*i32",
    prog_span_ptr="*i32", prog_q_wide_ptr="*i8", starts_ptr="*i32", ends_ptr="*i32", s_pad="i32",
    out_ptr="*fp32", out_width="i32", max_pos="i32", position_stride="i32", thr_ptr="*fp32",
    hist_lo_ptr="*fp32", hist_width_ptr="*fp32", hist_ptr="*i32", buf_ptr="*i64", capacity="i32",
    appended_ptr="*i32", thr_out_ptr="*fp32", nonfinite_ptr="*i8",
)


def compile_sm90(kernel, types: dict, constants: dict, num_warps: int, num_stages: int, path: str,
                 source=ASTSource) -> str:
    """Compile for sm_90 (pointer arguments 16-byte aligned, as the launcher's tensors are); write
    path.{cubin,ptx,ttgir,sass}; return the SASS."""
    signature = {name: types.get(name, "constexpr") for name in kernel.arg_names}
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n, t in types.items() if t.startswith("*")}
    compiled = triton.compile(source(kernel, signature, constants, attrs), target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=num_warps, num_stages=num_stages))
    with open(path + ".cubin", "wb") as f:
        f.write(compiled.asm["cubin"])
    for ext in ("ptx", "ttgir"):
        with open(f"{path}.{ext}", "w") as f:
            f.write(compiled.asm[ext])
    sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-sass", path + ".cubin"],
                          capture_output=True, text=True, check=True).stdout
    with open(path + ".sass", "w") as f:
        f.write(sass)
    return sass


def resources(path: str) -> str:
    usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage", path + ".cubin"],
                           capture_output=True, text=True, check=True).stdout
    return re.search(r"REG:\d+ STACK:\d+ SHARED:\d+", usage).group(0)


def innermost_mma_loop(sass: str) -> list[str]:
    """The instructions of the smallest backward-branch loop that holds a GMMA."""
    lines = [line for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4}\*/", line)]
    address = [int(re.match(r"\s+/\*([0-9a-f]+)\*/", line).group(1), 16) for line in lines]
    best: list[str] = []
    for line, at in zip(lines, address):
        target = re.search(r"BRA (0x[0-9a-f]+)", line)
        if target and int(target.group(1), 16) < at:
            body = [x for x, a in zip(lines, address) if int(target.group(1), 16) <= a <= at]
            if any("GMMA" in x for x in body) and (not best or len(body) < len(best)):
                best = body
    return [re.sub(r"^\s+/\*([0-9a-f]+)\*/\s+", r"\1 ", x).split(";")[0] for x in best]


def opcode_mix(loop: list[str]) -> collections.Counter:
    mix = collections.Counter()
    for line in loop:
        words = line.split()[1:]
        op = words[1] if words and words[0].startswith("@") else (words[0] if words else "")
        mix[op.split(".")[0]] += 1
    return mix


def main():
    from litetopk.kernels.triton.scoring import score_fp4_kernel

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4, help="BLOCK_ROWS")
    parser.add_argument("--keys", type=int, default=64, help="BLOCK_KEYS")
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--stages", type=int, default=3)
    args = parser.parse_args()
    out = os.environ.get("OUT", "/tmp/litetopk-sass")
    os.makedirs(out, exist_ok=True)
    for mode in ("dense", "scan"):
        constants = dict(TOPK=512, BLOCK_KEYS=args.keys, BLOCK_ROWS=args.rows, DENSE=mode == "dense", STRIDED=False,
                         ANY_WIDE=False, REFRESH=16, H=64, D=128, NB=32)
        path = os.path.join(out, f"score_{mode}_r{args.rows}_k{args.keys}_w{args.warps}_s{args.stages}")
        loop = innermost_mma_loop(compile_sm90(score_fp4_kernel, SCORE_TYPES, constants, args.warps, args.stages, path))
        mix = opcode_mix(loop)
        print(f"{mode}: {resources(path)}; loop {len(loop)} instructions per warp and step, "
              f"{mix['BAR']} BAR; {dict(mix.most_common(12))}")


if __name__ == "__main__":
    main()
