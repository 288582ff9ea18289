"""The life of a top-k request, the same for every transport (routes/topk.py over HTTP, ipc.py).

    admit                the regions first (the caller's own, live, at the named generation:
                         `unknown_region` / `stale_region` before anything else), then topk,
                         backend, weight_scale, the cache's format (ours, or AITER's kv_cache +
                         kv_scale pair), bounds, inline lengths, output regions (read-write, read
                         by no input): fail fast, no lease. The answer, `Admitted`, holds the
                         regions found, so that execute leases those very regions
    execute (device)     leases (each region still live, its owner alive: else `stale_region`) ->
                         tensors on the device (service/operator.py stages what must move) -> the
                         operator (graph replay; it checks dtypes and shapes: bad_dtype /
                         bad_shape) -> row faults, owners alive -> results into output regions and
                         the answer buffer -> release leases
    answer               an `Outcome`: the fields not written into regions in one host buffer laid out
                         by wire.result_layout; each transport encodes it (JSON, binary, IPC frame)

Two ways in, one life:

    call_topk(admitted, state, marks)         the event loop's (HTTP): admitted on the loop (`admit`, or
                                              the uid's kept ones: UidAdmissions), executed on the device
                                              worker, awaited within the timeout
    run_topk_if_idle(admitted, state, marks)  a transport thread's (IPC), admitted there (`admit`, or
    queue_topk(admitted, state, marks, done)  the connection's `Admissions`): the device idle, it is
                                              executed there (no thread hop), else queued for the
                                              worker, done(outcome) once

`marks` gets (phase, perf_counter()) at the end of each phase (HTTP's Server-Timing, the IPC
answer's `timing`).
"""

from __future__ import annotations

import array
import collections
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import msgspec
import numpy
import torch

from litetopk.kernels import RowFaultError, RowStatus, TopKResult
from litetopk.kernels.cache_layout import AITER_SCALE_SHAPE, AITER_VALUE_SHAPE
from litetopk.kernels.status import INPUT_FAULTS, describe_row_faults
from litetopk.kernels.validation import check_topk

from .errors import ServiceError
from .executor import Job
from .executor import Outcome as DeviceOutcome
from .regions import OWNERS, Region, view_key
from .wire import (
    RESULT_FIELDS,
    RegionSlice,
    TensorArg,
    TopKRequest,
    dtype_name,
    fields_in,
    layout_padding,
    result_layout,
    result_shape,
    tensor_arg_problem,
)

INPUTS = ("q_fp4", "q_scale", "kv_cache", "block_table", "weights", "row_to_batch", "starts", "ends")
STAGED = ("q_fp4", "q_scale", "block_table", "weights", "row_to_batch", "starts", "ends")  # all but the cache
_METADATA = ("block_table", "row_to_batch", "starts", "ends")  # a region slice or inline int32 values
_REGION_INPUTS = (*INPUTS, "kv_scale")
_OUT_NAMES = {name: f"out.{name}" for name in RESULT_FIELDS}
_RESULT_DTYPES = {name: dtype_name(dtype) for name, (dtype, _) in RESULT_FIELDS.items()}
_FAULT_BITS = int(INPUT_FAULTS | RowStatus.SELECTOR_FAILURE)
TALLIED = ("status", "repaired", "candidates")  # the result fields read on the host after the call
_TALLIED_OUTS = {f"out.{name}" for name in TALLIED}
ADMISSIONS_KEPT = 16  # admissions an IPC connection keeps (Admissions)
HTTP_ADMISSIONS_KEPT = 64  # admissions a uid's HTTP requests keep (UidAdmissions: its processes and engines share them)
UIDS_KEPT = 16  # uids whose HTTP admissions are kept (UidAdmissions)
ROWS_AS_INTS = 1024  # counts of at most this many rows are summed as Python ints (_total)


@dataclass(eq=False, slots=True)
class Outcome:
    """A request's answer: the fields not written into regions, in `buffer` (wire.result_layout)."""

    buffer: bytearray
    entries: list[dict]  # result_layout of the fields in `buffer`
    written: list[str]
    rows: int
    topk: int
    repaired: int
    candidates: int

    def fields(self) -> dict[str, torch.Tensor]:
        return fields_in(self.buffer, self.entries)


@dataclass(eq=False, slots=True)
class Binding:
    """An admission's tensors as `execute` hands them to the operator: the view of every region slice
    and the inline metadata, sorted (inputs where they live, those to stage, the cache, the output
    regions the operator writes in place, the host values read after the call). Worked out from the
    regions' mappings under the request's leases; a kept admission keeps its binding for its next
    executions until one of its regions closes (`Admitted.bound`)."""

    inputs: dict[str, torch.Tensor]  # STAGED inputs, where they live
    moving: list[str]  # the inputs not on the service's device: staged every call
    staging_shape: tuple | None  # (rows, block table shape, weights dtype) of the staging buffers
    kv_cache: torch.Tensor
    kv_scale: torch.Tensor | None
    outs: dict[str, torch.Tensor]  # result field -> its output region
    direct: dict[str, torch.Tensor]  # the output regions the operator writes in place (on the device)
    hosted: list[str]  # host output regions of a GPU service: written from the device after the checks
    tallies: dict[str, memoryview]  # int32 values of TALLIED fields in direct host output regions
    batch: int  # block table rows


@dataclass(eq=False, slots=True, weakref_slot=True)
class Admitted:
    """A request that passed admission, with what admission found: every tensor named by region as
    (name, slice, region) (inputs, then `out.<field>`), the distinct regions (leased together), the
    output slices by result field, and the query rows; and what follows from them alone, worked out
    once (kept admissions, `Admissions`, are executed again and again): the kept
    views' keys, the inline metadata as tensors, the answer buffer's layout, and (kept admissions)
    the binding of its tensors."""

    req: TopKRequest
    refs: list[tuple[str, RegionSlice, Region]]
    regions: list[Region]
    outputs: dict[str, RegionSlice]
    rows: int
    keyed: list[tuple] = field(init=False)  # (name, slice, region, view_key) of each of `refs`
    owners: list[Region] = field(init=False)  # a region of each distinct owner process
    answered: list[str] = field(init=False)  # the result fields not written into regions, in the answer
    entries: list[dict] = field(init=False)  # their result_layout in the answer buffer
    tallied: dict[str, tuple[int, int]] = field(init=False)  # [start, end) of TALLIED fields in the buffer
    padding: list[tuple[int, int]] = field(init=False)  # [start, end) of the buffer's padding bytes (zeroed)
    nbytes: int = field(init=False)
    kept: bool = field(init=False, default=False)  # kept (`Admissions`): keeps its binding
    binding: Binding | None = field(init=False, default=None)
    checked: int = field(init=False, default=-1)  # the table's `retirements` when its regions were last live
    _inline: dict | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.keyed = [(name, ref, region, view_key(ref)) for name, ref, region in self.refs]
        self.owners = list({(r.pid, r.pid_start): r for r in self.regions if r.pid is not None}.values())
        self.answered = [n for n in RESULT_FIELDS if n not in self.outputs]
        self.entries, self.nbytes = result_layout(self.answered, self.rows, self.req.topk)
        self.padding = layout_padding(self.entries)
        self.tallied = {
            e["name"]: (e["offset"], e["offset"] + e["nbytes"]) for e in self.entries if e["name"] in TALLIED
        }

    def inline(self) -> dict[str, torch.Tensor]:
        """The metadata sent as values, as int32 CPU tensors (made by the first execution: on the device's
        thread, not the event loop)."""
        if self._inline is None:
            named = {name for name, _, _ in self.refs}
            self._inline = {n: _inline_tensor(getattr(self.req, n)) for n in _METADATA if n not in named}
        return self._inline

    def bound(self, device: torch.device) -> Binding:
        """The binding of this admission's tensors (call it holding the leases of its regions). A kept
        admission keeps it, and each of its regions drops it when the region closes
        (`Region.bindings`, service/regions.py): views never outlive the mapping they view, and a
        region retired since cannot be leased, so a kept binding is only ever used while its regions
        are mapped."""
        binding = self.binding
        if binding is None:
            binding = _bind(self, device)
            if self.kept:
                self.binding = binding
                for region in self.regions:
                    region.bindings.add(self)
        return binding

    def unbind(self) -> None:
        """Drop the binding (a region of it closes)."""
        self.binding = None


class Admissions:
    """The admissions of the last `kept` distinct top-k requests of one IPC connection (ADMISSIONS_KEPT) or of one
    uid's HTTP requests (UidAdmissions), by the bytes of the request (an engine sends the same request every step:
    the same regions, new contents).

    Admission is a function of the request, of the caller's uid and of its regions' fixed facts (owner, size,
    access: a region never changes them; re-registering makes a new region), so a request whose bytes are those
    of a kept admission, all of whose regions are still live, is admitted as it was: it is neither decoded nor
    checked again. Any region retired since (unregistered, superseded, its owner dead) and the request is admitted
    anew, which answers why it cannot be; when no region at all has been retired since its regions were last found
    live (the table's `retirements`), none is looked at. Owners are still checked when the request's regions are
    leased and after the operator (service/topk.py execute). One uid, one thread (the connection's, or the event
    loop): not thread-safe."""

    def __init__(self, state, uid: int, kept: int = ADMISSIONS_KEPT):
        self.state, self.uid, self.kept = state, uid, kept
        self._kept: collections.OrderedDict[bytes, Admitted] = collections.OrderedDict()

    def admit(self, key: bytes, request: Callable[[], TopKRequest]) -> Admitted:
        """The kept admission of `key` when every region of it is live, else `admit(request())` (kept)."""
        admitted = self._kept.get(key)
        if admitted is not None:
            if admitted.checked == self.state.table.retirements or all(r.live for r in admitted.regions):
                self._kept.move_to_end(key)
                return admitted
            del self._kept[key]
        admitted = admit(request(), self.state, self.uid)
        admitted.kept = True
        self._kept[key] = admitted
        if len(self._kept) > self.kept:
            self._kept.popitem(last=False)
        return admitted


class UidAdmissions:
    """The kept admissions of HTTP requests (routes/topk.py: bodies of at most KEPT_BODY_MAX_BYTES, keyed by their
    bytes), by the caller's uid (what admission depends on: regions are a uid's), HTTP_ADMISSIONS_KEPT a uid, for
    the UIDS_KEPT uids most recently admitted a request (a request refused keeps nothing and evicts no uid). On the
    event loop only: not thread-safe."""

    def __init__(self):
        self._by_uid: collections.OrderedDict[int, Admissions] = collections.OrderedDict()

    @property
    def uids(self) -> list[int]:
        """The uids whose admissions are kept, the least recent first."""
        return list(self._by_uid)

    def admit(self, state, uid: int, key: bytes, request: Callable[[], TopKRequest]) -> Admitted:
        """Admissions.admit in `uid`'s kept admissions (ServiceError or the request's own error: nothing kept)."""
        kept = self._by_uid.get(uid) or Admissions(state, uid, HTTP_ADMISSIONS_KEPT)
        admitted = kept.admit(key, request)
        self._by_uid[uid] = kept
        self._by_uid.move_to_end(uid)
        if len(self._by_uid) > UIDS_KEPT:
            self._by_uid.popitem(last=False)
        return admitted


def from_model(model) -> TopKRequest:
    """The wire request of HTTP's validated body (service/schemas.py TopKRequest)."""
    return msgspec.convert(model.model_dump(), TopKRequest)


def outputs(req: TopKRequest) -> dict[str, RegionSlice]:
    """The output regions the request names, by result field."""
    if req.out is None:
        return {}
    return {name: ref for name in RESULT_FIELDS if (ref := getattr(req.out, name)) is not None}


def _rows(req: TopKRequest) -> int:
    return req.q_fp4.shape[0] if req.q_fp4.shape else 0


# ------------------------------------------------------------------------------------- admit


def _check_output(name: str, ref: RegionSlice, rows: int, topk: int) -> None:
    """An output region must hold exactly the result field (the operator never sees it)."""
    want, wire = list(result_shape(name, rows, topk)), _RESULT_DTYPES[name]
    if ref.dtype != wire:
        raise ServiceError("bad_dtype", f"out.{name} must be {wire}, got {ref.dtype}")
    if ref.shape != want:
        raise ServiceError("bad_shape", f"out.{name} must have shape {want}, got {list(ref.shape)}")


def _check_cache_format(req: TopKRequest) -> None:
    """The cache is ours (`kv_cache` alone) or AITER's pair (docs/cache-layouts.md): with `kv_scale`,
    kv_cache must be uint8 [P, 1, 4, 64, 16] and kv_scale uint8 [P, 1, 4, 64] (the same P). Our
    format's own shape is the operator's to check; an AITER-shaped kv_cache without kv_scale is
    named here, since the operator would only say that it is not ours."""
    cache, scale = req.kv_cache, req.kv_scale
    aiter_values = [*AITER_VALUE_SHAPE]
    if scale is None:
        if cache.shape[1:] == aiter_values:
            raise ServiceError(
                "bad_shape",
                f"kv_cache {list(cache.shape)} is AITER's values tensor: send its scales "
                f"as kv_scale (uint8 [{cache.shape[0]}, {', '.join(map(str, AITER_SCALE_SHAPE))}])",
            )
        return
    for name, ref, page in (("kv_cache", cache, aiter_values), ("kv_scale", scale, [*AITER_SCALE_SHAPE])):
        if ref.dtype != "uint8":
            raise ServiceError(
                "bad_dtype", f"{name} must be uint8 in AITER's format (kv_cache + kv_scale), got {ref.dtype}"
            )
        if len(ref.shape) != 1 + len(page) or list(ref.shape[1:]) != page:
            wanted = f"[num_pages, {', '.join(map(str, page))}]"
            hint = " (our format's kv_cache takes no kv_scale)" if name == "kv_cache" else ""
            raise ServiceError(
                "bad_shape", f"{name} must be {wanted} with kv_scale (AITER's format), got {list(ref.shape)}{hint}"
            )
    if cache.shape[0] != scale.shape[0]:
        raise ServiceError(
            "bad_shape",
            f"kv_scale must have one page per kv_cache page: kv_cache has "
            f"{cache.shape[0]} pages, kv_scale {scale.shape[0]}",
        )


def _region_args(req: TopKRequest, outs: dict[str, RegionSlice]) -> list[tuple[str, RegionSlice]]:
    """(name, region slice) of every tensor the request names by region, inputs then outputs."""
    named = []
    for name in _REGION_INPUTS:
        arg = getattr(req, name)
        if arg is not None and (arg.__class__ is not TensorArg or arg.data is None):
            named.append((name, arg))
    for name, ref in outs.items():
        named.append((_OUT_NAMES[name], ref))
    return named


def admit(req: TopKRequest, state, uid: int) -> Admitted:
    """Every check that needs no device: raise the request's error before it is queued (module docstring).

    The inputs' dtypes and shapes are the operator's to check (kernels/validation.py raises
    InputDtypeError / InputShapeError, answered `bad_dtype` / `bad_shape`); admission checks what
    the operator cannot see: regions (the caller's own) and their bounds, inline data against its
    shape, and the output regions the results are written into.
    """
    for name in _METADATA:
        problem = tensor_arg_problem(getattr(req, name))
        if problem is not None:
            raise ServiceError("validation_error", f"{name}: {problem}")
    outs = outputs(req)
    named = _region_args(req, outs)
    # unknown_region / stale_region first; each (region, generation) looked up once (4 metadata slices
    # often share one), every owner read once (`alive`), under one lock
    found = state.table.find_all([(ref.region, ref.generation) for _, ref in named], uid, {})
    check_topk(req.topk)
    if req.backend != "auto" and req.backend != state.backend:
        raise ServiceError(
            "backend_unavailable",
            f"this service runs the {state.backend} backend on "
            f"{state.device}; backend={req.backend!r} is served elsewhere (or send 'auto')",
        )
    if not math.isfinite(req.weight_scale):
        raise ServiceError("validation_error", f"weight_scale must be finite, got {req.weight_scale}")
    _check_cache_format(req)
    refs, read = [], set()  # read: the regions the inputs read
    for name, ref in named:
        region = found[(ref.region, ref.generation)]
        region.check_bounds(ref, name)
        refs.append((name, ref, region))
        if name[:4] != "out.":
            read.add(ref.region)
    for name in _METADATA:
        arg = getattr(req, name)
        if arg.data is not None and len(arg.data) != math.prod(arg.shape):
            raise ServiceError(
                "bad_shape",
                f"{name}: {len(arg.data)} values given for shape {list(arg.shape)} ({math.prod(arg.shape)} values)",
            )
    rows = _rows(req)
    for name, ref in outs.items():
        _check_output(name, ref, rows, req.topk)
        if found[(ref.region, ref.generation)].access != "read_write":
            raise ServiceError(
                "read_only_region",
                f"out.{name}: region {ref.region} was registered read_only; results go into read_write regions only",
            )
        if ref.region in read:
            raise ServiceError(
                "output_aliases_input",
                f"out.{name}: region {ref.region} is read by an "
                "input of this request; write results into a region no input reads",
            )
    return Admitted(req, refs, list({id(r): r for r in found.values()}.values()), outs, rows)


# ----------------------------------------------------------------------------------- execute


def _inline_tensor(arg: TensorArg) -> torch.Tensor:
    """The int32 CPU tensor of inline data (values range-checked on the wire). array('i') packs
    the list ~3.5x faster than torch.tensor(list): 0.14 against 0.51 ms for 8192 values."""
    if not arg.data or array.array("i").itemsize != 4:
        return torch.tensor(arg.data, dtype=torch.int32).view(arg.shape)
    return torch.frombuffer(array.array("i", arg.data), dtype=torch.int32).view(arg.shape)


def _raise_row_faults(status: memoryview) -> None:
    """Fail the request when rows are at fault (INVALID_ROW/INVALID_PAGE/NONFINITE/SELECTOR_FAILURE);
    `status` holds the rows' int32 flags on the host. The common case, every row 0, is one comparison."""
    if status.tobytes() == bytes(status.nbytes):
        return
    flags = status.tolist()
    bad = [row for row, flag in enumerate(flags) if flag & _FAULT_BITS]
    if bad:
        flags = [flags[row] for row in bad]
        raise RowFaultError(describe_row_faults(bad, flags, "cannot be answered"), bad, flags)


def _total(counts: memoryview) -> int:
    """The sum of int32 counts on the host: a decode batch's few rows as Python ints, more rows with
    numpy (its machinery costs ~3x that, cold, for a few rows)."""
    if len(counts) <= ROWS_AS_INTS:
        return sum(counts)
    return int(numpy.frombuffer(counts, dtype=numpy.int32).sum(dtype=numpy.int64))


def out_of(name: str, direct: dict, staging: dict, result: TopKResult) -> torch.Tensor:
    """Where the call left result field `name`: an output region on the device, or a staging buffer."""
    return direct[name] if name in direct else staging.get(name, getattr(result, name))


def _staging_shape(req: TopKRequest, given: dict) -> tuple | None:
    """(rows, block table shape, weights dtype) the staging buffers need, None when the inputs'
    shapes are not the operator's (it then says what is wrong, on the inputs as given)."""
    rows, table = _rows(req), given["block_table"].shape
    shapes = {
        "q_fp4": (rows, 64, 64),
        "q_scale": (rows, 64, 4),
        "weights": (rows, 64),
        "row_to_batch": (rows,),
        "starts": (rows,),
        "ends": (rows,),
    }
    if len(req.q_fp4.shape) != 3 or len(table) != 2 or any(tuple(given[n].shape) != s for n, s in shapes.items()):
        return None
    if (
        given["weights"].dtype not in (torch.float32, torch.bfloat16)
        or any(given[n].dtype != torch.int32 for n in ("block_table", "row_to_batch", "starts", "ends"))
        or any(given[n].dtype != torch.uint8 for n in ("q_fp4", "q_scale"))
    ):
        return None
    return rows, tuple(table), given["weights"].dtype


def _bind(admitted: Admitted, device: torch.device) -> Binding:
    """The Binding of `admitted` on the service's `device` (its regions leased)."""
    views = dict(admitted.inline())
    host = device.type == "cpu"
    tallies = {}  # a CPU service reads them in the output regions themselves
    for name, ref, region, key in admitted.keyed:
        view = region.views.get(key)
        views[name] = view if view is not None else region.view(ref, name, key)
        if host and name in _TALLIED_OUTS:
            tallies[name[4:]] = region.int32s(ref, name, key)
    inputs = {n: views[n] for n in STAGED}
    moving = [] if host else [n for n in STAGED if inputs[n].device != device]
    # Output regions stay where they live: those on the device are the operator's `out=` (written in
    # place), host regions of a GPU service get one copy after the checks.
    outs = {n: views[_OUT_NAMES[n]] for n in admitted.outputs}
    direct = outs if host else {n: t for n, t in outs.items() if t.device == device}
    table_shape = views["block_table"].shape
    return Binding(
        inputs=inputs,
        moving=moving,
        staging_shape=_staging_shape(admitted.req, views) if moving else None,
        kv_cache=views["kv_cache"],
        kv_scale=views["kv_scale"] if admitted.req.kv_scale is not None else None,
        outs=outs,
        direct=direct,
        hosted=[n for n in outs if n not in direct],
        tallies=tallies,
        batch=table_shape[0] if len(table_shape) else 0,
    )


def _tallies(
    bound: Binding, admitted: Admitted, buffer: bytearray, result: TopKResult, operator
) -> dict[str, memoryview]:
    """The int32 values of status, repaired and candidates on the host: in the host output regions, in
    the answer buffer (filled after the call), or (device output regions) copied into the operator's
    pinned host buffer on the call's stream. Read them once the stream is synchronized and the
    answer buffer filled."""
    if len(bound.tallies) == len(TALLIED):
        return bound.tallies
    tallies = dict(bound.tallies)
    answered = admitted.tallied
    view = memoryview(buffer) if answered else None
    for name in TALLIED:
        if name in answered:
            start, end = answered[name]
            tallies[name] = view[start:end].cast("i")
    missing = [name for name in TALLIED if name not in tallies]
    if missing:  # enqueued behind the operator: the call's one synchronization brings them
        tallies.update(zip(missing, operator.rows_to_host([getattr(result, name) for name in missing])))
    return tallies


def execute(admitted: Admitted, state, marks: list | None = None) -> Outcome:
    """The device's part (on the worker thread, or on a transport thread that found the device idle;
    on the device and its stream either way)."""
    req, rows = admitted.req, admitted.rows
    mark = marks.append if marks is not None else lambda _: None
    mark(("queue", time.perf_counter()))
    device, table = state.device, state.table
    admitted.checked = table.lease(admitted.regions, admitted.owners, admitted.checked)  # live, owners alive
    try:
        bound = admitted.bound(device)
        operator = state.executor.operator_for(rows, bound.batch)
        inputs, kv_cache, kv_scale = bound.inputs, bound.kv_cache, bound.kv_scale
        host = device.type == "cpu"
        if bound.staging_shape is not None:  # straight into the operator's staging buffers: the one copy
            rows_, table_shape, weights_dtype = bound.staging_shape
            staged = operator.staging(rows_, table_shape, req.topk, weights_dtype)
            inputs = dict(inputs)
            for name in bound.moving:
                inputs[name] = staged[name].copy_(inputs[name], non_blocking=True)
        elif bound.moving:
            inputs = {n: t.to(device, non_blocking=True) for n, t in inputs.items()}
        if not host:  # a host region's cache (or scales) is copied; one on the device is read in place
            kv_cache = kv_cache.to(device)
            kv_scale = kv_scale.to(device) if kv_scale is not None else None
        buffer = bytearray(admitted.nbytes)
        # on the CPU the answered fields are written into the answer itself; on a GPU into the operator's result
        # buffer, copied to the answer in one piece after the call
        staging = (
            fields_in(buffer, admitted.entries)
            if host
            else operator.result_buffers([*admitted.answered, *bound.hosted], rows, req.topk)
        )
        direct = bound.direct
        mark(("views", time.perf_counter()))
        result = operator(
            inputs,
            kv_cache,
            kv_scale=kv_scale,
            topk=req.topk,
            weight_scale=req.weight_scale,
            repair=req.repair,
            out={**direct, **staging},
        )
        tallies = _tallies(bound, admitted, buffer, result, operator)
        if device.type == "cuda":  # `op` is then the device's time; the tallies' copies are in
            torch.cuda.current_stream(device).synchronize()
        mark(("op", time.perf_counter()))
        if not host:
            operator.answer_to_host(buffer, admitted.nbytes, admitted.padding)  # answered fields first in staging
            result = TopKResult(**{n: out_of(n, direct, staging, result) for n in RESULT_FIELDS})
        _raise_row_faults(tallies["status"])
        _check_owners_alive(admitted.owners)
        mark(("checks", time.perf_counter()))
        for name in bound.hosted:  # a host region on a GPU service: the one D2H copy, straight into it
            bound.outs[name].copy_(getattr(result, name))
        mark(("write", time.perf_counter()))
        outcome = Outcome(
            buffer=buffer,
            entries=admitted.entries,
            written=list(bound.outs),
            rows=rows,
            topk=req.topk,
            repaired=_total(tallies["repaired"]),
            candidates=_total(tallies["candidates"]),
        )
        mark(("counts", time.perf_counter()))
        return outcome
    finally:
        table.release_all(admitted.regions)


def _check_owners_alive(owners: list[Region]) -> None:
    """Fail closed after the operator: memory of an owner that died mid-request may be gone (`owners`:
    a region of each owner process, each read once)."""
    for region in owners:
        if not OWNERS.alive(region.pid, region.pid_start):
            raise ServiceError(
                "stale_region",
                f"the owner of region {region.id} (pid {region.pid}) "
                "died while the request ran; its memory cannot be trusted",
            )


# ------------------------------------------------------------------------------------ the whole life


def _count(state, outcome: Outcome) -> None:
    metrics = state.metrics
    metrics.rows.inc(outcome.rows)
    if outcome.candidates:
        metrics.candidates.inc(outcome.candidates)
    if outcome.repaired:
        metrics.repairs.inc(outcome.repaired)


async def call_topk(admitted: Admitted, state, marks: list) -> Outcome:
    """Queue an admitted request (`admit`, or kept: UidAdmissions) for the device worker, execute,
    count: the request's answer (or its ServiceError)."""
    outcome = await state.executor.run(lambda: execute(admitted, state, marks), state.settings.request_timeout_s)
    marks.append(("settle", time.perf_counter()))
    _count(state, outcome)
    return outcome


def _settled(state, marks: list, outcome: DeviceOutcome) -> DeviceOutcome:
    marks.append(("settle", time.perf_counter()))
    if outcome[0]:
        _count(state, outcome[1])
    return outcome


def run_topk_if_idle(admitted: Admitted, state, marks: list) -> DeviceOutcome | None:
    """Execute an admitted request (`admit`, or a connection's `Admissions`) on a transport's own thread
    (never the event loop: the operator runs here) when the device is idle (the executor's
    `run_if_idle`: nothing queued or running): `(True, Outcome) | (False, error)`; None when the
    device is busy (then `queue_topk`, so that it runs behind the requests queued before it).
    `shutting_down` is raised here."""
    outcome = state.executor.run_if_idle(execute, admitted, state, marks)
    return _settled(state, marks, outcome) if outcome is not None else None


def queue_topk(admitted: Admitted, state, marks: list, done: Callable[[DeviceOutcome], None]) -> Job:
    """Queue an admitted request for the device worker (from any thread): `done((True, Outcome) | (False,
    error))` is called once, on the worker thread (set the returned job's `cancelled` to drop it before
    it runs). `overloaded` and `shutting_down` are raised here."""
    return state.executor.submit_threaded(
        lambda: execute(admitted, state, marks), lambda outcome: done(_settled(state, marks, outcome))
    )


def phase_durations(started: float | None, marks: list[tuple[str, float]]) -> dict[str, float]:
    """{phase: ms} of `marks` (each phase ends at its mark; the first starts at `started`, when the
    request's first byte arrived), plus `total`.

    parse   body read, decoding and validation                 admit   region and bound checks
    queue   waiting for the device worker                      views   leases, tensors, staging
    op      the operator (on a GPU: until its stream is idle)  checks  row faults, owners alive
    write   results into host `out` regions of a GPU service   counts  repaired/candidates sums
    settle  the device's end -> the transport (+ stream sync)  encode  the answer
    """
    first = started if started is not None else marks[0][1]
    out, last = {}, first
    for name, at in marks:
        out[name] = 1e3 * (at - last)
        last = at
    out["total"] = 1e3 * (last - first)
    return out


__all__ = [
    "ADMISSIONS_KEPT",
    "INPUTS",
    "Admissions",
    "Admitted",
    "Outcome",
    "UidAdmissions",
    "admit",
    "call_topk",
    "execute",
    "from_model",
    "outputs",
    "phase_durations",
    "queue_topk",
    "run_topk_if_idle",
]
