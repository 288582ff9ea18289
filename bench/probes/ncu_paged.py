"""Nsight Compute view of the paged mode's scoring kernel (Gluon, sm_90) on one decode shape: three LiteTopK
calls in TritonBackend(paged="always") at the default tuning, the first two to compile and warm. A call whose score
matrix fits LiteTopKTuning.dense_route_bytes scores densely: one launch a call (--launch-skip 2: the third call's);
a larger one scans: two launches a call, the calibration sample's then the scan's (--launch-skip 5: the third
call's scan). Run it under ncu:

    ncu --kernel-name regex:score_fp4_paged --launch-skip 2 --launch-count 1 --set full \\
        python3 -m bench.probes.ncu_paged --shape 64x1x65536x512

bench/device/gpu_ncu_paged.sh runs it on the device and keeps the report and its per-instruction source page.
"""

from __future__ import annotations

import argparse

import torch

from litetopk.kernels import litetopk_prefill, registry
from litetopk.kernels.triton import TritonBackend

from ..common.problems import decode_queries, paged_random_cache


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="64x1x65536x512", help="BxNxKEYSxK")
    parser.add_argument("--kernel", default="auto", choices=("auto", "triton"), help="the paged scoring kernel")
    args = parser.parse_args(argv)
    batch, next_n, keys, topk = (int(x) for x in args.shape.split("x"))
    lengths = [keys] * batch
    cache, block_table = paged_random_cache(lengths, seed=7, device="cuda")
    q = decode_queries(lengths, next_n, seed=8, device="cuda")
    call = (q["q_fp4"], q["q_scale"], cache, block_table, q["weights"], q["row_to_batch"], q["starts"], q["ends"])
    with registry.backend_instance("triton", TritonBackend(paged="always", scoring_kernel=args.kernel)):
        for _ in range(3):
            result = litetopk_prefill(*call, topk=topk, backend="triton")
    torch.cuda.synchronize()
    print(f"done: {args.shape}, candidates a row {float(result.candidates.float().mean()):.0f}")


if __name__ == "__main__":
    main()
