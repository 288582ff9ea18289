"""The service's own cost per /v1/topk request, phase by phase, with the operator mocked out.

The service runs in a subprocess of this script (`--serve`) whose `litetopk_prefill`, as the
/v1/topk route sees it, is replaced by a mock that returns a precomputed TopKResult of the
requested shape at once (this file only; production code has no mock). Everything else is the
real service: HTTP parsing, pydantic, region checks and leases, the device worker hand-off, row
fault scan, result writing and encoding, the transport and the client's decoding. Each request's
`Server-Timing` header (service/routes/topk.py) splits the service's part into phases; the
client's total minus the service's total is transport + client.

    python3 -m bench.service_overhead                      # 8192 rows, K=512 (the H200 prefill shape)
    python3 -m bench.service_overhead --rows 64 --iters 50 --device cpu
    python3 -m bench.service_overhead --real               # the real operator (reference on the CPU)

Modes: uds / tcp (the client picks how the result comes back: a pooled scratch region for large
results), uds+out (every field into the caller's shm regions), and uds+plain (as uds+out, but
block_table/row_to_batch/starts/ends are plain tensors: inline JSON lists up to
INLINE_MAX_VALUES values, else staged in the client's scratch region); uds+body asks for the
binary body (result_format="binary"), the path every large result took before the scratch.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time

import torch

from bench.service import FIELDS, Service, server_timing

# ---------------------------------------------------------------------------------- the service


def serve(argv: list[str]) -> int:
    """`python -m litetopk.service argv` with the route's operator mocked (unless LTK_BENCH_REAL=1)."""
    if os.environ.get("LTK_BENCH_REAL") != "1":
        import litetopk.service.routes.topk as route
        from litetopk.kernels import TopKResult

        cache: dict = {}

        def mock_prefill(q_fp4, *args, topk: int, **kwargs) -> TopKResult:
            rows, device = q_fp4.shape[0], q_fp4.device
            key = (rows, topk, str(device))
            if key not in cache:
                g = torch.Generator(device="cpu").manual_seed(0)
                values = torch.randn(rows, topk, generator=g)
                idx = torch.randint(0, 2**20, (rows, topk), generator=g, dtype=torch.int32)
                small = torch.zeros(rows, dtype=torch.int32)
                cache[key] = TopKResult(values=values.to(device), raw_indices=idx.to(device),
                                        physical_indices=(idx + 7).to(device), counts=(small + topk).to(device),
                                        status=small.to(device), repaired=small.to(device),
                                        candidates=(small + 2 * topk).to(device))
            return cache[key]

        route.litetopk_prefill = mock_prefill
    from litetopk.service.__main__ import main

    profile = os.environ.get("LTK_BENCH_PROFILE")  # cProfile of the event loop thread, written at exit
    if not profile:
        return main(argv)
    import cProfile

    profiler = cProfile.Profile()
    # uvicorn re-raises SIGTERM once it has shut down: exit through Python so that `finally` runs
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        return profiler.runcall(main, argv)
    finally:
        profiler.dump_stats(profile)


# ---------------------------------------------------------------------------------- measuring


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--serve"]:
        return serve(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--keys", type=int, default=2048, help="compressed keys (the mock ignores them)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--modes", default="uds,uds+out,uds+plain,tcp")
    parser.add_argument("--real", action="store_true", help="run the real operator, not the mock")
    args = parser.parse_args(argv)

    from bench.common.problems import call_args, prefill_problem
    from litetopk.clients import TopKClient

    problem = prefill_problem(args.rows, 4 * args.keys, 512, seed=7, device=args.device)
    call, kwargs = call_args(problem)
    rows, topk = args.rows, 512
    with tempfile.TemporaryDirectory(prefix="ltk-overhead-", dir="/tmp") as directory:
        service = Service(args.device, args.backend, directory,
                          entry=("-m", os.environ.get("LTK_BENCH_SERVE", "bench.service_overhead"), "--serve"),
                          env={**os.environ, "LTK_BENCH_REAL": "1" if args.real else "0"})
        try:
            owner = TopKClient(uds=service.uds)
            regions = {i: owner.register(a) for i, a in enumerate(call) if i in (0, 1, 2, 4)}
            meta = owner.register(torch.cat([call[3].flatten(), call[5], call[6], call[7]]))
            bt = call[3].numel()
            by_ref = [regions.get(i, a) for i, a in enumerate(call)]
            # RegionSlices, not tensors inside `meta`: a client finds tensors only in regions it
            # registered itself, and these clients did not (tensors would travel inline)
            by_ref[3] = meta.slice(0, torch.int32, call[3].shape)
            by_ref[5:8] = [meta.slice(4 * (bt + k * rows), torch.int32, (rows,)) for k in range(3)]
            plain = list(by_ref)
            plain[3], plain[5:8] = call[3], list(call[5:8])
            shapes = {"values": (rows, topk), "raw_indices": (rows, topk), "physical_indices": (rows, topk)}
            outs = {f: owner.register(torch.empty(shapes.get(f, (rows,)),
                                                  dtype=torch.float32 if f == "values" else torch.int32,
                                                  device=args.device)) for f in FIELDS}
            plans = {
                "uds": (dict(uds=service.uds), by_ref, None),
                "uds+out": (dict(uds=service.uds), by_ref, outs),
                "uds+plain": (dict(uds=service.uds), plain, outs),
                "tcp": (dict(base_url=service.url), by_ref, None),
                "uds+body": (dict(uds=service.uds), by_ref, None),  # result_format="binary": in the body
            }
            clients, timings, totals = {}, {}, {}
            for mode in args.modes.split(","):  # the modes take turns call by call (drifting load hits all alike)
                endpoint, _, _ = plans[mode]
                clients[mode] = client = TopKClient(**endpoint)
                timings[mode], totals[mode] = [], []
                client._http.event_hooks["response"].append(
                    lambda r, mode=mode: timings[mode].append(server_timing(r.headers.get("server-timing", ""))))
            for i in range(args.iters + 2):
                for mode, client in clients.items():
                    _, tensors, out = plans[mode]
                    start = time.perf_counter()
                    client.topk(*tensors, **kwargs, out=out,
                                result_format="binary" if mode.endswith("body") else "auto")
                    if i >= 2:
                        totals[mode].append(1e3 * (time.perf_counter() - start))
            results = {}
            for mode, client in clients.items():
                client.close()
                got = timings[mode][2:]
                phases = {k: statistics.median(t.get(k, 0.0) for t in got) for k in got[0]}
                if "total" in phases:  # a service without Server-Timing (an older one) gives no phases
                    phases["client+transport"] = statistics.median(c - t["total"] for c, t in zip(totals[mode], got))
                results[mode] = (statistics.median(totals[mode]), phases)
            owner.close()
        finally:
            service.stop()
    names = max((list(p) for _, p in results.values()), key=len)
    print(f"{'op ' + ('real' if args.real else 'mocked'):>12} {rows} rows K={topk} on {args.device}; p50 ms")
    print(f"{'mode':<12}{'client':>9}" + "".join(f"{n[:10]:>11}" for n in names))
    for mode, (total, phases) in results.items():
        print(f"{mode:<12}{total:>9.2f}" + "".join(f"{phases.get(n, float('nan')):>11.2f}" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
