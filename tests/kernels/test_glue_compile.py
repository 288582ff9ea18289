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


def test_the_radix_selectors_loops_are_pipelined_only_where_asked(build):
    """RADIX_CONFIG "stages": the one-launch kernel, built at 4 stages, loads its next column blocks by cp.async; the
    five launches' kernels, at the default 1, load as the measured kernels did (no cp.async)."""
    folder = build[1]
    ptx = {name: (folder / f"{name}.ptx").read_text() for name in ("radix_select_row_kernel", "radix_count_kernel")}
    assert "cp.async" in ptx["radix_select_row_kernel"], "the one-launch kernel's loads are not pipelined"
    assert "cp.async" not in ptx["radix_count_kernel"], "the count kernel pipelines its loads at 1 stage"
