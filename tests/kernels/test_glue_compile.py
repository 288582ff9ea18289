"""The glue kernels (decode bookkeeping, schedule, certificate, repair) compile for sm_90 as launched:
CI runs them under the interpreter, which accepts code the compiler refuses; this build (no GPU
needed, compile_glue_sm90) catches that, and checks that none of them spills."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from litetopk.kernels.triton.compile_glue_sm90 import KERNELS

NAMES = [kernel.fn.__name__ for kernel in KERNELS]


@pytest.fixture(scope="module")
def summary(tmp_path_factory) -> dict:
    """compile_glue_sm90's summary, built once in a fresh process (no interpreter)."""
    out = tmp_path_factory.mktemp("glue_sm90")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "litetopk.kernels.triton.compile_glue_sm90", str(out)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, f"sm_90 compile failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return json.loads((out / "summary.json").read_text())


@pytest.mark.parametrize("name", NAMES)
def test_glue_kernel_compiles_for_sm90_without_spills(summary, name):
    info = summary[name]
    assert info["REG"] > 0, f"{name}: {info}"
    assert info["STACK"] == 0, f"{name}: {info['STACK']} bytes of stack (spills)"
