"""Device probe: the dense radix selector (kernels/dense_selection.py select_topk_radix) on score rows of different
shapes of data, with each way of counting digits, in one process.

Why: the counting launches add one to a row's digit counter in global memory for every key at or above the floor
(RADIX_CONFIG "aggregate" False), or once a digit a warp (match.any.sync and popc, "aggregate" True). On normal
scores the first is faster (bench/JOURNAL.md 20-21), but keys that share a digit contend for one counter: where a
row's top keys all share their first digit (clustered or equal scores), the per-key form serializes. This probe
times both on such rows, so that the default is chosen on the data an engine can send, not only on normal scores.

Data per row (float32, a row of `width` keys): "normal" (randn), "clustered" (randn x 0.01 + 4: the top keys in a
few first digits), "equal" (every key the same score: one digit, every key ties, the bisection's case), "few
distinct" (16 values: each digit's keys tie). Every answer is checked bit for bit against the torch selector
(select_topk_dense(..., "torch")) before it is timed; timing: CUDA events around one call, 3 warm-up calls, the
median of REPS: the host's launches and allocations included, so calls under ~300 us on the H100's host measure the
host (its five launches from Python), not the GPU; rows of equal or few distinct scores are GPU-bound. Prints a
table, writes DIR/radix-data-probe-<card>.json.

    python -m bench.probes.radix_data_probe --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from bench.common.report import run_info
from bench.common.timing import cuda_ms
from litetopk.kernels import dense_selection
from litetopk.kernels.dense_selection import select_topk_dense, select_topk_radix

SHAPES = ((64, 65536, 512), (1, 65536, 512), (128, 65536, 1024))  # rows, width, K
DATA = {
    "normal": lambda g, shape: torch.randn(shape, generator=g, device="cuda"),
    "clustered": lambda g, shape: torch.randn(shape, generator=g, device="cuda") * 0.01 + 4.0,
    "equal": lambda g, shape: torch.full(shape, 1.5, device="cuda"),
    "few distinct": lambda g, shape: torch.randint(0, 16, shape, generator=g, device="cuda").float(),
}
AGGREGATE = (False, True)
WARM, REPS = 3, 15


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = parser.parse_args()
    g = torch.Generator(device="cuda").manual_seed(21)
    results = []
    print(f"{'shape':<18}{'data':<14}" + "".join(f"{'aggregate ' + str(a):>18}" for a in AGGREGATE) + "  equal")
    for rows, width, k in SHAPES:
        for name, draw in DATA.items():
            scores = draw(g, (rows, width)).contiguous()
            want = select_topk_dense(scores, k, "torch")
            entry = dict(rows=rows, width=width, k=k, data=name, us={}, equal={})
            for aggregate in AGGREGATE:
                got = select_topk_radix(scores, k, aggregate=aggregate)
                entry["equal"][str(aggregate)] = bool(torch.equal(got, want))
                call = lambda: select_topk_radix(scores, k, aggregate=aggregate)  # noqa: E731
                entry["us"][str(aggregate)] = 1e3 * cuda_ms(call, reps=REPS, warm=WARM)
            results.append(entry)
            print(
                f"{rows}x{width} K{k:<5}".ljust(18)
                + f"{name:<14}"
                + "".join(f"{entry['us'][str(a)]:>15.1f} us" for a in AGGREGATE)
                + f"  {all(entry['equal'].values())}",
                flush=True,
            )
    info = run_info(torch.device("cuda"), sys.argv[1:], "bench.probes.radix_data_probe")
    card = torch.cuda.get_device_name().split()[1].lower()
    path = os.path.join(args.out, f"radix-data-probe-{card}.json")
    with open(path, "w") as f:
        json.dump(dict(info, config=dense_selection.RADIX_CONFIG, results=results), f, indent=1)
    print(f"wrote {path}")
    return 0 if all(all(e["equal"].values()) for e in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
