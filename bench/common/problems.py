"""Benchmark problems, built directly on the device with random MXFP4 data:
- the seed's workload (`prefill_problem`: one sequence, Q causal prefill rows at the end of a raw
  context, C4 keys);
- decode batches (`decode_lengths`, `paged_random_cache`, `decode_queries`): B sequences of C4 keys in
  a paged cache whose pages are shuffled over the whole cache, next_n query rows at the end of each
  sequence (MTP), rows sequence-major. Row i (0 <= i < next_n) of sequence b sees [0, L_b - next_n + 1 + i):
  the last row sees every key of its sequence, each earlier row one key fewer (the causal windows of
  MTP's draft positions, as the engines' decode metadata gives them).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from litetopk.kernels import PAGE_BYTES, PAGE_SIZE, pack_kv_cache, quantize_mxfp4

HEAD_DIM = 128
NUM_HEADS = 64
KEY_BYTES = PAGE_BYTES // PAGE_SIZE  # 68: 64 bytes of packed E2M1 values, then 4 UE8M0 scales (docs/contract.md §2)
VALUE_BYTES = HEAD_DIM // 2
QUERY_BYTES = NUM_HEADS * (HEAD_DIM // 2 + HEAD_DIM // 32) + NUM_HEADS * 4  # q_fp4, q_scale, float32 weights

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
        q_fp4=q_fp4,
        q_scale=q_scale,
        kv_cache=cache,
        block_table=block_table,
        weights=weights,
        row_to_batch=torch.zeros(rows, dtype=torch.int32, device=device),
        starts=torch.zeros(rows, dtype=torch.int32, device=device),
        ends=ends,
        topk=topk,
    )


def call_args(problem: dict):
    """(positional args, keyword args) of litetopk_prefill for a problem dict."""
    names = ("q_fp4", "q_scale", "kv_cache", "block_table", "weights", "row_to_batch", "starts", "ends")
    return tuple(problem[n] for n in names), {"topk": problem["topk"]}


def decode_lengths(batch: int, keys: int | None, *, mixed_range: tuple[int, int], seed: int) -> list[int]:
    """C4 keys of each of `batch` sequences: `keys` each, or (keys=None, "mixed") lengths drawn
    log-uniform in [mixed_range[0], mixed_range[1]] (seeded: the same list for the same arguments)."""
    if keys is not None:
        return [int(keys)] * batch
    lo, hi = mixed_range
    rng = np.random.default_rng(seed)
    drawn = np.exp(rng.uniform(math.log(lo), math.log(hi), size=batch))
    return [int(n) for n in np.clip(np.rint(drawn), lo, hi)]


def paged_pages(lengths: list[int], spare_pages: int) -> int:
    """Physical pages of a paged cache holding `lengths` keys per sequence plus `spare_pages` unused."""
    return sum(-(-n // PAGE_SIZE) for n in lengths) + spare_pages


def paged_random_cache(
    lengths: list[int], *, seed: int, device, spread: int = 0, spare_pages: int = 7, chunk_pages: int = 4096
) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_cache uint8 [num_pages, PAGE_BYTES], block_table int32 [batch, max_pages]) for sequences of
    `lengths` C4 keys: sequence b's logical pages map to physical pages drawn without replacement from a
    random permutation of the whole cache (sequences interleave, no page is where its logical index
    says), unused table entries are -1, max_pages = ceil(max(lengths) / PAGE_SIZE). Every physical page
    (spare ones and slots past a sequence's end included) holds random MXFP4 keys (Gaussian values,
    block scales over 2 * spread + 1 binades), generated `chunk_pages` pages at a time on the device,
    so the cache may be tens of GB without a float copy of it."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    pages = [-(-n // PAGE_SIZE) for n in lengths]
    num_pages = paged_pages(lengths, spare_pages)
    perm = torch.randperm(num_pages, generator=gen, device=device).to(torch.int32)
    block_table = torch.full((len(lengths), max(pages)), -1, dtype=torch.int32, device=device)
    offset = 0
    for b, count in enumerate(pages):
        block_table[b, :count] = perm[offset : offset + count]
        offset += count
    cache = torch.empty(num_pages, PAGE_BYTES, dtype=torch.uint8, device=device)
    values_end = PAGE_SIZE * VALUE_BYTES
    for lo in range(0, num_pages, chunk_pages):
        hi = min(lo + chunk_pages, num_pages)
        k_fp4, k_scale = random_mxfp4((hi - lo, PAGE_SIZE, HEAD_DIM), gen, device, spread)
        cache[lo:hi, :values_end] = k_fp4.reshape(hi - lo, -1)
        cache[lo:hi, values_end:] = k_scale.reshape(hi - lo, -1)
    return cache, block_table


def decode_queries(lengths: list[int], next_n: int, *, seed: int, device, spread: int = 0) -> dict:
    """The query side of a decode call over sequences of `lengths` keys: next_n rows per sequence,
    sequence-major (row r belongs to sequence r // next_n), row i of sequence b seeing
    [0, max(0, L_b - next_n + 1 + i)) (module docstring); random MXFP4 queries, float32 weights."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    rows = len(lengths) * next_n
    q_fp4, q_scale = random_mxfp4((rows, NUM_HEADS, HEAD_DIM), gen, device, spread)
    weights = torch.randn(rows, NUM_HEADS, generator=gen, device=device)
    row_to_batch = torch.arange(rows, device=device, dtype=torch.int32) // next_n
    length = torch.tensor(lengths, dtype=torch.int32, device=device)[row_to_batch.long()]
    step = torch.arange(rows, device=device, dtype=torch.int32) % next_n
    ends = (length - next_n + 1 + step).clamp_min(0).to(torch.int32)
    return dict(
        q_fp4=q_fp4,
        q_scale=q_scale,
        weights=weights,
        row_to_batch=row_to_batch,
        starts=torch.zeros(rows, dtype=torch.int32, device=device),
        ends=ends,
    )
