"""Service benchmark: what the litetopk service adds to an in-process `litetopk_prefill` call.

Modes, per shape:
    in-process   litetopk_prefill on the device in this process (the floor)
    uds          TopKClient over the Unix socket; inputs in registered regions (CPU: shared memory,
                 CUDA: IPC handles, no copy), the result comes back in the body (binary form)
    uds+out      the same, but every result field is written into caller regions (zero copy)
    tcp          TopKClient over TCP to 127.0.0.1, like `uds`
Measured: latency p50/p99 of sequential calls (one in flight; the modes take turns call by call)
and throughput with `--concurrency` requests in flight (AsyncTopKClient; in-process: sequential). Every service answer
is checked
equal (torch.equal, every field) to the in-process answer.

Shapes (rows = query rows at the end of one sequence of `keys` compressed keys, K=512):
    GPU  decode  32 rows x 16,384 keys      prefill  8,192 rows x 65,536 keys (the issue's shape)
    CPU  decode   8 rows x  4,096 keys      prefill     64 rows x  8,192 keys (the reference backend
         is plain torch on the CPU: the GPU prefill shape would take hours; this one takes ~0.5 s)

    python3 -m bench.service                       # both shapes on the default device
    python3 -m bench.service --shapes prefill --out $OUT
Writes <out>/service-<device>.json (device, versions, command line, numbers) and a PNG plot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import BENCH_DIR, REPO_ROOT, RESULTS_DIR
from bench.common.problems import call_args, prefill_problem
from litetopk.clients import AsyncTopKClient, TopKClient, TransportError  # noqa: E402
from litetopk.kernels import litetopk_prefill  # noqa: E402

SHAPES = {  # name -> {device type -> (rows, keys)}
    "decode": {"cuda": (32, 16384), "cpu": (8, 4096)},
    "prefill": {"cuda": (8192, 65536), "cpu": (64, 8192)},
}
ITERS = {"decode": {"cuda": 200, "cpu": 40}, "prefill": {"cuda": 20, "cpu": 8}}
MODES = ("in-process", "uds", "uds+out", "tcp")
FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status", "repaired", "candidates")


# ---------------------------------------------------------------------------------- service


class Service:
    """`python -m litetopk.service` pinned to `device`, on a free TCP port and a private socket.

    `entry` replaces `-m litetopk.service` (e.g. a script that serves the same app with the
    operator mocked), `env` the child's environment."""

    def __init__(self, device: str, backend: str, directory: str, *,
                 entry: tuple[str, ...] = ("-m", "litetopk.service"), env: dict | None = None):
        self.uds = os.path.join(directory, "litetopk.sock")
        self.log = open(os.path.join(directory, "service.log"), "w+")
        argv = [sys.executable, *entry, "--device", device, "--backend", backend, "--port", "0",
                "--uds", self.uds, "--log-level", "warning", "--queue-size", "256", "--request-timeout-s", "900",
                "--max-request-bytes", str(256 * 2**20)]
        self.process = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=REPO_ROOT)
        self.url = self._wait_url()
        with TopKClient(self.url) as client:
            deadline = time.monotonic() + 900  # the warm-up compiles the kernels on a GPU
            while True:
                try:
                    if client.ready():
                        break
                except TransportError:  # not accepting (yet, or any more): the log says which
                    pass
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the service did not become ready:\n{self.text()}")
                time.sleep(0.1)

    def text(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def _wait_url(self) -> str:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            match = re.search(r"litetopk listening on (http://\S+)", self.text())
            if match:
                return match.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"the service did not start:\n{self.text()}")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# ---------------------------------------------------------------------------------- measuring


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, iters: int, warmup: int, device: torch.device) -> list[float]:
    for _ in range(warmup):
        fn()
    sync(device)
    seconds = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        sync(device)
        seconds.append(time.perf_counter() - start)
    return seconds


def summarize(seconds: list[float], rows: int) -> dict:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {"p50_ms": 1e3 * statistics.median(ordered), "p99_ms": 1e3 * p99, "mean_ms": 1e3 * statistics.fmean(ordered),
            "iters": len(ordered), "seq_req_per_s": 1 / statistics.fmean(ordered)}


def server_timing(header: str) -> dict[str, float]:
    """{phase: ms} of a Server-Timing header (`name;dur=ms, ...`)."""
    out = {}
    for item in header.split(","):
        name, _, dur = item.strip().partition(";dur=")
        if dur:
            out[name] = float(dur)
    return out


def same(a, b) -> bool:
    return all(torch.equal(getattr(a, f).cpu(), getattr(b, f).cpu()) for f in FIELDS)


async def concurrent_throughput(endpoint: dict, args, kwargs, requests: int, concurrency: int,
                                want=None) -> float:
    """Requests per second with `concurrency` in flight (regions registered by a fresh async client;
    metadata by RegionSlice; with `want`, each worker has output regions shaped like it: `+out`)."""
    async with AsyncTopKClient(**endpoint) as client:
        regions = [await client.register(a) if i in (0, 1, 2, 4) else a for i, a in enumerate(args)]
        rows, bt = args[5].shape[0], args[3].numel()
        meta = await client.register(torch.cat([args[3].flatten(), args[5], args[6], args[7]]))
        regions[3] = meta.slice(0, torch.int32, tuple(args[3].shape))
        regions[5:8] = [meta.slice(4 * (bt + k * rows), torch.int32, (rows,)) for k in range(3)]

        async def outputs():
            if want is None:
                return None
            return {f: await client.register(torch.empty_like(getattr(want, f))) for f in FIELDS}

        await client.topk(*regions, **kwargs, out=await outputs())
        queue = list(range(requests))

        async def worker(out):
            while queue:
                queue.pop()
                await client.topk(*regions, **kwargs, out=out)

        outs = [await outputs() for _ in range(concurrency)]
        start = time.perf_counter()
        await asyncio.gather(*[worker(out) for out in outs])
        return requests / (time.perf_counter() - start)


def bench_shape(name: str, device: torch.device, backend: str, service: Service, args_ns) -> dict:
    """Every mode timed in turn, call by call (round robin), so that drifting load on the machine
    weighs on all modes alike; then the throughput of each service mode."""
    rows, keys = SHAPES[name][device.type]
    if name == "prefill" and args_ns.prefill_rows:
        rows, keys = args_ns.prefill_rows, args_ns.prefill_keys or keys
    iters = args_ns.iters or ITERS[name][device.type]
    problem = prefill_problem(rows, 4 * keys, 512, seed=7, device=str(device))
    args, kwargs = call_args(problem)
    want = litetopk_prefill(*args, **kwargs, backend=backend)
    sync(device)
    endpoints = {"uds": {"uds": service.uds}, "uds+out": {"uds": service.uds}, "tcp": {"base_url": service.url}}
    calls = {"in-process": lambda: litetopk_prefill(*args, **kwargs, backend=backend)}
    equal = {"in-process": True}
    clients = []
    # Regions belong to the service, not to a transport: register once, name them from every mode
    # (registering the same CUDA allocation again would supersede the earlier registration).
    owner = TopKClient(uds=service.uds)
    clients.append(owner)
    regions = {i: owner.register(a) for i, a in enumerate(args) if i in (0, 1, 2, 4)}
    meta = owner.register(torch.cat([args[3].flatten(), args[5], args[6], args[7]]))
    call = [regions.get(i, a) for i, a in enumerate(args)]
    # RegionSlices, not tensors inside `meta` (a client finds tensors only in regions it registered
    # itself: the mode clients below did not, so until 2026-12 the metadata travelled inline as
    # JSON lists, .tolist() of CUDA tensors included)
    bt = args[3].numel()
    call[3] = meta.slice(0, torch.int32, tuple(args[3].shape))
    call[5:8] = [meta.slice(4 * (bt + k * rows), torch.int32, (rows,)) for k in range(3)]
    phases: dict[str, list[dict]] = {}  # Server-Timing of every answer, per mode (service/routes/topk.py)
    for mode, endpoint in endpoints.items():
        client = TopKClient(**endpoint)
        clients.append(client)
        phases[mode] = []
        client._http.event_hooks["response"].append(
            lambda r, got=phases[mode]: got.append(server_timing(r.headers.get("server-timing", "")))
            if r.url.path == "/v1/topk" else None)
        outs = ({f: owner.register(torch.empty_like(getattr(want, f))) for f in FIELDS}
                if mode.endswith("+out") else None)
        calls[mode] = lambda client=client, call=call, outs=outs: client.topk(*call, **kwargs, out=outs)
        equal[mode] = same(calls[mode](), want)
        if not equal[mode]:
            print(f"!! {name}/{mode}: the service answer differs from in-process", file=sys.stderr)
    seconds = {mode: [] for mode in calls}
    for i in range(iters + 2):  # two warm-up rounds
        for mode, fn in calls.items():
            start = time.perf_counter()
            fn()
            sync(device)
            if i >= 2:
                seconds[mode].append(time.perf_counter() - start)
    for client in clients:
        client.close()
    out = {"shape": {"rows": rows, "keys": keys, "topk": 512}, "modes": {}}
    for mode, samples in seconds.items():
        out["modes"][mode] = {**summarize(samples, rows), "equal": equal[mode]}
        timed_calls = phases.get(mode, [])[-len(samples):]
        if timed_calls and timed_calls[0]:
            out["modes"][mode]["server_timing_p50_ms"] = {
                k: statistics.median(t.get(k, 0.0) for t in timed_calls) for k in timed_calls[0]}
    out["modes"]["in-process"]["req_per_s"] = out["modes"]["in-process"]["seq_req_per_s"]
    for mode, endpoint in endpoints.items():
        out["modes"][mode]["req_per_s"] = asyncio.run(concurrent_throughput(
            endpoint, args, kwargs, max(iters, 8), args_ns.concurrency, want if mode.endswith("+out") else None))
    base = out["modes"]["in-process"]["p50_ms"]
    for record in out["modes"].values():
        record["overhead_pct"] = 100 * (record["p50_ms"] - base) / base
        record["rows_per_s"] = record["req_per_s"] * rows
    return out


def batching_probe(device: torch.device, backend: str) -> dict:
    """Two R-row calls vs one 2R-row call (what merging queued requests could save), decode shape."""
    rows, keys = SHAPES["decode"][device.type]
    one = prefill_problem(rows, 4 * keys, 512, seed=3, device=str(device))
    two = prefill_problem(2 * rows, 4 * keys, 512, seed=3, device=str(device))
    a1, k1 = call_args(one)
    a2, k2 = call_args(two)
    twice = timed(lambda: (litetopk_prefill(*a1, **k1, backend=backend), litetopk_prefill(*a1, **k1, backend=backend)),
                  20, 2, device)
    merged = timed(lambda: litetopk_prefill(*a2, **k2, backend=backend), 20, 2, device)
    return {"rows_per_request": rows, "keys": keys, "two_calls_p50_ms": 1e3 * statistics.median(twice),
            "merged_call_p50_ms": 1e3 * statistics.median(merged)}


# ---------------------------------------------------------------------------------- reporting


def device_slug(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    name = torch.cuda.get_device_name(device).lower().replace("nvidia", "").strip()
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-")


def versions() -> dict:
    import fastapi
    import httpx
    import pydantic
    import uvicorn

    found = {"python": platform.python_version(), "torch": torch.__version__, "fastapi": fastapi.__version__,
             "uvicorn": uvicorn.__version__, "httpx": httpx.__version__, "pydantic": pydantic.__version__}
    try:
        import triton

        found["triton"] = triton.__version__
    except ImportError:
        found["triton"] = None
    try:
        found["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                      cwd=BENCH_DIR, check=False).stdout.strip() or None
    except OSError:
        found["git"] = None
    return found


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"litetopk service on {report['device']} ({report['backend']} backend)")
    for col in ("shape", "mode", "p50 ms", "p99 ms", "vs in-process", f"req/s (x{report['concurrency']})",
                "rows/s", "equal"):
        table.add_column(col, justify="right" if col not in ("shape", "mode") else "left")
    for name, shape in report["shapes"].items():
        label = f"{name} {shape['shape']['rows']}x{shape['shape']['keys']}"
        for mode, r in shape["modes"].items():
            table.add_row(label, mode, f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['overhead_pct']:+.1f}%",
                          f"{r['req_per_s']:.1f}", f"{r['rows_per_s']:.0f}", "yes" if r["equal"] else "NO")
    Console(width=120).print(table)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = report["shapes"]
    fig, axes = plt.subplots(1, len(shapes), figsize=(5.5 * len(shapes), 4), squeeze=False)
    for ax, (name, shape) in zip(axes[0], shapes.items()):
        modes = list(shape["modes"])
        p50 = [shape["modes"][m]["p50_ms"] for m in modes]
        p99 = [shape["modes"][m]["p99_ms"] for m in modes]
        bars = ax.bar(modes, p50, color=["#555555", "#1f77b4", "#2ca02c", "#ff7f0e"][:len(modes)])
        ax.errorbar(modes, p50, yerr=[[0] * len(modes), [b - a for a, b in zip(p50, p99)]], fmt="none", ecolor="k",
                    capsize=4)
        for bar, m in zip(bars, modes):
            ax.annotate(f"{shape['modes'][m]['overhead_pct']:+.1f}%", (bar.get_x() + bar.get_width() / 2,
                        bar.get_height()), ha="center", va="bottom", fontsize=8)
        s = shape["shape"]
        ax.set_title(f"{name}: {s['rows']} rows x {s['keys']} keys, K={s['topk']}")
        ax.set_ylabel("latency ms (bar p50, whisker p99)")
    fig.suptitle(f"litetopk service vs in-process on {report['device']} ({report['backend']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (cuda:0 if available), cpu or cuda:N")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--shapes", default="decode,prefill", help="comma list of " + ",".join(SHAPES))
    parser.add_argument("--iters", type=int, default=0, help="timed calls per mode (0: per-shape default)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight for throughput")
    parser.add_argument("--prefill-rows", type=int, default=0, help="override the prefill rows")
    parser.add_argument("--prefill-keys", type=int, default=0, help="override the prefill keys")
    parser.add_argument("--out", default=str(RESULTS_DIR), help="folder for the JSON and PNG")
    args = parser.parse_args(argv)
    device = torch.device(args.device if args.device != "auto" else ("cuda:0" if torch.cuda.is_available() else "cpu"))
    backend = args.backend
    report = {"device": device_slug(device), "torch_device": str(device), "backend": backend,
              "versions": versions(), "command": " ".join([sys.executable, *sys.argv]),
              "concurrency": args.concurrency, "cpu_count": os.cpu_count(), "load_average_start": os.getloadavg(),
              "shapes": {},
              "note": ("CPU shapes are reduced (reference backend in plain torch); the service, the benchmark "
                       "and anything else running share the CPU cores (see load_average_*)")
              if device.type == "cpu" else ""}
    with tempfile.TemporaryDirectory(prefix="ltk-bench-", dir="/tmp") as directory:
        service = Service(str(device), backend, directory)
        try:
            with TopKClient(service.url) as client:
                report["backend"] = client.info()["backend"]
            for name in args.shapes.split(","):
                report["shapes"][name] = bench_shape(name, device, backend, service, args)
                print(f"done: {name}", file=sys.stderr)
        finally:
            service.stop()
    if "decode" in report["shapes"]:
        report["batching_probe"] = batching_probe(device, backend)
    report["load_average_end"] = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"service-{report['device']}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, path.with_suffix(".png"))
    print_table(report)
    if "batching_probe" in report:
        b = report["batching_probe"]
        print(f"batching probe ({b['rows_per_request']} rows x {b['keys']} keys): two calls "
              f"{b['two_calls_p50_ms']:.2f} ms, one merged call {b['merged_call_p50_ms']:.2f} ms")
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0 if all(r["equal"] for s in report["shapes"].values() for r in s["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
