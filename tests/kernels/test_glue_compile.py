"""The glue kernels (decode bookkeeping, schedule, certificate, repair) compile for sm_90 as launched:
CI runs them under the interpreter, which accepts code the compiler refuses; this build (no GPU
needed, compile/sm90_glue.py) catches that, and checks that none of them spills."""

from __future__ import annotations

import pytest

from litetopk.kernels.compile.sm90_glue import KERNELS
from tests.kernels.offline_compile import offline_summary

NAMES = [kernel.fn.__name__ for kernel in KERNELS]


@pytest.fixture(scope="module")
def summary(tmp_path_factory) -> dict:
    """compile/sm90_glue.py's summary, built once in a fresh process (no interpreter)."""
    return offline_summary("litetopk.kernels.compile.sm90_glue", tmp_path_factory.mktemp("glue_sm90"))


@pytest.mark.parametrize("name", NAMES)
def test_glue_kernel_compiles_for_sm90_without_spills(summary, name):
    info = summary[name]
    assert info["REG"] > 0, f"{name}: {info}"
    assert info["STACK"] == 0, f"{name}: {info['STACK']} bytes of stack (spills)"
