"""Fixtures of the kernel tests."""

from __future__ import annotations

import pytest

from litetopk.kernels import registry
from litetopk.kernels.triton import TritonBackend


@pytest.fixture
def prefill_mode():
    """Every `backend="triton"` call of the test in the Triton backend's prefill mode
    (TritonBackend(paged="never")): the modules that test that mode's kernels (int8 keys, the
    program-a-row-group schedule, the self-calibrating scan) on small problems, which by their shapes
    would take the paged mode (kernels/triton/paged.py; tests/kernels/test_paged_scoring.py tests it)."""
    with registry.backend_instance("triton", TritonBackend(paged="never")):
        yield
