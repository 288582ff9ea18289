"""The app factory: `create_app(settings)` wires settings -> regions -> executor -> routes.

Lifespan:
  start  resolve the pinned device and backend (a backend that cannot run here fails the start),
         write the TCP bearer token (0600, beside the socket), open the fd socket (host memory is
         handed over there), start the device worker, log where the service listens, queue the
         warm-up (a tiny random problem: /readyz turns ready and "ready" is logged when it has
         run; the same job then allocates the device's operator workspace, sized from the limits,
         and runs the problem once more on it), start the periodic check that retires regions of dead owners;
  stop   refuse new work (`shutting_down`), let the worker finish everything queued, release
         every region, close the fd socket and remove it and the token file.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path

import torch
from fastapi import FastAPI

from litetopk.kernels import SUPPORTED_TOPK, litetopk_prefill, pack_kv_cache, quantize_mxfp4, resolve_backend

from . import __version__
from .errors import install_error_handlers
from .executor import DeviceExecutor
from .fdpass import FdSocket
from .ipc import IpcServer
from .metrics import ServiceMetrics
from .middleware import RequestGuard
from .operator import WorkspaceLimits
from .principals import remove_token_file, write_token_file
from .regions import REGION_KINDS, RegionTable
from .routes import health_router, regions_router, topk_router
from .schemas import TopKRequest
from .settings import ServiceSettings
from .state import ServiceState
from .wire import FD_SOCKET_NAME, IPC_SOCKET_NAME

log = logging.getLogger("litetopk.service")


def warmup_problem(device: torch.device, seed: int = 0) -> tuple[tuple, dict]:
    """A tiny random problem (1 sequence of 600 keys, 2 rows, K=512) on `device`."""
    gen = torch.Generator().manual_seed(seed)
    length, rows = 600, 2
    k_fp4, k_scale = quantize_mxfp4(torch.randn(1, length, 128, generator=gen))
    pages = -(-length // 64)
    block_table = torch.arange(pages, dtype=torch.int32)[None]
    cache = pack_kv_cache(k_fp4, k_scale, block_table, pages)
    q_fp4, q_scale = quantize_mxfp4(torch.randn(rows, 64, 128, generator=gen))
    weights = torch.randn(rows, 64, generator=gen)
    meta = [
        torch.zeros(rows, dtype=torch.int32),
        torch.zeros(rows, dtype=torch.int32),
        torch.full((rows,), length, dtype=torch.int32),
    ]
    args = tuple(t.to(device) for t in (q_fp4, q_scale, cache, block_table, weights, *meta))
    return args, {"topk": 512}


def workspace_limits(settings: ServiceSettings, device: torch.device) -> WorkspaceLimits:
    """What the device's operator workspace is sized for (settings max_rows, max_keys, max_batch)."""
    return WorkspaceLimits(settings.row_limit(device), settings.max_keys, settings.max_batch)


async def _warm_up(state: ServiceState) -> None:
    settings, executor = state.settings, state.executor

    def allocate():
        limits = workspace_limits(settings, state.device)
        operator = executor.build_operator(
            limits, state.backend, state.tuning, graphs=settings.graphs, max_graphs=settings.max_graphs
        )
        log.info(
            "operator: %.1f MiB on %s for %d rows, %d keys, %d sequences, K in %s (graphs %s)",
            operator.nbytes / 2**20,
            state.device,
            limits.max_rows,
            limits.max_keys,
            limits.max_batch,
            SUPPORTED_TOPK,
            "on" if operator.runner is not None else "off",
        )
        return operator

    def run():  # one job: the warm-up, then the operator, then the warm-up again through it
        args, kwargs = warmup_problem(state.device)
        log.info("warm-up: a first call on %s (compiles the kernels on a cold cache)", state.device)
        litetopk_prefill(*args, **kwargs, backend=settings.backend, tuning=state.tuning).raise_for_status()
        limits = workspace_limits(settings, state.device)
        log.info(
            "warm-up: sizing the workspace for %d rows, %d keys, %d sequences (a call a mode and size class)",
            limits.max_rows,
            limits.max_keys,
            limits.max_batch,
        )
        operator = allocate()
        names = ("q_fp4", "q_scale", "kv_cache", "block_table", "weights", "row_to_batch", "starts", "ends")
        inputs = dict(zip(names, args))
        kv_cache = inputs.pop("kv_cache")
        operator(inputs, kv_cache, kv_scale=None, weight_scale=1.0, repair=True, out={}, **kwargs).raise_for_status()

    if not settings.warmup:  # ready at once; the requests queue behind the workspace's job
        state.ready.set()
        try:
            await executor.run(allocate, timeout=max(settings.request_timeout_s, 600.0))
        except Exception as exc:  # requests then answer not_ready (executor.operator_for)
            state.warmup_error = f"{type(exc).__name__}: {exc}"
            log.error("workspace allocation failed on %s: %s", state.device, state.warmup_error)
        return

    started = time.perf_counter()
    try:
        await executor.run(run, timeout=max(settings.request_timeout_s, 600.0))
    except Exception as exc:  # reported by /readyz (not_ready) and the log; the process stays up
        state.warmup_error = f"{type(exc).__name__}: {exc}"
        log.error("warm-up failed on %s: %s", state.device, state.warmup_error)
        return
    state.ready.set()
    log.info(
        "ready: warm-up done in %.1f s (backend %s on %s)", time.perf_counter() - started, state.backend, state.device
    )


async def _retire_dead_owners(state: ServiceState) -> None:
    while True:
        await asyncio.sleep(state.settings.region_check_interval_s)
        state.tickets.expire()
        await asyncio.to_thread(state.table.drop_dead_owners)  # closing a CUDA handle may block


def _bind_metrics(state: ServiceState) -> None:
    metrics, table = state.metrics, state.table
    for kind in REGION_KINDS:
        metrics.regions.labels(kind).set_function(lambda kind=kind: sum(r.kind == kind for r in table.list()))

    def on_retire(region) -> None:
        metrics.regions_retired.labels(region.reason.value).inc()
        if state.executor.operator is not None:  # its graphs may read the region: dropped before the next call
            state.executor.operator.invalidate()

    table.on_retire = on_retire


def _open_side_files(state: ServiceState, stack: contextlib.ExitStack) -> None:
    """The token file and the fd socket (each undone by `stack`)."""
    settings = state.settings
    if settings.uds:
        settings.socket_dir()  # created (or checked) without following links
        path = str(Path(settings.uds).parent / FD_SOCKET_NAME)
        fd_socket = FdSocket(
            path, state.tickets, settings.uds_mode, settings.socket_group_id(), settings.resource_log_interval_s
        )
        stack.callback(fd_socket.stop)
        fd_socket.start()
        state.fd_socket = path
    stack.callback(state.tickets.close_all)
    token_path = settings.token_path()
    if token_path is not None:
        state.token, state.token_path = write_token_file(token_path), token_path
        stack.callback(remove_token_file, token_path)


#: The dtype each tensor of a top-k body must have (the operator refuses others: bad_dtype): the
#: OpenAPI schema says so, as strict as the service.
TENSOR_DTYPES = {
    "q_fp4": ["uint8"],
    "q_scale": ["uint8"],
    "kv_cache": ["uint8"],
    "kv_scale": ["uint8"],
    "weights": ["float32", "bfloat16"],
    "block_table": ["int32"],
    "row_to_batch": ["int32"],
    "starts": ["int32"],
    "ends": ["int32"],
    "values": ["float32"],
    "raw_indices": ["int32"],
    "physical_indices": ["int32"],
    "counts": ["int32"],
    "status": ["int32"],
    "repaired": ["int32"],
    "candidates": ["int32"],
}


def _served_backend(settings: ServiceSettings) -> str | None:
    try:
        return resolve_backend(settings.backend, settings.torch_device())
    except Exception:  # the lifespan fails the start with the reason; the schema keeps every name
        return None


def _strict_topk_schema(components: dict, backend: str | None) -> None:
    """Each RegionSlice of the top-k body narrowed to its tensor's dtypes (a component per set), and
    `backend` to the names this service accepts ('auto' and its own)."""
    base = components["RegionSlice"]
    for model in ("TopKRequest", "OutputRegions"):
        for field, prop in components[model]["properties"].items():
            if field not in TENSOR_DTYPES:
                continue
            dtypes = TENSOR_DTYPES[field]
            name = "RegionSlice_" + "_".join(dtypes)
            narrowed = {
                **base,
                "properties": {**base["properties"], "dtype": {"enum": dtypes, "type": "string"}},
                "title": f"RegionSlice ({', '.join(dtypes)})",
            }
            components.setdefault(name, narrowed)
            ref = {"$ref": "#/components/schemas/RegionSlice"}
            for option in prop.get("anyOf", [prop]):
                if option == ref:
                    option["$ref"] = f"#/components/schemas/{name}"
            if prop.get("$ref") == ref["$ref"]:
                prop["$ref"] = f"#/components/schemas/{name}"
    if backend is not None:
        components["TopKRequest"]["properties"]["backend"]["enum"] = ["auto", backend]


def _with_body_schemas(app: FastAPI, backend: str | None, *models) -> None:
    """Add `models` (bodies a route parses itself) and their sub-models to the OpenAPI components."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in models:
            doc = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in doc.pop("$defs", {}).items():
                components.setdefault(name, sub)
            components.setdefault(model.__name__, doc)
        _strict_topk_schema(components, backend)
        return schema

    app.openapi = openapi


def create_app(settings: ServiceSettings | None = None, *, listening: str = "") -> FastAPI:
    """A FastAPI app serving one pinned device (settings from the environment when not given);
    `listening` (where __main__ bound its sockets) goes into the start line of the log."""
    settings = settings or ServiceSettings()
    metrics = ServiceMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        device = settings.torch_device()
        backend = resolve_backend(settings.backend, device)
        tuning = settings.tuning(backend)  # a calibration the backend cannot run fails the start here
        table = RegionTable(
            device,
            settings.foreign_pid_namespace,
            max_regions=settings.max_regions_per_principal,
            max_bytes=settings.max_region_bytes_per_principal,
        )
        executor = DeviceExecutor(
            device,
            settings.queue_size,
            metrics,
            settings.retry_after_s,
            settings.fault_delay_s,
            settings.fault_gate_file,
        )
        state = ServiceState(
            settings=settings,
            device=device,
            backend=backend,
            tuning=tuning,
            table=table,
            executor=executor,
            metrics=metrics,
            http_url=next((w for w in listening.split(" and ") if w.startswith("http")), None),
        )
        _bind_metrics(state)
        app.state.service = state
        with contextlib.ExitStack() as side_files:
            _open_side_files(state, side_files)
            executor.start()
            ipc = None
            if settings.uds and settings.ipc:
                ipc = IpcServer(
                    state,
                    str(Path(settings.uds).parent / IPC_SOCKET_NAME),
                    settings.uds_mode,
                    settings.socket_group_id(),
                )
                await ipc.start()
                state.ipc_socket = ipc.path
            log.info(
                "litetopk listening on %s (backend %s, device %s%s, fd socket %s, ipc socket %s, token file %s)",
                listening or "(in-process)",
                backend,
                device,
                f", gpu uuid {table.uuid}" if table.uuid else "",
                state.fd_socket,
                state.ipc_socket,
                state.token_path,
            )
            tasks = [asyncio.create_task(_warm_up(state)), asyncio.create_task(_retire_dead_owners(state))]
            try:
                yield
            finally:
                state.draining = True
                for task in tasks:
                    task.cancel()
                if ipc is not None:
                    try:
                        await asyncio.wait_for(ipc.close(), settings.shutdown_timeout_s + 1)
                    except asyncio.TimeoutError:
                        log.warning("IPC requests still running after the grace period: their connections close")
                await executor.close(settings.shutdown_timeout_s)
                table.close_all()

    app = FastAPI(
        title="litetopk",
        version=__version__,
        lifespan=lifespan,
        summary="Top-k index selection (DeepSeek-V4 lightning indexer) on one pinned GPU",
        description="Regions (shared memory, CUDA IPC) are registered once and named by every request; "
        "errors are RFC 9457 problem+json with a stable `code`.",
    )
    install_error_handlers(app)
    _with_body_schemas(app, _served_backend(settings), TopKRequest)
    app.add_middleware(RequestGuard, max_request_bytes=settings.max_request_bytes, metrics=metrics)
    app.include_router(regions_router)
    app.include_router(topk_router)
    app.include_router(health_router)
    return app


__all__ = ["create_app", "warmup_problem", "workspace_limits"]
