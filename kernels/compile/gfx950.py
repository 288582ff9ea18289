"""Compile every FlyDSL kernel variant for gfx950 without a device, and dump its final ISA.

Layer: public face (compile/, an offline tool; imports flydsl/ and the validation that builds its
placeholder problems).

    python -m litetopk.kernels.compile.gfx950 DUMP_DIR

sets COMPILE_ONLY=1, ARCH=gfx950, FLYDSL_DEBUG_DUMP_ASM=1, FLYDSL_DUMP_IR=1, FLYDSL_DUMP_DIR=DUMP_DIR (and turns
the disk cache off so that every variant is really compiled), then traces each configuration of
`compiled_configurations()` through the backend's own launch path (FlyDSLBackend.score_dense /
scan_candidates, launch_arguments) on CPU placeholder problems, one per cache format. FlyDSL's
last step links with `$ROCM_PATH/llvm/bin/ld.lld`; `make toolchain` provides it as .venv/rocm (LLVM 19's lld). The
final ISA of each variant lands in DUMP_DIR/<dense|scan>-<litetopk|aiter>/<kernel>_<n>/*_final_isa.s,
its LLVM IR beside it (*_llvm_ir.ll), with every earlier MLIR stage.
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
        "FLYDSL_DUMP_IR": "1",
        "FLYDSL_DUMP_DIR": str(dump_dir),
        "FLYDSL_RUNTIME_ENABLE_CACHE": "0",
        "ROCM_PATH": os.environ.get("LITETOPK_ROCM_PATH", str(TOOLCHAIN_ROCM_PATH)),
    }


def variant_name(config: dict) -> str:
    """Dump subfolder of one configuration: '<dense|scan>-<cache format>', e.g. 'scan-aiter'."""
    return f"{'scan' if config['SCAN'] else 'dense'}-{config['CACHE_FORMAT']}"


def placeholder_problem(cache_format: str, rows: int = 4, num_pages: int = 2):
    """A validated CPU problem of zeros whose cache is in `cache_format`: the operator's own
    validation builds it, so the compile-only build traces the backend's real launch path."""
    import torch

    from ..aiter_layout import aiter_pages_from_litetopk
    from ..cache_layout import NUM_HEADS, PAGE_BYTES, PAGE_SIZE, SCALE_BYTES, VALUE_BYTES
    from ..validation import validate_prefill

    ours = torch.zeros(num_pages, PAGE_BYTES, dtype=torch.uint8)
    kv_cache, kv_scale = (ours, None) if cache_format == "litetopk" else aiter_pages_from_litetopk(ours)
    row_ints = torch.zeros(rows, dtype=torch.int32)
    return validate_prefill(
        torch.zeros(rows, NUM_HEADS, VALUE_BYTES, dtype=torch.uint8),
        torch.zeros(rows, NUM_HEADS, SCALE_BYTES, dtype=torch.uint8),
        kv_cache,
        torch.arange(num_pages, dtype=torch.int32)[None],
        torch.zeros(rows, NUM_HEADS),
        row_ints,
        row_ints,
        torch.full((rows,), num_pages * PAGE_SIZE, dtype=torch.int32),
        topk=512,
        kv_scale=kv_scale,
    )


def compile_all(dump_dir: Path) -> int:
    """Trace and compile each configuration through FlyDSLBackend.score_dense / scan_candidates on
    placeholder CPU problems (the ISA of each goes to dump_dir/<variant_name>/); returns how many
    were compiled."""
    import torch

    from ..flydsl import FlyDSLBackend, compiled_configurations
    from ..keys import NO_KEY

    backend = FlyDSLBackend()
    count = 0
    for config in compiled_configurations():
        os.environ["FLYDSL_DUMP_DIR"] = str(dump_dir / variant_name(config))
        problem = placeholder_problem(config["CACHE_FORMAT"])
        if config["SCAN"]:
            no_threshold = torch.full((problem.num_rows,), NO_KEY, dtype=torch.int64)
            backend.scan_candidates(problem, no_threshold, capacity=8)
        else:
            backend.score_dense(problem)
        count += 1
    return count


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m litetopk.kernels.compile.gfx950 DUMP_DIR", file=sys.stderr)
        return 2
    os.environ.update(compile_env(Path(argv[0]).resolve()))
    print(f"compiled {compile_all(Path(argv[0]).resolve())} FlyDSL kernel variants for gfx950")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
