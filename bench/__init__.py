"""litetopk's benchmark suite (not installed; run from the repository root as `python -m bench.<name>`).

bench/README.md is the index: benchmarks at the top, `checks/` (acceptance checks on a device),
`probes/` (live experiments), `device/` (the shell scripts the H200 runs), `common/` (shared code).
"""
