"""Device probe: the paged mode's tuning choices side by side in one process on the same inputs, each
checked bit for bit against the first: LiteTopK's dense route against the scan (LiteTopKTuning), the radix
selector's forms (dense_selection.RADIX_CONFIG), the calibration sample's size and the candidate selection's
launch at decode sizes (selection.DECODE_CONFIG), the scan's threshold refresh, and the Gluon kernel's variants
(GLUON_PAGED_OPTIONS); `--variants` picks some.

For each decode shape (sequences x rows x C4 keys, K) and each variant: LiteTopK calls in
TritonBackend(paged="always") (Gluon kernel), after a warm-up; per call the GPU busy time and the scoring
kernel's device time (the sample's launch and the scan's, torch.profiler: bench.common.timing.gpu_activity),
the median of --reps calls; then the dense path (dense_topk_prefill: the paged kernel's dense mode, then
each of DENSE_SELECTORS over the score matrix), answers compared. Prints a table, writes OUT/paged-variants-<card>.json.

    source bench/device/gpu_env.sh && python3 -m bench.probes.paged_variants --out /tmp [--shapes 64x1x65536x512 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

from litetopk.kernels import (
    LiteTopKTuning,
    calibration,
    dense_selection,
    dense_topk_prefill,
    litetopk_prefill,
    registry,
    selection,
)
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.triton.paged_scoring_gluon import GLUON_PAGED_OPTIONS

from ..common.problems import decode_queries, paged_random_cache
from ..common.report import run_info
from ..common.timing import gpu_activity

#: name -> what the variant changes from the production settings: "tuning" (LiteTopKTuning's arguments), "select"
#: (selection.DECODE_CONFIG), "radix" (dense_selection.RADIX_CONFIG's entries), "sample_keys"
#: (calibration.DECODE_SAMPLE_KEYS; 0: the prefill's sample_size), "gluon" (paged_scoring_gluon.GLUON_PAGED_OPTIONS'
#: entries), "refresh" (TritonBackend.paged_refresh: key tiles between the scan's threshold raises), over the
#: production settings. The first, the scan (dense_route_bytes = 0), is the reference of the bit-for-bit check.
ROUTE = dict(dense_route_bytes=1 << 30)  # LiteTopKTuning.dense_route_bytes: every shape here routed
VARIANTS = {
    "scan": dict(tuning=dict(dense_route_bytes=0)),
    "dense route": dict(tuning=ROUTE),
    "route, 4 warps": dict(tuning=ROUTE, radix=dict(warps=4)),
    "route, an atomic a key": dict(tuning=ROUTE, radix=dict(aggregate=False)),
    "route, warp slots": dict(tuning=ROUTE, radix=dict(warp_slots=True)),
    "route, candidates": dict(tuning=ROUTE, radix=dict(candidates=True)),
    "route, candidates, warp slots": dict(tuning=ROUTE, radix=dict(candidates=True, warp_slots=True)),
}
SHAPES = ("64x1x65536x512", "1x1x65536x512", "32x4x65536x1024")
#: the dense path's selectors timed after the variants (dense_selection: torch.topk and tie settlement; radix)
DENSE_SELECTORS = ("torch", "radix")
FIELDS = ("values", "raw_indices", "physical_indices", "counts", "status")


def _print_row(shape: str, name: str, row: dict, equal: bool) -> None:
    heaviest = ", ".join(f"{n[:28]} {us:.0f}" for n, us in list(row["heaviest_us"].items())[:4])
    print(
        f"{shape:>18} {name:>26} busy {row['busy_us']:8.1f} us  scoring {row['scoring_us']:8.1f} us  "
        f"cands {row['candidates']:7.0f}  equal {equal}  [{heaviest}]",
        flush=True,
    )


def _apply(variant: dict, production: dict, backend: TritonBackend) -> None:
    """Set the module settings and the backend's refresh for `variant` (VARIANTS' keys) over `production` (what
    _production_settings read)."""
    selection.DECODE_CONFIG.clear()
    selection.DECODE_CONFIG.update(variant.get("select", production["select"]))
    calibration.DECODE_SAMPLE_KEYS = variant.get("sample_keys", production["sample_keys"])
    GLUON_PAGED_OPTIONS.clear()
    GLUON_PAGED_OPTIONS.update(production["gluon"], **variant.get("gluon", {}))
    dense_selection.RADIX_CONFIG.clear()
    dense_selection.RADIX_CONFIG.update(production["radix"], **variant.get("radix", {}))
    backend.paged_refresh = variant.get("refresh", production["refresh"])


def _production_settings(backend: TritonBackend) -> dict:
    return dict(
        select=dict(selection.DECODE_CONFIG),
        sample_keys=calibration.DECODE_SAMPLE_KEYS,
        gluon=dict(GLUON_PAGED_OPTIONS),
        radix=dict(dense_selection.RADIX_CONFIG),
        refresh=backend.paged_refresh,
    )


def _timed(call, reps: int, candidates: float, equal: bool) -> dict:
    """The median of `reps` profiled calls: GPU busy time, the scoring launches' time, the heaviest kernels."""
    runs = [gpu_activity(call, top=8) for _ in range(reps)]
    median_run = sorted(runs, key=lambda r: r["busy_ms"])[len(runs) // 2]
    return dict(
        busy_us=1e3 * statistics.median(r["busy_ms"] for r in runs),
        scoring_us=statistics.median(
            sum(us for name, us in r["heaviest_us"].items() if name.startswith("score_fp4_paged")) for r in runs
        ),
        equal_to_first=equal,
        candidates=candidates,
        heaviest_us=median_run["heaviest_us"],
    )


def probe_shape(shape: str, reps: int, names: list[str], dense: bool) -> dict:
    batch, next_n, keys, topk = (int(x) for x in shape.split("x"))
    lengths = [keys] * batch
    cache, block_table = paged_random_cache(lengths, seed=7, device="cuda")
    q = decode_queries(lengths, next_n, seed=8, device="cuda")
    args = (q["q_fp4"], q["q_scale"], cache, block_table, q["weights"], q["row_to_batch"], q["starts"], q["ends"])
    record, first = dict(shape=shape), None
    backend = TritonBackend(paged="always")
    production = _production_settings(backend)
    try:
        with registry.backend_instance("triton", backend):
            for name in names:
                variant = VARIANTS[name]
                _apply(variant, production, backend)
                tuning = LiteTopKTuning(**variant.get("tuning", {}))

                def call(tuning=tuning):
                    return litetopk_prefill(*args, topk=topk, backend="triton", tuning=tuning)

                result = call()
                torch.cuda.synchronize()
                first = first or result
                equal = all(torch.equal(getattr(result, f), getattr(first, f)) for f in FIELDS)
                record[name] = _timed(call, reps, float(result.candidates.float().mean()), equal)
                _print_row(shape, name, record[name], equal)
            # the dense path at the production settings (its scoring is the paged kernel's dense mode): what a
            # decode call costs with the score matrix written and a value top-k over it
            _apply({}, production, backend)
            for selector in DENSE_SELECTORS if dense else ():

                def dense_call(selector=selector):
                    return dense_topk_prefill(*args, topk=topk, backend="triton", selector=selector)

                name = f"dense path, {selector}"
                answer = dense_call()
                torch.cuda.synchronize()
                equal = all(torch.equal(getattr(answer, f), getattr(first, f)) for f in FIELDS)
                record[name] = _timed(dense_call, reps, 0.0, equal)
                _print_row(shape, name, record[name], equal)
    finally:
        _apply({}, production, backend)
    del cache, block_table, q
    torch.cuda.empty_cache()
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), help="BxNxKEYSxK")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), help="the first: the reference"
    )
    parser.add_argument("--no-dense", action="store_true", help="leave out the dense path's selectors")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    chosen = {name: VARIANTS[name] for name in args.variants}
    report = dict(run_info(device, sys.argv, "bench.probes.paged_variants"), variants=chosen, shapes=[])
    name = torch.cuda.get_device_name(device)
    path = os.path.join(args.out, f"paged-variants-{name.split()[1].lower() if ' ' in name else 'gpu'}.json")
    for shape in args.shapes:
        report["shapes"].append(probe_shape(shape, args.reps, args.variants, not args.no_dense))
        with open(path, "w") as f:
            json.dump(report, f, indent=1, default=str)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
