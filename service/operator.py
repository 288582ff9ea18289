"""The operator as the device worker runs it: one workspace, one graph runner, one result buffer.

Built once per device on the worker thread (`DeviceExecutor.build_operator`), after the warm-up,
sized from the service's limits (max rows, max keys, max sequences, every supported K):

    workspace   allocate_workspace(...): every explicit intermediate buffer of a call;
    runner      LiteTopKGraphs over that workspace (settings `graphs`): a request shape seen
                before is replayed from its CUDA graph (host time off the call); a new shape is
                run and captured once. With graphs off, litetopk_prefill runs eagerly on the
                same workspace;
    results     (GPU only) one device buffer the result fields not written into the caller's
                device regions land in, before the one copy to the host answer;
    host_rows   (GPU only) one pinned host buffer the per-row fields read on the host after a
                call (status, repaired, candidates) are copied into on the call's stream, so
                that the one synchronization at the call's end brings them too.

Inputs reach the operator without an extra copy where the layout allows: device regions are passed
as they lie (the runner's one staging copy reads them); inputs that must move to the device (host
regions or inline metadata on a GPU service) are copied straight into the runner's own staging
buffers (`staging`), which it then does not copy again. No request allocates device memory
(a cache in host memory on a GPU service is the exception: it is copied per request; register
caches on the GPU). The runner holds references to the caches of its graphs: `invalidate()` (any
thread, e.g. when a region is retired) makes the worker drop every graph before its next call.
Not thread-safe otherwise: the worker thread alone calls it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from litetopk.kernels import SUPPORTED_TOPK, LiteTopKGraphs, TopKResult, allocate_workspace, litetopk_prefill

from .wire import RESULT_FIELDS, result_layout


@dataclass(frozen=True)
class WorkspaceLimits:
    """What the workspace is sized for (settings max_rows, max_keys, max_batch)."""

    max_rows: int
    max_keys: int
    max_batch: int


class DeviceOperator:
    """litetopk_prefill on one device within `limits` (module docstring)."""

    def __init__(
        self,
        device: torch.device,
        limits: WorkspaceLimits,
        backend: str,
        tuning=None,
        *,
        graphs: bool = True,
        max_graphs: int = 16,
    ):
        self.device, self.limits, self.backend, self.tuning = device, limits, backend, tuning
        self.workspace = allocate_workspace(
            limits.max_rows,
            limits.max_keys,
            SUPPORTED_TOPK,
            device=device,
            backend=backend,
            tuning=tuning,
            max_batch=limits.max_batch,
        )
        self.runner = (
            LiteTopKGraphs(
                limits.max_rows,
                limits.max_keys,
                SUPPORTED_TOPK,
                device=device,
                backend=backend,
                tuning=tuning,
                max_batch=limits.max_batch,
                max_graphs=max_graphs,
                workspace=self.workspace,
            )
            if graphs
            else None
        )
        self.results = self.host_rows = None
        if device.type != "cpu":
            _, nbytes = result_layout(RESULT_FIELDS, limits.max_rows, max(SUPPORTED_TOPK))
            self.results = torch.empty(nbytes, dtype=torch.uint8, device=device)
            per_row = sum(1 for _, per_k in RESULT_FIELDS.values() if not per_k)
            self.host_rows = torch.empty((per_row, limits.max_rows), dtype=torch.int32, pin_memory=True)
        self._stale = False

    @property
    def nbytes(self) -> int:
        """Device bytes held: workspace, staging arena, result buffer."""
        arena = self.runner.arena_bytes if self.runner is not None else 0
        return self.workspace.numel() + arena + (self.results.numel() if self.results is not None else 0)

    def invalidate(self) -> None:
        """Drop every graph (and the cache references they hold) before the next call (any thread)."""
        self._stale = True

    def staging(self, rows: int, table_shape, topk: int, weights_dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """Device tensors to write a call's q_fp4, q_scale, block_table, weights, row_to_batch, starts,
        ends into when they do not lie on the device: the runner's own staging buffers (not copied
        again), or new tensors with graphs off."""
        if self.runner is not None:
            return self.runner.input_buffers(rows, tuple(table_shape), topk=topk, weights_dtype=weights_dtype)
        shapes = {
            "q_fp4": ((rows, 64, 64), torch.uint8),
            "q_scale": ((rows, 64, 4), torch.uint8),
            "block_table": (tuple(table_shape), torch.int32),
            "weights": ((rows, 64), weights_dtype),
            "row_to_batch": ((rows,), torch.int32),
            "starts": ((rows,), torch.int32),
            "ends": ((rows,), torch.int32),
        }
        return {name: torch.empty(shape, dtype=dtype, device=self.device) for name, (shape, dtype) in shapes.items()}

    def result_buffers(self, names, rows: int, topk: int) -> dict[str, torch.Tensor]:
        """Device tensors for the result fields `names` of a call (views of the one result buffer)."""
        entries, _ = result_layout(names, rows, topk)
        views = {}
        for e in entries:
            dtype = RESULT_FIELDS[e["name"]][0]
            count = math.prod(e["shape"])
            views[e["name"]] = self.results[e["offset"] : e["offset"] + count * 4].view(dtype).view(e["shape"])
        return views

    def answer_to_host(self, buffer: bytearray, nbytes: int, padding: list[tuple[int, int]]) -> None:
        """Copy the first `nbytes` of the result buffer into `buffer`: the fields a call of
        `result_buffers(names, ...)` laid out first, in `result_layout(names)`'s order, in one copy
        (the stream synchronized before); then zero `padding` (wire.layout_padding of that layout),
        which the copy filled with whatever an earlier call left in the buffer."""
        if nbytes:
            torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes).copy_(self.results[:nbytes])
        for start, end in padding:
            buffer[start:end] = bytes(end - start)

    def rows_to_host(self, fields: list[torch.Tensor]) -> list[memoryview]:
        """Enqueue on the current stream a copy of each per-row int32 field (a device tensor of at most
        max_rows values) into the pinned host buffer; their int32 host views, in order. They hold the
        values once the stream is synchronized, until the next call's copies (one call at a time)."""
        views = []
        for i, tensor in enumerate(fields):
            host = self.host_rows[i, : tensor.numel()]
            host.copy_(tensor.view(-1), non_blocking=True)
            views.append(memoryview(host.numpy()).cast("B").cast("i"))
        return views

    def __call__(
        self,
        inputs: dict[str, torch.Tensor],
        kv_cache: torch.Tensor,
        *,
        kv_scale,
        topk: int,
        weight_scale: float,
        repair: bool,
        out: dict[str, torch.Tensor],
    ) -> TopKResult:
        if self._stale:
            self._stale = False
            if self.runner is not None:
                self.runner.clear()
        options = dict(
            topk=topk,
            weight_scale=weight_scale,
            repair=repair,
            out=out,
            max_seq_len=self.limits.max_keys,
            kv_scale=kv_scale,
        )
        if self.runner is not None:
            return self.runner(kv_cache=kv_cache, **inputs, **options)
        return litetopk_prefill(
            kv_cache=kv_cache, **inputs, **options, backend=self.backend, tuning=self.tuning, workspace=self.workspace
        )


__all__ = ["DeviceOperator", "WorkspaceLimits"]
