"""PrefillProblem: the validated inputs of one prefill call, the type every stage and backend takes.

Layer: types, at the bottom of `litetopk.kernels` (imports cache_layout and scratch only).
validation.validate_prefill builds it (after its shape checks and the row checks' launch);
PrefillProblem.subset restricts it to some rows (the repair's rescan). Its `zeroed` words are zeros
for the stages' device accumulators, written by the row checks' launch (row_checks.py):

    zeroed[0:ZEROED_WORDS]           the decode's flag summary (triton/operands.py: OR of the key
                                     flags, OR of the query flags, weights refused; word 3 unused)
    zeroed[ZEROED_WORDS + b]         one word a sequence b (the decode's batch_wide flags)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .cache_layout import KVCache
from .scratch import Scratch

#: The zeroed words before the per-sequence ones (module docstring: the decode's flag summary).
ZEROED_WORDS = 4


@dataclass(frozen=True)
class PrefillProblem:
    """Validated inputs of one prefill call; every tensor is on `device` and contiguous except the
    cache, whose pages may lie any stride apart (`cache_layout.describe_kv_cache`).

    `starts`/`ends` are the effective windows: rows with a status bit have an empty window.
    `weights` is float32 (bfloat16 input is widened exactly).
    """

    q_fp4: torch.Tensor  # uint8 [rows, 64, 64]
    q_scale: torch.Tensor  # uint8 [rows, 64, 4]
    cache: KVCache  # the paged keys in either format, read in place (cache_layout.py)
    block_table: torch.Tensor  # int32 [batch, max_pages]
    weights: torch.Tensor  # float32 [rows, 64]
    row_to_batch: torch.Tensor  # int32 [rows]
    starts: torch.Tensor  # int32 [rows]
    ends: torch.Tensor  # int32 [rows]
    row_status: torch.Tensor  # int32 [rows], bits found by validation
    sequence_ends: torch.Tensor  # int32 [batch]: the key positions any row of a sequence may read (row_checks.py)
    zeroed: torch.Tensor  # int32 [ZEROED_WORDS + batch]: zeros for the stages' device accumulators (row_checks.py)
    topk: int
    weight_scale: float
    max_end: int  # static bound of every window end: min(max_seq_len, max_pages * 64); sizes buffers
    scratch: Scratch  # where every stage takes its intermediate buffers (scratch.py)
    parent: "PrefillProblem | None" = None  # subset(): the problem these rows were taken from
    parent_rows: torch.Tensor | None = None  # subset(): int64 [rows] indices into parent's rows

    @property
    def num_rows(self) -> int:
        return self.q_fp4.shape[0]

    @property
    def device(self) -> torch.device:
        return self.q_fp4.device

    @property
    def window_lengths(self) -> torch.Tensor:
        """int64 [rows]: keys in each row's effective window."""
        return (self.ends - self.starts).long()

    def subset(self, rows: torch.Tensor, live: torch.Tensor | None = None) -> "PrefillProblem":
        """The same problem restricted to `rows` (int64 device indices, repeats allowed), in that
        order; where `live` (bool [len(rows)]) is False the row's window is emptied (a padding
        slot: it scores nothing). Gathers on the device; no host round trip."""
        keep = (lambda t: t) if live is None else (lambda t: torch.where(live, t, 0))
        return replace(
            self,
            q_fp4=self.q_fp4[rows],
            q_scale=self.q_scale[rows],
            weights=self.weights[rows],
            row_to_batch=keep(self.row_to_batch[rows]),
            starts=keep(self.starts[rows]),
            ends=keep(self.ends[rows]),
            row_status=self.row_status[rows],
            parent=self.parent if self.parent is not None else self,
            parent_rows=rows if self.parent_rows is None else self.parent_rows[rows],
        )


__all__ = ["ZEROED_WORDS", "PrefillProblem"]
