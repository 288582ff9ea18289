"""Device probe: the paged mode's tuning choices side by side in one process on the same inputs, each
checked bit for bit against the first: the calibration sample's size and the candidate selection's launch
at decode sizes (selection.DECODE_CONFIG), the scan's threshold refresh, and the Gluon kernel's variants
(GLUON_PAGED_OPTIONS).

For each decode shape (sequences x rows x C4 keys, K) and each variant: LiteTopK calls in
TritonBackend(paged="always") (Gluon kernel), after a warm-up; per call the GPU busy time and the scoring
kernel's device time (the sample's launch and the scan's, torch.profiler: bench.common.timing.gpu_activity),
the median of --reps calls. Prints a table, writes OUT/paged-variants-<card>.json.

    source bench/device/gpu_env.sh && python3 -m bench.probes.paged_variants --out /tmp [--shapes 64x1x65536x512 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

from litetopk.kernels import LiteTopKTuning, calibration, litetopk_prefill, registry, selection
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.triton.paged_scoring_gluon import (
    FOUR_PROGRAMS_AT_ONE_ROW,
    FOUR_PROGRAMS_OPTIONS,
    GLUON_PAGED_MAX_REGISTERS,
    GLUON_PAGED_OPTIONS,
    PROGRAMS_PER_SM,
)

from ..common.problems import decode_queries, paged_random_cache
from ..common.report import run_info
from ..common.timing import gpu_activity

#: name -> what the variant changes from the production settings: "tuning" (LiteTopKTuning's arguments), "select"
#: (selection.DECODE_CONFIG), "sample_keys" (calibration.DECODE_SAMPLE_KEYS; 0: the prefill's sample_size),
#: "gluon" (paged_scoring_gluon.GLUON_PAGED_OPTIONS' entries), "refresh" (TritonBackend.paged_refresh: key tiles
#: between the scan's threshold raises), "one_row_grid" ((register cap, programs an SM) of the Gluon kernel at one
#: row a group: paged_scoring_gluon.GLUON_PAGED_MAX_REGISTERS[1], PROGRAMS_PER_SM[1]). The first, the production
#: settings, is the reference of the bit-for-bit check.
VARIANTS = {
    "production": {},
    "one-barrier flag": dict(gluon=dict(ONE_BARRIER_FLAG=True)),
    "4 programs an SM": dict(one_row_grid=FOUR_PROGRAMS_AT_ONE_ROW, gluon=FOUR_PROGRAMS_OPTIONS),
    "4 programs, 1-bar flag": dict(
        one_row_grid=FOUR_PROGRAMS_AT_ONE_ROW, gluon=dict(FOUR_PROGRAMS_OPTIONS, ONE_BARRIER_FLAG=True)
    ),
}
SHAPES = ("64x1x65536x512", "1x1x65536x512", "32x4x65536x1024")
FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status")


def probe_shape(shape: str, reps: int) -> dict:
    batch, next_n, keys, topk = (int(x) for x in shape.split("x"))
    lengths = [keys] * batch
    cache, block_table = paged_random_cache(lengths, seed=7, device="cuda")
    q = decode_queries(lengths, next_n, seed=8, device="cuda")
    args = (q["q_fp4"], q["q_scale"], cache, block_table, q["weights"], q["row_to_batch"], q["starts"], q["ends"])
    record, first = dict(shape=shape), None
    saved = dict(selection.DECODE_CONFIG), calibration.DECODE_SAMPLE_KEYS, dict(GLUON_PAGED_OPTIONS)
    backend = TritonBackend(paged="always")
    saved_refresh = backend.paged_refresh
    saved_grid = GLUON_PAGED_MAX_REGISTERS[1], PROGRAMS_PER_SM[1]
    try:
        with registry.backend_instance("triton", backend):
            for name, variant in VARIANTS.items():
                selection.DECODE_CONFIG.clear()
                selection.DECODE_CONFIG.update(variant.get("select", saved[0]))
                calibration.DECODE_SAMPLE_KEYS = variant.get("sample_keys", saved[1])
                GLUON_PAGED_OPTIONS.clear()
                GLUON_PAGED_OPTIONS.update(saved[2], **variant.get("gluon", {}))
                backend.paged_refresh = variant.get("refresh", saved_refresh)
                GLUON_PAGED_MAX_REGISTERS[1], PROGRAMS_PER_SM[1] = variant.get("one_row_grid", saved_grid)
                tuning = LiteTopKTuning(**variant.get("tuning", {}))

                def call(tuning=tuning):
                    return litetopk_prefill(*args, topk=topk, backend="triton", tuning=tuning)

                result = call()
                torch.cuda.synchronize()
                first = first or result
                equal = all(torch.equal(getattr(result, f), getattr(first, f)) for f in FIELDS)
                runs = [gpu_activity(call, top=4) for _ in range(reps)]
                kernel = [
                    sum(us for kernel_name, us in r["heaviest_us"].items() if kernel_name.startswith("score_fp4_paged"))
                    for r in runs
                ]
                median_run = sorted(runs, key=lambda r: r["busy_ms"])[len(runs) // 2]
                record[name] = dict(
                    busy_us=1e3 * statistics.median(r["busy_ms"] for r in runs),
                    scoring_us=statistics.median(kernel),
                    equal_to_first=equal,
                    candidates=float(result.candidates.float().mean()),
                    heaviest_us=median_run["heaviest_us"],
                )
                heaviest = ", ".join(f"{n[:28]} {us:.0f}" for n, us in list(median_run["heaviest_us"].items())[:4])
                print(
                    f"{shape:>18} {name:>26} busy {record[name]['busy_us']:8.1f} us  scoring "
                    f"{record[name]['scoring_us']:8.1f} us  cands {record[name]['candidates']:7.0f}  equal {equal}  "
                    f"[{heaviest}]",
                    flush=True,
                )
    finally:
        selection.DECODE_CONFIG.clear()
        selection.DECODE_CONFIG.update(saved[0])
        calibration.DECODE_SAMPLE_KEYS = saved[1]
        GLUON_PAGED_OPTIONS.clear()
        GLUON_PAGED_OPTIONS.update(saved[2])
        GLUON_PAGED_MAX_REGISTERS[1], PROGRAMS_PER_SM[1] = saved_grid
    del cache, block_table, q
    torch.cuda.empty_cache()
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), help="BxNxKEYSxK")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    report = dict(run_info(device, sys.argv, "bench.probes.paged_variants"), variants=VARIANTS, shapes=[])
    name = torch.cuda.get_device_name(device)
    path = os.path.join(args.out, f"paged-variants-{name.split()[1].lower() if ' ' in name else 'gpu'}.json")
    for shape in args.shapes:
        report["shapes"].append(probe_shape(shape, args.reps))
        with open(path, "w") as f:
            json.dump(report, f, indent=1, default=str)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
