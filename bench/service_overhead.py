"""The service's own cost per top-k request, phase by phase, with the operator mocked out.

The service runs in a subprocess of this script (`--serve`) whose operator (service/operator.py
`DeviceOperator.__call__`) is replaced by a mock that leaves a precomputed result of the requested
shape in the call's `out` tensors (this file only; production code has no mock). By default
(`--mock-writes once`) it writes each destination once and leaves it as it is on later calls: on a
GPU the operator's results are written by its kernels, not by the host, so copying ~400 KB of
results with 7 `copy_` calls on every call (`--mock-writes every`, the mock before 2026-12-06) put
~30-60 us of host work that the GPU path does not do into `op` (and evicted the service's working
set from the caches). `op` is still reported; a GPU's graph launch and stream sync are not mocked.
Everything else is the real service: decoding and validation, region checks and leases, the device
worker hand-off, the row-fault scan, the answer, the transport and the client. Each answer's phases
(IPC: the answer's `timing`; HTTP: `Server-Timing`) split the service's part; the client's total
minus the service's total is transport + client.

    python3 -m bench.service_overhead                          # 64 rows, K=512, on the CPU
    python3 -m bench.service_overhead --rows 8192 --device cuda:0 --out $OUT
    python3 -m bench.service_overhead --real                   # the real operator

Modes: ipc (the IPC channel), uds (HTTP over the Unix socket), tcp (HTTP over TCP); inputs in
registered regions, results into caller regions (an engine's hot path). Each mode's calls come in
blocks of --block, the modes taking turns block by block. Writes <out>/service-overhead-<device>[-real]
[-gap<ms>ms].json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import weakref
from pathlib import Path

import torch

from bench.common import RESULTS_DIR
from bench.common.report import run_info
from bench.common.service_process import ServiceProcess
from bench.common.timing import wall_seconds_in_blocks
from bench.service import FIELDS, batch_problem, device_slug, register_call, server_timing, versions

MODES = {"ipc": "ipc", "uds": "http", "tcp": "http"}


def serve(argv: list[str]) -> int:
    """`python -m litetopk.service argv` with the operator mocked (unless LTK_BENCH_REAL=1)."""
    if os.environ.get("LTK_BENCH_REAL") != "1":
        from litetopk.kernels import TopKResult
        from litetopk.service import operator

        cache: dict = {}
        every = os.environ.get("LTK_BENCH_MOCK_WRITES", "once") == "every"
        filled: dict = {}  # id -> weakref of each destination filled (kept bindings hand the mock the same views)

        def mock_call(self, inputs, kv_cache, *, topk: int, out: dict, **kwargs) -> TopKResult:
            rows, device = inputs["q_fp4"].shape[0], inputs["q_fp4"].device
            key = (rows, topk, str(device))
            if key not in cache:
                g = torch.Generator(device="cpu").manual_seed(0)
                idx = torch.randint(0, 2**20, (rows, topk), generator=g, dtype=torch.int32)
                small = torch.zeros(rows, dtype=torch.int32)
                cache[key] = {
                    "values": torch.randn(rows, topk, generator=g),
                    "raw_indices": idx,
                    "physical_indices": idx + 7,
                    "counts": small + topk,
                    "status": small,
                    "repaired": small,
                    "candidates": small + 2 * topk,
                }
                cache[key] = {n: t.to(device) for n, t in cache[key].items()}
            fields = {}
            for name, value in cache[key].items():
                if name not in out:
                    fields[name] = value
                    continue
                dst = fields[name] = out[name]
                ref = filled.get(id(dst))
                if every or ref is None or ref() is not dst:
                    dst.copy_(value)
                    filled[id(dst)] = weakref.ref(dst)
            return TopKResult(**fields)

        operator.DeviceOperator.__call__ = mock_call
    from litetopk.service.__main__ import main

    return main(argv)


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--serve"]:
        return serve(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--rows", type=int, default=64, help="query rows (one decode row a sequence, up to 256)")
    parser.add_argument("--keys", type=int, default=4096, help="compressed keys a sequence (the mock ignores them)")
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument(
        "--block", type=int, default=20, help="calls of one mode in a row before the next mode's (at least 1)"
    )
    parser.add_argument(
        "--gap-ms",
        type=float,
        default=0.0,
        help="a pause before each call (an engine's calls come between its GPU work; the threads sleep meanwhile)",
    )
    parser.add_argument("--real", action="store_true", help="run the real operator, not the mock")
    parser.add_argument(
        "--mock-writes",
        choices=("once", "every"),
        default="once",
        help="the mock writes each out destination once (a GPU's results are device writes) or on every call",
    )
    parser.add_argument("--out", default=str(RESULTS_DIR))
    args = parser.parse_args(argv)
    if args.block < 1 or args.iters < 1:  # (wall_seconds_in_blocks' bounds, said before the service starts)
        parser.error(f"--block {args.block} and --iters {args.iters} must be at least 1")
    device = torch.device(args.device)
    sequences = args.rows if args.rows <= 256 else 1  # a decode batch (one row a sequence) or a prefill chunk
    call, kwargs = batch_problem(sequences, args.rows // sequences, args.keys, 512, seed=7, device=device)
    results = {}
    with tempfile.TemporaryDirectory(prefix="ltk-overhead-", dir="/tmp") as directory:
        with ServiceProcess(
            directory,
            device=str(device),
            backend=args.backend,
            log_level="warning",
            entry=("-m", "bench.service_overhead", "--serve"),
            timeout=900,
            env={"LTK_BENCH_REAL": "1" if args.real else "0", "LTK_BENCH_MOCK_WRITES": args.mock_writes},
        ) as service:
            from litetopk.clients import TopKClient
            from litetopk.kernels import TopKResult

            rows = call[0].shape[0]
            want = TopKResult(
                values=torch.empty(rows, 512, device=device),
                raw_indices=torch.empty(rows, 512, dtype=torch.int32, device=device),
                physical_indices=torch.empty(rows, 512, dtype=torch.int32, device=device),
                **{f: torch.empty(rows, dtype=torch.int32, device=device) for f in FIELDS[3:]},
            )
            clients, plans, timings = {}, {}, {}
            owner = TopKClient(uds=service.uds)  # regions registered once, named by every mode (one principal)
            regions, _ = register_call(owner, call, want, outputs=False)
            for mode in args.modes.split(","):
                endpoint = (
                    {"base_url": service.url, "token": service.token}
                    if mode == "tcp"
                    else {"uds": service.uds, "transport": MODES[mode]}
                )
                clients[mode] = client = TopKClient(**endpoint)
                plans[mode] = (regions, {f: owner.register(torch.empty_like(getattr(want, f))) for f in FIELDS})
                timings[mode] = []
                client.observe = timings[mode].append  # each answer: its Server-Timing read after the timed calls
            # each mode's calls come in blocks of --block in a row, as an engine's worker sends its stream over one
            # transport; the modes take turns block by block (drifting load hits all alike). Turns call by call put
            # each request behind another transport's, whose tail work (uvicorn's after the client has its answer)
            # then shares the 2 cores: on our 2-core VM ipc 0.074 ms p50 in blocks against 0.198 call by call
            # (bench/results/service-overhead/cpu-session21-blocks.json; bench/JOURNAL.md 21d)
            warm = 20
            calls = {
                mode: lambda client=client, plan=plans[mode]: client.topk(*plan[0], **kwargs, out=plan[1])
                for mode, client in clients.items()
            }
            pause = (lambda: time.sleep(args.gap_ms / 1e3)) if args.gap_ms else None
            seconds = wall_seconds_in_blocks(calls, args.iters, warm, args.block, before=pause)
            totals = {mode: [1e3 * s for s in samples] for mode, samples in seconds.items()}
            for mode, client in clients.items():
                client.close()
                got = [server_timing(answer.headers.get("server-timing", "")) for answer in timings[mode][warm:]]
                phases = {k: statistics.median(t.get(k, 0.0) for t in got) for k in got[0]}
                phases["client+transport"] = statistics.median(c - t["total"] for c, t in zip(totals[mode], got))
                ordered = sorted(totals[mode])
                results[mode] = {
                    "p50_ms": statistics.median(ordered),
                    "p99_ms": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
                    "phases_p50_ms": phases,
                }
            owner.close()
    report = {
        "device": device_slug(device),
        "rows": rows,
        "topk": 512,
        "operator": "real" if args.real else "mocked",
        "mock_writes": None if args.real else args.mock_writes,
        "command": " ".join(["python -m bench.service_overhead", *(argv if argv is not None else sys.argv[1:])]),
        "run": run_info(device, sys.argv[1:] if argv is None else argv, "bench.service_overhead"),  # commit, card
        "iters": args.iters,
        "block": args.block,
        "gap_ms": args.gap_ms,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "versions": versions(),
        "modes": results,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    gap = f"-gap{args.gap_ms:g}ms" if args.gap_ms else ""
    path = out / f"service-overhead-{report['device']}{'-real' if args.real else ''}{gap}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    names = max((list(r["phases_p50_ms"]) for r in results.values()), key=len)
    mocked = "" if args.real else f" (writes {args.mock_writes})"
    print(f"operator {report['operator']}{mocked}, {rows} rows K=512 on {device} ({os.cpu_count()} cores); p50 ms")
    print(f"{'mode':<6}{'client':>9}{'p99':>9}" + "".join(f"{n[:10]:>11}" for n in names))
    for mode, r in results.items():
        print(
            f"{mode:<6}{r['p50_ms']:>9.3f}{r['p99_ms']:>9.3f}"
            + "".join(f"{r['phases_p50_ms'].get(n, float('nan')):>11.3f}" for n in names)
        )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
