"""Where the host time of one warm litetopk_prefill call goes (torch.profiler, CPU + CUDA): the ops
and ranges with the most self CPU time, and the number of launches. Prints a table, writes JSON.

    python -m bench.probes.host_time --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from torch.profiler import ProfilerActivity, profile

from bench.common.problems import prefill_problem
from litetopk.kernels import litetopk_prefill


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "bench/results"))
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--keys", type=int, default=65536)
    parser.add_argument("--topk", type=int, default=512)
    args = parser.parse_args(argv)
    problem = prefill_problem(args.rows, args.keys * 4, args.topk, 3)
    topk = problem.pop("topk")
    call = lambda: litetopk_prefill(**problem, topk=topk, max_seq_len=args.keys)  # noqa: E731
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    host = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    top = [dict(name=e.key, calls=e.count, self_cpu_ms=e.self_cpu_time_total / 1e3, cpu_ms=e.cpu_time_total / 1e3,
                cuda_ms=e.device_time_total / 1e3) for e in rows[:40]]
    ranges = [dict(name=e.key, cpu_ms=e.cpu_time_total / 1e3, cuda_ms=e.device_time_total / 1e3)
              for e in prof.key_averages() if e.key.startswith("litetopk.")]
    launches = sum(e.count for e in prof.key_averages() if e.key in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx"))
    print(f"host ms (unprofiled) {host:.2f}; launches {launches}")
    for r in ranges:
        print(f"  range {r['name']:<28} cpu {r['cpu_ms']:8.3f} ms  cuda {r['cuda_ms']:8.3f} ms")
    for r in top:
        print(f"  {r['name'][:60]:<60} x{r['calls']:<5} self cpu {r['self_cpu_ms']:8.3f} ms")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "host-time-h200.json"), "w") as fh:
        json.dump(dict(command="python -m bench.probes.host_time", host_ms=host, launches=launches, ranges=ranges,
                       top=top), fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
