"""TopKResult: what every backend returns (docs/contract.md §3).

Layer: types, at the bottom of `litetopk.kernels` (imports errors and status only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .errors import RowFaultError
from .status import describe_row_faults

#: Every TopKResult field: its shape as a function of (rows, K), and its dtype (the one table the
#: assembly's buffers and the operator's check of caller-owned `out=` tensors read).
RESULT_FIELDS = {
    "values": (lambda rows, k: (rows, k), torch.float32),
    "raw_indices": (lambda rows, k: (rows, k), torch.int32),
    "physical_indices": (lambda rows, k: (rows, k), torch.int32),
    "counts": (lambda rows, k: (rows,), torch.int32),
    "status": (lambda rows, k: (rows,), torch.int32),
    "repaired": (lambda rows, k: (rows,), torch.int32),
    "candidates": (lambda rows, k: (rows,), torch.int32),
}

#: The fields that are the answer: the same bits on every run of a call and on every path of a backend. The
#: rest (`candidates`) is a metric: where several programs of the Triton backend's paged mode share a row, each
#: raises the row's threshold as it goes, so the count can differ by a few keys from run to run. (`repaired` and the
#: capacity bits of `status` follow that count against the buffer's capacity; the paged mode's buffer holds every
#: window, so its count never reaches it, and the other modes' counts do not vary.)
ANSWER_FIELDS = tuple(name for name in RESULT_FIELDS if name != "candidates")


@dataclass(frozen=True)
class TopKResult:
    """The K best keys of every row, sorted by (score desc, position asc).

    values float32 [rows, K] (-inf padded); raw_indices int32 [rows, K] logical positions (-1
    padded); physical_indices int32 [rows, K] page-mapped slots (-1 padded); counts int32 [rows]
    keys published; status int32 [rows] RowStatus bits (a row with a bit set publishes nothing);
    repaired int32 [rows] 1 where a capacity event was repaired by an exact rescan; candidates
    int32 [rows] keys the fast path appended for the row (the whole window for the dense path),
    for metrics and benchmarks.
    """

    values: torch.Tensor
    raw_indices: torch.Tensor
    physical_indices: torch.Tensor
    counts: torch.Tensor
    status: torch.Tensor
    repaired: torch.Tensor
    candidates: torch.Tensor

    def faulty_rows(self) -> tuple[list[int], list[int]]:
        """(rows, flags) of every row with a status bit set."""
        rows = torch.nonzero(self.status != 0).flatten()
        return rows.tolist(), self.status[rows].tolist()

    def raise_for_status(self) -> "TopKResult":
        """Return self when every row is answered; else raise RowFaultError naming the rows."""
        rows, flags = self.faulty_rows()
        if rows:
            raise RowFaultError(describe_row_faults(rows, flags), rows, flags)
        return self
