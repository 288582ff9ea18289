"""One device call: correctness of the Triton backend at medium shapes, a stage breakdown and a
small tile sweep at the production shape, and the SASS instruction mix. Writes $OUT/probe.json."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch
import triton

from litetopk.kernels import LiteTopKTuning, dense_topk_prefill, litetopk_prefill
from litetopk.kernels.operator import get_backend
from litetopk.kernels.pipeline import calibrate, run_litetopk
from litetopk.kernels.selection import NO_KEY, select_topk_dense, select_topk_keys
from litetopk.kernels.triton import TritonBackend
from litetopk.kernels.triton.selection import select_topk_candidates_kernel
from litetopk.kernels.validation import validate_prefill

from problems_gpu import call_args, cuda_ms, json_logger, prefill_problem, profile_call

OUT = os.environ.get("OUT", "/tmp")
report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}


log = json_logger(os.path.join(OUT, "probe.json"), report)


# 1. correctness at a medium shape: triton lite == triton dense; triton vs reference (GPU torch)
for topk, rows, raw in ((512, 256, 65536), (1024, 128, 131072)):
    p = prefill_problem(rows, raw, topk, seed=rows + raw)
    args, kw = call_args(p)
    t0 = time.time()
    lite = litetopk_prefill(*args, **kw, backend="triton")
    dense = dense_topk_prefill(*args, **kw, backend="triton")
    ref = dense_topk_prefill(*args, **kw, backend="reference")
    torch.cuda.synchronize()
    same = {f: torch.equal(getattr(lite, f), getattr(dense, f)) for f in ("values", "raw_indices", "physical_indices", "counts", "status")}
    rel = ((lite.values - ref.values).abs() / ref.values.abs().clamp_min(1e-30)).max().item()
    set_diff = sum(len(set(a.tolist()) ^ set(b.tolist())) for a, b in zip(lite.raw_indices, ref.raw_indices))
    log(f"check_k{topk}_rows{rows}_raw{raw}", dict(lite_eq_dense=same, max_rel_vs_ref=rel, set_diff_vs_ref=set_diff,
        status=int(lite.status.abs().sum()), repaired=int(lite.repaired.sum()),
        cand_mean=float(lite.candidates.float().mean()), cand_max=int(lite.candidates.max()), secs=time.time() - t0))

# 2. production shape: stage breakdown and sweep
for topk in (512, 1024):
    p = prefill_problem(8192, 262144, topk, seed=7)
    args, kw = call_args(p)
    backend = get_backend("triton", torch.device("cuda"))
    problem = validate_prefill(*args, **kw)
    tuning = LiteTopKTuning()
    res = {}
    res["validate"] = cuda_ms(lambda: validate_prefill(*args, **kw))
    backend._prepared = None
    res["operands"] = cuda_ms(lambda: (setattr(backend, "_prepared", None), backend.operands(problem)))
    res["schedule"] = cuda_ms(lambda: backend.schedule(problem))
    from litetopk.kernels.triton.decode import decode_keys_fp4_triton, decode_queries_fp4_triton
    res["decode_queries_kernel"] = cuda_ms(lambda: decode_queries_fp4_triton(problem.q_fp4, problem.q_scale))
    need = torch.full((1,), problem.max_end, dtype=torch.int32, device="cuda")
    res["decode_keys_kernel"] = cuda_ms(lambda: decode_keys_fp4_triton(problem.cache, problem.block_table, need, problem.max_end))
    res["calibrate"] = cuda_ms(lambda: calibrate(problem, backend, tuning))
    thr, ceil = calibrate(problem, backend, tuning)
    cap = tuning.capacity(topk)
    res["scan"] = cuda_ms(lambda: backend.scan_candidates(problem, thr, cap, ceilings=ceil))
    res["scan_again"] = cuda_ms(lambda: backend.scan_candidates(problem, thr, cap, ceilings=ceil))
    scan = backend.scan_candidates(problem, thr, cap, ceilings=ceil)
    res["select_candidates"] = cuda_ms(lambda: backend.select_candidates(scan, topk))
    res["select_candidates_torch_topk"] = cuda_ms(lambda: select_topk_keys(scan.keys[:, :int(scan.appended.max())], topk))
    kept = scan.appended.clamp(max=cap)
    full = triton.next_power_of_2(cap)
    whole_row = torch.empty(problem.num_rows, topk, dtype=torch.int64, device="cuda")
    res["select_candidates_whole_row"] = cuda_ms(lambda: select_topk_candidates_kernel[(problem.num_rows,)](
        scan.keys, cap, kept, scan.thresholds, whole_row, whole_row, TOPK=topk, FULL=full, SMALL=full,
        num_warps=max(4, min(16, full // 512))))
    res["select_equal_torch_topk"] = bool(torch.equal(backend.select_candidates(scan, topk), select_topk_keys(scan.keys, topk))
                                          and torch.equal(whole_row, select_topk_keys(scan.keys, topk)))
    res["passing_final_threshold"] = torch.quantile(
        ((scan.keys >= scan.thresholds[:, None]) & (scan.keys != NO_KEY)).sum(dim=1).double(),
        torch.tensor([0.5, 0.99, 1.0], device="cuda", dtype=torch.float64)).tolist()
    res["cand_mean"] = float(scan.appended.float().mean())
    res["cand_quantiles"] = torch.quantile(scan.appended.double(), torch.tensor([0.5, 0.9, 0.99, 1.0], device=scan.appended.device, dtype=torch.float64)).tolist()
    res["cand_max"] = int(scan.appended.max())
    res["lite_total"] = cuda_ms(lambda: litetopk_prefill(*args, **kw, backend="triton"))
    res["dense_score"] = cuda_ms(lambda: backend.score_dense(problem))
    scores, _ = backend.score_dense(problem)
    res["torch_topk"] = cuda_ms(lambda: torch.topk(scores, topk, dim=1))
    res["select_dense"] = cuda_ms(lambda: select_topk_dense(scores, topk))
    res["dense_total"] = cuda_ms(lambda: dense_topk_prefill(*args, **kw, backend="triton"))
    del scores
    lite = litetopk_prefill(*args, **kw, backend="triton")
    dense = dense_topk_prefill(*args, **kw, backend="triton")
    res["lite_eq_dense"] = all(torch.equal(getattr(lite, f), getattr(dense, f)) for f in ("values", "raw_indices", "physical_indices", "counts", "status"))
    res["repaired"] = int(lite.repaired.sum())
    log(f"prod_k{topk}", res)

# 3. tile sweep of the dense scoring kernel (K=512 problem)
p = prefill_problem(8192, 262144, 512, seed=7)
args, kw = call_args(p)
problem = validate_prefill(*args, **kw)
sweep = {}
for br, bk, nw, ns in ((4, 64, 4, 3),):
    be = TritonBackend(block_rows=br, block_keys=bk, num_warps=nw, num_stages=ns)
    be.operands(problem)
    thr, ceil = calibrate(problem, be, LiteTopKTuning())
    try:
        d = cuda_ms(lambda: be.score_dense(problem), reps=3, warm=1)
        s = cuda_ms(lambda: be.scan_candidates(problem, thr, 4096, ceilings=ceil), reps=3, warm=1)
    except Exception as exc:  # a configuration that does not compile is a result too
        d = s = repr(exc)[:200]
    sweep[f"br{br}_bk{bk}_w{nw}_s{ns}"] = {"dense_ms": d, "scan_ms": s}
    log("sweep", sweep)

# 4. SASS instruction mix of the compiled scan kernel
from litetopk.kernels.triton.scoring import score_fp4_kernel
try:
    cache_dir = os.path.expanduser("~/.triton/cache")
    cubins = subprocess.run(f"find {cache_dir} -name 'score_fp4_kernel*.cubin'", shell=True, capture_output=True, text=True).stdout.split()
    mix = {}
    for cubin in cubins[:4]:
        sass = subprocess.run(["cuobjdump", "--dump-sass", cubin], capture_output=True, text=True).stdout
        ops = {}
        for line in sass.splitlines():
            parts = line.split("*/")
            if len(parts) > 1 and "/*" in parts[0]:
                ins = parts[1].strip().split(" ")[0].split(".")[0]
                if ins:
                    ops[ins] = ops.get(ins, 0) + 1
        mix[os.path.basename(os.path.dirname(cubin))] = {k: v for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:25]}
        with open(os.path.join(OUT, "sass_" + os.path.basename(os.path.dirname(cubin))[:12] + ".txt"), "w") as f:
            f.write(sass)
    log("sass_mix", mix)
except Exception as exc:
    log("sass_error", repr(exc))

# 5. where the LiteTopK call's time goes: torch profiler over one warm call (CPU ops and CUDA kernels)
try:
    args, kw = call_args(prefill_problem(8192, 262144, 512, seed=7))
    profile_call(lambda: litetopk_prefill(*args, **kw, backend="triton"), OUT, "lite")
    log("profile", "lite-profile.txt, lite-trace.json")
except Exception as exc:
    log("profile_error", repr(exc))
