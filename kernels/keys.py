"""The ordering keys: one int64 per (score, position) whose integer order is the contract's total order.

Layer: formats, at the bottom of `litetopk.kernels` (imports torch and triton only). Every stage,
backend and kernel that makes or reads keys takes them from here: the torch functions and their
Triton helpers (the same bits, tested through every stage that uses them).

Math. A (score, position) pair becomes one int64 key whose integer order is the total order of
docs/contract.md §1 (score descending, then position ascending):
    key = ordered_bits(score) * 2^32 + (2^32 - 1 - position)
where ordered_bits maps float32 bits to an int32 with the same order (-0.0 is folded into +0.0
first, so the two zeros tie and fall back to position). NO_KEY (int64 min) marks an empty slot; no
finite score maps to it. Selecting the K largest keys is therefore an exact, tie-free top-K, and
its work grows with the number of candidates, not with the window.

    torch:   make_keys, split_keys, score_floor_keys, select_topk_keys, kth_key
    Triton:  NO_KEY_C, _ordered_bits, _scores_of_ordered, _scores_of_keys, _ordering_keys
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NO_KEY = -(2**63)
NO_KEY_C = tl.constexpr(NO_KEY)
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


@triton.jit
def _ordered_bits(scores):
    """int64 of the int32 whose order is the order of the float32 `scores` (-0.0 ties +0.0)."""
    bits = scores.to(tl.int32, bitcast=True)
    bits = tl.where(scores == 0.0, 0, bits)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)


@triton.jit
def _scores_of_ordered(ordered):
    """float32 scores of int32 ordered bits: the inverse of _ordered_bits (+0.0 for both zeros)."""
    return tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _scores_of_keys(keys):
    """float32 scores of int64 ordering keys (split_keys' scores): -inf for NO_KEY."""
    return tl.where(keys == NO_KEY_C, float("-inf"), _scores_of_ordered((keys >> 32).to(tl.int32)))


@triton.jit
def _ordering_keys(scores, positions):
    """int64 keys of float32 scores at int32 positions (make_keys, in Triton)."""
    return (_ordered_bits(scores) << 32) + (4294967295 - positions.to(tl.int64))


__all__ = ["NO_KEY", "NO_KEY_C", "kth_key", "make_keys", "score_floor_keys", "select_topk_keys", "split_keys"]
