"""Where a decode-shaped call's GPU time goes, in the Triton backend's paged and prefill modes side by side.

For each shape (sequences x rows x C4 keys, K) it profiles one call of LiteTopK and of the dense path in
each mode (TritonBackend(paged="always") with its Gluon kernel and with the Triton kernel, and
TritonBackend(paged="never"), on the same inputs, after a warm-up) with
torch.profiler (bench.common.timing.gpu_activity: the GPU busy time, the span from the first to the last
device activity, the heaviest kernels by name, the longest gaps) and checks that both modes and both
paths give one answer (LiteTopK == dense bit for bit within a mode; across modes the indices, which may
differ only where float32 rounding of the head sum ties or reorders scores). Eager calls: their GPU
busy time is what a graph replay costs, less its gaps.

    source bench/device/gpu_env.sh && python3 -m bench.probes.paged_probe --out /tmp [--shapes 64x1x65536x512 ...]
Writes OUT/paged-probe-<card>.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from litetopk.kernels import dense_topk_prefill, litetopk_prefill, registry
from litetopk.kernels.triton import TritonBackend

from ..common.problems import decode_queries, paged_random_cache
from ..common.report import run_info
from ..common.timing import gpu_activity

MODES = {("always", "auto"): "paged", ("always", "triton"): "paged-triton", ("never", "auto"): "prefill"}
SHAPES = ("1x1x65536x512", "8x1x65536x512", "64x1x65536x512", "128x2x32768x1024", "32x4x65536x1024", "256x1x8192x512")


def _call(fn_name, args, kw):
    fn = litetopk_prefill if fn_name == "litetopk" else dense_topk_prefill
    return fn(*args, **kw)


def _probe_mode(mode: str, args: tuple, kw: dict, record: dict, answers: dict) -> None:
    """One profiled call of LiteTopK and of the dense path (after a warm-up) in the backend instance the
    caller put in place: record[f"{path}-{mode}"] and answers[...] (module docstring)."""
    for path in ("litetopk", "dense"):
        name = f"{path}-{mode}"
        _call(path, args, kw)  # compile and warm
        torch.cuda.synchronize()
        result = _call(path, args, kw)
        answers[name] = result
        record[name] = gpu_activity(lambda: _call(path, args, kw), top=4)
        record[name]["candidates_mean"] = float(result.candidates.float().mean())
        record[name]["repaired"] = int(result.repaired.sum())
        record[name]["status_nonzero"] = int((result.status != 0).sum())


def probe_shape(shape: str, device: torch.device, seed: int) -> dict:
    batch, next_n, keys, topk = (int(x) for x in shape.split("x"))
    lengths = [keys] * batch
    cache, block_table = paged_random_cache(lengths, seed=seed, device=device)
    q = decode_queries(lengths, next_n, seed=seed + 1, device=device)
    args = (q["q_fp4"], q["q_scale"], cache, block_table, q["weights"], q["row_to_batch"], q["starts"], q["ends"])
    kw = dict(topk=topk, backend="triton")
    record = dict(shape=shape, rows=batch * next_n, keys=keys * batch)
    answers = {}
    for mode, kernel in (("always", "auto"), ("always", "triton"), ("never", "auto")):
        with registry.backend_instance("triton", TritonBackend(paged=mode, scoring_kernel=kernel)):
            _probe_mode(MODES[mode, kernel], args, kw, record, answers)
    fields = ("values", "raw_indices", "physical_indices", "counts", "status")
    for mode in MODES.values():
        lite, dense = answers[f"litetopk-{mode}"], answers[f"dense-{mode}"]
        record[f"exact-{mode}"] = all(torch.equal(getattr(lite, f), getattr(dense, f)) for f in fields)
    record["gluon_equals_triton"] = all(
        torch.equal(getattr(answers["litetopk-paged"], f), getattr(answers["litetopk-paged-triton"], f)) for f in fields
    )
    a, b = answers["litetopk-paged"], answers["litetopk-prefill"]
    record["modes_same_values"] = bool(torch.equal(a.values, b.values))
    record["modes_index_agreement"] = float((a.raw_indices == b.raw_indices).float().mean())
    del cache, block_table, q, answers
    torch.cuda.empty_cache()
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), help="BxNxKEYSxK")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    report = dict(run_info(device, sys.argv, "bench.probes.paged_probe"), shapes={})
    tag = torch.cuda.get_device_name(device).split()[1].lower() if " " in torch.cuda.get_device_name(device) else "gpu"
    path = os.path.join(args.out, f"paged-probe-{tag}.json")
    print(
        f"{'shape':<18} {'mode':<12} {'lite busy':>10} {'lite span':>10} {'dense busy':>10} {'cands':>7} "
        "exact  heaviest (us)"
    )
    for shape in args.shapes:
        record = probe_shape(shape, device, args.seed)
        report["shapes"][shape] = record
        with open(path, "w") as f:
            json.dump(report, f, indent=1, default=str)
        for mode in MODES.values():
            lite, dense = record[f"litetopk-{mode}"], record[f"dense-{mode}"]
            heavy = ", ".join(f"{k[:28]} {v:.0f}" for k, v in list(lite["heaviest_us"].items())[:4])
            print(
                f"{shape:<18} {mode:<12} {lite['busy_ms'] * 1e3:>9.1f}u {lite['span_ms'] * 1e3:>9.1f}u "
                f"{dense['busy_ms'] * 1e3:>9.1f}u {lite['candidates_mean']:>7.0f} "
                f"{record[f'exact-{mode}']!s:<6} {heavy}",
                flush=True,
            )
        print(
            f"{'':<18} modes: same values {record['modes_same_values']}, index agreement "
            f"{record['modes_index_agreement']:.4f}; gluon == triton (paged) {record['gluon_equals_triton']}",
            flush=True,
        )
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
