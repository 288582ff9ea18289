"""One device step: the scan's threshold-raising knobs (TritonBackend refresh, num_bins) at the
production shape (Q=8192, S=65,536), K=512 and 1024. Per variant: scan ms, candidates (mean, max),
candidate selection ms, the whole LiteTopK call ms (validation + run_litetopk), and whether the
answer equals the dense path's. Prints a table, writes $OUT/scan-tuning.json.
    OUT=... python3 -m bench.probes.scan_tuning
"""

from __future__ import annotations

import json
import os

import torch
from rich.console import Console
from rich.table import Table

from litetopk.kernels import LiteTopKTuning, dense_topk_prefill
from litetopk.kernels.pipeline import calibrate, run_litetopk
from litetopk.kernels.selection import select_topk_keys
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.validation import validate_prefill

from bench.common.problems import call_args, prefill_problem
from bench.common.timing import cuda_ms

VARIANTS = ((16, 32), (8, 32), (16, 64), (8, 64), (4, 64))
FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status")


def main():
    out = os.environ.get("OUT", "/tmp")
    results = []
    for topk in (512, 1024):
        args, kw = call_args(prefill_problem(8192, 262144, topk, seed=11))
        dense = dense_topk_prefill(*args, **kw, backend="triton")
        for refresh, bins in VARIANTS:
            backend = TritonBackend(refresh=refresh, num_bins=bins)
            tuning = LiteTopKTuning()
            problem = validate_prefill(*args, **kw)
            thresholds, ceilings = calibrate(problem, backend, tuning)
            capacity = tuning.capacity(topk)
            scan = backend.scan_candidates(problem, thresholds, capacity, ceilings=ceilings)
            used = int(scan.appended.max())
            lite = run_litetopk(validate_prefill(*args, **kw), backend, repair=True, tuning=tuning)
            row = dict(topk=topk, refresh=refresh, bins=bins,
                       scan_ms=cuda_ms(lambda: backend.scan_candidates(problem, thresholds, capacity,
                                                                       ceilings=ceilings), reps=7),
                       candidates_mean=float(scan.appended.float().mean()), candidates_max=used,
                       select_ms=cuda_ms(lambda: select_topk_keys(scan.keys[:, :min(used, capacity)], topk), reps=7),
                       lite_ms=cuda_ms(lambda: run_litetopk(validate_prefill(*args, **kw), backend, repair=True,
                                                            tuning=tuning), reps=7),
                       repaired=int(lite.repaired.sum()),
                       equals_dense=all(torch.equal(getattr(lite, f), getattr(dense, f)) for f in FIELDS))
            results.append(row)
            print(row, flush=True)
    with open(os.path.join(out, "scan-tuning.json"), "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(0), command="bench/probes/scan_tuning.py", results=results), f, indent=1)
    table = Table(title="scan threshold knobs, Q=8192, S=65,536")
    for col in ("K", "refresh", "bins", "scan ms", "cand mean", "cand max", "select ms", "lite ms", "exact"):
        table.add_column(col)
    for r in results:
        table.add_row(str(r["topk"]), str(r["refresh"]), str(r["bins"]), f"{r['scan_ms']:.2f}",
                      f"{r['candidates_mean']:.0f}", str(r["candidates_max"]), f"{r['select_ms']:.2f}",
                      f"{r['lite_ms']:.2f}", str(r["equals_dense"]))
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
