"""The glue kernels (decode bookkeeping, schedule, certificate, repair) compile for sm_90 as launched:
CI runs them under the interpreter, which accepts code the compiler refuses; this build (no GPU
needed, compile/sm90_glue.py) catches that, and checks that none of them spills."""

from __future__ import annotations

import pytest

from litetopk.kernels.compile.sm90_glue import KERNELS
from tests.kernels.offline_compile import offline_summary

NAMES = [kernel.fn.__name__ for kernel in KERNELS]


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


@pytest.mark.parametrize("name", ["radix_floor_kernel", "radix_count_kernel", "radix_collect_kernel"])
def test_the_radix_selectors_column_loops_are_pipelined(build, name):
    """RADIX_CONFIG "stages" (4): the floor's, counting and collecting launches load their next column blocks by
    cp.async while one is counted (the form measured faster on an H100, bench/JOURNAL.md 22a)."""
    assert "cp.async" in (build[1] / f"{name}.ptx").read_text(), f"{name}: its column loads are not pipelined"
