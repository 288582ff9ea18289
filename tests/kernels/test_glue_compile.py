"""The glue kernels (decode bookkeeping, schedule, certificate, repair) compile for sm_90 as launched:
CI runs them under the interpreter, which accepts code the compiler refuses; this build (no GPU
needed, compile/sm90_glue.py) catches that, and checks that none of them spills."""

from __future__ import annotations

import pytest

from litetopk.kernels.compile.sm90_glue import KERNELS, MEASURED
from tests.kernels.offline_compile import offline_summary

NAMES = [kernel.fn.__name__ for kernel in KERNELS] + list(MEASURED)


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> tuple:
    """(compile/sm90_glue.py's summary, its folder of builds), built once in a fresh process (no interpreter)."""
    folder = tmp_path_factory.mktemp("glue_sm90")
    return offline_summary("litetopk.kernels.compile.sm90_glue", folder), folder


@pytest.fixture(scope="module")
def summary(build) -> dict:
    return build[0]


@pytest.mark.parametrize("name", NAMES)
def test_glue_kernel_compiles_for_sm90_without_spills(summary, name):
    info = summary[name]
    assert info["REG"] > 0, f"{name}: {info}"
    assert info["STACK"] == 0, f"{name}: {info['STACK']} bytes of stack (spills)"


@pytest.mark.parametrize(
    "name", ["radix_floor_kernel", "radix_count_kernel", "radix_collect_kernel", "radix_threshold_kernel"]
)
def test_the_radix_selectors_column_loops_are_pipelined(build, name):
    """RADIX_CONFIG "stages" (4): the floor's, counting and collecting launches load their next column blocks by
    cp.async while one is counted (the form measured faster on an H100, bench/JOURNAL.md 22a); the candidates
    form's threshold its next programs' maxima (THRESHOLD_STAGES)."""
    assert "cp.async" in (build[1] / f"{name}.ptx").read_text(), f"{name}: its column loads are not pipelined"


def test_the_warp_slots_append_once_a_list_a_warp(build):
    """RADIX_CONFIG "warp_slots": the collect's append is one inline-PTX block (_WARP_APPEND_ASM) a register of keys,
    so that its atomic runs once for each list of a warp: Triton copies an elementwise asm it needs in several
    layouts, which would repeat the atomic. The compiled loop holds one match.any and one atomic per asm instance,
    and the block form no match.any at all."""
    folder = build[1]
    warp = (folder / "radix_collect_kernel_warp_slots.ptx").read_text()
    block = (folder / "radix_collect_kernel.ptx").read_text()
    matches, atomics = warp.count("match.any.sync"), warp.count("atom.global.relaxed.gpu.add.u64")
    assert matches == atomics > 0, f"{matches} match.any, {atomics} list atomics"
    assert (folder / "radix_collect_kernel_warp_slots.ttgir").read_text().count("elementwise_inline_asm") == 1
    assert "match.any.sync" not in block, "the block form appends by block sums"
