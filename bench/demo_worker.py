"""A worker beside the service: register a key cache once, then ask for top-k (compose profile `demo`).

    python bench/demo_worker.py                     # LITETOPK_URL, else the default socket, else 127.0.0.1:8471
    LITETOPK_URL=unix:/run/litetopk/litetopk.sock python bench/demo_worker.py --calls 3
    python bench/demo_worker.py --url http://127.0.0.1:8471 --device cuda   # a CUDA cache: IPC handle, no copy

It builds a small random problem with `litetopk.kernels.random_problem` (2 sequences of 2,048 compressed keys in a
permuted paged MXFP4 cache, 8 query rows each), waits until the service is ready, registers the
cache as a region (shared memory for a CPU tensor, a CUDA IPC handle for a CUDA one), calls
`topk` `--calls` times and checks every answer against `litetopk_prefill` run in this process
with the service's backend (where that backend runs here). Exit status 0 when every answer
matched; 1 on a mismatch; 2 when the service never became ready.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from litetopk.clients import TopKClient, TransportError
from litetopk.kernels import BackendUnavailableError, litetopk_prefill, random_problem

FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status", "repaired")


def wait_ready(client: TopKClient, timeout: float) -> bool:
    """Poll /readyz (the service warms up first; its socket may not exist yet)."""
    deadline, why = time.monotonic() + timeout, "not ready"
    while time.monotonic() < deadline:
        try:
            if client.ready():
                return True
        except TransportError as exc:
            why = str(exc)
        time.sleep(0.5)
    print(f"demo worker: the service was not ready within {timeout:.0f} s ({why})", file=sys.stderr)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        help="http://host:port or unix:/path (default: LITETOPK_URL, the default socket, http://127.0.0.1:8471)",
    )
    parser.add_argument("--calls", type=int, default=2, help="topk calls against the registered cache")
    parser.add_argument("--topk", type=int, default=512, choices=(512, 1024))
    parser.add_argument("--device", default="cpu", help="where the worker's tensors live (cpu, cuda, cuda:N)")
    parser.add_argument("--wait", type=float, default=120.0, help="seconds to wait for /readyz")
    args = parser.parse_args(argv)

    if args.url and args.url.startswith("unix:"):
        client = TopKClient(uds=args.url[len("unix:") :])
    else:
        client = TopKClient(args.url)
    problem = random_problem(16, [2048, 2048], args.topk, device=args.device)  # 2 sequences, 8 causal rows each
    with client:
        if not wait_ready(client, args.wait):
            return 2
        info = client.info()
        print(f"demo worker: service on {info['device']} ({info['backend']} backend)", flush=True)
        cache = client.register(problem.kv_cache)  # once; every call below names it by region id
        q_fp4, q_scale, _, *rest = problem.args()
        try:
            expected = litetopk_prefill(*problem.args(), **problem.kwargs(), backend=info["backend"])
        except BackendUnavailableError as exc:
            expected = None
            print(f"demo worker: answers not checked here ({exc})", flush=True)
        for call in range(args.calls):
            start = time.perf_counter()
            result = client.topk(q_fp4, q_scale, cache, *rest, **problem.kwargs())
            elapsed_ms = (time.perf_counter() - start) * 1e3
            differ = (
                []
                if expected is None
                else [
                    name
                    for name in FIELDS
                    if not torch.equal(getattr(result, name).cpu(), getattr(expected, name).cpu())
                ]
            )
            print(
                f"demo worker: call {call}: {result.raw_indices.shape[0]} rows, top-{args.topk}, "
                f"{elapsed_ms:.1f} ms, {'differs in ' + ', '.join(differ) if differ else 'ok'}",
                flush=True,
            )
            if differ:
                return 1
        client.unregister(cache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
