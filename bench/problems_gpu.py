"""Benchmark problems: the seed's workload (one sequence, Q causal prefill rows at the end of a
raw context, C4 keys), built directly on the device with random MXFP4 data."""

from __future__ import annotations

import torch

from litetopk.kernels import pack_kv_cache, quantize_mxfp4

MODELS = {"deepseek-v4-flash": 512, "deepseek-v4-pro": 1024}


def random_mxfp4(shape, generator: torch.Generator, device, spread: int = 0):
    """MXFP4 of normal values with per-block magnitudes over 2 * spread + 1 binades (spread 0: plain
    Gaussian data, no vector needs the wide int8 operands; spread 1: about 0.1 % of vectors do)."""
    x = torch.randn(shape, generator=generator, device=device)
    blocks = torch.randint(-spread, spread + 1, (*shape[:-1], shape[-1] // 32), generator=generator, device=device)
    x = x * torch.exp2(blocks.float()).repeat_interleave(32, dim=-1)
    return quantize_mxfp4(x)


def prefill_problem(rows: int, raw_context: int, topk: int, seed: int, device="cuda", spread: int = 0):
    """Arguments of litetopk_prefill for `rows` causal rows ending a sequence of raw_context tokens."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    keys = raw_context // 4
    pages = -(-keys // 64)
    k_fp4, k_scale = random_mxfp4((1, keys, 128), gen, device, spread)
    perm = torch.randperm(pages + 7, generator=gen, device=device)[:pages]
    block_table = perm.to(torch.int32)[None, :].contiguous()
    cache = pack_kv_cache(k_fp4, k_scale, block_table, pages + 7)
    q_fp4, q_scale = random_mxfp4((rows, 64, 128), gen, device, spread)
    weights = torch.randn(rows, 64, generator=gen, device=device)
    raw_pos = torch.arange(raw_context - rows, raw_context, device=device)
    ends = ((raw_pos + 1) // 4).to(torch.int32)
    return dict(
        q_fp4=q_fp4, q_scale=q_scale, kv_cache=cache, block_table=block_table, weights=weights,
        row_to_batch=torch.zeros(rows, dtype=torch.int32, device=device),
        starts=torch.zeros(rows, dtype=torch.int32, device=device), ends=ends, topk=topk,
    )


def call_args(problem: dict):
    """(positional args, keyword args) of litetopk_prefill for a problem dict."""
    names = ("q_fp4", "q_scale", "kv_cache", "block_table", "weights", "row_to_batch", "starts", "ends")
    return tuple(problem[n] for n in names), {"topk": problem["topk"]}


def cuda_ms(fn, reps: int = 5, warm: int = 2) -> float:
    """Median milliseconds of `reps` calls of fn timed with CUDA events, after `warm` calls."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def json_logger(path: str, report: dict):
    """log(key, value): report[key] = value, printed, and the whole report rewritten to `path` (so a
    call cut short still leaves what it measured)."""
    import json

    def log(key, value):
        report[key] = value
        print(key, value, flush=True)
        with open(path, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return log


def profile_call(fn, out_dir: str, name: str) -> None:
    """Profile one call of fn after two warm-up calls: writes out_dir/name-profile.txt (ops by CPU
    time, then by CUDA time) and out_dir/name-trace.json (chrome trace)."""
    import os

    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with open(os.path.join(out_dir, f"{name}-profile.txt"), "w") as f:
        f.write(prof.key_averages().table(sort_by="cpu_time_total", row_limit=40))
        f.write("\n\n" + prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
    prof.export_chrome_trace(os.path.join(out_dir, f"{name}-trace.json"))
