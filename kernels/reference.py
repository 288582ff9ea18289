"""Reference backend: exact scoring in plain torch, on any device (the CPU default and the oracle).

Layer: backends (the operator's registry loads it; imports the backend interface, types and formats).

Math (docs/contract.md §1), in this fixed order:
    dot[i, h, j] = q[i, h, :] . k[j, :]        float64 GEMM of the decoded MXFP4 values
    r            = relu(float32(dot))           one rounding of the exact dot
    acc          = 0;  for h = 0 .. 63:  acc = fl32(acc + fl32(w[i, h] * r[h]))
    score[i, j]  = fl32(acc * fl32(weight_scale))
The float64 GEMM is exact: every product of two E2M1 values with power-of-two scales has at
most 4 significant bits, and 128 of them sum exactly in float64 while the exponents of the
products of one dot span at most 40 binades (nonzero blocks of a q and a k vector spanning at
most 20 binades each; MXFP4 data from real activations spans a few). Beyond that the dot is
still float64-accurate (relative error below 2^-40 of its largest term).

Tiling: rows in chunks, keys in blocks, so that one block of dots holds at most
`block_elements` float64 values (default 2^22, 32 MiB); no [rows, S] tensor is allocated by
`scan_candidates`. The outputs (score matrix, candidate buffer and scan state) come from
`problem.scratch` (the caller's workspace, scratch.py); the blocks' temporaries, whose number
depends on the windows, from torch's allocator.
"""

from __future__ import annotations

import torch

from .backend import CandidateScan, ScoringBackend, self_calibration_unavailable
from .cache_layout import NUM_HEADS, PAGE_SIZE, gather_keys
from .keys import NO_KEY, kth_key, make_keys
from .mxfp4 import dequantize_mxfp4
from .problem import PrefillProblem


def ref_score_keys(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, weight_scale: float) -> torch.Tensor:
    """Scores float32 [R, P] of decoded float64 queries q [R, 64, 128] against keys [P, 128]."""
    rows = q.shape[0]
    dots = (q.reshape(rows * NUM_HEADS, -1) @ keys.T).reshape(rows, NUM_HEADS, -1)
    relu = torch.relu(dots.to(torch.float32))
    acc = torch.zeros(rows, keys.shape[0], dtype=torch.float32, device=q.device)
    for h in range(NUM_HEADS):
        acc += weights[:, h, None] * relu[:, h]
    return acc * torch.tensor(weight_scale, dtype=torch.float32, device=q.device)


class ReferenceBackend(ScoringBackend):
    """Exact torch scoring; see the module docstring."""

    name = "reference"

    def __init__(self, block_elements: int = 2**22, row_chunk: int = 64):
        self.block_elements = block_elements
        self.row_chunk = row_chunk

    def check_device(self, device: torch.device) -> None:
        """Every device torch supports can run the reference."""

    def _decoded_keys(self, problem: PrefillProblem, batch: int, positions: torch.Tensor) -> torch.Tensor:
        pages = problem.block_table[batch].long()[positions // PAGE_SIZE]
        # Pages outside every live window may be garbage: read page 0 there; the window masks it.
        pages = torch.where((pages >= 0) & (pages < problem.cache.num_pages), pages, 0)
        values, scales = gather_keys(problem.cache, pages, positions % PAGE_SIZE)
        return dequantize_mxfp4(values, scales, torch.float64)

    def score_positions(self, problem: PrefillProblem, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """float32 [len(rows), len(positions)]: scores of shared `positions`, -inf outside windows."""
        out = torch.full((rows.numel(), positions.numel()), float("-inf"), device=problem.device)
        q = dequantize_mxfp4(problem.q_fp4[rows], problem.q_scale[rows], torch.float64)
        batches = problem.row_to_batch[rows]
        for batch in torch.unique(batches).tolist():
            sel = torch.nonzero(batches == batch).flatten()
            scores = ref_score_keys(
                q[sel],
                problem.weights[rows[sel]],
                self._decoded_keys(problem, batch, positions),
                problem.weight_scale,
            )
            in_window = (positions[None, :] >= problem.starts[rows[sel], None]) & (
                positions[None, :] < problem.ends[rows[sel], None]
            )
            out[sel] = torch.where(in_window, scores, float("-inf"))
        return out

    def _blocks(self, problem: PrefillProblem, rows: torch.Tensor, stride: int):
        """Yield (positions, in_window) blocks covering the windows of `rows` (positions % stride == 0)."""
        lo = int(problem.starts[rows].min())
        hi = int(problem.ends[rows].max())
        first = -(-lo // stride) * stride
        block = max(stride, self.block_elements // (rows.numel() * NUM_HEADS) * stride)
        for begin in range(first, hi, block):
            positions = torch.arange(begin, min(begin + block, hi), stride, device=problem.device)
            in_window = (positions[None, :] >= problem.starts[rows, None]) & (
                positions[None, :] < problem.ends[rows, None]
            )
            yield positions, in_window

    def _row_chunks(self, problem: PrefillProblem):
        live = torch.nonzero(problem.ends > problem.starts).flatten()
        if live.numel() == 0:
            return ()
        order = live[torch.argsort(problem.row_to_batch[live].long() * 2**32 + problem.starts[live].long())]
        return torch.split(order, self.row_chunk)

    def score_dense(self, problem: PrefillProblem, stride: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(scores float32 [rows, ceil(max_end / stride)], column c = position c * stride, -inf
        outside windows; nonfinite bool [rows])."""
        columns = -(-problem.max_end // stride)
        scores = problem.scratch.full((problem.num_rows, columns), float("-inf"), torch.float32)
        nonfinite = problem.scratch.zeros(problem.num_rows, torch.bool)
        for rows in self._row_chunks(problem):
            for positions, in_window in self._blocks(problem, rows, stride):
                block = self.score_positions(problem, rows, positions)
                nonfinite[rows] |= (in_window & ~torch.isfinite(block)).any(dim=1)
                scores[rows[:, None], positions[None, :] // stride] = block
        return scores, nonfinite

    def scan_candidates(
        self,
        problem: PrefillProblem,
        thresholds: torch.Tensor,
        capacity: int,
        ceilings: torch.Tensor | None = None,
        sample_size: int = 0,
    ) -> CandidateScan:
        """Filtered scan with an append-only buffer; after each block of keys a row's threshold is
        raised to the K-th best key it holds (a lower bound of its true K-th best key); it needs no
        `ceilings`. No self-calibrating scan (`sample_size` > 0 raises)."""
        if sample_size or thresholds is None:
            raise self_calibration_unavailable(self)
        rows_total = problem.num_rows
        buffer = problem.scratch.full((rows_total, capacity), NO_KEY, torch.int64)
        appended = problem.scratch.zeros(rows_total, torch.int64)
        thresholds = problem.scratch.empty(rows_total, torch.int64).copy_(thresholds)
        nonfinite = problem.scratch.zeros(rows_total, torch.bool)
        for rows in self._row_chunks(problem):
            for positions, in_window in self._blocks(problem, rows, 1):
                scores = self.score_positions(problem, rows, positions)
                finite = torch.isfinite(scores)
                nonfinite[rows] |= (in_window & ~finite).any(dim=1)
                keys = make_keys(scores, positions[None, :])
                passing = in_window & finite & (keys >= thresholds[rows, None])
                hit_row, hit_col = torch.nonzero(passing, as_tuple=True)
                slot = appended[rows][hit_row] + passing.long().cumsum(dim=1)[hit_row, hit_col] - 1
                fits = slot < capacity
                buffer[rows[hit_row[fits]], slot[fits]] = keys[hit_row[fits], hit_col[fits]]
                appended[rows] += passing.sum(dim=1)
                thresholds[rows] = torch.maximum(thresholds[rows], kth_key(buffer[rows], problem.topk))
        return CandidateScan(keys=buffer, appended=appended, thresholds=thresholds, nonfinite=nonfinite)
