"""FlyDSL backend: the fused MXFP4 scoring + filter kernel for gfx950 (MI350X / MI355X).

Layer: backends (flydsl/; the operator's registry loads it). compile/gfx950.py builds its kernels
without a device.

Compiled for gfx950 here (CI compiles every FlyDSL kernel with COMPILE_ONLY=1, ARCH=gfx950 and
checks the final ISA); it has not been executed on a gfx950 device by this project. A user with
an MI355X verifies it with the commands in README.md, "gfx950 backend (FlyDSL)".

    FlyDSLBackend            the ScoringBackend: check_device, score_dense, scan_candidates
    score_fp4.py             the kernel (math, tiling, limits, precision bound in its docstring)
    key_addressing.py        where the kernel reads a key in either cache format (no flydsl needed)

The cache is read in place in either format ("litetopk" at any 4-byte-aligned page stride, or
AITER's kv_cache / kv_scale pair, each at its own stride): the format is a compile-time constant
of the kernel (compiled_configurations), the page strides launch arguments (launch_arguments).

Only the scoring runs here; calibration, certificate, selection, page mapping and repair are the
shared code of pipeline.py and its stages. `check_device` raises BackendUnavailableError on any
device that is not a ROCm gfx950 device, or when flydsl is missing; there is no fallback.
"""

from __future__ import annotations

import torch

from ..backend import CandidateScan, ScoringBackend, self_calibration_unavailable
from ..cache_layout import CACHE_FORMATS
from ..devices import is_gfx950
from ..errors import BackendUnavailableError
from ..keys import NO_KEY
from ..problem import PrefillProblem
from .key_addressing import cache_operands

#: What this backend needs, in the words of its errors.
REQUIREMENT = "a ROCm device of architecture gfx950 (AMD MI350X / MI355X) and the flydsl package (0.4.2)"


def _kernel_module():
    """The kernel module (imports flydsl); BackendUnavailableError when flydsl is missing."""
    try:
        from . import score_fp4
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend='flydsl' needs {REQUIREMENT}; flydsl cannot be imported: {exc}"
        ) from exc
    return score_fp4


class FlyDSLBackend(ScoringBackend):
    """Scaled-FP4-MFMA scoring on gfx950; see the module docstring and score_fp4.py."""

    name = "flydsl"

    def check_device(self, device: torch.device) -> None:
        if not is_gfx950(device):
            vendor = (
                ("ROCm " + torch.cuda.get_device_properties(device).gcnArchName if torch.version.hip else "NVIDIA CUDA")
                if device.type == "cuda"
                else ""
            )
            found = device.type if device.type != "cuda" else f"{device} ({vendor})"
            raise BackendUnavailableError(f"backend='flydsl' needs {REQUIREMENT}; the inputs are on {found}")
        _kernel_module()

    def _launch(self, problem: PrefillProblem, **buffers) -> None:
        arguments = launch_arguments(problem, **buffers)
        if arguments is not None:
            _kernel_module().score_fp4_flydsl(**arguments, stream=_stream(problem.device))

    def score_dense(self, problem: PrefillProblem, stride: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores float32 [rows, ceil(max_end / stride)], column c = position c * stride, -inf
        outside windows; nonfinite bool [rows])."""
        scratch = problem.scratch  # every buffer from the caller's workspace when there is one
        rows = problem.num_rows
        columns = -(-problem.max_end // stride)
        scores = scratch.full((rows, columns), float("-inf"), torch.float32)
        nonfinite = scratch.zeros(rows, torch.int32)
        unused = scratch.zeros(max(rows, 1), torch.int64)
        self._launch(
            problem,
            scan=False,
            out=scores,
            out_cols=columns,
            stride=stride,
            thresholds_in=unused,
            thresholds=unused,
            appended=unused,
            histogram=scratch.zeros(1, torch.int32),
            nonfinite=nonfinite,
        )
        return scores, nonfinite.bool()

    def scan_candidates(
        self,
        problem: PrefillProblem,
        thresholds: torch.Tensor,
        capacity: int,
        ceilings: torch.Tensor | None = None,
        sample_size: int = 0,
    ) -> CandidateScan:
        """Fused scan (score_fp4.py, SCAN=True) of every position of each window; the kernel
        ranges its histogram from the threshold itself and does not use `ceilings`. No
        self-calibrating scan (`sample_size` > 0 raises)."""
        if sample_size or thresholds is None:
            raise self_calibration_unavailable(self)
        scratch = problem.scratch  # every buffer from the caller's workspace when there is one
        rows = problem.num_rows
        keys = scratch.full((rows, capacity), NO_KEY, torch.int64)
        appended = scratch.zeros(rows, torch.int64)
        raised = scratch.empty(rows, torch.int64).copy_(thresholds)
        histogram = scratch.zeros(rows * 64, torch.int32)
        nonfinite = scratch.zeros(rows, torch.int32)
        self._launch(
            problem,
            scan=True,
            out=keys,
            out_cols=capacity,
            stride=1,
            thresholds_in=thresholds.to(torch.int64).contiguous(),
            thresholds=raised,
            appended=appended,
            histogram=histogram,
            nonfinite=nonfinite,
        )
        return CandidateScan(keys=keys, appended=appended, thresholds=raised, nonfinite=nonfinite.bool())


def launch_arguments(
    problem: PrefillProblem,
    *,
    scan: bool,
    out: torch.Tensor,
    out_cols: int,
    stride: int,
    thresholds_in: torch.Tensor,
    thresholds: torch.Tensor,
    appended: torch.Tensor,
    histogram: torch.Tensor,
    nonfinite: torch.Tensor,
) -> dict | None:
    """The arguments of score_fp4.score_fp4_flydsl, by name, for one call over `problem` (None when
    there is nothing to score): the cache of either format is passed in place as the operands of
    key_addressing.cache_operands (InputError for value pages that are not 4-byte aligned), its
    format as the compile-time CACHE_FORMAT."""
    rows = problem.num_rows
    sampled = -(-problem.max_end // stride)
    if rows == 0 or sampled == 0:
        return None
    kernel = _kernel_module()
    value_words, scale_bytes, value_page_words, scale_page_stride = cache_operands(problem.cache)
    return dict(
        q_words=problem.q_fp4.view(torch.int32).reshape(-1),
        q_scale_words=problem.q_scale.view(torch.int32).reshape(-1),
        kv_value_words=value_words,
        kv_scale_bytes=scale_bytes,
        block_table=problem.block_table.reshape(-1),
        weights=problem.weights.reshape(-1),
        row_to_batch=problem.row_to_batch,
        starts=problem.starts,
        ends=problem.ends,
        out=out.reshape(-1),
        thresholds_in=thresholds_in,
        thresholds=thresholds,
        appended=appended,
        histogram=histogram,
        nonfinite=nonfinite,
        num_rows=rows,
        max_pages=problem.block_table.shape[1],
        value_page_words=value_page_words,
        scale_page_stride=scale_page_stride,
        out_cols=out_cols,
        stride=stride,
        topk=problem.topk,
        weight_scale=float(torch.tensor(problem.weight_scale, dtype=torch.float32)),
        grid_x=-(-rows // kernel.WAVES_PER_BLOCK),
        grid_y=-(-sampled // kernel.KEYS_PER_CHUNK),
        SCAN=scan,
        CACHE_FORMAT=problem.cache.format,
    )


def _stream(device: torch.device):
    """The FlyDSL stream of `device`'s current stream; none for the CPU placeholders of the
    compile-only build (compile/gfx950.py), which launches nothing."""
    import flydsl.expr as fx

    return fx.Stream(torch.cuda.current_stream(device) if device.type == "cuda" else None)


def compiled_configurations() -> tuple[dict, ...]:
    """The fixed configurations compiled per process (the JIT caches one binary for each): the
    dense and the scan epilogue, each for both cache formats."""
    return tuple(
        {"SCAN": scan, "CACHE_FORMAT": cache_format} for cache_format in CACHE_FORMATS for scan in (False, True)
    )


__all__ = ["REQUIREMENT", "FlyDSLBackend", "compiled_configurations", "launch_arguments"]
