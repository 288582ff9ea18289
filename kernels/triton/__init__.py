"""Triton backend: the H200 path. decode.py (MXFP4 -> exact int8 operands), scoring.py (fused
tensor-core scoring + LiteTopK filter, the CI-tested kernel) and scoring_gluon.py (its sm_90 twin
in Gluon, the same bits), selection.py (the pipeline's selections as kernels), row_checks.py
(validation's per-row checks on CUDA), backend.py (launchers behind ScoringBackend), compile_sm90.py
(offline sm_90 builds for the ISA checks)."""

from .backend import TritonBackend

__all__ = ["TritonBackend"]
