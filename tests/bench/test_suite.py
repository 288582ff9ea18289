"""bench/ is a package run as `python -m bench.<name>` from the repository root: its modules import
on a machine without a GPU (no work at import time), none edits sys.path, and the device scripts
name only files and modules that exist."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import bench

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
MODULES = sorted(m.name for m in pkgutil.walk_packages(bench.__path__, "bench."))
SCRIPTS = sorted(BENCH.rglob("*.sh"))


def test_the_suite_has_its_parts():
    for name in ("bench.operator", "bench.common.problems", "bench.checks.production", "bench.probes.stage_timeline"):
        assert name in MODULES, f"{name} is missing from bench/"


@pytest.mark.parametrize("name", [m for m in MODULES if not m.endswith("__init__")])
def test_every_module_is_in_the_index(name):
    """bench/README.md names every module (as `bench.x.y`, or as its path for a script), so that a
    newcomer finds each benchmark, check and probe there."""
    index = (BENCH / "README.md").read_text()
    path = "bench/" + "/".join(name.split(".")[1:]) + ".py"
    if (ROOT / path).exists():  # a module, not a package
        assert f"`{name}`" in index or f"`{path}`" in index, f"{name} is not in bench/README.md"


@pytest.mark.parametrize("name", MODULES)
def test_module_imports_without_a_device(name):
    importlib.import_module(name)


@pytest.mark.parametrize("path", sorted(BENCH.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_bench_file_edits_sys_path(path):
    assert not re.search(r"sys\.path\.(insert|append|extend)|sys\.path\s*[+]?=", path.read_text()), (
        f"{path.relative_to(ROOT)} edits sys.path: import through the bench package instead"
    )


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_device_scripts_name_existing_files_and_modules(path):
    text = "\n".join(line.split("#")[0] if not line.startswith("#!") else "" for line in path.read_text().splitlines())
    for module in re.findall(r"python3? -m (bench(?:\.\w+)+)", text):
        assert module in MODULES, f"{path.name} runs {module}, which does not exist"
    for target in re.findall(r"\b(bench/[\w/.-]+\.(?:sh|py))", text):
        assert (ROOT / target).exists(), f"{path.name} names {target}, which does not exist"
    for target in re.findall(r"\b(tests/[\w/.-]+\.py)", text):
        assert (ROOT / target).exists(), f"{path.name} names {target}, which does not exist"
    assert "cd bench" not in text, f"{path.name} changes into bench/: modules run from the repository root"


@pytest.mark.interpret
def test_self_calibration_probe_runs_end_to_end(tmp_path):
    """The device probe of the first GPU call, on a small problem on the CPU (interpreter): it must not
    fail on the H200 for a reason a CPU run shows (its stage calls once passed thresholds together
    with a sample, which the backend refuses). Two rows, windows of up to 6,144 keys against a 4,096-key buffer
    (K = 512): the thresholds must filter, or rows overflow and are repaired. Its report: both modes
    exact, no row repaired, fewer candidates than the buffer holds."""
    import json

    from bench.probes import self_calibration_probe

    self_calibration_probe.main(
        [
            "--out",
            str(tmp_path),
            "--keys",
            "6144",
            "--topk",
            "512",
            "--spread",
            "1",
            "--rows",
            "2",
            "--warm",
            "0",
            "--pairs",
            "1",
            "--sample-size",
            "512",
        ]
    )
    report = json.loads((tmp_path / "self-calibration.json").read_text())
    assert len(report["cases"]) == 1 and (tmp_path / "self-calibration.png").exists()
    case = report["cases"][0]
    assert case["exact"] == {"sample": True, "scan": True}, case
    assert case["repaired"] == {"sample": 0, "scan": 0}, case
    assert all(most < 4096 for _, most in case["candidates"].values()), case  # the buffer: 8 x K


def test_the_socket_round_trip_probe_times_both_modes(tmp_path):
    import json

    from bench.probes import uds_pingpong

    assert uds_pingpong.main(["--out", str(tmp_path), "--iters", "40", "--spin-us", "100"]) == 0
    (path,) = tmp_path.glob("uds-pingpong-*.json")
    report = json.loads(path.read_text())
    assert set(report["modes"]) == set(uds_pingpong.MODES), report
    assert all(m["iters"] == 40 and 0 < m["p50_us"] <= m["p99_us"] for m in report["modes"].values()), report
