"""A drop-in for AITER's FP4 LiteTopK operator, on every backend (docs/cache-layouts.md).

Layer: public face (imports the operator, the workspace sizing and the formats).

Matched: ROCm/aiter `aiter/ops/flydsl/pa_mqa_litetopk_fp4.py` (PR #5309; stored version
c99a2abb973692e32519dc71533e86fd8e7d32a8) and its tests `op_tests/test_flydsl_pa_mqa_litetopk_fp4.py`.
A caller of `aiter.ops.flydsl.flydsl_pa_mqa_litetopk_fp4_prefill` imports the function of the same
name from here: same positional arguments, keywords and result fields (FP4LiteTopKResult), the
cache read in place in AITER's layout (kv_cache [pages, 1, 4, 64, 16], kv_scale [pages, 1, 4, 64]).

Status bits (ours -> AITER's), the same values where both have the bit:
    OVERFLOW 1          -> STATUS_CANDIDATE_OVERFLOW 1 | STATUS_BAD_CERTIFICATE 16   (repair=False)
    UNDERFILLED 2       -> STATUS_UNDERFILLED 2 | STATUS_BAD_CERTIFICATE 16         (repair=False)
    NONFINITE 4         -> STATUS_NONFINITE 4
    INVALID_PAGE 8      -> STATUS_INVALID_INDEX 8
    INVALID_ROW 16      -> STATUS_INVALID_INDEX 8   (also: a window ending past max_seq_len)
    SELECTOR_FAILURE 32 -> STATUS_SELECTOR_FAILURE 32
    SLOT_OVERFLOW 64    -> STATUS_INVALID_INDEX 8   (a physical slot AITER's int32 output cannot hold)
    UNSUPPORTED 128     -> STATUS_SELECTOR_FAILURE 32 (the triton backend cannot score the row exactly;
                           AITER has no such bit: the row published nothing, and says so)
With repair=True (the default) a capacity event is repaired by an exact rescan and the row is
published with status 0 (AITER fails such a row closed with its certificate bit).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .aiter_layout import unshuffle_q_scale_aiter
from .errors import InputError, RowFaultError
from .operator import litetopk_prefill
from .result import RESULT_FIELDS, TopKResult
from .status import RowStatus
from .validation import SUPPORTED_TOPK
from .workspace import allocate_workspace

FP4_LITETOPK_SUPPORTED_TOPKS = SUPPORTED_TOPK
DEFAULT_TOPK = 512
DEFAULT_SAMPLE_LEN = 8192
DEFAULT_NUM_BUCKETS = 256
DEFAULT_REFRESH_EVERY = 64
DEFAULT_MERGE_CAP = 196_608

STATUS_OK = 0
STATUS_CANDIDATE_OVERFLOW = 1 << 0
STATUS_UNDERFILLED = 1 << 1
STATUS_NONFINITE = 1 << 2
STATUS_INVALID_INDEX = 1 << 3
STATUS_BAD_CERTIFICATE = 1 << 4
STATUS_SELECTOR_FAILURE = 1 << 5

#: (our bit, AITER's bits) in the order of the module docstring's table.
STATUS_MAP = (
    (RowStatus.OVERFLOW, STATUS_CANDIDATE_OVERFLOW | STATUS_BAD_CERTIFICATE),
    (RowStatus.UNDERFILLED, STATUS_UNDERFILLED | STATUS_BAD_CERTIFICATE),
    (RowStatus.NONFINITE, STATUS_NONFINITE),
    (RowStatus.INVALID_PAGE, STATUS_INVALID_INDEX),
    (RowStatus.INVALID_ROW, STATUS_INVALID_INDEX),
    (RowStatus.SELECTOR_FAILURE, STATUS_SELECTOR_FAILURE),
    (RowStatus.SLOT_OVERFLOW, STATUS_INVALID_INDEX),
    (RowStatus.UNSUPPORTED, STATUS_SELECTOR_FAILURE),
)


class FP4LiteTopKResult(NamedTuple):
    """AITER's result fields: values float32 [rows, K], raw_indices / physical_indices int32
    [rows, K], counts / candidate_counts / status int32 [rows] (AITER's status bits)."""

    values: torch.Tensor
    raw_indices: torch.Tensor
    physical_indices: torch.Tensor
    counts: torch.Tensor
    candidate_counts: torch.Tensor
    status: torch.Tensor


@dataclass(frozen=True)
class FP4LiteTopKWorkspace:
    """What `allocate_fp4_litetopk_workspace` returns: the calls it serves (rows <= row_capacity, the
    same topk; checked as AITER's) and, when it was sized for a window bound, the operator's
    caller-owned workspace for them (`buffer`, kernels.workspace.allocate_workspace: every
    intermediate buffer of a call is carved from it; None: the call allocates its own)."""

    row_capacity: int
    topk: int
    device: torch.device
    buffer: torch.Tensor | None = None


def allocate_fp4_litetopk_workspace(
    rows: int,
    device,
    *,
    topk: int = DEFAULT_TOPK,
    max_seq_len: int | None = None,
    max_batch: int = 1,
    backend: str = "auto",
    **_aiter_sizes,
) -> FP4LiteTopKWorkspace:
    """AITER's workspace allocator's signature; see FP4LiteTopKWorkspace. With `max_seq_len` (and
    `max_batch` sequences) the workspace holds the operator's buffers for every call within those
    bounds (sized by running the operator once per calibration shape on `device`: seconds on a GPU
    at production sizes). One workspace serves one call at a time: calls on different streams need
    one each. `_aiter_sizes` takes AITER's other sizing keywords for signature compatibility; our
    operator sizes from the bounds above and does not use them. Raises InputError for rows <= 0 or
    an unsupported topk."""
    if rows <= 0:
        raise InputError(f"rows must be positive, got {rows}")
    if topk not in SUPPORTED_TOPK:
        raise InputError(f"topk={topk!r} is not supported; supported: {SUPPORTED_TOPK}")
    buffer = None
    if max_seq_len is not None:
        buffer = allocate_workspace(rows, max_seq_len, topk, device=device, backend=backend, max_batch=max_batch)
    return FP4LiteTopKWorkspace(row_capacity=rows, topk=topk, device=torch.device(device), buffer=buffer)


def aiter_status(status: torch.Tensor) -> torch.Tensor:
    """Our RowStatus bits int32 [rows] -> AITER's status bits int32 [rows] (module docstring)."""
    out = torch.zeros_like(status)
    for ours, theirs in STATUS_MAP:
        out |= torch.where((status & int(ours)) != 0, theirs, 0).to(status.dtype)
    return out


def _check_aiter_tuning(sample_len, num_buckets, refresh_every, merge_cap, max_seq_len, block_tables) -> None:
    fixed = {
        "sample_len": (sample_len, DEFAULT_SAMPLE_LEN),
        "num_buckets": (num_buckets, DEFAULT_NUM_BUCKETS),
        "refresh_every": (refresh_every, DEFAULT_REFRESH_EVERY),
        "merge_cap": (merge_cap, DEFAULT_MERGE_CAP),
    }
    for name, (got, want) in fixed.items():
        if got != want:
            raise InputError(f"{name}={got} is not supported; AITER's operator (and this drop-in) takes {name}={want}")
    if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or not 1 <= max_seq_len <= merge_cap:
        raise InputError(f"max_seq_len must be an int in [1, merge_cap={merge_cap}], got {max_seq_len!r}")
    if isinstance(block_tables, torch.Tensor) and block_tables.ndim == 2 and max_seq_len > block_tables.shape[1] * 64:
        raise InputError(
            f"max_seq_len={max_seq_len} exceeds block_tables capacity ({block_tables.shape[1]} pages of 64)"
        )


#: AITER's result field -> ours (RESULT_FIELDS): how results are returned and `out` is written.
_OUR_FIELD = {
    "values": "values",
    "raw_indices": "raw_indices",
    "physical_indices": "physical_indices",
    "counts": "counts",
    "candidate_counts": "candidates",
    "status": "status",
}


def _out_mapping(out: FP4LiteTopKResult | None, rows: int, topk: int, device) -> dict | None:
    """AITER's `out` tensors checked against each field's dtype and shape (InputError naming AITER's
    field), as litetopk_prefill's `out=` mapping; `status` is left out: it holds AITER's bits, mapped
    into it after the call."""
    if out is None:
        return None
    mapping = {}
    for name, dst in zip(FP4LiteTopKResult._fields, out):
        shape_of, dtype = RESULT_FIELDS[_OUR_FIELD[name]]
        shape = shape_of(rows, topk)
        if (
            not isinstance(dst, torch.Tensor)
            or dst.dtype != dtype
            or tuple(dst.shape) != shape
            or dst.device != torch.device(device)
        ):
            raise InputError(f"out.{name} must be {str(dtype).removeprefix('torch.')} {list(shape)} on {device}")
        if name != "status":
            mapping[_OUR_FIELD[name]] = dst
    return mapping


def flydsl_pa_mqa_litetopk_fp4_prefill(
    q_fp4,
    q_scale,
    kv_cache,
    kv_scale,
    block_tables,
    weights,
    row_to_batch,
    local_starts,
    local_ends,
    max_seq_len: int,
    *,
    topk: int = DEFAULT_TOPK,
    sample_len: int = DEFAULT_SAMPLE_LEN,
    num_buckets: int = DEFAULT_NUM_BUCKETS,
    refresh_every: int = DEFAULT_REFRESH_EVERY,
    merge_cap: int = DEFAULT_MERGE_CAP,
    weight_scale: float = 1.0,
    workspace: FP4LiteTopKWorkspace | None = None,
    out: FP4LiteTopKResult | None = None,
    stream: torch.cuda.Stream | None = None,
    enforce_status: bool = True,
    backend: str = "auto",
    repair: bool = True,
) -> FP4LiteTopKResult:
    """AITER's `flydsl_pa_mqa_litetopk_fp4_prefill`, answered by `litetopk_prefill`.

    Where we differ from AITER:
    - looser: runs on every backend (`backend`, "auto" by device), not only gfx950; caches whose
      pages lie any stride(0) apart; float32 weights; our own cache format when kv_scale is None;
      capacity events repaired exactly (repair=True) instead of failing the row closed.
    - stricter: none of AITER's tuning knobs other than its defaults (as AITER); `out` is checked
      for dtype/shape/device but need not alias a workspace.
    - the same: a window ending past `max_seq_len` or a bad batch / page fails only that row
      (STATUS_INVALID_INDEX); `enforce_status=True` asserts every row is OK on the device
      (`torch._assert_async`, no host sync) or, on the CPU, raises RowFaultError.
    - `workspace` checks the call's shape and, when allocated with max_seq_len, is the operator's
      workspace; `out` fields are written in place by the operator (status: AITER's bits, copied in);
      q_scale is unshuffled into a new rows x 256-byte tensor (the cache, q_fp4, weights and
      metadata are not copied).

    Parameters
    ----------
    q_fp4 : torch.Tensor
        uint8 [rows, 64, 64]: packed E2M1 queries.
    q_scale : torch.Tensor
        uint8 [rows, 1, 4, 16, 4]: UE8M0 query scales in AITER's head shuffle.
    kv_cache, kv_scale : torch.Tensor
        AITER's cache, uint8 [pages, 1, 4, 64, 16] and [pages, 1, 4, 64], read in place (kv_scale
        None: kv_cache is in our format).
    block_tables : torch.Tensor
        int32 [batch, max_pages] (guard columns past max_seq_len, as AITER's callers append, are
        never read).
    weights : torch.Tensor
        bfloat16 (or float32) [rows, 64]: head weights.
    row_to_batch, local_starts, local_ends : torch.Tensor
        int32 [rows]: each row's sequence and window.
    max_seq_len : int
        The static window bound.
    topk : int
        K, in FP4_LITETOPK_SUPPORTED_TOPKS (default 512).
    sample_len, num_buckets, refresh_every, merge_cap
        AITER's tuning knobs: only their defaults are accepted.
    weight_scale : float
        As litetopk_prefill.
    workspace : FP4LiteTopKWorkspace, optional
        From allocate_fp4_litetopk_workspace.
    out : FP4LiteTopKResult, optional
        Caller-owned result fields, written in place.
    stream : torch.cuda.Stream, optional
        The stream of the call (default: the current one).
    enforce_status : bool
        Assert every row is OK (default True; above).
    backend, repair
        As litetopk_prefill.

    Returns
    -------
    FP4LiteTopKResult
        values, raw_indices, physical_indices, counts, candidate_counts and status with AITER's
        status bits (module docstring), written into `out` when given.

    Example
    -------
    >>> from litetopk.kernels import random_problem
    >>> from litetopk.kernels.aiter_layout import aiter_pages_from_litetopk, shuffle_q_scale_aiter
    >>> p = random_problem(rows=4, keys=[1500, 900], topk=512)
    >>> kv_cache, kv_scale = aiter_pages_from_litetopk(p.kv_cache)  # AITER's cache format
    >>> result = flydsl_pa_mqa_litetopk_fp4_prefill(
    ...     p.q_fp4, shuffle_q_scale_aiter(p.q_scale), kv_cache, kv_scale, p.block_table, p.weights,
    ...     p.row_to_batch, p.starts, p.ends, p.block_table.shape[1] * 64, topk=512)
    >>> result.status.tolist(), result.counts.tolist()
    ([0, 0, 0, 0], [512, 512, 512, 512])
    """
    if topk not in SUPPORTED_TOPK:
        raise InputError(f"FP4 LiteTopK requires topk in {SUPPORTED_TOPK}, got {topk}")
    _check_aiter_tuning(sample_len, num_buckets, refresh_every, merge_cap, max_seq_len, block_tables)
    if not isinstance(q_scale, torch.Tensor):
        raise InputError(f"q_scale must be a uint8 tensor, got {type(q_scale).__name__}")
    if workspace is not None and (workspace.row_capacity < q_scale.shape[0] or workspace.topk != topk):
        raise InputError("workspace is incompatible with this LiteTopK call (rows or topk)")
    guard = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    with guard:
        # A window past max_seq_len is a bad row (INVALID_ROW -> STATUS_INVALID_INDEX): validation's.
        device = q_fp4.device if isinstance(q_fp4, torch.Tensor) else torch.device("cpu")
        result = litetopk_prefill(
            q_fp4,
            unshuffle_q_scale_aiter(q_scale),
            kv_cache,
            block_tables,
            weights,
            row_to_batch,
            local_starts,
            local_ends,
            topk=topk,
            weight_scale=weight_scale,
            backend=backend,
            repair=repair,
            kv_scale=kv_scale,
            max_seq_len=max_seq_len,
            out=_out_mapping(out, q_scale.shape[0], topk, device),
            workspace=workspace.buffer if workspace is not None else None,
        )
        answer = as_aiter_result(result)
        if out is not None:  # every field but status was written in place; status gets AITER's bits
            out.status.copy_(answer.status)
            answer = answer._replace(status=out.status)
        if enforce_status:
            _enforce(answer.status)
    return answer


def as_aiter_result(result: TopKResult) -> FP4LiteTopKResult:
    """Our TopKResult as AITER's FP4LiteTopKResult (status bits mapped; no other copy)."""
    fields = {name: getattr(result, ours) for name, ours in _OUR_FIELD.items()}
    return FP4LiteTopKResult(**{**fields, "status": aiter_status(result.status)})


def _enforce(status: torch.Tensor) -> None:
    """Every row OK: a device-side assert on accelerators (no host sync), RowFaultError on the CPU."""
    if status.device.type != "cpu":
        torch._assert_async((status == 0).all(), "FP4 LiteTopK produced an invalid row")
        return
    rows = torch.nonzero(status).flatten().tolist()
    if rows:
        flags = status[rows].tolist()
        raise RowFaultError(
            f"FP4 LiteTopK produced {len(rows)} invalid row(s): rows {rows[:8]} (AITER status bits {flags[:8]})",
            rows,
            flags,
        )


__all__ = [
    "FP4_LITETOPK_SUPPORTED_TOPKS",
    "FP4LiteTopKResult",
    "FP4LiteTopKWorkspace",
    "STATUS_BAD_CERTIFICATE",
    "STATUS_CANDIDATE_OVERFLOW",
    "STATUS_INVALID_INDEX",
    "STATUS_NONFINITE",
    "STATUS_OK",
    "STATUS_SELECTOR_FAILURE",
    "STATUS_UNDERFILLED",
    "aiter_status",
    "allocate_fp4_litetopk_workspace",
    "as_aiter_result",
    "flydsl_pa_mqa_litetopk_fp4_prefill",
]
