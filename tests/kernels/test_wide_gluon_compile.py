"""The Gluon scoring kernel's wide (ANY_WIDE) variants where no sm_90 device exists: every variant's
shared memory lets as many programs share an SM as its registers do (4), and the wide variants
keep no shared buffer of their own for a wide key tile's k_hi (it takes the other slot of the
ring of key tiles, scoring_gluon.py).

Why: before this check the wide variants asked for 57,344 (dense) and 57,856 (scan) bytes of
dynamic shared memory a program; with the cubin's 1 KiB static section and the driver's 1 KiB
reserved a block, 4 programs need more than the 228 KiB of an H200 multiprocessor, so they ran 3
programs per SM instead of 4 on every problem that holds a wide vector (the scan even without
counting the reservation twice); bench/NOTES.md, Next steps 2. The count here is the conservative
one (static section and reservation both); bench/probes/gluon_wide_probe.py asks the driver. The
numbers are the compiler's own (compile/sm90.py's summary), built once in a fresh process without the
interpreter."""

from __future__ import annotations

import pytest

from litetopk.kernels.compile.sm90 import GLUON_VARIANTS
from litetopk.kernels.triton.scoring_gluon import GLUON_BLOCK_KEYS, GLUON_MAX_REGISTERS, GLUON_NUM_WARPS, NUM_BUFFERS
from tests.kernels.offline_compile import offline_summary

SHARED_PER_SM = 228 * 1024  # sm_90: shared memory of one multiprocessor (H100 / H200)
RESERVED_PER_PROGRAM = 1024  # sm_90: shared memory the driver reserves for each resident block
REGISTERS_PER_SM = 65536
KEY_TILE = GLUON_BLOCK_KEYS * 128  # bytes of one int8 key tile (D = 128)


@pytest.fixture(scope="module")
def summary(tmp_path_factory) -> dict:
    return offline_summary("litetopk.kernels.compile.sm90", tmp_path_factory.mktemp("gluon_wide_sm90"))


def programs_per_sm(info: dict) -> tuple[int, int]:
    """(programs per SM its shared memory allows, programs per SM its registers allow); SHARED is the
    cubin's static section (cuobjdump), counted besides the driver's reservation."""
    per_program = info["DYNAMIC_SHARED"] + info["SHARED"] + RESERVED_PER_PROGRAM
    return SHARED_PER_SM // per_program, REGISTERS_PER_SM // (info["REG"] * 32 * GLUON_NUM_WARPS)


@pytest.mark.parametrize("variant", list(GLUON_VARIANTS))
def test_shared_memory_allows_the_programs_registers_allow(summary, variant):
    by_shared, by_registers = programs_per_sm(summary[variant])
    assert by_registers == REGISTERS_PER_SM // (GLUON_MAX_REGISTERS * 32 * GLUON_NUM_WARPS) == 4, (
        f"{variant}: {summary[variant]['REG']} registers"
    )
    assert by_shared >= by_registers, (
        f"{variant}: {summary[variant]['DYNAMIC_SHARED']} bytes of dynamic shared memory allow {by_shared} "
        f"programs per SM, the registers {by_registers}"
    )


@pytest.mark.parametrize("mode", ["dense", "strided", "scan"])
def test_wide_variant_adds_only_the_query_hi_operand(summary, mode):
    """The wide variant's shared memory is the narrow one's plus q_hi [128 columns, 128] int8, nothing
    for k_hi (a key tile's worth of bytes, KEY_TILE, would show)."""
    narrow, wide = summary[mode]["DYNAMIC_SHARED"], summary[f"{mode}_wide"]["DYNAMIC_SHARED"]
    q_hi = 2 * 64 * 128
    assert wide - narrow == q_hi, f"{mode}: wide {wide} vs narrow {narrow} bytes (k_hi tile: {KEY_TILE})"
    assert narrow >= NUM_BUFFERS * KEY_TILE + q_hi, f"{mode}: {narrow} bytes hold the ring and q_lo"
