"""Value top-k of a dense float32 score matrix by a library selector (the dense baseline only).

`select_topk_dense` (selection.py) asks a selector for the k+1 largest values of each row, sorted
descending, with their column indices; ties across the k-th place are then settled exactly with
ordering keys, so every selector gives the same answer.

    flashinfer_topk   FlashInfer's radix top-k (`flashinfer.top_k(input, k, sorted=True)`), from
                      flashinfer-python 0.6.18 (H200-NOTES.md: wheels with --no-deps, a ~250 s
                      JIT compile on the first call, FLASHINFER_WORKSPACE_BASE keeps it)
"""

from __future__ import annotations

import torch

from .errors import BackendUnavailableError


def flashinfer_topk(scores: torch.Tensor, take: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values float32 [rows, take] sorted descending, positions int64 [rows, take]) by FlashInfer.

    Raises BackendUnavailableError when flashinfer is not installed or the tensor is not on CUDA
    (the dense baseline never falls back to another selector).
    """
    try:
        import flashinfer
    except ImportError as exc:
        raise BackendUnavailableError(
            "selector='flashinfer' needs the flashinfer-python package (0.6.18 was measured on the H200); "
            "use selector='torch' where it is not installed"
        ) from exc
    if scores.device.type != "cuda":
        raise BackendUnavailableError(f"selector='flashinfer' runs on CUDA tensors, got {scores.device}")
    values, positions = flashinfer.top_k(scores, take, sorted=True)
    return values, positions.long()
