"""One device call (H200 host): TritonBackend.schedule against the schedule it replaced (ufunc.at,
lexsort), on the production rows (8192 causal rows of one sequence) and on 8192 shuffled rows of
16 sequences; the host numpy of the H200 machine is ~3x slower than ours for this code
(bench/NOTES.md). Checks both give the same programs (as sets: the order among equal spans may
differ) and times each op class the two use. Writes $OUT/schedule-probe.json.
    source bench/gpu_env.sh && OUT=/tmp python3 bench/schedule_probe.py
"""

from __future__ import annotations

import json
import os
import platform
import time

import numpy as np
import torch

import litetopk.kernels.triton.backend as backend_module
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.validation import validate_prefill

from problems_gpu import call_args, prefill_problem

OUT = os.environ.get("OUT", "/tmp")


def schedule_before(host_rows: np.ndarray, block: int) -> np.ndarray:
    """The numpy part of the schedule before session 5 (commit 7eea4ee), for the A/B only."""
    rtb, starts, ends = host_rows.astype(np.int64)
    live = np.flatnonzero(ends > starts)
    order = live[np.lexsort((starts[live], rtb[live]))]
    batch_of = rtb[order]
    run_start = np.flatnonzero(np.r_[True, batch_of[1:] != batch_of[:-1]])
    run_length = np.diff(np.r_[run_start, order.size])
    run_programs = -(-run_length // block)
    run_of = np.repeat(np.arange(run_start.size), run_length)
    rank = np.arange(order.size) - run_start[run_of]
    program = (np.cumsum(run_programs) - run_programs)[run_of] + rank // block
    count = int(run_programs.sum())
    prog_rows = np.full((count, block), -1, dtype=np.int64)
    prog_rows[program, rank % block] = order
    prog_batch = np.zeros(count, dtype=np.int64)
    prog_batch[program] = batch_of
    span = np.empty((count, 2), dtype=np.int64)
    span[:, 0] = np.iinfo(np.int32).max
    span[:, 1] = 0
    np.minimum.at(span[:, 0], program, starts[order])
    np.maximum.at(span[:, 1], program, ends[order])
    first = np.argsort(span[:, 0] - span[:, 1], kind="stable")
    return np.concatenate([prog_rows[first].ravel(), prog_batch[first], span[first].ravel()]).astype(np.int32)


def host_us(fn, reps: int = 200) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps * 1e6


def programs(rows, batch, span) -> set:
    return {(tuple(r), b, tuple(s)) for r, b, s in zip(rows.tolist(), batch.tolist(), span.tolist())}


report = {"device": torch.cuda.get_device_name(0), "numpy": np.__version__, "cpu": platform.processor(),
          "python": platform.python_version()}
args, kw = call_args(prefill_problem(8192, 262144, 512, seed=7))
causal = validate_prefill(*args, **kw)
gen = torch.Generator(device="cuda").manual_seed(3)
shuffled = torch.randperm(8192, generator=gen, device="cuda")
args_many = list(args)
args_many[3] = args[3].expand(16, -1).contiguous()  # 16 sequences sharing the pages
args_many[5] = torch.randint(0, 16, (8192,), generator=gen, device="cuda", dtype=torch.int32)
args_many[6] = args[6][shuffled].contiguous()
args_many[7] = args[7][shuffled].contiguous()
many = validate_prefill(*args_many, **kw)
backend = TritonBackend()
for name, problem in (("causal", causal), ("shuffled_16_sequences", many)):
    rows, batch, span = (t.cpu().numpy() for t in backend.schedule(problem))
    flat = schedule_before(problem.host_rows, backend.block_rows)
    count = rows.shape[0]
    before = (flat[:2 * count].reshape(count, 2), flat[2 * count:3 * count], flat[3 * count:].reshape(count, 2))
    res = {"same_programs": programs(rows, batch, span) == programs(*before),
           "longest_first": bool((np.diff(span[:, 1] - span[:, 0]) <= 0).all()),
           "before_numpy_us": host_us(lambda: schedule_before(problem.host_rows, 2)),
           "after_with_copy_us": host_us(lambda: backend.schedule(problem))}
    report[name] = res
    print(name, res, flush=True)
x = np.arange(8192, dtype=np.int64)
idx = x // 2
out = np.zeros(4096, dtype=np.int64)
report["op_us"] = {
    "minimum.at": host_us(lambda: np.minimum.at(out, idx, x)),
    "lexsort": host_us(lambda: np.lexsort((x, x))),
    "argsort_stable": host_us(lambda: np.argsort(-x, kind="stable")),
    "fancy_index": host_us(lambda: x[idx]),
    "cumsum": host_us(lambda: np.cumsum(x)),
    "pin_copy": host_us(lambda: torch.from_numpy(x).pin_memory().to("cuda", non_blocking=True)),
    "torch_empty_cuda": host_us(lambda: torch.empty(8192, device="cuda")),
}
# Host time of single launches (operands cached; GPU work queued behind, the host never waits).
ops = backend.operands(causal)
sample, _ = backend.score_dense(causal, 16)
report["launch_us"] = {
    "score_dense_strided_gluon": host_us(lambda: backend.score_dense(causal, 16), reps=20),
    "calibration_keys": host_us(lambda: backend.calibration_keys(sample, 512, 16), reps=50),
    "decode_queries": host_us(lambda: backend_module.prepare_queries_fp4_triton(
        causal.q_fp4, causal.q_scale, causal.weights, causal.ends > causal.starts), reps=50),
    "operands_uncached": host_us(lambda: (setattr(backend, "_prepared", None), backend.operands(causal)), reps=20),
}
torch.cuda.synchronize()
print(report["op_us"], report["launch_us"])
with open(os.path.join(OUT, "schedule-probe.json"), "w") as f:
    json.dump(report, f, indent=1)
