"""Session-wide test settings.

Where no CUDA device exists, Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1
must be set before any kernel module is imported (the @triton.jit decorator reads it), so it is
set here, first. On a machine with a GPU the same tests run the compiled kernels.
GPU-only tests are marked `gpu` and reported as skipped (with the reason) where there is none.
Every test that draws random data takes the `seed` fixture: a fresh seed per run, printed with a
failure; LITETOPK_TEST_SEED replays one.
"""

from __future__ import annotations

import os
import secrets

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: not run on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def seed(request) -> int:
    """A fresh seed for this test (or LITETOPK_TEST_SEED), attached to the test's report."""
    fixed = os.environ.get("LITETOPK_TEST_SEED")
    value = int(fixed) if fixed else secrets.randbits(31)
    request.node.add_report_section("call", "seed", f"seed={value} (replay: LITETOPK_TEST_SEED={value})")
    return value
