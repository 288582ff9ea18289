"""One device step (issue 15 item 1): what the calibration sample buys, at the production shape
(Q = 8192, S = 65,536 and 196,608 C4 keys), K = 512 and 1024.

The scan raises its own threshold every `refresh` key steps from the histogram of what it has
scored (scoring.py), so the calibration sample only sets where it starts. Per variant
(sample_size, refresh): the calibration's GPU time (strided scoring + order statistics), the scan's,
the candidates it appends (mean, max) against the capacity, the rows beyond it (capacity events,
repaired), the whole LiteTopK call, and whether the answer equals the dense path's bit for bit.
Prints a table, writes $OUT/scan-tuning.json (rewritten after every row).
    OUT=... python3 -m bench.probes.scan_tuning [--keys 65536 196608]
"""

from __future__ import annotations

import argparse
import os

import torch
from rich.console import Console
from rich.table import Table

from bench.common.problems import call_args, prefill_problem
from bench.common.timing import cuda_ms, json_logger
from litetopk.kernels import LiteTopKTuning, dense_topk_prefill
from litetopk.kernels.calibration import calibrate
from litetopk.kernels.pipeline import run_litetopk
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.validation import validate_prefill

VARIANTS = ((4096, 16), (3072, 16), (2048, 16), (1536, 16))  # (sample_size, refresh); 1024 and below overflow (v12)
FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status")


def measure(args, kw, topk: int, sample_size: int, refresh: int, dense) -> dict:
    """One variant on one problem (module docstring)."""
    backend = TritonBackend(refresh=refresh)
    tuning = LiteTopKTuning(sample_size=sample_size)
    problem = validate_prefill(*args, **kw)
    thresholds, ceilings = calibrate(problem, backend, sample_size)
    capacity = tuning.capacity(topk)
    scan = backend.scan_candidates(problem, thresholds, capacity, ceilings=ceilings)
    lite = run_litetopk(validate_prefill(*args, **kw), backend, repair=True, tuning=tuning, check=True)
    return dict(
        topk=topk,
        sample_size=sample_size,
        refresh=refresh,
        capacity=capacity,
        calibrate_ms=cuda_ms(lambda: calibrate(problem, backend, sample_size), reps=7),
        scan_ms=cuda_ms(lambda: backend.scan_candidates(problem, thresholds, capacity, ceilings=ceilings), reps=7),
        candidates_mean=float(scan.appended.float().mean()),
        candidates_max=int(scan.appended.max()),
        rows_over_capacity=int((scan.appended > capacity).sum()),
        lite_ms=cuda_ms(
            lambda: run_litetopk(validate_prefill(*args, **kw), backend, repair=True, tuning=tuning), reps=7
        ),
        repaired=int(lite.repaired.sum()),
        equals_dense=all(torch.equal(getattr(lite, f), getattr(dense, f)) for f in FIELDS),
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keys", type=int, nargs="+", default=[65536])
    parser.add_argument("--topk", type=int, nargs="+", default=[512, 1024])
    cli = parser.parse_args()
    out = os.environ.get("OUT", "/tmp")
    log = json_logger(
        os.path.join(out, "scan-tuning.json"),
        dict(
            gpu=torch.cuda.get_device_name(0),
            command="python -m bench.probes.scan_tuning "
            + " ".join(["--keys", *map(str, cli.keys), "--topk", *map(str, cli.topk)]),
        ),
    )
    results = []
    for keys in cli.keys:
        for topk in cli.topk:
            args, kw = call_args(prefill_problem(8192, keys * 4, topk, seed=11))
            dense = dense_topk_prefill(*args, **kw, backend="triton")
            for sample_size, refresh in VARIANTS:
                row = dict(keys=keys, **measure(args, kw, topk, sample_size, refresh, dense))
                results.append(row)
                log("results", results)
    table = Table(title="calibration sample and threshold refresh, Q = 8192")
    for col in (
        "keys",
        "K",
        "sample",
        "refresh",
        "calib ms",
        "scan ms",
        "cand mean",
        "cand max",
        "capacity",
        "rows over",
        "lite ms",
        "exact",
    ):
        table.add_column(col)
    for r in results:
        table.add_row(
            str(r["keys"]),
            str(r["topk"]),
            str(r["sample_size"]),
            str(r["refresh"]),
            f"{r['calibrate_ms']:.3f}",
            f"{r['scan_ms']:.2f}",
            f"{r['candidates_mean']:.0f}",
            str(r["candidates_max"]),
            str(r["capacity"]),
            str(r["rows_over_capacity"]),
            f"{r['lite_ms']:.2f}",
            str(r["equals_dense"]),
        )
    Console(width=150).print(table)


if __name__ == "__main__":
    main()
