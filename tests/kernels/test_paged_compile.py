"""The paged mode's scoring kernels where no sm_90 device exists: every variant the launcher uses compiles
for sm_90 (compile/sm90_paged.py, a fresh process without the interpreter), without stack, the Gluon
kernel within the register cap that lets its programs an SM reside (paged.paged_programs), and the step
loop of both holds the int8 wgmma and the PTX E2M1 decode (byte permutes: 4 for 8 values) they are
written for. Their results are compared with each other and with the float64 oracle on a GPU
(test_paged_scoring.py, gpu)."""

from __future__ import annotations

import pytest

from litetopk.kernels.compile.sm90_paged import PAGED_VARIANTS
from litetopk.kernels.triton.paged_scoring_gluon import (
    GLUON_PAGED_MAX_REGISTERS,
    PROGRAMS_PER_SM,
)
from tests.kernels.offline_compile import offline_summary

BUILDS = [f"{kernel}_{variant}" for variant in PAGED_VARIANTS for kernel in ("triton", "gluon")]


@pytest.fixture(scope="module")
def summary(tmp_path_factory) -> dict:
    """compile/sm90_paged.py's summary, built once in a fresh process (no interpreter)."""
    return offline_summary("litetopk.kernels.compile.sm90_paged", tmp_path_factory.mktemp("paged_sm90"))


@pytest.mark.parametrize("build", BUILDS)
def test_paged_kernel_compiles_for_sm90_without_stack(summary, build):
    info = summary[build]
    assert info["REG"] > 0 and info["STACK"] == 0, f"{build}: {info['REG']} registers, {info['STACK']} bytes of stack"


@pytest.mark.parametrize("build", [b for b in BUILDS if b.startswith("gluon")])
def test_gluon_paged_kernel_lets_its_programs_reside(summary, build):
    rows = int(build[-1])
    info = summary[build]
    assert info["REG"] <= GLUON_PAGED_MAX_REGISTERS[rows], f"{build}: {info['REG']} registers"
    assert PROGRAMS_PER_SM[rows] * info["REG"] * 128 <= 65536, f"{build}: {PROGRAMS_PER_SM[rows]} programs an SM"


@pytest.mark.parametrize("build", BUILDS)
def test_the_step_loop_holds_the_wgmma_and_the_ptx_decode(summary, build):
    opcodes = summary[build]["loop_opcodes"]
    assert opcodes.get("IGMMA", 0) >= 4, f"{build}: {opcodes.get('IGMMA', 0)} int8 wgmma in the step loop"
    # a thread decodes 2 keys x 16 bytes a step: 8 words of 4 bytes, 4 byte permutes a word
    assert opcodes.get("PRMT", 0) >= 32, f"{build}: {opcodes.get('PRMT', 0)} byte permutes"


@pytest.mark.parametrize("build", [b for b in BUILDS if b.startswith("gluon")])
def test_the_gluon_step_feeds_the_mma_from_registers(summary, build):
    """The Gluon kernel's wgmma reads the decoded keys from registers, so the step loop
    has no proxy fence (MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S) and stores no 16-byte operand words to shared
    memory beyond the scan's one layout change."""
    opcodes = summary[build]["loop_opcodes"]
    assert opcodes.get("MEMBAR", 0) == 0 and opcodes.get("FENCE", 0) == 0, f"{build}: {opcodes}"
    assert opcodes.get("STS", 0) <= 8, f"{build}: {opcodes.get('STS', 0)} shared stores in the step loop"


@pytest.mark.parametrize("build", [b for b in BUILDS if b.startswith("gluon")])
def test_the_gluon_wide_flag_is_a_warp_vote_and_one_barrier(summary, build):
    """The tile's wide flag (paged_scoring_gluon._tile_any): one vote a warp and one barrier on the fast path, where the
    generic reduction took five lane exchanges and two barriers; the step loop (both branches) keeps at most 5."""
    opcodes = summary[build]["loop_opcodes"]
    assert opcodes.get("VOTE", 0) >= 1, f"{build}: no warp vote in the step loop: {opcodes}"
    assert opcodes.get("BAR", 0) <= 5, f"{build}: {opcodes.get('BAR', 0)} barriers in the step loop"


@pytest.mark.parametrize("build", [b for b in BUILDS if b.startswith("gluon")])
def test_no_instruction_writes_the_operand_of_an_mma_in_flight(summary, build):
    """The Gluon step's MMAs read their A operand from registers: between an MMA and its wait nothing may write those
    registers (sm90.operand_writes_in_flight), which an asynchronous chain of MMAs would have to keep so. (The loop
    holds such MMAs, so the check has something to watch.)"""
    assert summary[build]["register_operand_mmas"] >= 4, f"{build}: no register-operand MMA found in the step loop"
    assert summary[build]["operand_writes_in_flight"] == [], f"{build}: {summary[build]['operand_writes_in_flight']}"


@pytest.mark.parametrize("build", [b for b in BUILDS if b.startswith("gluon")])
def test_the_gluon_steps_relu_runs_on_the_fma_pipe(summary, build):
    """paged_scoring_gluon._relu_bits: the dot's relu is a saturating float add (FADD.SAT, 32 a row a thread), not an
    integer max on the integer pipe."""
    adds = summary[build]["saturating_adds"]
    assert adds >= 32 * int(build[-1]), f"{build}: {adds} FADD.SAT in the step loop"


def test_operand_writes_in_flight_finds_a_write_before_the_wait():
    from litetopk.kernels.compile.sm90 import operand_writes_in_flight

    loop = [
        "0010 WARPGROUP.ARRIVE",
        "0020 IGMMA.64x64x32.S8.S8 R24, R88, gdesc[UR8], RZ, !UPT",
        "0030 IGMMA.64x64x32.S8.S8 R24, R76, gdesc[UR48], R24",
        "0040 PRMT R90, R29, R41, R66",
        "0050 WARPGROUP.DEPBAR.LE gsb0, 0x0",
        "0060 PRMT R91, R29, R41, R66",
        "0070 @P5 LOP3.LUT R77, R56, 0x8888, RZ, 0x3c, !PT",
    ]
    assert operand_writes_in_flight(loop) == ["0040 PRMT R90, R29, R41, R66"]
    assert operand_writes_in_flight(loop[:3] + loop[6:]) == ["0070 @P5 LOP3.LUT R77, R56, 0x8888, RZ, 0x3c, !PT"]
    shuffle = "0045 SHFL.BFLY PT, R91, R14, 0x2, 0x1f"  # a predicate destination first, then the register
    assert operand_writes_in_flight(loop[:3] + [shuffle] + loop[4:]) == [shuffle]
    # a wait that leaves a group in flight keeps its operands live
    partial_wait = "0048 WARPGROUP.DEPBAR.LE gsb0, 0x1"
    assert operand_writes_in_flight(loop[:3] + [partial_wait, shuffle]) == [shuffle]
