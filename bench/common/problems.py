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
