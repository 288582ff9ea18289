"""litetopk.kernels: the exact top-k index selection operator (LiteTopK) with its backends.

The layers, top to bottom; a module imports only modules below it (or beside it on its floor,
without a cycle), never one above, lazily or not (tests/kernels/test_import_graph.py keeps it so):

    public face   __init__.py   this curated namespace (__all__)
                  graphs.py     LiteTopKGraphs: the operator replayed from per-signature CUDA graphs
                  adapters.py   sglang / vLLM tensors -> the operator, zero copy
                  aiter.py      the drop-in for AITER's FP4 LiteTopK operator
                  operator.py   litetopk_prefill, dense_topk_prefill: eager, or the ops under torch.compile
                  ops.py        the torch.library custom ops (litetopk::prefill, ...) with fake
                                implementations, and the implementation they run
                  workspace.py  workspace_bytes / allocate_workspace (sizing: it runs the pipeline)
                  registry.py   the backend registry (BACKEND_NAMES, get_backend, resolve_backend)
                  compile/      offline builds for sm_90 and gfx950 (python -m ...; CI's ISA checks)
    method        pipeline.py   the LiteTopK method and the dense baseline, shared by every backend
    stages        validation.py  row_checks.py  calibration.py  certify.py  repair.py  selection.py
                  dense_selection.py  assembly.py: each one file with its torch code, its Triton
                  twin and the line that picks between them (devices.runs_triton_stages)
    backends      backend.py    ScoringBackend, CandidateScan: what differs per device
                  reference.py  exact torch scoring, any device
                  triton/       Triton scoring on NVIDIA (operands, schedule, Gluon / Triton kernels)
                  flydsl/       FlyDSL scoring on AMD gfx950
    types and     problem.py (PrefillProblem), keys.py (ordering keys, torch and Triton),
    formats       mxfp4.py, cache_layout.py, aiter_layout.py, result.py, status.py, errors.py,
                  devices.py, profiling.py, problems.py (random_problem), scratch.py (the allocator)
"""

from .cache_layout import PAGE_BYTES, PAGE_SIZE, pack_kv_cache, unpack_kv_cache
from .errors import (
    BackendUnavailableError,
    DeviceError,
    InputDtypeError,
    InputError,
    InputShapeError,
    LiteTopKError,
    RowFaultError,
    UnsupportedTopKError,
)
from .graphs import LiteTopKGraphs
from .mxfp4 import dequantize_mxfp4, quantize_mxfp4
from .operator import BACKEND_NAMES, dense_topk_prefill, litetopk_prefill, resolve_backend
from .pipeline import LiteTopKTuning
from .problems import random_problem
from .result import TopKResult
from .status import RowStatus
from .validation import SUPPORTED_TOPK
from .workspace import allocate_workspace, workspace_bytes

__all__ = [
    "BACKEND_NAMES",
    "PAGE_BYTES",
    "PAGE_SIZE",
    "SUPPORTED_TOPK",
    "BackendUnavailableError",
    "DeviceError",
    "InputDtypeError",
    "InputError",
    "InputShapeError",
    "LiteTopKError",
    "LiteTopKGraphs",
    "LiteTopKTuning",
    "RowFaultError",
    "RowStatus",
    "TopKResult",
    "UnsupportedTopKError",
    "allocate_workspace",
    "dense_topk_prefill",
    "dequantize_mxfp4",
    "litetopk_prefill",
    "pack_kv_cache",
    "quantize_mxfp4",
    "random_problem",
    "resolve_backend",
    "unpack_kv_cache",
    "workspace_bytes",
]
