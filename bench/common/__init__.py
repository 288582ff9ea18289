"""What the benchmarks, checks and probes share: the seed's workload built on the device
(`problems`) and timing helpers (`timing`). Run benchmarks as modules from the repository root
(`python -m bench.operator`), so `bench.common` imports without any `sys.path` edit."""

from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent  # bench/
REPO_ROOT = BENCH_DIR.parent  # where `python -m bench.<name>` runs
RESULTS_DIR = BENCH_DIR / "results"  # the JSON and PNG of the benchmarks
