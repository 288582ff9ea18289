"""Session-wide test settings.

Where no CUDA device exists, Triton kernels run in Triton's CPU interpreter: TRITON_INTERPRET=1
must be set before any kernel module is imported (the @triton.jit decorator reads it), so it is
set here, first. On a machine with a GPU the same tests run the compiled kernels.
GPU-only tests are marked `gpu` and reported as skipped (with the reason) where there is none.
"""

from __future__ import annotations

import os

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
