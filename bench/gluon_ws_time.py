"""On the H200: time the two loops of bench/gluon_ws_sass.py (plain bar.sync loop vs warp-specialized
producer/consumer with mbarriers) on the same work, check they agree, and report int8 TOP/s.
Work: PROGRAMS CTAs, each N = 128 (head, row) columns x STEPS x 64 keys x D = 128 (the key tiles
shared, so they stay in L2 as the scoring kernel's do). Writes $OUT/gluon-ws.json.
    source bench/gpu_env.sh && cd bench && OUT=/tmp python3 gluon_ws_time.py
"""

from __future__ import annotations

import json
import os

import torch

from gluon_ws_sass import BK, D, N, plain_kernel, ws_kernel
from problems_gpu import cuda_ms

PROGRAMS, STEPS = 2048, 1024
gen = torch.Generator(device="cuda").manual_seed(5)
k = torch.randint(-12, 13, (STEPS * BK, D), generator=gen, device="cuda", dtype=torch.int8)
q = torch.randint(-12, 13, (N, D), generator=gen, device="cuda", dtype=torch.int8)
w = torch.randn(N, generator=gen, device="cuda") * 2.0**100  # so that relu bits (subnormals) x w are normal
report = {"device": torch.cuda.get_device_name(0), "programs": PROGRAMS, "steps": STEPS, "N": N}
outs = {}
for name, kernel, stages in (("plain", plain_kernel, 1), ("ws_stages3", ws_kernel, 3), ("ws_stages4", ws_kernel, 4)):
    out = torch.full((BK,), float("nan"), device="cuda")
    try:
        run = lambda: kernel[(PROGRAMS,)](k, q, w, out, STEPS, BK=BK, N=N, D=D, STAGES=stages, num_warps=4)
        ms = cuda_ms(run, reps=5, warm=1)
    except Exception as exc:
        report[name] = {"error": repr(exc)[:400]}
        print(name, report[name], flush=True)
        continue
    outs[name] = out.clone()
    report[name] = {"ms": ms, "int8_tops": 2 * PROGRAMS * STEPS * BK * N * D / ms / 1e9}
    print(name, report[name], flush=True)
if "plain" in outs:
    report["agree_with_plain"] = {n: bool(torch.equal(o, outs["plain"])) for n, o in outs.items()}
    print(report["agree_with_plain"])
with open(os.path.join(os.environ.get("OUT", "/tmp"), "gluon-ws.json"), "w") as f:
    json.dump(report, f, indent=1)
