"""Compile every FlyDSL kernel variant for gfx950 without a device, and dump its final ISA.

    python -m litetopk.kernels.flydsl.compile DUMP_DIR

sets COMPILE_ONLY=1, ARCH=gfx950, FLYDSL_DEBUG_DUMP_ASM=1, FLYDSL_DUMP_DIR=DUMP_DIR (and turns
the disk cache off so that every variant is really compiled), then traces each configuration of
`compiled_configurations()` with CPU placeholder tensors. FlyDSL's last step links with
`$ROCM_PATH/llvm/bin/ld.lld`; `make toolchain` provides it as .venv/rocm (LLVM 19's lld). The
final ISA of each variant lands in DUMP_DIR/<dense|scan>/<kernel>_<n>/*_final_isa.s.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: Where `make toolchain` puts the ROCM_PATH shim (llvm/bin/ld.lld -> /usr/lib/llvm-19/bin/ld.lld).
TOOLCHAIN_ROCM_PATH = Path(sys.prefix) / "rocm"


def compile_env(dump_dir: Path) -> dict[str, str]:
    """Environment variables of a compile-only gfx950 build that dumps the final ISA."""
    return {
        "COMPILE_ONLY": "1",
        "ARCH": "gfx950",
        "FLYDSL_GPU_ARCH": "gfx950",
        "FLYDSL_DEBUG_DUMP_ASM": "1",
        "FLYDSL_DUMP_DIR": str(dump_dir),
        "FLYDSL_RUNTIME_ENABLE_CACHE": "0",
        "ROCM_PATH": os.environ.get("LITETOPK_ROCM_PATH", str(TOOLCHAIN_ROCM_PATH)),
    }


def variant_name(config: dict) -> str:
    """Dump subfolder of one configuration: 'scan' or 'dense'."""
    return "scan" if config["SCAN"] else "dense"


def compile_all(dump_dir: Path, rows: int = 4) -> int:
    """Trace and compile each configuration with placeholder CPU tensors (the ISA of each goes
    to dump_dir/<variant_name>/); returns how many were compiled."""
    import torch

    from . import compiled_configurations
    from .score_fp4 import score_fp4_flydsl

    def zeros(n, dtype):
        return torch.zeros(n, dtype=dtype)

    count = 0
    for config in compiled_configurations():
        scan = config["SCAN"]
        os.environ["FLYDSL_DUMP_DIR"] = str(dump_dir / variant_name(config))
        out = zeros(rows * 8, torch.int64 if scan else torch.float32)
        score_fp4_flydsl(
            zeros(rows * 64 * 16, torch.int32), zeros(rows * 64, torch.int32), zeros(1088 * 2, torch.int32),
            zeros(2, torch.int32), zeros(rows * 64, torch.float32), zeros(rows, torch.int32),
            zeros(rows, torch.int32), zeros(rows, torch.int32), out, zeros(rows, torch.int64),
            zeros(rows, torch.int64), zeros(rows, torch.int64), zeros(rows * 64, torch.int32),
            zeros(rows, torch.int32), rows, 2, 8, 1, 512, 1.0, 1, 1, scan,
        )
        count += 1
    return count


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m litetopk.kernels.flydsl.compile DUMP_DIR", file=sys.stderr)
        return 2
    os.environ.update(compile_env(Path(argv[0]).resolve()))
    print(f"compiled {compile_all(Path(argv[0]).resolve())} FlyDSL kernel variants for gfx950")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
