"""TopKClient and AsyncTopKClient: one implementation of request building and response parsing.

Every operation is written once as a *flow*: a generator that yields HTTP calls
`(method, path, kwargs)`, receives the httpx.Response of each, and returns the operation's
value. `TopKClient` drives flows with httpx.Client, `AsyncTopKClient` with httpx.AsyncClient;
nothing else differs between them.

`topk(...)` takes the arguments of `litetopk.kernels.litetopk_prefill`, the cache in either format
(ours: `kv_cache` alone; AITER's: `kv_cache` values plus `kv_scale=`, docs/cache-layouts.md). Each
tensor argument may
be a Region, a RegionSlice, a tensor inside a region this client registered (sent as a reference),
or a plain tensor: small row metadata (block_table, row_to_batch, starts, ends; at most
INLINE_MAX_VALUES values) then travels inline as JSON; larger metadata (as int32) and a large
CPU tensor (q_fp4, q_scale, kv_cache, kv_scale, weights) are copied into a pooled scratch shared-memory
region; a large CUDA tensor is registered by IPC handle for the call. Register what
you reuse (the cache above all) once with `register(tensor, access="read_only")`.

Host memory travels as sealed memfds (litetopk.clients.memfd): `register` hands the fd to the
service's fd socket (beside its Unix socket; over TCP the path /v1/info names), which answers a
one-time ticket, then registers the ticket over HTTP. A service whose fd socket this process
cannot reach accepts CUDA tensors only; large results then come back in the response body.
"""

from __future__ import annotations

import asyncio
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generator

import httpx
import torch

from litetopk.kernels import TopKResult
from litetopk.service.wire import (
    BINARY_MEDIA_TYPE,
    CODES,
    JSON_MEDIA_TYPE,
    RESULT_FIELDS,
    WireFormatError,
    assemble_result,
    decode_result_binary,
    decode_result_json,
    result_nbytes,
    result_shape,
)

from .errors import ProtocolError, RegionProblem, TopKClientError, TransportError, problem_error
from .ipc import AsyncIpcChannel, IpcChannel, IpcResponse, PackedBody, http_arguments, reachable
from .memfd import FD_SOCKET_NAME, HandoverError, SealedMemory, hand_over_fd
from .regions import Region, RegionSlice, export, owner_fields, release_export, resolve_owner_pid
from .transport import (
    DEFAULT_TIMEOUT,
    Endpoint,
    async_http,
    read_token_file,
    resolve_endpoint,
    resolve_token,
    sync_http,
    transport_error,
)

Call = tuple[str, str, dict]
Flow = Generator[Call, httpx.Response, Any]

SMALL_INPUTS = ("block_table", "row_to_batch", "starts", "ends")
INPUT_ORDER = ("q_fp4", "q_scale", "kv_cache", "block_table", "weights", "row_to_batch", "starts", "ends")
ACCEPT = {"auto": f"{JSON_MEDIA_TYPE}, {BINARY_MEDIA_TYPE}", "json": JSON_MEDIA_TYPE, "binary": BINARY_MEDIA_TYPE}
SCRATCH_MIN_BYTES = 1 << 20
# Row metadata (block_table, row_to_batch, starts, ends) of more values than this travels in the
# scratch region, not inline: 3 x 8192 values as JSON lists cost ~2.5 ms of parsing in the service
# and ~2 ms of .tolist()/encoding here (bench/NOTES-service.md).
INLINE_MAX_VALUES = 1024
# With result_format="auto", result fields of at least this many bytes in all (8192 rows x K=512:
# 50 MB) are written by the service into a pooled scratch shared-memory region and copied out here,
# instead of travelling in the response body: bench/NOTES-service.md measured the body at
# ~170 ms for 50 MB over the Unix socket (h11 + asyncio, 64 KiB reads), the region at ~10 ms.
RESULT_SCRATCH_MIN_BYTES = 1 << 20
PLANS_KEPT = 16  # top-k calls made of references only a client keeps worked out (_Plan)


def _read_timeout(timeout) -> float | None:
    """The read timeout of an httpx timeout (or a number) for the IPC channel's socket."""
    if isinstance(timeout, httpx.Timeout):
        return timeout.read
    return timeout


def _check(response):
    """Return a 2xx response; raise the typed problem (or ProtocolError) for anything else."""
    if response.is_success:
        return response
    ctype = response.headers.get("content-type", "")
    if "json" in ctype:
        try:
            body = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and "code" in body:
            raise problem_error(body, response.status_code, response.headers.get("retry-after"))
    raise ProtocolError(f"HTTP {response.status_code} without a problem body: {response.text[:200]!r}")


@dataclass(eq=False, slots=True)
class _Plan:
    """A top-k call whose every tensor is a reference (a Region or a RegionSlice: the same body every
    time, as an engine's hot path sends it), worked out once by the client: the call (its body and
    the body's msgpack, PackedBody), the objects it names, held so that no id in its key is reused
    while it is kept (`_plan_key`), and its answer's result when every field goes into `out`."""

    call: Call
    named: tuple  # every Region / RegionSlice the call names (inputs, then `out`)
    out: dict
    written: list[str]  # the fields written into `out`, in the order the service reports them
    result: TopKResult | None  # the `out` tensors as a result, when they hold every field


def _plan_key(args: tuple, kv_scale, out: dict | None, options: tuple) -> tuple:
    """The key of a top-k call among the kept plans: the ids of the objects it names (a kept plan holds
    its own, so ids are never reused among them) and its options."""
    if out:
        return (*map(id, args), id(kv_scale), *out, *map(id, out.values()), *options)
    return (*map(id, args), id(kv_scale), *options)


def _referenced(value) -> bool:
    """Whether `value` goes on the wire as a reference whose form never changes."""
    return (isinstance(value, Region) and value.registered) or isinstance(value, RegionSlice)


class _Flows:
    """Request building and response parsing shared by both clients (no I/O here)."""

    def __init__(self, endpoint: Endpoint, owner_pid: int | str | None = "current") -> None:
        self.endpoint = endpoint
        self.owner_pid = owner_pid  # resolved: 'current', None or a pid
        self._fd_socket: str | None = endpoint.uds and str(Path(endpoint.uds).parent / FD_SOCKET_NAME)
        self._lock = threading.Lock()
        self._regions: dict[str, Region] = {}
        self._scratch: list[Region] = []  # idle scratch regions
        self._plans: dict[tuple, _Plan] = {}  # by _plan_key
        self.observe = None  # called with every top-k answer (benchmarks: its Server-Timing header)

    # -- regions ---------------------------------------------------------------------------------

    def fd_socket(self) -> Flow:
        """The service's fd socket: beside its Unix socket, or (TCP) the one /v1/info names (None: none)."""
        if self._fd_socket is None:
            self._fd_socket = (yield from self.info()).get("fd_socket") or ""
        return self._fd_socket or None

    def register(self, tensor: torch.Tensor, *, min_size: int = 0, access: str = "read_write") -> Flow:
        exported = export(tensor, min_size=min_size, access=access)
        registration = {**exported.registration, **owner_fields(self.owner_pid)}
        try:
            if isinstance(exported.keepalive, SealedMemory):
                registration["ticket"] = yield from self._hand_over(exported.keepalive)
            info = _check((yield "POST", "/v1/regions", {"json": registration})).json()
        finally:
            if isinstance(exported.keepalive, SealedMemory):
                exported.keepalive.close_fd()  # the service has its own fd (or none: the memory goes with us)
        region = Region(
            id=info["id"],
            generation=info["generation"],
            kind=info["kind"],
            size=info["size"],
            base=exported.base,
            tensor=exported.tensor,
            keepalive=exported.keepalive,
        )
        with self._lock:
            self._regions[region.id] = region
        return region

    def _hand_over(self, memory: SealedMemory) -> Flow:
        path = yield from self.fd_socket()
        if path is None:
            raise TransportError(
                f"the service at {self.endpoint} has no fd socket (it listens on no Unix socket): "
                "host tensors cannot be registered there; register CUDA tensors or run the service "
                "with a Unix socket"
            )
        try:
            return hand_over_fd(path, memory.fd)
        except HandoverError as exc:
            if exc.problem is not None and exc.problem["code"] in CODES:  # e.g. overloaded, fd_exhausted
                status = CODES[exc.problem["code"]][0]
                raise problem_error({**exc.problem, "status": status}, status) from exc
            raise TransportError(str(exc)) from exc

    def unregister(self, region: Region) -> Flow:
        """Unregister (idempotent: a region the service already dropped is only released here)."""
        try:
            if region.registered:
                response = yield "DELETE", f"/v1/regions/{region.id}", {"params": {"generation": region.generation}}
                try:
                    _check(response)
                except RegionProblem as problem:
                    if problem.code not in ("unknown_region", "stale_region"):
                        raise
        finally:
            with self._lock:
                if self._regions.get(region.id) is region:
                    del self._regions[region.id]
                if region in self._scratch:
                    self._scratch.remove(region)
                self._plans = {
                    key: plan
                    for key, plan in self._plans.items()
                    if not any(v is region or getattr(v, "region", None) is region for v in plan.named)
                }
            release_export(region)

    def list_regions(self) -> Flow:
        return _check((yield "GET", "/v1/regions", {})).json()["regions"]

    def info(self) -> Flow:
        return _check((yield "GET", "/v1/info", {})).json()

    def ready(self) -> Flow:
        return (yield "GET", "/readyz", {}).status_code == 200

    def close(self) -> Flow:
        with self._lock:
            regions = list(self._regions.values())
        for region in regions:
            try:
                yield from self.unregister(region)
            except TopKClientError:
                pass  # the service is gone or refused: the local side is released all the same

    # -- topk ------------------------------------------------------------------------------------

    def _find(self, tensor: torch.Tensor) -> RegionSlice | None:
        with self._lock:
            regions = list(self._regions.values())
        for region in regions:
            if region.registered and region.contains(tensor):
                return RegionSlice(region, region.offset_of(tensor), tensor.dtype, tuple(tensor.shape))
        return None

    def _reference(self, value) -> RegionSlice | None:
        if isinstance(value, Region):
            return value.slice()
        if isinstance(value, RegionSlice):
            return value
        if isinstance(value, torch.Tensor):
            return self._find(value)
        raise TypeError(f"expected a torch.Tensor, Region or RegionSlice, got {type(value).__name__}")

    def _take_scratch(self, nbytes: int) -> Region | None:
        with self._lock:
            fitting = [r for r in self._scratch if r.size >= nbytes]
            if not fitting:
                return None
            region = min(fitting, key=lambda r: r.size)
            self._scratch.remove(region)
            return region

    def topk(
        self,
        args: tuple,
        *,
        topk: int,
        weight_scale: float = 1.0,
        backend: str = "auto",
        repair: bool = True,
        out: dict | None = None,
        result_format: str = "auto",
        kv_scale=None,
    ) -> Flow:
        if len(args) != len(INPUT_ORDER):
            raise TypeError(f"topk() takes {len(INPUT_ORDER)} tensors ({', '.join(INPUT_ORDER)}), got {len(args)}")
        key = _plan_key(args, kv_scale, out, (topk, weight_scale, backend, repair, result_format))
        try:
            hash(key)  # kept when the call is made of references only (`planned` finds it next time)
        except TypeError:  # an unhashable option: the service says what is wrong with it
            key = None
        named = dict(zip(INPUT_ORDER, args))
        if kv_scale is not None:  # AITER's cache format: kv_cache holds its values
            named["kv_scale"] = kv_scale
        body: dict[str, Any] = {}
        staged: list[tuple[str, torch.Tensor]] = []  # large CPU tensors to copy into scratch
        temporary: list[Region] = []
        scratch: Region | None = None
        results: Region | None = None  # scratch the service writes large results into
        collect: dict[str, RegionSlice] = {}
        try:
            for name, value in named.items():
                if isinstance(value, Region) and value.registered:  # the common cases: their wire form is kept
                    body[name] = value.wire()
                    continue
                if isinstance(value, RegionSlice):
                    body[name] = value.to_wire()
                    continue
                ref = self._reference(value)
                if ref is not None:
                    body[name] = ref.to_wire()
                elif name in SMALL_INPUTS and value.numel() <= INLINE_MAX_VALUES:
                    body[name] = {
                        "dtype": "int32",
                        "shape": list(value.shape),
                        "data": value.to(torch.int32).flatten().tolist(),
                    }
                elif name in SMALL_INPUTS:  # large metadata: staged like large CPU inputs (no JSON list)
                    staged.append((name, value.to(torch.int32)))
                elif value.device.type == "cuda":
                    region = yield from self.register(value.contiguous(), access="read_only")
                    temporary.append(region)
                    body[name] = region.slice().to_wire()
                else:
                    staged.append((name, value))
            if staged:
                scratch, layout = yield from self._stage(staged)
                body.update(layout)
            if out:
                body["out"] = {}
                for name, value in out.items():
                    if name not in RESULT_FIELDS:
                        raise ValueError(f"out[{name!r}]: not a result field; fields: {list(RESULT_FIELDS)}")
                    if isinstance(value, Region) and value.registered:
                        body["out"][name] = value.wire()
                        continue
                    ref = self._reference(value)
                    if ref is None:
                        raise ValueError(
                            f"out[{name!r}] must be a Region, RegionSlice or a tensor inside a registered region"
                        )
                    body["out"][name] = ref.to_wire()
            if result_format == "auto":
                results, collect = yield from self._result_scratch(named["q_fp4"], topk, out or {})
                if collect:
                    body.setdefault("out", {}).update({n: ref.to_wire() for n, ref in collect.items()})
            body.update(topk=topk, weight_scale=float(weight_scale), repair=bool(repair), backend=backend)
            for value in named.values():  # the exporter's duty: contents complete before the call
                if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                    torch.cuda.current_stream(value.device).synchronize()
            call = ("POST", "/v1/topk", {"json": body, "headers": {"accept": ACCEPT[result_format]}})
            if key is not None and not (staged or temporary or collect):
                refs = (*named.values(), *(out or {}).values())
                if all(_referenced(value) for value in refs):
                    call = self._keep_plan(key, call, refs, out or {})
            response = yield call
            return self._parse_result(_check(response), out or {}, collect)
        except RegionProblem as problem:
            if problem.code in ("unknown_region", "stale_region"):
                for region in (scratch, results):  # the service forgot it (restart, eviction): never reuse it
                    if region is not None:
                        release_export(region)
                scratch = results = None
            raise
        finally:
            for region in (scratch, results):
                if region is not None:
                    with self._lock:
                        self._scratch.append(region)
            for region in temporary:
                yield from self.unregister(region)

    def _keep_plan(self, key: tuple, call: Call, named: tuple, out: dict) -> Call:
        """Keep the plan of a call made of references only (at most PLANS_KEPT: then they start over);
        its call, whose body now carries its msgpack."""
        method, path, kwargs = call
        call = (method, path, {**kwargs, "json": PackedBody(kwargs["json"])})
        written = [n for n in RESULT_FIELDS if n in out]
        result = None
        if len(written) == len(RESULT_FIELDS):
            result = assemble_result({n: self._out_tensor(out[n]) for n in written})
        if len(self._plans) >= PLANS_KEPT:
            self._plans = {}
        self._plans[key] = _Plan(call, named, dict(out), written, result)  # the caller may change its dict
        return call

    def planned(self, args: tuple, kv_scale, out: dict | None, options: tuple) -> _Plan | None:
        """The kept plan of a top-k call (`topk`'s arguments; `options` = (topk, weight_scale, backend,
        repair, result_format)), None when it has none: the clients then send its one call without
        driving the flow, and read the answer with `planned_result`."""
        if len(args) != len(INPUT_ORDER):
            return None
        try:
            return self._plans.get(_plan_key(args, kv_scale, out, options))
        except TypeError:
            return None

    def planned_result(self, response, plan: _Plan) -> TopKResult:
        """The result of a planned call: its kept result when the answer wrote every field into `out`."""
        _check(response)
        if plan.result is not None and isinstance(response, IpcResponse):
            fields, written = response.result
            if not fields and written == plan.written:
                if self.observe is not None:
                    self.observe(response)
                return plan.result
        return self._parse_result(response, plan.out)

    def _result_scratch(self, q_fp4, topk: int, out: dict) -> Flow:
        """(scratch region, {field: slice}) for the result fields not in `out` when they are large
        (RESULT_SCRATCH_MIN_BYTES); (None, {}) otherwise (they come back in the body)."""
        names = [n for n in RESULT_FIELDS if n not in out]
        if not names:
            return None, {}  # every field goes into the caller's regions
        shape = (
            q_fp4.shape
            if isinstance(q_fp4, (torch.Tensor, RegionSlice))
            else q_fp4.tensor.shape
            if isinstance(q_fp4, Region)
            else None
        )
        if shape is None or len(shape) != 3 or not isinstance(topk, int) or isinstance(topk, bool) or topk < 1:
            return None, {}  # malformed: the service says what is wrong
        rows = int(shape[0])
        if result_nbytes(rows, topk, names) < RESULT_SCRATCH_MIN_BYTES:
            return None, {}
        layout, total = [], 0
        for name in names:
            dims = result_shape(name, rows, topk)
            layout.append((name, total, dims))
            total += -(-math.prod(dims) * 4 // 64) * 64
        region = self._take_scratch(total)
        if region is None:
            if (yield from self.fd_socket()) is None:
                return None, {}  # the service takes no host memory from us: results come back in the body
            size = max(SCRATCH_MIN_BYTES, 1 << max(total - 1, 1).bit_length())
            region = yield from self.register(torch.empty(0, dtype=torch.uint8), min_size=size)
        return region, {n: RegionSlice(region, offset, RESULT_FIELDS[n][0], dims) for n, offset, dims in layout}

    def _stage(self, staged: list[tuple[str, torch.Tensor]]) -> Flow:
        """Copy large CPU tensors into one idle scratch region (registering a bigger one if needed)."""
        offsets, total = [], 0
        for _, tensor in staged:
            offsets.append(total)
            total += -(-tensor.numel() * tensor.element_size() // 64) * 64
        scratch = self._take_scratch(total)
        if scratch is None:
            size = max(SCRATCH_MIN_BYTES, 1 << max(total - 1, 1).bit_length())
            scratch = yield from self.register(torch.empty(0, dtype=torch.uint8), min_size=size)
        layout = {}
        for (name, tensor), offset in zip(staged, offsets):
            ref = RegionSlice(scratch, offset, tensor.dtype, tuple(tensor.shape))
            ref.tensor().copy_(tensor)
            layout[name] = ref.to_wire()
        return scratch, layout

    def _out_tensor(self, value) -> torch.Tensor:
        """The local tensor of an `out` value (a tensor, a Region or a RegionSlice)."""
        if isinstance(value, torch.Tensor):
            return value
        if isinstance(value, Region):
            return value.tensor
        return self._reference(value).tensor()

    def _parse_result(self, response, out: dict, collect: dict | None = None) -> TopKResult:
        if self.observe is not None:
            self.observe(response)
        ctype = "" if isinstance(response, IpcResponse) else response.headers.get("content-type", "")
        try:
            if isinstance(response, IpcResponse):
                fields, written = response.result
            elif ctype.startswith(BINARY_MEDIA_TYPE):
                fields, *_rest, written = decode_result_binary(response.content)
            elif ctype.startswith(JSON_MEDIA_TYPE):
                fields, *_rest, written = decode_result_json(response.json())
            else:
                raise ProtocolError(f"unexpected result media type {ctype!r}")
        except WireFormatError as exc:
            raise ProtocolError(str(exc)) from exc
        for name in written:
            if collect and name in collect:  # pooled scratch: copied out before the region is reused
                fields[name] = collect[name].tensor().clone()
                continue
            fields[name] = self._out_tensor(out[name])
        try:
            return assemble_result(fields)
        except WireFormatError as exc:
            raise ProtocolError(str(exc)) from exc


TRANSPORTS = ("auto", "ipc", "http")


class _ClientBase:
    def __init__(
        self,
        base_url: str | None = None,
        *,
        uds: str | None = None,
        timeout=DEFAULT_TIMEOUT,
        owner_pid: int | str | None = "auto",
        token: str | None = None,
        transport: str = "auto",
    ):
        if transport not in TRANSPORTS:
            raise ValueError(f"transport={transport!r}: give one of {TRANSPORTS}")
        self.endpoint: Endpoint = resolve_endpoint(base_url, uds)
        self._flows = _Flows(self.endpoint, resolve_owner_pid(owner_pid))
        self._token = None if self.endpoint.uds else resolve_token(token)
        self._ipc_path = None
        if transport != "http":
            self._ipc_path = reachable(self.endpoint.uds)
            if self._ipc_path is None and transport == "ipc":
                raise TransportError(
                    f"no IPC channel beside {self.endpoint} (it needs the service's Unix socket "
                    "and a service with LITETOPK_IPC on); use transport='http'"
                )

    @property
    def transport(self) -> str:
        """'ipc' or 'http': what this client's calls travel over."""
        return "ipc" if self._ipc is not None else "http"

    @property
    def observe(self):
        return self._flows.observe

    @observe.setter
    def observe(self, callback) -> None:
        """`callback(response)` after every top-k answer (benchmarks: the phases are its Server-Timing
        header, `response.headers["server-timing"]`, best read after the timed calls)."""
        self._flows.observe = callback

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.endpoint})"


class TopKClient(_ClientBase):
    """Blocking client of the litetopk service (TCP `base_url` or Unix socket `uds`).

    owner_pid  the process whose death retires this client's regions in the service: 'auto'
               (default: $LITETOPK_CLIENT_OWNER_PID when set, 'none' or a pid, else this process),
               None (send `pid: null`: nothing is tracked; unregister explicitly) or a pid. The
               client also sends its pid namespace, so a service in another pid namespace refuses
               the pid (`foreign_pid_namespace`) instead of tracking an unrelated process.
    token      the bearer token sent over TCP: None (default: $LITETOPK_TOKEN, the file
               $LITETOPK_TOKEN_FILE, or the service's token file beside the default socket) or the
               token itself. On the Unix socket the service knows the caller by its uid instead.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        uds: str | None = None,
        timeout=DEFAULT_TIMEOUT,
        owner_pid: int | str | None = "auto",
        token: str | None = None,
        transport: str = "auto",
    ):
        super().__init__(base_url, uds=uds, timeout=timeout, owner_pid=owner_pid, token=token, transport=transport)
        self._http = sync_http(self.endpoint, timeout, self._token)
        if self._token is None and not self.endpoint.uds:
            self._find_token()
        self._ipc = IpcChannel(self._ipc_path, _read_timeout(timeout)) if self._ipc_path else None

    def _find_token(self) -> None:
        """Over TCP without a token: the token file /v1/info names, when this user can read it."""
        try:
            path = self._http.get("/v1/info").json().get("token_file")
        except (httpx.HTTPError, ValueError, AttributeError):
            return
        token = read_token_file(path) if path else None
        if token:
            self._token = token
            self._http.headers["authorization"] = f"Bearer {token}"

    def _call(self, method: str, path: str, kwargs: dict):
        """One call on the client's channel (IPC, else HTTP), httpx's transport errors translated."""
        try:
            if self._ipc is not None:
                return self._ipc.request(method, path, **kwargs)
            return self._http.request(method, path, **http_arguments(kwargs))
        except httpx.TransportError as exc:
            raise transport_error(self.endpoint, exc) from exc

    def _drive(self, flow: Flow):
        reply, error = None, None
        while True:
            try:
                call = flow.throw(error) if error is not None else flow.send(reply)
            except StopIteration as stop:
                return stop.value
            try:
                reply, error = self._call(*call), None
            except BaseException as exc:  # e.g. KeyboardInterrupt: the flow cleans up, then re-raises it
                reply, error = None, exc

    def register(self, tensor: torch.Tensor, *, access: str = "read_write") -> Region:
        """Share `tensor` with the service (CPU: copied once into a sealed memfd; CUDA: IPC handle).

        access  'read_write' (default: `out=` may name it) or 'read_only' (inputs only, e.g. a cache)."""
        return self._drive(self._flows.register(tensor, access=access))

    def unregister(self, region: Region) -> None:
        """Unregister `region`; when this returns the service no longer touches its memory."""
        self._drive(self._flows.unregister(region))

    def topk(
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
        backend: str = "auto",
        repair: bool = True,
        out: dict | None = None,
        result_format: str = "auto",
        kv_scale=None,
    ) -> TopKResult:
        """`litetopk_prefill` on the service. `out` maps result fields to regions written in place.

        kv_scale  None (our cache format: `kv_cache` uint8 [pages, 4352]) or AITER's scales uint8
                  [pages, 1, 4, 64], `kv_cache` then being AITER's values [pages, 1, 4, 64, 16];
                  like every tensor argument a tensor, a Region or a RegionSlice."""
        args = (q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends)
        plan = self._flows.planned(args, kv_scale, out, (topk, weight_scale, backend, repair, result_format))
        if plan is not None:  # made of references only, as before: its one call, without the flow
            return self._flows.planned_result(self._call(*plan.call), plan)
        return self._drive(
            self._flows.topk(
                args,
                topk=topk,
                weight_scale=weight_scale,
                backend=backend,
                repair=repair,
                out=out,
                result_format=result_format,
                kv_scale=kv_scale,
            )
        )

    def regions(self) -> list[dict]:
        return self._drive(self._flows.list_regions())

    def info(self) -> dict:
        return self._drive(self._flows.info())

    def ready(self) -> bool:
        return self._drive(self._flows.ready())

    def close(self) -> None:
        """Unregister every region this client registered, then close the connection."""
        try:
            self._drive(self._flows.close())
        finally:
            self._http.close()
            if self._ipc is not None:
                self._ipc.close()

    def __enter__(self) -> "TopKClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncTopKClient(_ClientBase):
    """asyncio client of the litetopk service; the same options and methods as TopKClient, awaitable."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        uds: str | None = None,
        timeout=DEFAULT_TIMEOUT,
        owner_pid: int | str | None = "auto",
        token: str | None = None,
        transport: str = "auto",
    ):
        super().__init__(base_url, uds=uds, timeout=timeout, owner_pid=owner_pid, token=token, transport=transport)
        self._http = async_http(self.endpoint, timeout, self._token)
        self._ipc = None
        self._connecting = asyncio.Lock()

    async def _channel(self):
        if self._ipc_path is None:
            return self._http
        async with self._connecting:
            if self._ipc is None:
                self._ipc = await AsyncIpcChannel(self._ipc_path).connect()
        return self._ipc

    async def _call(self, method: str, path: str, kwargs: dict):
        """One call on the client's channel (IPC, else HTTP), httpx's transport errors translated."""
        channel = self._ipc or await self._channel()
        try:
            if channel is self._http:
                return await channel.request(method, path, **http_arguments(kwargs))
            return await channel.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise transport_error(self.endpoint, exc) from exc

    async def _drive(self, flow: Flow):
        reply, error = None, None
        while True:
            try:
                call = flow.throw(error) if error is not None else flow.send(reply)
            except StopIteration as stop:
                return stop.value
            try:
                reply, error = await self._call(*call), None
            except BaseException as exc:  # e.g. CancelledError: the flow cleans up, then re-raises it
                reply, error = None, exc

    async def register(self, tensor: torch.Tensor, *, access: str = "read_write") -> Region:
        return await self._drive(self._flows.register(tensor, access=access))

    async def unregister(self, region: Region) -> None:
        await self._drive(self._flows.unregister(region))

    async def topk(
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
        backend: str = "auto",
        repair: bool = True,
        out: dict | None = None,
        result_format: str = "auto",
        kv_scale=None,
    ) -> TopKResult:
        args = (q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends)
        plan = self._flows.planned(args, kv_scale, out, (topk, weight_scale, backend, repair, result_format))
        if plan is not None:  # made of references only, as before: its one call, without the flow
            return self._flows.planned_result(await self._call(*plan.call), plan)
        return await self._drive(
            self._flows.topk(
                args,
                topk=topk,
                weight_scale=weight_scale,
                backend=backend,
                repair=repair,
                out=out,
                result_format=result_format,
                kv_scale=kv_scale,
            )
        )

    async def regions(self) -> list[dict]:
        return await self._drive(self._flows.list_regions())

    async def info(self) -> dict:
        return await self._drive(self._flows.info())

    async def ready(self) -> bool:
        return await self._drive(self._flows.ready())

    async def close(self) -> None:
        try:
            await self._drive(self._flows.close())
        finally:
            await self._http.aclose()
            if self._ipc is not None:
                await self._ipc.aclose()

    async def __aenter__(self) -> "AsyncTopKClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


__all__ = ["AsyncTopKClient", "TopKClient"]
