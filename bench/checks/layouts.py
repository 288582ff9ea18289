"""Device check (issue 17): one problem answered identically from both cache formats.

The keys of a random prefill problem are held twice: in our format (uint8 [pages, 4352]) and in
AITER's (kv_cache uint8 [pages, 1, 4, 64, 16] + kv_scale uint8 [pages, 1, 4, 64], made by
kernels.aiter_layout.aiter_pages_from_litetopk). For each backend asked for, `litetopk_prefill` and
`dense_topk_prefill` run on both, read in place, and every result field must be equal bit for bit;
AITER's drop-in (kernels.aiter, with AITER's shuffled q_scale and bf16 weights) must return the same
indices as our operator given the same bf16-rounded weights. Writes $OUT/check-layouts.json.

    python -m bench.checks.layouts [--rows 2048] [--keys 65536] [--topk 512 1024] [--backend triton]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

from bench.common import RESULTS_DIR
from bench.common.problems import call_args, prefill_problem
from litetopk.kernels import dense_topk_prefill, litetopk_prefill
from litetopk.kernels.aiter import flydsl_pa_mqa_litetopk_fp4_prefill
from litetopk.kernels.aiter_layout import aiter_pages_from_litetopk, shuffle_q_scale_aiter
from litetopk.kernels.result import RESULT_FIELDS

FIELDS = tuple(RESULT_FIELDS)


def _equal(a, b) -> dict:
    return {f: bool(torch.equal(getattr(a, f), getattr(b, f))) for f in FIELDS}


def check_point(rows: int, keys: int, topk: int, backend: str, device: str, seed: int) -> dict:
    """Both formats, both methods, and the drop-in, on one random problem."""
    problem = prefill_problem(rows, keys * 4, topk, seed=seed, device=device)
    pos, kw = call_args(problem)
    aiter_cache, aiter_scale = aiter_pages_from_litetopk(problem["kv_cache"])
    aiter_pos = (pos[0], pos[1], aiter_cache, *pos[3:])
    ours = litetopk_prefill(*pos, **kw, backend=backend)
    theirs = litetopk_prefill(*aiter_pos, **kw, backend=backend, kv_scale=aiter_scale)
    dense_ours = dense_topk_prefill(*pos, **kw, backend=backend)
    dense_theirs = dense_topk_prefill(*aiter_pos, **kw, backend=backend, kv_scale=aiter_scale)
    bf16 = problem["weights"].bfloat16()
    rounded = litetopk_prefill(*pos[:4], bf16, *pos[5:], **kw, backend=backend)
    max_seq_len = int(problem["block_table"].shape[1]) * 64
    dropin = flydsl_pa_mqa_litetopk_fp4_prefill(
        problem["q_fp4"],
        shuffle_q_scale_aiter(problem["q_scale"]),
        aiter_cache,
        aiter_scale,
        problem["block_table"],
        bf16,
        problem["row_to_batch"],
        problem["starts"],
        problem["ends"],
        max_seq_len,
        topk=topk,
        backend=backend,
        enforce_status=False,
    )
    torch.cuda.synchronize() if device.startswith("cuda") else None
    point = {
        "rows": rows,
        "keys": keys,
        "topk": topk,
        "backend": backend,
        "device": device,
        "litetopk_both_formats": _equal(ours, theirs),
        "dense_both_formats": _equal(dense_ours, dense_theirs),
        "litetopk_equals_dense": {
            f: bool(torch.equal(getattr(ours, f), getattr(dense_ours, f)))
            for f in FIELDS
            if f not in ("candidates", "repaired")
        },  # the scan's own counts
        "dropin_equals_operator": {
            "physical_indices": bool(torch.equal(dropin.physical_indices, rounded.physical_indices)),
            "raw_indices": bool(torch.equal(dropin.raw_indices, rounded.raw_indices)),
            "values": bool(torch.equal(dropin.values, rounded.values)),
        },
        "status_nonzero_rows": int((ours.status != 0).sum()),
        "candidates_mean": float(ours.candidates.double().mean()),
    }
    point["ok"] = all(all(v.values()) for k, v in point.items() if isinstance(v, dict))
    return point


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--keys", type=int, default=65536, help="C4 keys of the sequence")
    parser.add_argument("--topk", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--backend", default="triton")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--out", default=str(RESULTS_DIR))
    args = parser.parse_args()
    points = []
    for topk in args.topk:
        point = check_point(args.rows, args.keys, topk, args.backend, args.device, args.seed)
        points.append(point)
        print(
            f"rows={args.rows} keys={args.keys} topk={topk} backend={args.backend}: "
            f"{'OK' if point['ok'] else 'MISMATCH'} "
            + json.dumps({k: v for k, v in point.items() if isinstance(v, dict)}),
            flush=True,
        )
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "check-layouts.json")
    name = torch.cuda.get_device_name(0) if args.device.startswith("cuda") else "cpu"
    with open(path, "w") as f:
        json.dump(
            {
                "command": " ".join(["python -m bench.checks.layouts", *sys.argv[1:]]),
                "device": name,
                "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "points": points,
            },
            f,
            indent=1,
        )
    print(f"wrote {path}")
    if not all(p["ok"] for p in points):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
