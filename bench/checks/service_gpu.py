"""GPU acceptance check of the service (run by bench/device/gpu_service_check.sh on a CUDA machine).

1. Start `python -m litetopk.service --device cuda:0` (backend auto: Triton on NVIDIA).
2. A separate worker process (the "inference engine") builds a paged cache on cuda:0, registers it
   with the service by CUDA IPC handle (no copy), calls /v1/topk over the Unix socket and TCP,
   with the result in the body and written into its own GPU output regions, and checks every
   answer equal (torch.equal, every field) to its in-process `litetopk_prefill`.
3. No copy: the worker rewrites part of its cache in place and calls again without registering
   anything: the service's answer must follow (it reads the worker's memory, not a copy).
4. The worker is SIGKILLed while holding its regions: the service must drop them.
Prints one JSON summary line and writes it to <out>/check.json; exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import REPO_ROOT, RESULTS_DIR
from bench.common.problems import call_args, prefill_problem
from bench.common.service_process import ServiceProcess
from litetopk.clients import TopKClient  # noqa: E402
from litetopk.kernels import litetopk_prefill  # noqa: E402
from litetopk.kernels.result import ANSWER_FIELDS, RESULT_FIELDS  # noqa: E402

FIELDS = tuple(RESULT_FIELDS)  # every field written; the answers compared on ANSWER_FIELDS (candidates: a metric)


def differs(a, b) -> list[str]:
    return [f for f in ANSWER_FIELDS if not torch.equal(getattr(a, f).cpu(), getattr(b, f).cpu())]


def worker(uds: str, url: str, rows: int, keys: int, device: torch.device, backend: str) -> int:
    """The worker process: register by IPC, compare with in-process, then wait to be killed."""
    problem = prefill_problem(rows, 4 * keys, 512, seed=11, device=str(device))
    args, kwargs = call_args(problem)
    report = {}
    with TopKClient(uds=uds) as client, TopKClient(url) as tcp:
        cache = client.register(args[2])
        q = client.register(args[0])
        report["cache_region_kind"] = cache.kind
        want = litetopk_prefill(*args, **kwargs, backend=backend)
        call = (q, args[1], cache, *args[3:])
        report["uds_body_differs"] = differs(client.topk(*call, **kwargs), want)
        outs = {f: client.register(torch.empty_like(getattr(want, f))) for f in FIELDS}
        got = client.topk(*call, **kwargs, out=outs)
        report["uds_out_differs"] = differs(got, want)
        report["out_is_zero_copy"] = got.values.data_ptr() == outs["values"].tensor.data_ptr()
        # Regions belong to the service, not to a transport: the TCP client names the same regions.
        # (Registering the same CUDA allocation twice supersedes the first registration by design.)
        report["tcp_body_differs"] = differs(tcp.topk(*call, **kwargs), want)
        with TopKClient(uds=uds, transport="http") as http:  # HTTP over the Unix socket, the same regions
            report["uds_http_differs"] = differs(http.topk(*call, **kwargs), want)
        # No copy: rewrite the worker's cache in place (the first half of the pages get the second
        # half's bytes), call again without registering, expect the new in-process answer.
        pages = args[2].shape[0]
        cache.tensor[: pages // 2].copy_(cache.tensor[pages - pages // 2 :].clone())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        changed = litetopk_prefill(args[0], args[1], cache.tensor, *args[3:], **kwargs, backend=backend)
        report["answer_changed_in_process"] = bool(differs(changed, want))
        report["service_follows_in_place_write"] = differs(client.topk(*call, **kwargs), changed)
        report["regions"] = sorted(r["id"] for r in client.regions() if r["pid"] == os.getpid())
        print(json.dumps(report), flush=True)
        time.sleep(600)  # hold the regions until killed
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--keys", type=int, default=16384)
    parser.add_argument("--out", default=str(RESULTS_DIR))
    parser.add_argument("--device", default="cuda:0", help="cpu: a dry run of the flow (shared memory, no IPC)")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--worker", nargs=2, metavar=("UDS", "URL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = torch.device(args.device)
    if args.worker:
        return worker(args.worker[0], args.worker[1], args.rows, args.keys, device, args.backend)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: this check needs one (or --device cpu for a dry run)", file=sys.stderr)
        return 2
    summary = {"device": str(device)}
    if device.type == "cuda":
        summary.update(gpu=torch.cuda.get_device_name(device), uuid=str(torch.cuda.get_device_properties(device).uuid))
    with tempfile.TemporaryDirectory(prefix="ltk-check-", dir="/tmp") as directory:
        # the workspace sized for the check's calls (one sequence of --rows rows, --keys keys), not the GPU defaults
        # (8,192 rows, 65,536 keys, 256 sequences), whose warm-up compiles for minutes on a cold cache
        started = time.monotonic()
        print(f"starting the service on {device} ({args.rows} rows, {args.keys} keys)", file=sys.stderr, flush=True)
        service = ServiceProcess(
            directory,
            device=str(device),
            backend=args.backend,
            log_level="info",
            queue_size=256,
            request_timeout_s=900,
            max_rows=args.rows,
            max_keys=args.keys,
            max_batch=1,
            timeout=300,
        )
        print(f"service ready after {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
        child = None
        try:
            with TopKClient(service.url, token=service.token) as client:
                summary["service"] = client.info()
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.checks.service_gpu",
                    "--rows",
                    str(args.rows),
                    "--keys",
                    str(args.keys),
                    "--device",
                    str(device),
                    "--backend",
                    args.backend,
                    "--worker",
                    service.uds,
                    service.url,
                ],
                stdout=subprocess.PIPE,
                text=True,
                cwd=REPO_ROOT,
            )
            print("worker started", file=sys.stderr, flush=True)
            line = child.stdout.readline()
            print("worker reported", file=sys.stderr, flush=True)
            if not line:
                raise RuntimeError(f"the worker exited with {child.wait()} before reporting")
            summary["worker"] = report = json.loads(line)
            child.send_signal(signal.SIGKILL)
            child.wait()
            with TopKClient(service.url, token=service.token) as client:
                deadline = time.monotonic() + 30
                while set(report["regions"]) & {r["id"] for r in client.regions()} and time.monotonic() < deadline:
                    time.sleep(0.2)
                summary["regions_left_after_worker_killed"] = sorted(
                    set(report["regions"]) & {r["id"] for r in client.regions()}
                )
                summary["service_ready_after"] = client.ready()
        finally:
            if child is not None and child.poll() is None:
                child.kill()
                child.wait()
            service.stop()
            summary["service_log_tail"] = service.log()[-2000:]
    w = summary.get("worker", {})
    checks = {
        "cache registered by CUDA IPC": w.get("cache_region_kind")
        == ("cuda_ipc" if device.type == "cuda" else "memfd"),
        "ipc answer == in-process": w.get("uds_body_differs") == [],
        "uds+out answer == in-process": w.get("uds_out_differs") == [],
        "out regions are zero copy": w.get("out_is_zero_copy") is True,
        "tcp answer == in-process": w.get("tcp_body_differs") == [],
        "uds http answer == in-process": w.get("uds_http_differs") == [],
        "in-place cache write changes the answer": w.get("answer_changed_in_process") is True,
        "service reads the live cache (no copy)": w.get("service_follows_in_place_write") == [],
        "killed worker's regions dropped": summary.get("regions_left_after_worker_killed") == [],
        "service still ready": summary.get("service_ready_after") is True,
    }
    summary["checks"] = checks
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "check.json").write_text(json.dumps(summary, indent=2) + "\n")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
