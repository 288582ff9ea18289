"""The Gluon scoring kernel where no sm_90 device exists (it has no interpreter): every variant the
backend launches compiles for sm_90 with the backend's options, fits the register budget that lets
4 programs share an SM (the scan spills one register; the wide variants a few), and its step loop holds the int8 wgmma
it is written for,
two CTA barriers, and in the scan one slot atomic and one histogram reduction per thread.
Its results are checked against the Triton twin on the H200 (test_triton_backend.py, gpu)."""

from __future__ import annotations

import pytest

from litetopk.kernels.compile.sm90 import GLUON_VARIANTS
from litetopk.kernels.triton.scoring_gluon import GLUON_MAX_REGISTERS
from tests.kernels.offline_compile import offline_summary


@pytest.fixture(scope="module")
def summary(tmp_path_factory) -> dict:
    """compile/sm90.py's summary of the Gluon variants, built once in a fresh process (no interpreter)."""
    return offline_summary("litetopk.kernels.compile.sm90", tmp_path_factory.mktemp("gluon_sm90"))


# The scan spills one register under the cap: one store and one reload (L1) per step, measured
# cheaper than the 3 programs per SM that ~165 registers would leave (bench/NOTES.md, session 4).
# The ANY_WIDE variants (problems holding a wide MXFP4 vector) spill up to 10 (loop invariants reloaded
# from L1; the price of their k_hi in the ring's other slot, which keeps 4 programs per SM:
# test_wide_gluon_compile.py).
# The self-calibrating scans (LiteTopKTuning(calibration="scan")) hold their calibration outside the step
# loops (in a step loop the narrow one reloads at most 1 register a step, as the scan; the wide one up to 10, scan_wide
# 5).
ALLOWED_SPILL_BYTES = {
    "dense": 0,
    "strided": 0,
    "scan": 8,
    "dense_wide": 24,
    "strided_wide": 40,
    "scan_wide": 40,
    "scan_calibrating": 24,
    "scan_wide_calibrating": 120,
}
# the ANY_WIDE false variants: the loop checks below are theirs
COMMON = ("dense", "strided", "scan", "scan_calibrating")


@pytest.mark.parametrize("variant", list(GLUON_VARIANTS))
def test_registers_fit_four_programs_per_sm(summary, variant):
    info = summary[variant]
    assert info["REG"] <= GLUON_MAX_REGISTERS, f"{variant}: {info['REG']} registers"
    assert info["STACK"] <= ALLOWED_SPILL_BYTES[variant], f"{variant}: {info['STACK']} bytes of stack (spills)"
    if variant in COMMON:
        spill_ops = info["loop_opcodes"].get("STL", 0) + info["loop_opcodes"].get("LDL", 0)
        assert spill_ops <= ALLOWED_SPILL_BYTES[variant] // 4, f"{variant}: {spill_ops} spill instructions per step"


@pytest.mark.parametrize("variant", ["dense_wide", "strided_wide", "scan_wide", "scan_wide_calibrating"])
def test_wide_variants_run_the_hi_dots_on_int8_wgmma(summary, variant):
    info = summary[variant]
    assert info["wgmma"] == ["IGMMA.64x128x32.S8.S8"], f"{variant}: {info['wgmma']}"
    # one plain step (4 k-steps) plus the Horner chain of up to four dots (16 k-steps)
    assert info["loop_opcodes"].get("IGMMA") == 4 + 16, f"{variant}: {info['loop_opcodes'].get('IGMMA')} IGMMA"


@pytest.mark.parametrize("variant", COMMON)
def test_step_loop_is_int8_wgmma_with_two_barriers(summary, variant):
    info = summary[variant]
    assert info["wgmma"] == ["IGMMA.64x128x32.S8.S8"], f"{variant}: {info['wgmma']}"
    assert info["loop_opcodes"].get("IGMMA") == 4, f"{variant}: {info['loop_opcodes']}"
    barriers = info["loop_opcodes"].get("BAR", 0)
    # the scan's two extra sit in its every-REFRESH-steps branch; the self-calibrating scan's innermost
    # loop is its sample's, which raises nothing
    want = 4 if variant == "scan" else 2
    assert barriers == want, f"{variant}: {barriers} BAR in the step loop"


@pytest.mark.parametrize("variant, histogram", [("scan", 1), ("scan_calibrating", 0)])
def test_scan_appends_with_one_atomic_per_thread(summary, variant, histogram):
    """One slot atomic (ATOMG) a thread and step, and one histogram add (REDG) where the histogram
    counts: the self-calibrating scan's innermost loop is its sample's, whose histogram is off by
    construction (the program sets it up itself), so the compiler drops the add there."""
    ops = summary[variant]["loop_opcodes"]
    assert ops.get("ATOMG") == 1 and ops.get("REDG", 0) == histogram, f"{variant} loop atomics: {ops}"
    assert "ATOMG" not in summary["dense"]["loop_opcodes"], "the dense loop holds an atomic"


@pytest.mark.parametrize(
    "variant, plain, phases", [("scan_calibrating", "scan", 3), ("scan_wide_calibrating", "scan_wide", 2)]
)
def test_self_calibrating_scan_loops_stay_the_scan_loop(summary, variant, plain, phases):
    """The calibration runs between the phases' loops, not in them: each of the self-calibrating
    scan's step loops is the scan's within a few instructions (offline: 253 / 347 / 341 vs 326;
    phase A's raises and counts nothing). In the wide variant ptxas moves one phase's dots into a subroutine,
    so two of its three loops hold a wgmma themselves (781 / 932 vs 846)."""
    want = summary[plain]["loop_instructions"]
    loops = summary[variant]["mma_loop_instructions"]
    assert len(loops) == phases and max(loops) <= want * 1.12, f"{variant}: step loops {loops} vs {plain}'s {want}"
