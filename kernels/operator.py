"""The public operator: validation, then one backend, then the shared pipeline.

Layer: public face (graphs.py, adapters.py, aiter.py and workspace.py build on it). It imports the
method (pipeline.py), the first stage (validation.py) and, through the backend registry, the
backends (each loaded on first use: get_backend / new_backend).

    litetopk_prefill(...)   the fused LiteTopK method (pipeline.run_litetopk)
    dense_topk_prefill(...) the dense baseline (pipeline.run_dense)

`backend` is one of BACKEND_NAMES. "auto" picks by the inputs' device: a CUDA (NVIDIA) device ->
"triton", a ROCm gfx950 device -> "flydsl", anything else -> "reference". A backend that cannot
run raises BackendUnavailableError; no request is ever served by another backend than the one
asked for. Device, driver and compiler failures leave as DeviceError (raised from the original).
Every call runs on the inputs' device (made current for the call), on the current stream.
"""

from __future__ import annotations

import contextlib

import torch

from .backend import ScoringBackend
from .devices import is_cuda, is_gfx950
from .errors import DeviceError, InputError, LiteTopKError
from .pipeline import LiteTopKTuning, run_dense, run_litetopk
from .result import TopKResult
from .validation import validate_prefill

BACKEND_NAMES = ("auto", "reference", "triton", "flydsl")


def _load_backend(name: str) -> ScoringBackend:
    if name == "reference":
        from .reference import ReferenceBackend

        return ReferenceBackend()
    if name == "triton":
        from .triton import TritonBackend

        return TritonBackend()
    if name == "flydsl":
        from .flydsl import FlyDSLBackend

        return FlyDSLBackend()
    raise InputError(f"backend={name!r} is not known; choose one of {BACKEND_NAMES}")


_BACKENDS: dict[str, ScoringBackend] = {}


def _resolve(name: str, device: torch.device) -> str:
    if name == "auto":
        return "triton" if is_cuda(device) else "flydsl" if is_gfx950(device) else "reference"
    return name


@contextlib.contextmanager
def backend_instance(name: str, backend: ScoringBackend):
    """Inside the block, calls with backend=`name` ("auto" resolving to it included) run `backend` (e.g.
    TritonBackend(paged="never"): one mode of a backend for a probe or a benchmark); the previous
    instance is back afterwards, whatever happens inside. Not thread-safe (the registry is global)."""
    had, previous = name in _BACKENDS, _BACKENDS.get(name)
    _BACKENDS[name] = backend
    try:
        yield backend
    finally:
        if had:
            _BACKENDS[name] = previous
        else:
            _BACKENDS.pop(name, None)


def get_backend(name: str, device: torch.device) -> ScoringBackend:
    """The backend `name` ("auto" resolved for `device`), checked to run on `device`."""
    name = _resolve(name, device)
    if name not in _BACKENDS:
        _BACKENDS[name] = _load_backend(name)
    backend = _BACKENDS[name]
    backend.check_device(device)
    return backend


def new_backend(name: str, device: torch.device) -> ScoringBackend:
    """A new instance of the backend `name` ("auto" resolved for `device`), checked to run on `device`
    (workspace sizing: its cached operands go with it, not with the shared instance)."""
    backend = _load_backend(_resolve(name, device))
    backend.check_device(device)
    return backend


def resolve_backend(name: str, device: torch.device) -> str:
    """The backend name `name` stands for on `device` ("auto" resolved), checked to run there
    (BackendUnavailableError otherwise): what a service reports as the backend it serves with."""
    return get_backend(name, device).name


@contextlib.contextmanager
def on_device(device: torch.device, backend: ScoringBackend):
    """Make `device` current and translate foreign failures into DeviceError."""
    guard = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
    try:
        with guard:
            yield
    except LiteTopKError:
        raise
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
        raise DeviceError(f"the {backend.name} backend failed on {device}: {exc}") from exc


def litetopk_prefill(
    q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends, *,
    topk: int, weight_scale: float = 1.0, backend: str = "auto", repair: bool = True,
    tuning: LiteTopKTuning | None = None, out: dict | None = None, max_seq_len: int | None = None,
    kv_scale: torch.Tensor | None = None,
    check: bool = False, workspace: torch.Tensor | None = None,
) -> TopKResult:
    """Top-`topk` keys of every query row by the fused LiteTopK method (docs/contract.md §1-§4).

    Inputs as in docs/contract.md §2: q_fp4 uint8 [rows, 64, 64], q_scale uint8 [rows, 64, 4],
    kv_cache uint8 [num_pages, 4352] (any view of 4352-byte pages lying stride(0) >= 4352 bytes
    apart), or with `kv_scale` AITER's pair kv_cache [num_pages, 1, 4, 64, 16] / kv_scale
    [num_pages, 1, 4, 64] (docs/cache-layouts.md), read in place; block_table int32 [batch,
    max_pages], weights float32 or bfloat16 [rows, 64], row_to_batch / starts / ends int32 [rows],
    all on one device. Both cache formats of the same keys give the same result bit for bit.
    Returns a TopKResult equal, bit for bit, to `dense_topk_prefill` with the same backend.
    Raises InputError for malformed arguments and BackendUnavailableError / DeviceError as the
    module docstring says; row faults are status bits (`result.raise_for_status()` raises them).

    Embedding (docs/operator-embedding.md): the call runs on the current stream and never waits
    for the device (no host round trip; capturable in a CUDA graph with fixed shapes).
    `out` maps result field names to caller-owned tensors (any strides, e.g. `buf[a:b, :K]`),
    written in place and returned in the result; they may not overlap the inputs or each other.
    `max_seq_len` bounds every window end (rows beyond it are INVALID_ROW); buffers, grids and the
    calibration stride are sized from it (default max_pages * 64: pass it when the block table is
    much wider than the longest window). `check=True` is the one synchronizing convenience: it
    repairs any capacity events left beyond the device repair's capacity, then raises RowFaultError
    for faulty rows (never use it under graph capture). `workspace` (allocate_workspace / workspace_bytes:
    a uint8 device tensor, reused across calls, one call at a time) holds every explicit intermediate
    buffer of the call (kernels/scratch.py says which); without it they come from torch's allocator.
    """
    problem = validate_prefill(
        q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends,
        topk=topk, weight_scale=weight_scale, max_seq_len=max_seq_len, kv_scale=kv_scale, out=out, workspace=workspace,
    )
    chosen = get_backend(backend, problem.device)
    with on_device(problem.device, chosen):
        return run_litetopk(problem, chosen, repair=repair, tuning=tuning or LiteTopKTuning(), out=out, check=check)


def dense_topk_prefill(
    q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends, *,
    topk: int, weight_scale: float = 1.0, backend: str = "auto", selector: str = "torch",
    out: dict | None = None, max_seq_len: int | None = None, kv_scale: torch.Tensor | None = None, check: bool = False,
    workspace: torch.Tensor | None = None,
) -> TopKResult:
    """The dense baseline: the full float32 [rows, max_end] score matrix, then an exact top-K.

    Same arguments and result as `litetopk_prefill`; `selector` picks the value top-k doing the
    bulk of the selection ("torch" or "flashinfer"); the answer does not depend on it. Its tie
    check reads tied rows on the host (the dense path is the baseline, not the embeddable op). Its
    `workspace` is sized with workspace_bytes(..., dense=True): it holds the score matrix.
    """
    problem = validate_prefill(
        q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends,
        topk=topk, weight_scale=weight_scale, max_seq_len=max_seq_len, kv_scale=kv_scale, out=out, workspace=workspace,
    )
    chosen = get_backend(backend, problem.device)
    with on_device(problem.device, chosen):
        return run_dense(problem, chosen, selector=selector, out=out, check=check)


__all__ = ["BACKEND_NAMES", "dense_topk_prefill", "get_backend", "is_cuda", "is_gfx950", "litetopk_prefill",
           "resolve_backend"]
