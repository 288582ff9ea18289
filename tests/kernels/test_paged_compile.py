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
