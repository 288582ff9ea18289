"""Service benchmark: what the litetopk service adds to the operator called in-process.

Modes, per shape (inputs always in registered regions, results always into caller regions: what
an inference engine does on its hot path):
    in-process   LiteTopKGraphs (the graph runner the service replays) in this process: the floor
    ipc          TopKClient over the IPC channel (msgpack frames on ipc.sock)
    uds+out      TopKClient over HTTP on the Unix socket
    tcp+out      TopKClient over HTTP on TCP (bearer token)
Measured: latency p50/p99 of sequential calls and requests a second with 1 and 8 requests in flight
(AsyncTopKClient over one connection; in-process: one runner, calls in sequence). Every answer is
checked equal (torch.equal, every field) to in-process. The sequential calls come in blocks of BLOCK
calls of one mode (an engine's worker sends a stream of calls over one transport), the modes taking
turns block by block, so that drifting load hits all alike. Turns call by call (before 3ebba96)
put every ipc call right after an in-process one, GPU work of another process: ipc's `op` measured
0.90 ms p50 on an H100 there against 0.68 for HTTP's, which followed another service call (the
likely cause, the GPU's switch between the two processes' contexts, not measured apart). A block's
first call still follows another mode's (in p99, not in p50).

Shapes (K; rows x sequences x keys a sequence):
    decode64     64 x 1 x 65,536 (K=512)    one decode row each of 64 sequences
    decode128    128 x 2 x 32,768 (K=1024)  two decode rows (MTP) each of 128 sequences
    prefill      8,192 x 65,536 (K=512)     a prefill chunk of one sequence
On the CPU (the reference backend in plain torch) the shapes are scaled down (`--cpu-scale`).

    python3 -m bench.service                                    # every shape on the default device
    python3 -m bench.service --shapes decode64 --out $OUT
Writes <out>/service-<device>.json, a PNG plot and prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import BENCH_DIR, RESULTS_DIR
from bench.common.report import run_info
from bench.common.service_process import ServiceProcess
from bench.common.timing import wall_seconds_in_blocks
from litetopk.clients import AsyncTopKClient, TopKClient  # noqa: E402
from litetopk.kernels import SUPPORTED_TOPK, LiteTopKGraphs, pack_kv_cache, quantize_mxfp4  # noqa: E402
from litetopk.kernels.result import ANSWER_FIELDS, RESULT_FIELDS  # noqa: E402

SHAPES = {  # name -> (sequences, rows per sequence, keys per sequence, K)
    "decode64": (64, 1, 65536, 512),
    "decode128": (128, 2, 32768, 1024),
    "prefill": (1, 8192, 65536, 512),
}
CPU_SHAPES = {"decode64": (8, 1, 4096, 512), "decode128": (8, 2, 2048, 1024), "prefill": (1, 64, 8192, 512)}
ITERS = {"decode64": {"cuda": 200, "cpu": 20}, "decode128": {"cuda": 200, "cpu": 20}, "prefill": {"cuda": 20, "cpu": 6}}
MODES = ("in-process", "ipc", "uds+out", "tcp+out")
FIELDS = tuple(RESULT_FIELDS)  # every field written; the answers compared on ANSWER_FIELDS (candidates: a metric)
CONCURRENCY = (1, 8)
BLOCK = 20  # sequential calls of one mode in a row


def batch_problem(sequences: int, rows_per_seq: int, keys: int, topk: int, seed: int, device: torch.device):
    """(args, kwargs) of litetopk_prefill: `sequences` sequences of `keys` compressed keys each, the last
    `rows_per_seq` positions of each a query row (decode: one or two rows a sequence)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    pages = -(-keys // 64)
    k_fp4, k_scale = quantize_mxfp4(torch.randn(sequences, keys, 128, generator=gen, device=device))
    block_table = torch.randperm(sequences * pages, generator=gen, device=device).to(torch.int32)
    block_table = block_table.view(sequences, pages).contiguous()
    cache = pack_kv_cache(k_fp4, k_scale, block_table, sequences * pages)
    rows = sequences * rows_per_seq
    q_fp4, q_scale = quantize_mxfp4(torch.randn(rows, 64, 128, generator=gen, device=device))
    weights = torch.randn(rows, 64, generator=gen, device=device)
    row_to_batch = torch.arange(sequences, device=device, dtype=torch.int32).repeat_interleave(rows_per_seq)
    offset = torch.arange(rows_per_seq, device=device, dtype=torch.int32).repeat(sequences)
    ends = (keys - rows_per_seq + 1 + offset).to(torch.int32)
    starts = torch.zeros(rows, dtype=torch.int32, device=device)
    return (q_fp4, q_scale, cache, block_table, weights, row_to_batch, starts, ends), {"topk": topk}


# ---------------------------------------------------------------------------------- measuring


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def summarize(seconds: list[float], rows: int) -> dict:
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return {
        "p50_ms": 1e3 * statistics.median(ordered),
        "p99_ms": 1e3 * p99,
        "mean_ms": 1e3 * statistics.fmean(ordered),
        "iters": len(ordered),
        "seq_req_per_s": 1 / statistics.fmean(ordered),
    }


def server_timing(header: str) -> dict[str, float]:
    """{phase: ms} of a Server-Timing header (`name;dur=ms, ...`)."""
    out = {}
    for item in header.split(","):
        name, _, dur = item.strip().partition(";dur=")
        if dur:
            out[name] = float(dur)
    return out


def same(a, b) -> bool:
    return all(torch.equal(getattr(a, f).cpu(), getattr(b, f).cpu()) for f in ANSWER_FIELDS)


def register_call(client, args, want, outputs: bool = True):
    """(the call's tensors as regions of `client`, output regions shaped like `want` or None)."""
    regions = [client.register(a, access="read_only") if i in (0, 1, 2, 4) else a for i, a in enumerate(args)]
    rows, bt = args[5].shape[0], args[3].numel()
    meta = client.register(torch.cat([args[3].flatten(), args[5], args[6], args[7]]), access="read_only")
    regions[3] = meta.slice(0, torch.int32, tuple(args[3].shape))
    regions[5:8] = [meta.slice(4 * (bt + k * rows), torch.int32, (rows,)) for k in range(3)]
    outs = {f: client.register(torch.empty_like(getattr(want, f))) for f in FIELDS} if outputs else None
    return regions, outs


async def concurrent_throughput(endpoint: dict, args, kwargs, want, requests: int, concurrency: int) -> float:
    """Requests a second with `concurrency` in flight over one async client (regions by slice, each
    worker with its own output regions)."""
    async with AsyncTopKClient(**endpoint) as client:
        regions = [await client.register(a, access="read_only") if i in (0, 1, 2, 4) else a for i, a in enumerate(args)]
        rows, bt = args[5].shape[0], args[3].numel()
        meta = await client.register(torch.cat([args[3].flatten(), args[5], args[6], args[7]]), access="read_only")
        regions[3] = meta.slice(0, torch.int32, tuple(args[3].shape))
        regions[5:8] = [meta.slice(4 * (bt + k * rows), torch.int32, (rows,)) for k in range(3)]
        outs = [
            {f: await client.register(torch.empty_like(getattr(want, f))) for f in FIELDS} for _ in range(concurrency)
        ]
        await client.topk(*regions, **kwargs, out=outs[0])
        queue = list(range(requests))

        async def worker(out):
            while queue:
                queue.pop()
                await client.topk(*regions, **kwargs, out=out)

        start = time.perf_counter()
        await asyncio.gather(*[worker(out) for out in outs])
        return requests / (time.perf_counter() - start)


def bench_shape(name: str, device: torch.device, service: ServiceProcess, args_ns) -> dict:
    """Every mode timed in blocks of BLOCK calls, the modes taking turns block by block, so that drifting
    load on the machine weighs on all modes alike; then the throughput of each mode with 1 and 8 in flight."""
    sequences, rows_per_seq, keys, topk = (SHAPES if device.type == "cuda" else CPU_SHAPES)[name]
    iters = args_ns.iters or ITERS[name][device.type]
    args, kwargs = batch_problem(sequences, rows_per_seq, keys, topk, seed=7, device=device)
    rows = args[0].shape[0]
    info = service.info
    runner = LiteTopKGraphs(
        info["max_rows"],
        info["max_keys"],
        SUPPORTED_TOPK,
        device=device,
        backend=info["backend"],
        max_batch=info["max_batch"],
    )
    want = runner(*args, **kwargs, max_seq_len=info["max_keys"])
    sync(device)
    ref = {f: getattr(want, f).clone() for f in FIELDS}
    want_outs = {f: torch.empty_like(ref[f]) for f in FIELDS}
    calls = {"in-process": lambda: runner(*args, **kwargs, max_seq_len=info["max_keys"], out=want_outs)}
    endpoints = {
        "ipc": {"uds": service.uds, "transport": "ipc"},
        "uds+out": {"uds": service.uds, "transport": "http"},
        "tcp+out": {"base_url": service.url, "token": service.token},
    }
    equal = {"in-process": True}
    clients, phases = [], {}
    # Regions belong to the principal, not to a transport: registered once, named by every mode (the
    # same CUDA allocation registered again would supersede the earlier registration).
    owner = TopKClient(uds=service.uds)
    clients.append(owner)
    regions, _ = register_call(owner, args, want, outputs=False)
    for mode, endpoint in endpoints.items():
        client = TopKClient(**endpoint)
        clients.append(client)
        phases[mode] = []
        client.observe = phases[mode].append  # each answer: its Server-Timing read after the timed calls
        outs = {f: owner.register(torch.empty_like(ref[f])) for f in FIELDS}
        calls[mode] = lambda client=client, outs=outs: client.topk(*regions, **kwargs, out=outs)
        got = calls[mode]()
        equal[mode] = all(torch.equal(getattr(got, f).cpu(), ref[f].cpu()) for f in ANSWER_FIELDS)
        if not equal[mode]:
            print(f"!! {name}/{mode}: the service answer differs from in-process", file=sys.stderr)
    # each mode's calls in blocks, the modes taking turns (docstring); a call is timed until the device is idle
    synced = {mode: lambda fn=fn: (fn(), sync(device)) for mode, fn in calls.items()}
    seconds = wall_seconds_in_blocks(synced, iters, warm=2, block=BLOCK)
    for client in reversed(clients):
        client.close()
    out = {"shape": {"sequences": sequences, "rows": rows, "keys": keys, "topk": topk}, "modes": {}}
    for mode, samples in seconds.items():
        out["modes"][mode] = {**summarize(samples, rows), "equal": equal[mode]}
        timed_calls = [server_timing(a.headers.get("server-timing", "")) for a in phases.get(mode, [])[-len(samples) :]]
        if timed_calls and timed_calls[0]:
            out["modes"][mode]["server_timing_p50_ms"] = {
                k: statistics.median(t.get(k, 0.0) for t in timed_calls) for k in timed_calls[0]
            }
    requests = max(iters, 16)
    for n in CONCURRENCY:
        out["modes"]["in-process"][f"req_per_s_x{n}"] = out["modes"]["in-process"]["seq_req_per_s"]
        for mode, endpoint in endpoints.items():
            out["modes"][mode][f"req_per_s_x{n}"] = asyncio.run(
                concurrent_throughput(endpoint, args, kwargs, want, requests, n)
            )
    base = out["modes"]["in-process"]
    for record in out["modes"].values():
        record["overhead_ms"] = record["p50_ms"] - base["p50_ms"]
        record["overhead_pct"] = 100 * record["overhead_ms"] / base["p50_ms"]
        record["throughput_vs_in_process_x8"] = record["req_per_s_x8"] / base["req_per_s_x8"]
    return out


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

    found = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "fastapi": fastapi.__version__,
        "uvicorn": uvicorn.__version__,
        "httpx": httpx.__version__,
        "pydantic": pydantic.__version__,
    }
    try:
        import triton

        found["triton"] = triton.__version__
    except ImportError:
        found["triton"] = None
    try:  # uvicorn's HTTP parser: httptools when installed, else h11 (pure Python, slower)
        import httptools

        found["httptools"] = httptools.__version__
    except ImportError:
        found["httptools"] = None
    try:
        found["git"] = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=BENCH_DIR, check=False
            ).stdout.strip()
            or None
        )
    except OSError:
        found["git"] = None
    return found


def print_table(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"litetopk service on {report['device']} ({report['backend']} backend)")
    for col in (
        "shape",
        "mode",
        "p50 ms",
        "p99 ms",
        "vs in-process",
        "req/s x1",
        "req/s x8",
        "x8 vs in-process",
        "equal",
    ):
        table.add_column(col, justify="right" if col not in ("shape", "mode") else "left")
    for name, shape in report["shapes"].items():
        s = shape["shape"]
        label = f"{name} {s['rows']}x{s['keys']} K={s['topk']}"
        for mode, r in shape["modes"].items():
            table.add_row(
                label,
                mode,
                f"{r['p50_ms']:.3f}",
                f"{r['p99_ms']:.3f}",
                f"{r['overhead_ms']:+.3f} ms ({r['overhead_pct']:+.1f}%)",
                f"{r['req_per_s_x1']:.1f}",
                f"{r['req_per_s_x8']:.1f}",
                f"{100 * r['throughput_vs_in_process_x8']:.0f}%",
                "yes" if r["equal"] else "NO",
            )
    Console(width=160).print(table)


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
        bars = ax.bar(modes, p50, color=["#555555", "#1f77b4", "#2ca02c", "#ff7f0e"][: len(modes)])
        ax.errorbar(
            modes, p50, yerr=[[0] * len(modes), [b - a for a, b in zip(p50, p99)]], fmt="none", ecolor="k", capsize=4
        )
        for bar, m in zip(bars, modes):
            ax.annotate(
                f"{shape['modes'][m]['overhead_pct']:+.1f}%",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=8,
            )
        s = shape["shape"]
        ax.set_title(f"{name}: {s['rows']} rows x {s['keys']} keys, K={s['topk']}", fontsize=9)
        ax.set_ylabel("latency ms (bar p50, whisker p99)")
    fig.suptitle(f"litetopk service vs in-process on {report['device']} ({report['backend']})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto (cuda:0 if available), cpu or cuda:N")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--shapes", default=",".join(SHAPES), help="comma list of " + ",".join(SHAPES))
    parser.add_argument("--iters", type=int, default=0, help="timed calls per mode (0: per-shape default)")
    parser.add_argument("--out", default=str(RESULTS_DIR), help="folder for the JSON and PNG")
    args = parser.parse_args(argv)
    device = torch.device(args.device if args.device != "auto" else ("cuda:0" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu":
        torch.set_num_threads(1)  # as the service's (OMP_NUM_THREADS=1): the in-process floor on equal terms
    report = {
        "device": device_slug(device),
        "torch_device": str(device),
        "backend": args.backend,
        "versions": versions(),
        "command": " ".join([sys.executable, *sys.argv]),
        "run": run_info(device, sys.argv[1:] if argv is None else argv, "bench.service"),  # commit, card
        "concurrency": list(CONCURRENCY),
        "block": BLOCK,  # sequential calls of one mode in a row (the modes take turns block by block)
        "cpu_count": os.cpu_count(),
        "load_average_start": os.getloadavg(),
        "shapes": {},
        "note": (
            "CPU shapes are reduced (reference backend in plain torch); the service, the benchmark "
            "and anything else running share the CPU cores (see load_average_*)"
        )
        if device.type == "cpu"
        else "",
    }
    with tempfile.TemporaryDirectory(prefix="ltk-bench-", dir="/tmp") as directory:
        with ServiceProcess(
            directory,
            device=str(device),
            backend=args.backend,
            log_level="warning",
            queue_size=256,
            request_timeout_s=900,
            max_request_bytes=256 * 2**20,
            timeout=900,
        ) as service:
            report["backend"] = service.info["backend"]
            report["service_info"] = service.info
            for name in args.shapes.split(","):
                report["shapes"][name] = bench_shape(name, device, service, args)
                print(f"done: {name}", file=sys.stderr)
    report["load_average_end"] = os.getloadavg()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"service-{report['device']}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, path.with_suffix(".png"))
    print_table(report)
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0 if all(r["equal"] for s in report["shapes"].values() for r in s["modes"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
