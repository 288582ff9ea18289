"""Per-row status bits of a TopKResult (docs/contract.md §3). A row with any bit set publishes nothing.

Layer: types, at the bottom of `litetopk.kernels` (imports torch only).
"""

from __future__ import annotations

import enum

import torch


class RowStatus(enum.IntFlag):
    """Bit flags in `TopKResult.status`; 0 means the row's answer is published and exact."""

    OK = 0
    OVERFLOW = 1  # the candidate buffer overflowed (capacity event; repaired unless repair=False)
    UNDERFILLED = 2  # fewer certified candidates than min(K, window) (capacity event; repaired likewise)
    NONFINITE = 4  # a weight or a score of the row's window is NaN or inf
    INVALID_PAGE = 8  # a page of the row's window is negative or outside the cache
    INVALID_ROW = 16  # bad batch index, or a window outside [0, pages * PAGE_SIZE)
    SELECTOR_FAILURE = 32  # the selector could not produce a certified answer
    SLOT_OVERFLOW = 64  # a page of the row's window has physical slots beyond int32 (page id >= 2^25)
    UNSUPPORTED = 128  # the backend cannot score the row exactly (triton: a vector whose block scales
    #                    span more than 7 binades, or head weights outside its range); use "reference"


#: Bits that are capacity events of the fast path (repairable), not faults of the input.
CAPACITY_EVENTS = RowStatus.OVERFLOW | RowStatus.UNDERFILLED
#: Bits that are faults of the input: the request fails naming these rows.
INPUT_FAULTS = (
    RowStatus.NONFINITE
    | RowStatus.INVALID_PAGE
    | RowStatus.INVALID_ROW
    | RowStatus.SLOT_OVERFLOW
    | RowStatus.UNSUPPORTED
)


def set_status_bit(status: torch.Tensor, condition: torch.Tensor, bit: RowStatus) -> torch.Tensor:
    """`status | bit` where `condition` (bool [rows]) holds, on the device (int32 [rows], new tensor).
    Two kernels (an OR with a Python int, a select): a where over scalars would add two fills and a cast."""
    return torch.where(condition, status | int(bit), status)


def describe(flags: int) -> str:
    """Names of the bits set in `flags`, e.g. 'OVERFLOW|NONFINITE' ('OK' for 0)."""
    if flags == 0:
        return "OK"
    return "|".join(bit.name for bit in RowStatus if bit and flags & bit)


def describe_row_faults(rows: list[int], flags: list[int], what: str = "published nothing") -> str:
    """The one message for faulty rows: '<n> row(s) <what>: row 3: OVERFLOW, ...' (first 8 shown)."""
    shown = ", ".join(f"row {r}: {describe(f)}" for r, f in list(zip(rows, flags))[:8])
    more = f" (and {len(rows) - 8} more)" if len(rows) > 8 else ""
    return f"{len(rows)} row(s) {what}: {shown}{more}"
