"""Triton backend: the H200 path. decode.py (MXFP4 -> exact int8 operands), scoring.py (fused
tensor-core scoring + LiteTopK filter), backend.py (launchers behind ScoringBackend)."""

from .backend import TritonBackend

__all__ = ["TritonBackend"]
