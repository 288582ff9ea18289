"""Random, valid prefill problems: the arguments of `litetopk_prefill` in one object.

Layer: utilities (imports the formats only: mxfp4, cache_layout); the package exports random_problem.

`random_problem(rows, keys, topk)` builds what a worker would hold: MXFP4 keys of one or more
sequences packed into a paged cache whose pages are permuted (so physical and logical positions
differ), MXFP4 queries, float32 head weights and one key window per row. The quick start, the
service's warm-up and the tests build their inputs with it; nothing here computes an answer.

    problem = random_problem(rows=4, keys=2048, topk=512)
    result = litetopk_prefill(*problem.args(), **problem.kwargs())

Values are Gaussian; each 32-element block is scaled by 2^e with e drawn from [-spread, spread]
(`spread=0`: one binade, as Hadamard-rotated activations; larger spreads make wide vectors).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .cache_layout import HEAD_DIM, NUM_HEADS, PAGE_SIZE, pack_kv_cache
from .mxfp4 import quantize_mxfp4


@dataclass
class RandomProblem:
    """Arguments of litetopk_prefill: the eight tensors in order (`args()`), `topk` and `weight_scale`
    (`kwargs()`); `note` and `extra` are free for whoever builds it (tests name their cases there)."""

    q_fp4: torch.Tensor
    q_scale: torch.Tensor
    kv_cache: torch.Tensor
    block_table: torch.Tensor
    weights: torch.Tensor
    row_to_batch: torch.Tensor
    starts: torch.Tensor
    ends: torch.Tensor
    topk: int
    weight_scale: float = 1.0
    note: str = ""
    extra: dict = field(default_factory=dict)

    def args(self) -> tuple[torch.Tensor, ...]:
        """(q_fp4, q_scale, kv_cache, block_table, weights, row_to_batch, starts, ends)."""
        return (
            self.q_fp4,
            self.q_scale,
            self.kv_cache,
            self.block_table,
            self.weights,
            self.row_to_batch,
            self.starts,
            self.ends,
        )

    def kwargs(self) -> dict:
        """{"topk": ..., "weight_scale": ...}: the keyword arguments the problem fixes."""
        return {"topk": self.topk, "weight_scale": self.weight_scale}

    def to(self, device) -> RandomProblem:
        """The same problem with every tensor on `device`."""
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return RandomProblem(**moved)


def random_mxfp4(shape, rng: np.random.Generator, spread: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 (packed uint8[..., D/2], scales uint8[..., D/32]) of Gaussian values whose 32-element
    blocks are scaled by 2^e, e uniform in [-spread, spread]."""
    values = rng.standard_normal(shape)
    exponents = rng.integers(-spread, spread + 1, size=(*shape[:-1], shape[-1] // 32)).repeat(32, -1)
    x = values * np.exp2(exponents)
    return quantize_mxfp4(torch.from_numpy(x.astype(np.float32)))


def random_problem(
    rows: int,
    keys: int | Sequence[int],
    topk: int = 512,
    *,
    device: str | torch.device = "cpu",
    seed: int = 0,
    causal: bool = True,
    spread: int = 0,
    weights_dtype: torch.dtype = torch.float32,
    weight_scale: float = 1.0,
    spare_pages: int = 3,
    note: str = "",
) -> RandomProblem:
    """A random valid problem on `device`, the same for the same arguments.

    A causal row of a sequence of n keys sees [0, (t+1)//4) for a raw position t drawn from the last
    page of raw tokens, [4n - 256, 4n); a non-causal row sees a random sub-window [a, c) of [0, n].
    The cache holds every sequence in a permutation of its pages plus `spare_pages` unused ones.

    Parameters
    ----------
    rows : int
        Query rows, split evenly over the sequences (ValueError unless it divides).
    keys : int or sequence of int
        Compressed keys of one sequence, or a list of per-sequence lengths (each >= 1).
    topk : int
        K, passed through (the operator checks it against SUPPORTED_TOPK; default 512).
    device : torch.device or str
        Where every tensor lies (default "cpu").
    seed : int
        The draw (default 0): the same seed and arguments give the same problem.
    causal : bool
        Causal prefill windows (default) or random sub-windows.
    spread : int
        Each 32-element block is scaled by 2^e, e uniform in [-spread, spread] (default 0: one binade).
    weights_dtype : torch.dtype
        float32 (default) or bfloat16 head weights.
    weight_scale : float
        Passed through to the operator (default 1.0).
    spare_pages : int
        Pages of the cache no sequence uses (default 3).
    note : str
        Free text for whoever builds it (tests name their cases there).

    Returns
    -------
    RandomProblem
        The operator's arguments: `.args()` the eight tensors in order, `.kwargs()` topk and weight_scale.

    Example
    -------
    >>> from litetopk.kernels import litetopk_prefill, random_problem
    >>> p = random_problem(rows=4, keys=[1500, 900], topk=512, seed=7)
    >>> p.q_fp4.shape, p.block_table.shape, p.row_to_batch.tolist()
    (torch.Size([4, 64, 64]), torch.Size([2, 25]), [0, 0, 1, 1])
    >>> litetopk_prefill(*p.args(), **p.kwargs()).counts.tolist()
    [512, 512, 512, 512]
    """
    seq_lens = [int(keys)] if isinstance(keys, int) else [int(n) for n in keys]
    if not seq_lens or min(seq_lens) < 1:
        raise ValueError(f"keys={keys!r}: give one or more sequence lengths >= 1")
    batch = len(seq_lens)
    if rows < batch or rows % batch:
        raise ValueError(f"rows={rows} must be a positive multiple of the {batch} sequences")
    rows_per_seq = rows // batch
    rng = np.random.default_rng(seed)
    length = max(seq_lens)
    pages_per_seq = -(-length // PAGE_SIZE)
    max_pages = pages_per_seq + 1
    num_pages = batch * max_pages + spare_pages
    perm = rng.permutation(num_pages)
    block_table = np.full((batch, max_pages), -1, dtype=np.int32)
    for b in range(batch):
        block_table[b, :pages_per_seq] = perm[b * pages_per_seq : (b + 1) * pages_per_seq]
    k_fp4, k_scale = random_mxfp4((batch, length, HEAD_DIM), rng, spread)
    cache = pack_kv_cache(k_fp4, k_scale, torch.from_numpy(block_table), num_pages)
    q_fp4, q_scale = random_mxfp4((rows, NUM_HEADS, HEAD_DIM), rng, spread)
    row_to_batch = np.repeat(np.arange(batch), rows_per_seq).astype(np.int32)
    starts = np.zeros(rows, dtype=np.int32)
    ends = np.zeros(rows, dtype=np.int32)
    for i, b in enumerate(row_to_batch):
        n = seq_lens[b]
        if causal:
            raw = rng.integers(max(0, 4 * n - 4 * PAGE_SIZE), 4 * n)
            ends[i] = (raw + 1) // 4
        else:
            a, c = sorted(rng.integers(0, n + 1, size=2))
            starts[i], ends[i] = a, c
    weights = torch.from_numpy(rng.standard_normal((rows, NUM_HEADS)).astype(np.float32)).to(weights_dtype)
    problem = RandomProblem(
        q_fp4=q_fp4,
        q_scale=q_scale,
        kv_cache=cache,
        block_table=torch.from_numpy(block_table),
        weights=weights,
        row_to_batch=torch.from_numpy(row_to_batch),
        starts=torch.from_numpy(starts),
        ends=torch.from_numpy(ends),
        topk=topk,
        weight_scale=weight_scale,
        note=note,
    )
    return problem.to(device)


__all__ = ["RandomProblem", "random_mxfp4", "random_problem"]
