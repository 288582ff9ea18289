"""Which accelerator a tensor lives on: the named vendor checks every layer uses.

Layer: utilities, at the bottom of `litetopk.kernels` (imports torch only).

torch calls both NVIDIA and ROCm devices "cuda"; these functions tell them apart.
"""

from __future__ import annotations

import torch


def is_cuda(device: torch.device) -> bool:
    """True for an NVIDIA CUDA device (not a ROCm device, which torch also calls 'cuda')."""
    return device.type == "cuda" and torch.version.hip is None


def is_gfx950(device: torch.device) -> bool:
    """True for a ROCm device of architecture gfx950 (MI350X / MI355X)."""
    if device.type != "cuda" or torch.version.hip is None:
        return False
    return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0] == "gfx950"


def runs_triton_stages(device: torch.device) -> bool:
    """The one decision of which code runs a pipeline stage that has a torch version and a Triton
    twin (row checks, calibration's order statistics, candidate selection, result assembly): the
    Triton kernel on an NVIDIA CUDA device, the torch code everywhere else (CPU, ROCm). Both give
    the same bits; CI runs the twins under TRITON_INTERPRET=1 against the torch code."""
    return is_cuda(device)
