"""Random prefill problems and an independent float64 oracle, written from CONTRACT.md alone.

Nothing here calls the code under test except `quantize_mxfp4` / `pack_kv_cache` to build inputs
(the codec and the packing have their own byte-level tests against ml_dtypes and the layout).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from litetopk.kernels import pack_kv_cache, quantize_mxfp4

H, D, PAGE = 64, 128, 64
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float64)


@dataclass
class Problem:
    """Arguments of litetopk_prefill (as `args()` / `kwargs`) plus what the oracle needs."""

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

    def args(self):
        return (self.q_fp4, self.q_scale, self.kv_cache, self.block_table, self.weights,
                self.row_to_batch, self.starts, self.ends)

    def to(self, device) -> "Problem":
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return Problem(**moved)


def decode_fp4(packed: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float64 values [..., 128] from packed [..., 64] and scales [..., 4] (contract §1)."""
    low = packed & 0xF
    high = packed >> 4
    codes = np.stack([low, high], axis=-1).reshape(*packed.shape[:-1], D)
    values = E2M1[codes]
    factor = np.exp2(scales.astype(np.float64) - 127.0)
    return (values.reshape(*scales.shape, 32) * factor[..., None]).reshape(*packed.shape[:-1], D)


def oracle_scores(p: Problem) -> tuple[np.ndarray, np.ndarray]:
    """(scores float64 [rows, S], bound float64 [rows]) with -inf outside windows.

    bound[i] covers float32 rounding of a 64-term head sum of non-negative-ReLU products:
    70 * 2^-24 * max_j sum_h |w_ih| relu(dot) * |weight_scale| (plus the final scale rounding).
    """
    cache = p.kv_cache.cpu().numpy().reshape(-1, PAGE * 68)
    values = cache[:, : PAGE * 64].reshape(-1, PAGE, 64)
    scales = cache[:, PAGE * 64:].reshape(-1, PAGE, 4)
    bt = p.block_table.cpu().numpy().astype(np.int64)
    q = decode_fp4(p.q_fp4.cpu().numpy(), p.q_scale.cpu().numpy())  # [rows, H, D]
    w = p.weights.float().cpu().numpy().astype(np.float64)
    rtb = p.row_to_batch.cpu().numpy()
    st = p.starts.cpu().numpy()
    en = p.ends.cpu().numpy()
    s_max = int(en.max()) if len(en) else 0
    scores = np.full((len(rtb), s_max), -np.inf)
    bound = np.zeros(len(rtb))
    for i in range(len(rtb)):
        if en[i] <= st[i]:
            continue
        pos = np.arange(st[i], en[i])
        pages = bt[rtb[i], pos // PAGE]
        k = decode_fp4(values[pages, pos % PAGE], scales[pages, pos % PAGE])  # [n, D]
        dots = q[i] @ k.T  # [H, n]
        relu = np.maximum(dots, 0.0)
        scores[i, pos] = p.weight_scale * (w[i] @ relu)
        bound[i] = 70 * 2.0**-24 * abs(p.weight_scale) * float((np.abs(w[i]) @ relu).max())
    return scores, bound


def oracle_topk(scores: np.ndarray, k: int) -> list[list[int]]:
    """Positions of the k best of each row by (score desc, position asc), -inf excluded."""
    out = []
    for row in scores:
        live = np.nonzero(row > -np.inf)[0]
        order = np.lexsort((live, -row[live]))
        out.append(live[order][:k].tolist())
    return out


def random_fp4(shape, rng: np.random.Generator, spread: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 vectors of normal values whose 32-element blocks span `spread` binades of magnitude."""
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-spread, spread + 1, size=(*shape[:-1], shape[-1] // 32)).repeat(32, -1))
    return quantize_mxfp4(torch.from_numpy(x.astype(np.float32)))


def make_problem(
    seed: int,
    *,
    seq_lens: list[int],
    rows_per_seq: int,
    topk: int = 512,
    causal: bool = True,
    spare_pages: int = 3,
    weights_dtype=torch.float32,
    weight_scale: float = 1.0,
    spread: int = 3,
    note: str = "",
) -> Problem:
    """A fresh random problem: sequences of `seq_lens` compressed keys in a permuted paged cache,
    `rows_per_seq` query rows each; causal rows see [0, (t+1)//4) for raw positions t near the end
    of the sequence, non-causal rows see a random sub-window."""
    rng = np.random.default_rng(seed)
    batch = len(seq_lens)
    max_pages = max(-(-n // PAGE) for n in seq_lens) + 1
    num_pages = batch * max_pages + spare_pages
    perm = rng.permutation(num_pages)
    block_table = np.full((batch, max_pages), -1, dtype=np.int32)
    used = 0
    length = max(seq_lens)
    for b, n in enumerate(seq_lens):
        need = -(-length // PAGE)
        block_table[b, :need] = perm[used:used + need]
        used += need
    k_fp4, k_scale = random_fp4((batch, length, D // 2 * 2), rng, spread)
    cache = pack_kv_cache(k_fp4, k_scale, torch.from_numpy(block_table), num_pages)
    rows = batch * rows_per_seq
    q_fp4, q_scale = random_fp4((rows, H, D), rng, spread)
    row_to_batch = np.repeat(np.arange(batch), rows_per_seq).astype(np.int32)
    starts = np.zeros(rows, dtype=np.int32)
    ends = np.zeros(rows, dtype=np.int32)
    for i, b in enumerate(row_to_batch):
        n = seq_lens[b]
        if causal:
            raw = rng.integers(max(0, 4 * n - 4 * PAGE), 4 * n)
            ends[i] = (raw + 1) // 4
        else:
            a, c = sorted(rng.integers(0, n + 1, size=2))
            starts[i], ends[i] = a, c
    weights = torch.from_numpy(rng.standard_normal((rows, H)).astype(np.float32)).to(weights_dtype)
    return Problem(
        q_fp4=q_fp4, q_scale=q_scale, kv_cache=cache, block_table=torch.from_numpy(block_table),
        weights=weights, row_to_batch=torch.from_numpy(row_to_batch), starts=torch.from_numpy(starts),
        ends=torch.from_numpy(ends), topk=topk, weight_scale=weight_scale, note=note,
    )


def results_equal(a, b) -> list[str]:
    """Names of the TopKResult fields where `a` and `b` differ (torch.equal on each); [] when equal."""
    names = ("values", "raw_indices", "physical_indices", "counts", "status", "repaired", "candidates")
    return [n for n in names if not torch.equal(getattr(a, n).cpu(), getattr(b, n).cpu())]
