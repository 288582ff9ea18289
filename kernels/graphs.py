"""LiteTopKGraphs: `litetopk_prefill` replayed from one CUDA graph per call signature.

Layer: public face (imports the operator, the workspace sizing and the first stage's host checks).

Why. An eager call enqueues 20-24 launches from Python: 2-5 ms of host time at Q = 8192 on the H200,
and the GPU waits for the host during the short stages before the scan (bench/results/
host-time-h200.json). A runner captures each call signature once and replays it:

    graphs = LiteTopKGraphs(8192, 65536, (512, 1024), device="cuda:0", max_batch=16)
    result = graphs(q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends,
                    topk=512, out={"physical_indices": buf[:rows, :512]})

A call (same arguments and result as litetopk_prefill, same bits; no host synchronization):
1. the host checks of litetopk_prefill (validation.check_prefill: the same InputErrors);
2. the queries, weights, block table and row metadata are copied into the runner's staging arena
   (fixed addresses; ~38 MB at 8,192 rows: tens of microseconds of copies on the device);
3. the graph of the call's signature is replayed on the current stream. The signature: rows, the
   block table's shape, the weights' dtype, K, weight_scale, max_seq_len, repair, and the cache
   (kv_cache, kv_scale) by address, shape and strides: the cache is read in place, as an engine
   keeps it (one tensor for the whole run); the runner holds a reference to every cache it has a
   graph of (so the address stays valid), a new cache address is a new signature. On a miss the
   call runs the operator eagerly on the staged inputs (this call's answer; Triton compiles here)
   and then captures it (one device synchronization, ~tens of ms);
4. the result fields are copied out of the arena: into `out` (caller-owned), the others into one
   new allocation.
An engine can skip step 2: `input_buffers(rows, block_table_shape, topk=K)` hands out the staged
tensors of a call shape; inputs written there and passed as they are are not copied, and the call's
first device work is the graph's own (no wait for the graph launch after a copy: 0.12 ms of idle
device per call on the H200, bench/results/host-cprofile-h200.json). An input that lies in the arena
but is not its own staged tensor, and an `out` tensor in the arena, are InputErrors. After the arena
grows, tensors handed out before lie outside it: ordinary inputs again, copied like any other.

Rules. Calls are bounded as the workspace is (allocate_workspace: rows <= max_rows, sequences <=
max_batch, window bound <= max_seq_len, K in `topk`; beyond them InputError, before anything runs).
A block table wider than max_seq_len / 64 pages grows the arena (every graph dropped, once the new
signature is captured; `stats["arena_regrowths"]`); a miss that fails leaves the runner as it was.
`clear()` drops every graph and the cache references they hold.
At most `max_graphs` signatures are kept (the least recently used is dropped). All graphs share the
runner's workspace, arena and memory pool: one call at a time (not thread-safe); a call on another
stream than the last first waits for the last call's work. Under the caller's own graph capture a
call runs the operator directly on the runner's workspace and the inputs where they lie (no staging,
no arena check; the caller's graph holds it): the caller orders that graph's replays with the
runner's own calls. Free the runner only after its last call's work is done. check=True
synchronizes: with repair, rows left with a capacity event are finished by the eager operator
(litetopk_prefill check=True), then raise_for_status. On a device without CUDA graphs (CPU: the
reference backend, or Triton's interpreter) a "graph" is the captured call itself, re-run on the
staged buffers: the same staging and bits, no host savings; that is how CI tests the staging
(tests/kernels/test_graphs.py).
"""

from __future__ import annotations

import functools
import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from .cache_layout import NUM_HEADS, PAGE_SIZE, SCALE_BYTES, VALUE_BYTES
from .errors import InputError
from .operator import litetopk_prefill
from .pipeline import LiteTopKTuning
from .registry import get_backend, on_device
from .result import RESULT_FIELDS, TopKResult
from .scratch import ALIGNMENT
from .status import CAPACITY_EVENTS
from .validation import _byte_span, check_prefill
from .workspace import allocate_workspace

#: The inputs copied into the arena before every replay (the cache is read in place).
STAGED_INPUTS = ("q_fp4", "q_scale", "block_table", "weights", "row_to_batch", "starts", "ends")


@dataclass(eq=False)
class _Captured:
    """One signature: its staged inputs and result fields (views of the arena) and its replay."""

    staged: dict[str, torch.Tensor]
    fields: dict[str, torch.Tensor]
    results: torch.Tensor  # uint8 view of the arena spanning every result field (one copy out)
    run: Callable[[], TopKResult]  # the operator on the staged tensors
    replay: Callable[[], object] | None = None
    keep: tuple = field(default_factory=tuple)  # the graph, the cache tensors it reads

    def stage(self, inputs: Mapping[str, torch.Tensor]) -> None:
        """Copy the caller's inputs into the staged tensors: one batched copy of byte views (one dtype,
        so torch fuses the copies into one multi-tensor launch instead of a memcpy each). An input that
        is its staged tensor already (LiteTopKGraphs.input_buffers) is not copied; none copied, no launch."""
        moved = [
            (staged, inputs[name])
            for (name, view), staged in zip(self.staged.items(), self.staged_bytes)
            if inputs[name].data_ptr() != view.data_ptr()
        ]
        if moved:
            torch._foreach_copy_([staged for staged, _ in moved], [given.view(torch.uint8) for _, given in moved])

    def check_in_place(self, inputs: Mapping[str, torch.Tensor], arena: torch.Tensor) -> None:
        """InputError for an input lying in the runner's arena that is not its own staged tensor."""
        lo, hi = _byte_span(arena)
        for name, view in self.staged.items():
            start, end = _byte_span(inputs[name])
            if start < hi and lo < end and inputs[name].data_ptr() != view.data_ptr():
                raise InputError(
                    f"{name} lies in the runner's staging arena but is not its {name} buffer for this "
                    "call's shape (LiteTopKGraphs.input_buffers)"
                )

    @functools.cached_property
    def staged_bytes(self) -> list[torch.Tensor]:
        return [view.view(torch.uint8) for view in self.staged.values()]


def _check_outside(out: Mapping[str, torch.Tensor] | None, arena: torch.Tensor) -> None:
    """InputError for an `out` tensor overlapping the runner's arena (the staged inputs and result fields
    it copies from)."""
    lo, hi = _byte_span(arena)
    for name, tensor in (out or {}).items():
        start, end = _byte_span(tensor)
        if start < hi and lo < end:
            raise InputError(f"out[{name!r}] lies in the runner's staging arena; results go to the caller's own memory")


def _address(tensor: torch.Tensor | None):
    if tensor is None:
        return None
    return tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype


def _carve(arena: torch.Tensor, specs: Sequence[tuple[str, tuple, torch.dtype]]) -> tuple[dict, int]:
    """Views of `arena` (uint8, None: count only) for (name, shape, dtype) specs, in order, each on an
    ALIGNMENT boundary; returns (views, bytes used)."""
    views, used = {}, 0
    for name, shape, dtype in specs:
        nbytes = math.prod(shape) * dtype.itemsize
        if arena is not None:
            views[name] = arena[used : used + nbytes].view(dtype).view(shape)
        used += -(-nbytes // ALIGNMENT) * ALIGNMENT
    return views, used


def _staging_specs(rows: int, table_shape: tuple, weights_dtype: torch.dtype, topk: int):
    inputs = [
        ("q_fp4", (rows, NUM_HEADS, VALUE_BYTES), torch.uint8),
        ("q_scale", (rows, NUM_HEADS, SCALE_BYTES), torch.uint8),
        ("block_table", table_shape, torch.int32),
        ("weights", (rows, NUM_HEADS), weights_dtype),
    ]
    inputs += [(name, (rows,), torch.int32) for name in ("row_to_batch", "starts", "ends")]
    fields = [(name, shape_of(rows, topk), dtype) for name, (shape_of, dtype) in RESULT_FIELDS.items()]
    return inputs, fields


class LiteTopKGraphs:
    """litetopk_prefill replayed from per-signature CUDA graphs on one device (module docstring).

    Built once for the bounds of the calls it serves (its workspace and staging arena are sized up
    front); each call takes litetopk_prefill's arguments and returns its TopKResult, the same bits,
    replaying the graph captured for the call's signature (a new signature runs eagerly and is
    captured). Eager only: a compiled model calls the operator's custom op (ops.py) and captures it
    in its own graphs.

    Parameters
    ----------
    max_rows, max_seq_len, topk, max_batch
        The bounds of the calls, as allocate_workspace takes them: rows <= max_rows, block-table rows
        <= max_batch, window bound <= max_seq_len, K in `topk` (an int or a sequence of them).
    device : torch.device or str
        The one device the runner serves (CUDA: real graphs; elsewhere the captured call is re-run).
    backend : str
        The calls' backend (default "auto": the one it resolves to on `device`).
    tuning : LiteTopKTuning, optional
        The calls' tuning (default: the production settings).
    max_graphs : int
        Signatures kept at once, least recently used dropped first (default 8).
    workspace : torch.Tensor, optional
        One the caller already allocated for these bounds (allocate_workspace), used instead of a new one.

    Example
    -------
    >>> from litetopk.kernels import LiteTopKGraphs, litetopk_prefill, random_problem
    >>> p = random_problem(rows=8, keys=[3000, 2000], topk=512)
    >>> graphs = LiteTopKGraphs(16, 4096, 512, device="cpu", max_batch=2)  # device="cuda:0" on a GPU
    >>> first = graphs(*p.args(), topk=512)  # a miss: runs eagerly, then captures
    >>> again = graphs(*p.args(), topk=512)  # a replay
    >>> torch.equal(again.raw_indices, litetopk_prefill(*p.args(), topk=512).raw_indices), graphs.stats["replays"]
    (True, 1)
    """

    def __init__(
        self,
        max_rows: int,
        max_seq_len: int,
        topk: int | Sequence[int],
        *,
        device,
        backend: str = "auto",
        tuning: LiteTopKTuning | None = None,
        max_batch: int = 1,
        max_graphs: int = 8,
        workspace: torch.Tensor | None = None,
    ):
        """A runner for calls within the bounds (allocate_workspace's arguments, which size its workspace
        and its staging arena up front); `max_graphs` signatures kept at once. `workspace`: one the caller
        already allocated for these bounds (allocate_workspace), used instead of a new one."""
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1:
            raise InputError(f"max_graphs must be an int >= 1, got {max_graphs!r}")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:  # the inputs' tensors name their device's index
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self._chosen = get_backend(backend, self.device)
        self.backend = self._chosen.name
        self.tuning = tuning or LiteTopKTuning()
        self.max_graphs = max_graphs
        self.max_rows, self.max_batch, self.max_seq_len = max_rows, max_batch, max_seq_len
        self.workspace = (
            workspace
            if workspace is not None
            else allocate_workspace(
                max_rows,
                max_seq_len,
                topk,
                device=self.device,
                backend=self.backend,
                tuning=self.tuning,
                max_batch=max_batch,
            )
        )
        self._ks = (topk,) if isinstance(topk, int) else tuple(topk)
        inputs, fields = _staging_specs(
            max_rows, (max_batch, max(1, -(-max_seq_len // PAGE_SIZE))), torch.float32, max(self._ks)
        )
        self._arena = self._new_arena(_carve(None, inputs + fields)[1])
        self._graphs: OrderedDict[tuple, _Captured] = OrderedDict()
        self._cuda_graphs = self.device.type == "cuda"
        self._pool = torch.cuda.graph_pool_handle() if self._cuda_graphs else None
        self._last_stream = None
        #: captures, replays, evictions, arena_regrowths (a signature larger than the arena: every graph dropped)
        self.stats: Counter = Counter()

    def _new_arena(self, nbytes: int) -> torch.Tensor:
        # Zeroed once: the alignment padding between the fields is never written, so the one block a
        # call's new result fields share (`_publish`) never carries another call's bytes.
        return torch.zeros(nbytes, dtype=torch.uint8, device=self.device)

    def clear(self) -> None:
        """Drop every graph and with them the runner's references to the caches they read (an engine
        that reallocates its cache calls this to release the old one)."""
        self._graphs.clear()
        self._pool = torch.cuda.graph_pool_handle() if self._cuda_graphs else None  # no graph holds the old one

    def input_buffers(
        self, rows: int, block_table_shape: Sequence[int], *, topk: int, weights_dtype: torch.dtype = torch.float32
    ) -> dict[str, torch.Tensor]:
        """The runner's own staging tensors (STAGED_INPUTS, views of its arena) for calls of `rows` query
        rows, a block table of `block_table_shape` and K `topk`, weights of `weights_dtype`: an engine
        that writes a call's inputs there and passes these very tensors skips the staging copy, and the
        device's wait for the graph launch behind it (an engine's static input buffers). Their contents
        are the caller's to write before each call (on the stream of the call). Valid until the arena
        grows (a larger signature: `stats["arena_regrowths"]`, which this call may cause itself), and
        only for calls of this shape; InputError beyond the runner's bounds."""
        bounds = (
            ("query rows", rows, self.max_rows),
            ("sequences (block_table rows)", block_table_shape[0], self.max_batch),
        )
        for what, count, bound in bounds:
            if count > bound:
                raise InputError(f"{count} {what}: this runner was built for at most {bound} (LiteTopKGraphs bounds)")
        if topk not in self._ks:
            raise InputError(f"topk={topk}: this runner was built for K in {self._ks} (LiteTopKGraphs bounds)")
        # sized for the fields of every K of the runner: the input views do not depend on K, so a call of
        # this shape with another K finds them in place instead of growing the arena under them
        inputs, fields = _staging_specs(rows, tuple(block_table_shape), weights_dtype, max(self._ks))
        nbytes = _carve(None, inputs + fields)[1]
        if nbytes > self._arena.numel():
            self._install_arena(self._new_arena(nbytes))
        return _carve(self._arena, inputs)[0]

    def _install_arena(self, arena: torch.Tensor) -> None:
        if self._cuda_graphs:
            torch.cuda.synchronize(self.device)  # no stream still uses the old arena when it is freed
        self._graphs.clear()  # they read the old arena
        self._arena = arena
        self.stats["arena_regrowths"] += 1

    @property
    def arena_bytes(self) -> int:
        """Bytes of the staging arena (inputs and result fields of the largest signature so far)."""
        return self._arena.numel()

    def __call__(
        self,
        q_fp4,
        q_scale,
        kv_cache,
        block_table,
        weights,
        row_to_batch,
        starts,
        ends,
        *,
        topk: int,
        weight_scale: float = 1.0,
        repair: bool = True,
        out: Mapping[str, torch.Tensor] | None = None,
        max_seq_len: int | None = None,
        kv_scale: torch.Tensor | None = None,
        check: bool = False,
    ) -> TopKResult:
        """litetopk_prefill(...) with this runner's backend, tuning and workspace (module docstring).

        Parameters
        ----------
        q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends : torch.Tensor
            As litetopk_prefill, on the runner's device and within its bounds (InputError otherwise).
            Inputs are copied into the runner's staging arena unless they are its own
            (input_buffers); the cache is read in place and is part of the signature.
        topk, weight_scale, repair, out, max_seq_len, kv_scale, check
            As litetopk_prefill.

        Returns
        -------
        TopKResult
            litetopk_prefill's result, bit for bit: the `out` tensors written, the other fields new.
        """
        inputs = dict(
            q_fp4=q_fp4,
            q_scale=q_scale,
            block_table=block_table,
            weights=weights,
            row_to_batch=row_to_batch,
            starts=starts,
            ends=ends,
        )
        options = dict(topk=topk, weight_scale=weight_scale, max_seq_len=max_seq_len, kv_scale=kv_scale)
        _, max_end = check_prefill(kv_cache=kv_cache, out=out, **inputs, **options, workspace=self.workspace)
        _check_outside(out, self._arena)
        if topk not in self._ks:
            raise InputError(f"topk={topk}: this runner was built for K in {self._ks} (LiteTopKGraphs bounds)")
        if q_fp4.device != self.device:
            raise InputError(f"the inputs are on {q_fp4.device}; this runner serves {self.device}")
        for what, count, bound in (
            ("query rows", q_fp4.shape[0], self.max_rows),
            ("sequences (block_table rows)", block_table.shape[0], self.max_batch),
            ("window bound (min(max_seq_len, block_table.shape[1] * 64))", max_end, self.max_seq_len),
        ):
            if count > bound:
                raise InputError(f"{count} {what}: this runner was built for at most {bound} (LiteTopKGraphs bounds)")
        if self._cuda_graphs and torch.cuda.is_current_stream_capturing():
            return litetopk_prefill(
                kv_cache=kv_cache,
                **inputs,
                **options,
                backend=self.backend,
                repair=repair,
                tuning=self.tuning,
                out=out,
                check=check,
                workspace=self.workspace,
            )
        with on_device(self.device, self._chosen):  # the device current; torch / CUDA failures -> DeviceError
            captured = self._replay(inputs, kv_cache, options, repair)
            result = self._publish(captured, out)
        if check and repair and bool(((result.status & int(CAPACITY_EVENTS)) != 0).any()):
            return litetopk_prefill(
                kv_cache=kv_cache,
                **inputs,
                **options,
                backend=self.backend,
                repair=True,
                tuning=self.tuning,
                out=out,
                check=True,
                workspace=self.workspace,
            )
        return result.raise_for_status() if check else result

    def _replay(self, inputs: dict, kv_cache: torch.Tensor, options: dict, repair: bool) -> _Captured:
        """Stage the inputs and replay (or, on a miss, run and capture) the signature's graph."""
        if self._cuda_graphs:
            stream = torch.cuda.current_stream(self.device)
            if self._last_stream is not None and stream != self._last_stream:
                stream.wait_stream(self._last_stream)
            self._last_stream = stream
        key = (
            tuple(inputs["block_table"].shape),
            inputs["q_fp4"].shape[0],
            inputs["weights"].dtype,
            options["topk"],
            float(options["weight_scale"]),
            options["max_seq_len"],
            bool(repair),
            _address(kv_cache),
            _address(options["kv_scale"]),
        )
        captured = self._graphs.get(key)
        if captured is not None:
            self._graphs.move_to_end(key)
            captured.check_in_place(inputs, self._arena)
            captured.stage(inputs)
            captured.replay()
            self.stats["replays"] += 1
            return captured
        captured, arena = self._stage(inputs, kv_cache, options, repair)
        captured.check_in_place(inputs, self._arena)
        captured.stage(inputs)
        captured.run()  # this call's answer; compiles and warms every kernel before the capture
        if self._cuda_graphs:
            graph = torch.cuda.CUDAGraph()
            # Synchronizes the device first; other threads' CUDA work does not invalidate the capture.
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                captured.run()
            captured.replay, captured.keep = graph.replay, (graph, kv_cache, options["kv_scale"])
        else:
            captured.replay, captured.keep = captured.run, (kv_cache, options["kv_scale"])
        if arena is not self._arena:  # installed only now: a failed miss leaves every graph and the arena as they were
            self._install_arena(arena)
        self._graphs[key] = captured  # only once captured: a failed capture leaves no signature behind
        if len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)
            self.stats["evictions"] += 1
        self.stats["captures"] += 1
        return captured

    def _stage(
        self, inputs: dict, kv_cache: torch.Tensor, options: dict, repair: bool
    ) -> tuple[_Captured, torch.Tensor]:
        """(the views of a new signature, the arena they lie in): the runner's, or a larger new one when
        it is too small (installed by the caller once the signature is captured)."""
        input_specs, field_specs = _staging_specs(
            inputs["q_fp4"].shape[0], tuple(inputs["block_table"].shape), inputs["weights"].dtype, options["topk"]
        )
        _, nbytes = _carve(None, input_specs + field_specs)
        arena = self._arena if nbytes <= self._arena.numel() else self._new_arena(nbytes)
        views, _ = _carve(arena, input_specs + field_specs)
        _, inputs_end = _carve(None, input_specs)
        staged = {name: views[name] for name in STAGED_INPUTS}
        fields = {name: views[name] for name in RESULT_FIELDS}
        last = field_specs[-1]
        results_end = inputs_end + _carve(None, field_specs[:-1])[1] + math.prod(last[1]) * last[2].itemsize
        backend, tuning, workspace = self.backend, self.tuning, self.workspace

        def run() -> TopKResult:
            return litetopk_prefill(
                kv_cache=kv_cache,
                **staged,
                **options,
                backend=backend,
                repair=repair,
                tuning=tuning,
                out=fields,
                workspace=workspace,
            )

        return _Captured(staged=staged, fields=fields, results=arena[inputs_end:results_end], run=run), arena

    def _publish(self, captured: _Captured, out: Mapping[str, torch.Tensor] | None) -> TopKResult:
        """The result fields out of the arena: into `out`, the others into one new allocation."""
        given = dict(out or {})
        if given:
            torch._foreach_copy_(list(given.values()), [captured.fields[name] for name in given])
        fields = dict(given)
        if len(given) < len(RESULT_FIELDS):
            block = captured.results.clone()  # one allocation and one copy for every field not in `out`
            typed = {dtype: block.view(dtype) for dtype in {view.dtype for view in captured.fields.values()}}
            base = captured.results.data_ptr()
            for name, view in captured.fields.items():
                if name not in given:  # the same place in the block as in the arena
                    offset = (view.data_ptr() - base) // view.element_size()
                    fields[name] = typed[view.dtype].as_strided(view.shape, view.stride(), offset)
        return TopKResult(**fields)


__all__ = ["LiteTopKGraphs", "STAGED_INPUTS"]
