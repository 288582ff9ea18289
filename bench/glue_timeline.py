"""One device call (H200): where the host time of one LiteTopK call goes, stage by stage.

Wraps the stages of `litetopk_prefill` (validation, its row checks and host copy, the backend's
operands / schedule / decode launches, calibration, scan preparation, scan, selection, assembly)
with timers that note, at each stage's entry and exit, the host clock and a CUDA event. After the
call, each stage gets its host start and duration (ms from the call's start) and the GPU clock
at its entry and exit: where the GPU clock at a stage's entry equals the host clock, the GPU was
waiting for the host (idle). Median of REPS calls, no profiler (its overhead would swamp the
small host costs). Writes $OUT/glue-timeline-<tag>.json and prints a table.

    source bench/gpu_env.sh && OUT=/tmp TAG=new python3 bench/glue_timeline.py
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import time

import torch

import litetopk.kernels.triton.backend as triton_backend
import litetopk.kernels.triton.row_checks as row_checks
import litetopk.kernels.validation as validation
from litetopk.kernels import litetopk_prefill
from litetopk.kernels.triton import TritonBackend

from problems_gpu import call_args, prefill_problem

OUT = os.environ.get("OUT", "/tmp")
TAG = os.environ.get("TAG", "new")
REPS = int(os.environ.get("REPS", "7"))
marks: list[tuple[str, str, float, torch.cuda.Event]] = []


def note(name: str, edge: str) -> None:
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    marks.append((name, edge, time.perf_counter(), event))


def timed(owner, attribute: str, name: str | None = None) -> None:
    """Replace owner.attribute by a wrapper noting its entry and exit (absent attributes are skipped)."""
    inner = getattr(owner, attribute, None)
    if inner is None:
        return

    @functools.wraps(inner)
    def wrapper(*args, **kwargs):
        note(name or attribute, "in")
        try:
            return inner(*args, **kwargs)
        finally:
            note(name or attribute, "out")
    setattr(owner, attribute, wrapper)


for attr in ("operands", "schedule", "score_dense", "calibration_keys", "scan_candidates", "select_candidates",
             "assemble_result"):
    timed(TritonBackend, attr)
for attr in ("decode_keys_fp4_triton", "prepare_queries_fp4_triton", "prepare_scan_triton"):
    timed(triton_backend, attr)
timed(row_checks, "row_checks_triton")
timed(validation, "_summary_of", "host_rows_copy")
timed(validation, "validate_prefill")
import litetopk.kernels.operator as operator  # noqa: E402  (after the validation wrapper: it binds the name)

operator.validate_prefill = validation.validate_prefill


def one_call(args, kw):
    marks.clear()
    torch.cuda.synchronize()
    note("call", "in")
    litetopk_prefill(*args, **kw, backend="triton")
    note("call", "out")
    torch.cuda.synchronize()
    t0, e0 = marks[0][2], marks[0][3]
    rows = {}
    for name, edge, host, event in marks:
        entry = rows.setdefault(name, {})
        key = f"host_{edge}"
        if key not in entry:  # a stage called twice (score_dense for calibration): its first call
            entry[key] = (host - t0) * 1e3
            entry[f"gpu_{edge}"] = e0.elapsed_time(event)
    return rows


report = {"device": torch.cuda.get_device_name(0), "tag": TAG, "reps": REPS}
for topk, raw in ((512, 262144), (1024, 262144), (512, 786432)):
    args, kw = call_args(prefill_problem(8192, raw, topk, seed=7))
    for _ in range(3):
        one_call(args, kw)
    calls = [one_call(args, kw) for _ in range(REPS)]
    table = {name: {k: statistics.median(c[name][k] for c in calls) for k in calls[0][name]} for name in calls[0]}
    report[f"k{topk}_raw{raw}"] = table
    print(f"\n{TAG} K={topk} raw={raw}: stage, host in / host ms, GPU clock in / out (ms from the call's start)")
    for name, t in sorted(table.items(), key=lambda x: x[1]["host_in"]):
        print(f"  {name:26s} host {t['host_in']:7.3f} +{t['host_out'] - t['host_in']:6.3f}   "
              f"gpu {t['gpu_in']:7.3f} -> {t['gpu_out']:7.3f}")
    with open(os.path.join(OUT, f"glue-timeline-{TAG}.json"), "w") as f:
        json.dump(report, f, indent=1)
