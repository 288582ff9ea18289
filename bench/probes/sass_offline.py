"""Compile the Triton scoring kernel for sm_90 on this (GPU-less) machine and print the instruction
mix of its innermost wgmma loop: registers, stack, shared memory, instructions per warp and step.
No device time: Triton's wheel carries ptxas and cuobjdump. The loop's instruction count per warp
tracked the H200's scan / dense times while the kernel was issue-bound (bench/NOTES.md, session 2).

    python3 -m bench.probes.sass_offline              # the Triton kernel at the backend's tile, dense and scan
    python -m litetopk.kernels.compile.sm90 DIR          # the Gluon kernel (what sm_90 runs)
    python3 -m bench.probes.sass_offline --warps 8    # another tile configuration
Writes the SASS, PTX and TTGIR under $OUT (default /tmp/litetopk-sass).
"""

from __future__ import annotations

import argparse
import os

from triton.compiler import ASTSource

from litetopk.kernels.compile import sm90
from litetopk.kernels.compile.sm90 import BIN, SCORE_TYPES, innermost_mma_loop, opcode_mix  # noqa: F401


def compile_sm90(
    kernel, types: dict, constants: dict, num_warps: int, num_stages: int, path: str, source=ASTSource
) -> str:
    """kernels/compile/sm90.compile_sm90 with the warps and stages as arguments."""
    return sm90.compile_sm90(
        kernel, types, constants, dict(num_warps=num_warps, num_stages=num_stages), path, source=source
    )


def resources(path: str) -> str:
    """ "REG:n STACK:n SHARED:n" of path.cubin."""
    return " ".join(f"{k}:{v}" for k, v in sm90.resource_usage(path).items())


def main():
    from litetopk.kernels.triton.scoring import score_fp4_kernel

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2, help="BLOCK_ROWS")
    parser.add_argument("--keys", type=int, default=64, help="BLOCK_KEYS")
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--stages", type=int, default=3)
    args = parser.parse_args()
    out = os.environ.get("OUT", "/tmp/litetopk-sass")
    os.makedirs(out, exist_ok=True)
    for mode in ("dense", "scan"):
        constants = dict(
            TOPK=512,
            BLOCK_KEYS=args.keys,
            BLOCK_ROWS=args.rows,
            DENSE=mode == "dense",
            STRIDED=False,
            ANY_WIDE=False,
            REFRESH=16,
            H=64,
            D=128,
            NB=32,
        )
        path = os.path.join(out, f"score_{mode}_r{args.rows}_k{args.keys}_w{args.warps}_s{args.stages}")
        loop = innermost_mma_loop(compile_sm90(score_fp4_kernel, SCORE_TYPES, constants, args.warps, args.stages, path))
        mix = opcode_mix(loop)
        print(
            f"{mode}: {resources(path)}; loop {len(loop)} instructions per warp and step, "
            f"{mix['BAR']} BAR; {dict(mix.most_common(12))}"
        )


if __name__ == "__main__":
    main()
