"""FlyDSL backend: the fused MXFP4 scoring + filter kernel for gfx950 (MI350X / MI355X).

Compiled for gfx950 here (CI compiles every FlyDSL kernel with COMPILE_ONLY=1, ARCH=gfx950 and
checks the final ISA); it has not been executed on a gfx950 device by this project. A user with
an MI355X verifies it with the commands in README.md, "gfx950 backend (FlyDSL)".

    FlyDSLBackend            the ScoringBackend: check_device, score_dense, scan_candidates
    score_fp4.py             the kernel (math, tiling, limits, precision bound in its docstring)
    compile.py               compile every kernel variant for gfx950 without a device (CI)

Only the scoring runs here; calibration, certificate, selection, page mapping and repair are the
shared code of pipeline.py / selection.py. `check_device` raises BackendUnavailableError on any
device that is not a ROCm gfx950 device, or when flydsl is missing; there is no fallback.
"""

from __future__ import annotations

import torch

from ..backend import CandidateScan, ScoringBackend
from ..devices import is_gfx950
from ..cache_layout import PAGE_BYTES
from ..errors import BackendUnavailableError, InputError
from ..selection import NO_KEY
from ..validation import PrefillProblem

#: What this backend needs, in the words of its errors.
REQUIREMENT = "a ROCm device of architecture gfx950 (AMD MI350X / MI355X) and the flydsl package (0.4.2)"


def _kernel_module():
    """The kernel module (imports flydsl); BackendUnavailableError when flydsl is missing."""
    try:
        from . import score_fp4
    except ImportError as exc:
        raise BackendUnavailableError(f"backend='flydsl' needs {REQUIREMENT}; flydsl cannot be imported: {exc}") from exc
    return score_fp4


class FlyDSLBackend(ScoringBackend):
    """Scaled-FP4-MFMA scoring on gfx950; see the module docstring and score_fp4.py."""

    name = "flydsl"

    def check_device(self, device: torch.device) -> None:
        if not is_gfx950(device):
            found = device.type if device.type != "cuda" else (
                f"{device} ({'ROCm ' + torch.cuda.get_device_properties(device).gcnArchName if torch.version.hip else 'NVIDIA CUDA'})"
            )
            raise BackendUnavailableError(f"backend='flydsl' needs {REQUIREMENT}; the inputs are on {found}")
        _kernel_module()

    def _launch(self, problem: PrefillProblem, *, scan: bool, out: torch.Tensor, out_cols: int, stride: int,
                thresholds_in: torch.Tensor, thresholds: torch.Tensor, appended: torch.Tensor,
                histogram: torch.Tensor, nonfinite: torch.Tensor) -> None:
        kernel = _kernel_module()
        cache = problem.cache
        if cache.format != "litetopk" or cache.value_page_stride != PAGE_BYTES:
            raise InputError(
                "the flydsl kernel reads our cache format with 4352-byte pages only (not yet AITER's "
                f"format or a page stride of {cache.value_page_stride} bytes); convert with "
                "litetopk_pages_from_aiter / .contiguous(), or use backend='reference'"
            )
        rows = problem.num_rows
        sampled = -(-problem.max_end // stride)
        if rows == 0 or sampled == 0:
            return
        grid_x = -(-rows // kernel.WAVES_PER_BLOCK)
        grid_y = -(-sampled // kernel.KEYS_PER_CHUNK)
        import flydsl.expr as fx

        stream = fx.Stream(torch.cuda.current_stream(problem.device))
        kernel.score_fp4_flydsl(
            problem.q_fp4.view(torch.int32).reshape(-1), problem.q_scale.view(torch.int32).reshape(-1),
            cache.values.reshape(-1).view(torch.int32), problem.block_table.reshape(-1),
            problem.weights.reshape(-1), problem.row_to_batch, problem.starts, problem.ends,
            out.reshape(-1), thresholds_in, thresholds, appended, histogram, nonfinite,
            rows, problem.block_table.shape[1], out_cols, stride, problem.topk,
            float(torch.tensor(problem.weight_scale, dtype=torch.float32)), grid_x, grid_y, scan,
            stream=stream,
        )

    def score_dense(self, problem: PrefillProblem, stride: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores float32 [rows, ceil(max_end / stride)], column c = position c * stride, -inf
        outside windows; nonfinite bool [rows])."""
        device = problem.device
        rows = problem.num_rows
        columns = -(-problem.max_end // stride)
        scores = torch.full((rows, columns), float("-inf"), dtype=torch.float32, device=device)
        nonfinite = torch.zeros(rows, dtype=torch.int32, device=device)
        unused = torch.zeros(max(rows, 1), dtype=torch.int64, device=device)
        self._launch(problem, scan=False, out=scores, out_cols=columns, stride=stride,
                     thresholds_in=unused, thresholds=unused, appended=unused,
                     histogram=torch.zeros(1, dtype=torch.int32, device=device), nonfinite=nonfinite)
        return scores, nonfinite.bool()

    def scan_candidates(
        self, problem: PrefillProblem, thresholds: torch.Tensor, capacity: int,
        ceilings: torch.Tensor | None = None,
    ) -> CandidateScan:
        """Fused scan (score_fp4.py, SCAN=True) of every position of each window; the kernel
        ranges its histogram from the threshold itself and does not use `ceilings`."""
        device = problem.device
        rows = problem.num_rows
        keys = torch.full((rows, capacity), NO_KEY, dtype=torch.int64, device=device)
        appended = torch.zeros(rows, dtype=torch.int64, device=device)
        raised = thresholds.to(torch.int64).clone()
        histogram = torch.zeros(rows * 64, dtype=torch.int32, device=device)
        nonfinite = torch.zeros(rows, dtype=torch.int32, device=device)
        self._launch(problem, scan=True, out=keys, out_cols=capacity, stride=1,
                     thresholds_in=thresholds.to(torch.int64).contiguous(), thresholds=raised,
                     appended=appended, histogram=histogram, nonfinite=nonfinite)
        return CandidateScan(keys=keys, appended=appended, thresholds=raised, nonfinite=nonfinite.bool())


def compiled_configurations() -> tuple[dict, ...]:
    """The fixed configurations compiled per process (the JIT caches one binary for each)."""
    return ({"SCAN": False}, {"SCAN": True})


__all__ = ["REQUIREMENT", "FlyDSLBackend", "compiled_configurations"]
