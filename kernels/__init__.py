"""litetopk.kernels: MXFP4 codec, paged cache layout, and the top-k operator with its backends.

Pipeline, one module a stage: mxfp4 (codec) -> cache_layout (pages) -> validation (one layer for
every backend) -> backends (reference.py, triton/, flydsl/) -> pipeline (LiteTopK method and
dense baseline, shared) -> selection (exact top-K and page mapping, shared) -> operator (public);
workspace holds a call's intermediate buffers (allocate_workspace / workspace_bytes: caller-owned);
graphs replays the operator from per-signature CUDA graphs (LiteTopKGraphs: host time off the call);
devices holds the vendor checks (is_cuda, is_gfx950) every layer uses.
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
