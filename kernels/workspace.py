"""Workspace sizing: the bytes of a caller-owned workspace that serves every call within bounds.

Layer: public face (it runs the pipeline to measure, with a backend from registry.py). The workspace
itself is carved by scratch.Scratch (the allocator at the bottom of the package, which says what a
workspace holds); here:

    workspace_bytes(max_rows, max_seq_len, topk, *, device, ...)     the bytes, measured
    allocate_workspace(...)                                          a uint8 tensor of that size

Sizing is measured, not restated: the operator's pipeline itself runs at the bounds (rows with
empty windows: the buffers' shapes come from shapes and bounds only, never from the data) and
Scratch counts the bytes carved (`Scratch.used`). Every buffer grows with rows, sequences and the
window bound, except where the calibration changes its sample shape: at the window bounds below
`max_seq_len` where the stride changes (`calibration.shape_changes`), and, where the candidate buffer
holds the windows (a decode call), at the rows below the path's most where the sample's size changes
(`calibration.sample_size_for`: few rows sample more densely; `calibration.sample_size_changes`). The
run is repeated at each such (rows, bound) and the largest count is the answer (also with
LiteTopKTuning(calibration="scan"), whose scan has no sample: a backend may still calibrate some calls
from the sample stage, ScoringBackend.calibration_for). A backend with several scoring paths (the Triton
backend's prefill and paged modes) is run at each path's largest call (ScoringBackend.sizing_calls).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .cache_layout import PAGE_BYTES, PAGE_SIZE
from .calibration import sample_size_changes, shape_changes
from .errors import InputError
from .pipeline import LiteTopKTuning, run_dense, run_litetopk
from .problem import PrefillProblem
from .registry import new_backend, on_device
from .scratch import ALIGNMENT
from .validation import check_topk, validate_prefill


def workspace_bytes(
    max_rows: int,
    max_seq_len: int,
    topk: int | Sequence[int],
    *,
    device,
    backend: str = "auto",
    tuning=None,
    dense: bool = False,
    max_batch: int = 1,
) -> int:
    """Bytes of a workspace that serves every call within the bounds: exact, measured.

    The largest call within the bounds carves exactly this many bytes: the call at the bounds, or one
    at a bound below max_seq_len where the calibration sample changes shape (module docstring:
    measured by running the pipeline on `device`, a few launches with empty windows; call it once,
    outside graph capture).

    Parameters
    ----------
    max_rows : int
        The most query rows of a call.
    max_seq_len : int
        The largest window bound of a call: max_end = min(its max_seq_len argument,
        block_table.shape[1] * 64) <= max_seq_len.
    topk : int or sequence of int
        The K of the calls (any of a sequence), each in SUPPORTED_TOPK.
    device : torch.device or str
        Where the calls run.
    backend : str
        The calls' backend (default "auto": the one it resolves to on `device`).
    tuning : LiteTopKTuning, optional
        The calls' tuning (default: the production settings).
    dense : bool
        Size for `dense_topk_prefill` (the score matrix) instead of `litetopk_prefill`.
    max_batch : int
        The most block-table rows (sequences) of a call (default 1).

    Returns
    -------
    int
        The bytes. Raises InputError for a bound out of range.

    Example
    -------
    >>> nbytes = workspace_bytes(64, 8192, (512, 1024), device="cpu", max_batch=4)
    >>> nbytes > 0
    True
    """
    ks = (topk,) if isinstance(topk, int) else tuple(topk)
    for k in ks:
        check_topk(k)
    for name, value, least in (("max_rows", max_rows, 0), ("max_seq_len", max_seq_len, 0), ("max_batch", max_batch, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InputError(f"{name} must be an int >= {least}, got {value!r}")
    device = torch.device(device)
    tuning = tuning or LiteTopKTuning()
    chosen = new_backend(backend, device)  # its own instance: the dry runs' operands are not kept around
    with on_device(device, chosen):
        return max(
            _bytes_at(variant, run_rows, batch, max_seq_len, end, k, device, tuning, dense)
            for variant, rows, batch in chosen.sizing_calls(max_rows, max_batch)
            for run_rows, k, end in _runs(variant, rows, batch, max_seq_len, ks, device, tuning, dense)
        )


def allocate_workspace(
    max_rows: int,
    max_seq_len: int,
    topk: int | Sequence[int],
    *,
    device,
    backend: str = "auto",
    tuning=None,
    dense: bool = False,
    max_batch: int = 1,
) -> torch.Tensor:
    """A workspace for every call within the bounds: pass it as `workspace=` to those calls, one call at
    a time (litetopk_prefill, dense_topk_prefill with dense=True, LiteTopKGraphs).

    Parameters
    ----------
    max_rows, max_seq_len, topk, device, backend, tuning, dense, max_batch
        As workspace_bytes: the bounds of the calls.

    Returns
    -------
    torch.Tensor
        uint8 [workspace_bytes(...)] on `device`, its start aligned to ALIGNMENT (256) bytes.

    Example
    -------
    >>> from litetopk.kernels import litetopk_prefill, random_problem
    >>> p = random_problem(rows=4, keys=2000, topk=512)
    >>> workspace = allocate_workspace(4, p.block_table.shape[1] * 64, 512, device="cpu")
    >>> result = litetopk_prefill(*p.args(), topk=512, workspace=workspace)
    >>> result.status.tolist()
    [0, 0, 0, 0]
    """
    nbytes = workspace_bytes(
        max_rows, max_seq_len, topk, device=device, backend=backend, tuning=tuning, dense=dense, max_batch=max_batch
    )
    raw = torch.empty(nbytes + ALIGNMENT, dtype=torch.uint8, device=device)
    start = -raw.data_ptr() % ALIGNMENT  # CPU tensors start on 64 bytes, CUDA ones on 512
    return raw[start : start + nbytes]


def _runs(
    backend, rows: int, batch: int, max_seq_len: int, ks: tuple[int, ...], device: torch.device, tuning, dense: bool
) -> list[tuple[int, int, int]]:
    """(rows, K, window bound) of the calls run for one sizing call (`backend` at `rows` rows over `batch`
    sequences: the largest call of one scoring path, ScoringBackend.sizing_calls), whose largest count
    bounds every call of that path within the bounds. The dense path: the bounds. LiteTopK: the calls where
    the calibration sample changes shape. Its size depends on the rows where the candidate buffer holds the
    windows (calibration.sample_size_for: a decode call of few rows samples more densely), so for each
    sample size the call's path can take, the most rows that take it (calibration.sample_size_changes), each
    at every window bound where that sample's stride changes (calibration.shape_changes). A self-calibrating
    scan has no sample, but a backend may calibrate some calls from the sample stage all the same
    (ScoringBackend.calibration_for): those bounds are run for it too. With LiteTopKTuning.dense_route_bytes,
    the dense route's largest calls as well: a routed call carves its score matrix (4 bytes a key), which can
    exceed what the scan carves at the same call where the tuning caps the candidate buffer
    (candidate_capacity); a run point the route takes is measured routed (run_litetopk decides)."""
    if dense:
        return [(rows, k, max_seq_len) for k in ks]
    # the path's mode, from a problem at its bounds (the same for its calls of fewer rows and sequences)
    holds_windows = rows > 0 and backend.buffers_hold_windows(
        _problem(rows, batch, max_seq_len, max_seq_len, ks[0], device)
    )
    runs = [
        (run_rows, k, end)
        for run_rows, sample_size in sample_size_changes(rows, tuning.sample_size, holds_windows)
        for k in ks
        for end in shape_changes(max_seq_len, sample_size, k)
    ]
    if not tuning.dense_route_bytes:
        return runs
    # The dense route's calls: what one carves grows with its rows and its window bound, and its score matrix
    # (rows x bound x 4 bytes) is at most dense_route_bytes, so its largest call lies at an end of that curve: its
    # most rows at the window bound, or the path's most rows at the longest bound the route takes with them.
    route_rows = min(rows, tuning.dense_route_bytes // (4 * max_seq_len))
    route_end = min(max_seq_len, tuning.dense_route_bytes // (4 * rows)) if rows else 0
    routed = [(r, e) for r, e in ((route_rows, max_seq_len), (rows, route_end)) if r and e]
    return runs + [
        (run_rows, k, end)
        for run_rows, end in routed
        for k in ks
        if tuning.takes_dense_route(run_rows, end, holds_windows)
    ]


def _problem(rows: int, batch: int, table_end: int, max_end: int, k: int, device: torch.device) -> PrefillProblem:
    """A validated call of `rows` empty rows over `batch` sequences, window bound `max_end` (what a call
    carves follows from these shapes and bounds alone, never from the data)."""

    def zeros(*shape, dtype=torch.int32):
        return torch.zeros(shape, dtype=dtype, device=device)

    return validate_prefill(
        zeros(rows, 64, 64, dtype=torch.uint8),
        torch.full((rows, 64, 4), 127, dtype=torch.uint8, device=device),
        zeros(1, PAGE_BYTES, dtype=torch.uint8),
        zeros(batch, max(1, -(-table_end // PAGE_SIZE))),
        zeros(rows, 64, dtype=torch.float32),
        zeros(rows),
        zeros(rows),
        zeros(rows),
        topk=k,
        max_seq_len=max_end,
    )


def _bytes_at(
    backend, rows: int, batch: int, table_end: int, max_end: int, k: int, device: torch.device, tuning, dense: bool
) -> int:
    """Scratch.used of one call of `rows` empty rows over `batch` sequences, window bound `max_end`."""
    problem = _problem(rows, batch, table_end, max_end, k, device)
    if dense:
        run_dense(problem, backend, selector="torch")
    else:
        run_litetopk(problem, backend, repair=True, tuning=tuning)
    return problem.scratch.used


__all__ = ["allocate_workspace", "workspace_bytes"]
