"""Stage 5, selection: ordering keys and the exact top-K, shared by every backend (torch; the
candidate top-K's Triton twin is kernels/triton/radix_select.py, the same bits).

Ordering keys. A (score, position) pair becomes one int64 key whose integer order is the total
order of CONTRACT.md §1 (score descending, then position ascending):
    key = ordered_bits(score) * 2^32 + (2^32 - 1 - position)
where ordered_bits maps float32 bits to an int32 with the same order (-0.0 is folded into +0.0
first, so the two zeros tie and fall back to position). NO_KEY (int64 min) marks an empty slot; no
finite score maps to it. Selecting the K largest keys is therefore an exact, tie-free top-K, and
its work grows with the number of candidates, not with the window.
"""

from __future__ import annotations

import torch

from .devices import runs_triton_stages
from .errors import InputError
from .workspace import Scratch

NO_KEY = -(2**63)
_LOW32 = 0xFFFFFFFF


def make_keys(scores: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """int64 ordering keys of float32 `scores` at int `positions` (broadcast together)."""
    bits = (scores.float() + 0.0).view(torch.int32).long()  # + 0.0 turns -0.0 into +0.0
    ordered = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return ordered * 2**32 + (_LOW32 - positions.long())


def score_floor_keys(scores: torch.Tensor) -> torch.Tensor:
    """The smallest key of each float32 score: `key >= score_floor_keys(t)` iff score >= t."""
    return make_keys(scores, torch.full_like(scores, _LOW32, dtype=torch.int64))


def split_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of make_keys: (scores float32, positions int32); NO_KEY gives (-inf, -1)."""
    ordered = torch.div(keys, 2**32, rounding_mode="floor")
    positions = _LOW32 - (keys - ordered * 2**32)
    bits = torch.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(torch.int32)
    scores = bits.view(torch.float32)
    empty = keys == NO_KEY
    return (
        torch.where(empty, float("-inf"), scores),
        torch.where(empty, -1, positions).to(torch.int32),
    )


def select_topk_keys(keys: torch.Tensor, k: int) -> torch.Tensor:
    """The k largest keys of each row of int64 `keys [rows, n]`, sorted descending, NO_KEY padded."""
    rows, n = keys.shape
    if n < k:
        keys = torch.nn.functional.pad(keys, (0, k - n), value=NO_KEY)
    return torch.topk(keys, k, dim=1, largest=True, sorted=True).values


def kth_key(keys: torch.Tensor, k: int) -> torch.Tensor:
    """The k-th largest key of each row (NO_KEY where a row holds fewer than k real keys)."""
    return select_topk_keys(keys, k)[:, k - 1]


def select_topk_dense(scores: torch.Tensor, k: int, selector: str = "torch") -> torch.Tensor:
    """Exact top-k keys [rows, k] of a dense float32 score matrix whose column is the position.

    Entries outside a row's window must be -inf. `selector` names the value top-k that does the
    bulk of the work ("torch": torch.topk; "flashinfer": flashinfer.top_k); it is asked for k+1
    values so that a tie across the k-th place is detected, and such rows are settled exactly
    (settle_ties). The answer is the same for every selector. Every tensor here is a torch op's
    result or, for a matrix of no column, a new tensor from the allocator (not the workspace:
    workspace.py says why). Reads nothing back on the host where the Triton stages run.
    """
    rows, width = scores.shape
    take = min(k + 1, width)
    if take == 0:
        return torch.full((rows, k), NO_KEY, dtype=torch.int64, device=scores.device)
    values, positions = _value_topk(scores, take, selector)
    keys = make_keys(values, positions)
    keys = torch.where(torch.isneginf(values), NO_KEY, keys)
    if take == k + 1:
        settle_ties(scores, values.contiguous(), keys, k)
    return select_topk_keys(keys, k)


def settle_ties(scores: torch.Tensor, values: torch.Tensor, keys: torch.Tensor, k: int) -> None:
    """Make the keys [rows, k + 1] of a value top-(k+1) `values` (sorted descending) of `scores` exact
    where the k-th and (k+1)-th values tie (finite): slots [0, k) then hold the row's exact top-k keys
    in some order, slot k NO_KEY; other rows are left as they are. In place. Runs the Triton twin
    (kernels/triton/dense_ties.py: no host sync) where devices.runs_triton_stages says so."""
    if runs_triton_stages(scores.device):
        from .triton.dense_ties import settle_ties_triton

        settle_ties_triton(scores, values, keys, k)
        return
    settle_ties_torch(scores, values, keys, k)


def settle_ties_torch(scores: torch.Tensor, values: torch.Tensor, keys: torch.Tensor, k: int) -> None:
    """settle_ties in torch ops: the tied rows found on the host, each re-selected with ordering keys."""
    tied = (values[:, k - 1] == values[:, k]) & ~torch.isneginf(values[:, k])
    for row in torch.nonzero(tied).flatten().tolist():
        row_scores = scores[row]
        live = torch.nonzero(~torch.isneginf(row_scores)).flatten()
        keys[row, :k] = select_topk_keys(make_keys(row_scores[live], live)[None, :], k)[0]
        keys[row, k] = NO_KEY  # the value top-k's (k+1)-th key may duplicate or beat an exact one


def _value_topk(scores: torch.Tensor, take: int, selector: str) -> tuple[torch.Tensor, torch.Tensor]:
    if selector == "torch":
        values, positions = torch.topk(scores, take, dim=1, largest=True, sorted=True)
        return values, positions
    if selector == "flashinfer":
        from .dense_selectors import flashinfer_topk

        return flashinfer_topk(scores, take)
    raise InputError(f"selector={selector!r} is not known; use 'torch' or 'flashinfer'")


def select_candidates(keys: torch.Tensor, kept: torch.Tensor, thresholds: torch.Tensor, k: int,
                      scratch: Scratch | None = None) -> torch.Tensor:
    """int64 [rows, k]: the k largest of the first kept[r] keys of each row of the scan's buffer
    `keys` [rows, capacity] (whatever lies after them is not read), sorted descending, NO_KEY padded. `thresholds` are at
    or below the k-th best key of every row whose scan certifies (other rows are repaired or publish
    nothing); the Triton twin (kernels/triton/radix_select.py: a radix select above the threshold,
    then a sort of K keys) uses them, the torch code needs none. Runs the twin where
    devices.runs_triton_stages says so, its buffers from `scratch` (the problem's; None: the allocator)."""
    if runs_triton_stages(keys.device):
        from .triton.radix_select import select_topk_candidates_radix

        return select_topk_candidates_radix(keys, kept, thresholds, k, scratch=scratch)
    kept_slots = torch.arange(keys.shape[1], device=keys.device)[None, :] < kept[:, None]
    return select_topk_keys(torch.where(kept_slots, keys, NO_KEY), k)
