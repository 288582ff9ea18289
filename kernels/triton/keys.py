"""The ordering keys of kernels/selection.py in Triton (make_keys, split_keys' scores, score_floor_keys'
order), for every kernel that makes or reads them: an int64 key ordered(score) << 32 | (2^32 - 1 -
position), whose integer order is the contract's total order (score descending, then position
ascending); NO_KEY marks an empty slot. The same bits as the torch functions (tested through every
stage that uses them)."""

from __future__ import annotations

import triton
import triton.language as tl

from ..selection import NO_KEY

NO_KEY_C = tl.constexpr(NO_KEY)


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
    """float32 scores of int64 ordering keys (selection.split_keys' scores): -inf for NO_KEY."""
    return tl.where(keys == NO_KEY_C, float("-inf"), _scores_of_ordered((keys >> 32).to(tl.int32)))


@triton.jit
def _ordering_keys(scores, positions):
    """int64 keys of float32 scores at int32 positions (selection.make_keys, in Triton)."""
    return (_ordered_bits(scores) << 32) + (4294967295 - positions.to(tl.int64))
