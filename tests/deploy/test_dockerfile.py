"""The Dockerfile, read as text (no Docker engine here): stages, user, health check, and the
install and entry commands it must share with the README and the Makefile."""

from __future__ import annotations

import posixpath
import re
import shlex

import pytest
import tomllib

from .files import ROOT, entry_mismatches, env_pairs, exec_form, healthcheck_command, make_recipes, parse_dockerfile

DOCKERFILE = (ROOT / "Dockerfile").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()
README = (ROOT / "README.md").read_text()
IMAGE = parse_dockerfile(DOCKERFILE)
EXTRAS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_stages_build_on_the_base_argument():
    assert len(IMAGE.stages) >= 2, "multi-stage: a builder and a small runtime stage"
    assert IMAGE.global_args.get("BASE", "").startswith("python:3"), IMAGE.global_args
    assert all(stage.base == "${BASE}" for stage in IMAGE.stages), [s.base for s in IMAGE.stages]
    assert IMAGE.stages[-1].all("COPY") and any("--from=" in c for c in IMAGE.stages[-1].all("COPY")), (
        "the runtime stage copies the built tree from the builder"
    )


@pytest.mark.parametrize("arg", ["BASE", "TORCH_INDEX_URL", "EXTRAS", "RUNTIME_PACKAGES"])
def test_build_argument_declared_and_documented(arg):
    assert arg in IMAGE.args(), f"ARG {arg} is not declared"
    header = DOCKERFILE.split("\nARG ", 1)[0]
    assert arg in header, f"the header comment does not document {arg}"


@pytest.mark.parametrize("target", ["cpu", "cuda", "rocm"])
def test_header_documents_each_target(target):
    assert re.search(rf"^#\s+{target}\s+\S+\s+https://\S+", DOCKERFILE, re.MULTILINE), (
        f"the header has no `{target}  BASE  TORCH_INDEX_URL` row"
    )


def test_torch_build_comes_from_the_index_argument():
    builder = IMAGE.stages[0]
    env = {k: v for args in builder.all("ENV") for k, v in env_pairs(args).items()}
    assert env.get("PIP_EXTRA_INDEX_URL") == "${TORCH_INDEX_URL}", env


def test_runtime_runs_as_a_non_root_user():
    user = IMAGE.runtime.last("USER")
    assert user is not None, "the runtime stage sets no USER (it would run as root)"
    assert user.split(":")[0] not in ("root", "0"), user
    keys = [key for key, _ in IMAGE.runtime.instructions]
    assert keys.index("USER") < keys.index("CMD"), "USER must come before CMD"


def test_healthcheck_is_the_services_own_livez_probe():
    check = IMAGE.runtime.last("HEALTHCHECK")
    assert check is not None, "no HEALTHCHECK in the runtime stage"
    command = healthcheck_command(check)
    # the CMD plus `--check livez`: the same program reads the same settings (socket or TCP)
    assert command == [*exec_form(IMAGE.runtime.last("CMD")), "--check", "livez"], command


def test_makefile_installs_the_extras_variable_with_dev_by_default():
    assert re.search(r"^EXTRAS \?= dev$", MAKEFILE, re.MULTILINE), "the Makefile must declare `EXTRAS ?= dev`"
    rules = make_recipes(MAKEFILE)
    installs = [line for prereq in rules["env"][0] for line in rules[prereq][1] if "pip install" in line]
    assert any(line.endswith("-e '.[dev]'") for line in installs), f"make env/test/run install dev: {installs}"
    raw = [line for line in MAKEFILE.splitlines() if "pip install" in line and "-e '." in line]
    assert raw and all("'.[$(EXTRAS)]'" in line for line in raw), raw


def image_extras() -> tuple[str, str]:
    """(the builder's EXTRAS default, what its `make env` is given)."""
    builder = IMAGE.stages[0]
    default = next(arg.split("=", 1)[1] for arg in builder.all("ARG") if arg.startswith("EXTRAS="))
    (run,) = [run for run in builder.all("RUN") if "make" in shlex.split(run)[:1]]
    return default, run


def test_image_installs_runtime_extras_only():
    default, run = image_extras()
    assert shlex.split(run) == ["make", "env", "EXTRAS=${EXTRAS}"], run
    names = default.split(",")
    assert set(names) <= set(EXTRAS) and "dev" not in names, (
        f"EXTRAS={default}: extras of pyproject.toml: {set(EXTRAS)}"
    )
    packages = {requirement.split("=")[0] for name in names for requirement in EXTRAS[name]}
    assert not packages & {"pytest", "schemathesis", "triton", "flydsl"}, f"the cpu image would install {packages}"


def test_image_listens_on_its_own_loopback_unless_told():
    env = {k: v for args in IMAGE.runtime.all("ENV") for k, v in env_pairs(args).items()}
    assert "LITETOPK_HOST" not in env, "0.0.0.0 comes only from an explicit LITETOPK_HOST (compose.yaml)"
    assert "8471" in IMAGE.runtime.all("EXPOSE"), "EXPOSE the default port"


def test_socket_directory_belongs_to_the_service_user():
    env = {k: v for args in IMAGE.runtime.all("ENV") for k, v in env_pairs(args).items()}
    directory = posixpath.dirname(env["LITETOPK_UDS"])
    user = IMAGE.runtime.last("USER")
    assert any(f"install -d -o {user} -g {user} -m 0700 {directory}" in run for run in IMAGE.runtime.all("RUN")), (
        f"{directory} must be created 0700 for {user} (a named volume copies it on first use)"
    )


def test_dockerignore_keeps_host_state_out():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    # A copied .venv would make the builder's `make env` reuse the host's environment.
    assert {".venv", ".git"} <= ignored, ignored


def test_install_and_entry_are_the_readme_and_makefile_commands():
    assert entry_mismatches(DOCKERFILE, MAKEFILE, README) == []


# Changing one side alone must fail the comparison above.
MUTATIONS = {
    "makefile run recipe": ("Makefile", "-m litetopk.service", "-m litetopk.service --port 9000"),
    "makefile install target": ("Makefile", "env: $(STAMP)", "environment: $(STAMP)"),
    "readme run line": ("README.md", "# = .venv/bin/python -m litetopk.service", "# = python -m litetopk.service"),
    "dockerfile cmd": ("Dockerfile", '"-m", "litetopk.service"]', '"-m", "litetopk.service", "--warmup"]'),
    "dockerfile workdir": ("Dockerfile", "/opt/litetopk\nWORKDIR /opt/litetopk", "/opt/litetopk\nWORKDIR /srv"),
    "dockerfile install": ("Dockerfile", "RUN make env EXTRAS=${EXTRAS}", "RUN python3 -m pip install ."),
    "makefile extras": ("Makefile", "'.[$(EXTRAS)]'", "'.[dev]'"),
}


@pytest.mark.parametrize("case", MUTATIONS)
def test_comparison_fails_when_one_side_changes(case):
    path, old, new = MUTATIONS[case]
    files = {"Dockerfile": DOCKERFILE, "Makefile": MAKEFILE, "README.md": README}
    assert files[path].count(old) == 1, f"{case}: {old!r} is not in {path} exactly once; update this test"
    files[path] = files[path].replace(old, new)
    assert entry_mismatches(files["Dockerfile"], files["Makefile"], files["README.md"]), (
        f"{case}: changing {path} alone went unnoticed"
    )
