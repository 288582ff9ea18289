"""Profiler ranges around the pipeline's stages (bench/probes/stage_timeline.py reads them).

Layer: utilities, at the bottom of `litetopk.kernels` (imports torch only).

`stage_range("litetopk.<stage>")` is torch.profiler.record_function while a torch profiler is
recording and a no-op otherwise: an idle range still costs ~10-15 us of host time to enter and
leave, ~0.2 ms over a call's ten ranges, on the host path before the scan.
"""

from __future__ import annotations

import contextlib

import torch
from torch.profiler import record_function


def stage_range(name: str):
    """A profiler range named `name` while torch's profiler records, else a null context."""
    if torch._C._autograd._profiler_enabled():
        return record_function(name)
    return contextlib.nullcontext()
