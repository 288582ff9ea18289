"""compose.yaml, parsed with PyYAML (no Docker engine here): profiles, loopback-only ports, the
socket volume, GPU access for the cuda and rocm profiles, the demo worker; and `docker compose
config` for every profile where the docker client has the compose plugin."""

from __future__ import annotations

import functools
import posixpath
import re
import shutil
import subprocess

import pytest
import tomllib
import yaml

from litetopk.service import ServiceSettings

from .files import ROOT, parse_dockerfile

COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
SERVICES = COMPOSE["services"]
IMAGE = parse_dockerfile((ROOT / "Dockerfile").read_text())
OPTIONAL = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
SOCKET_VOLUME = "litetopk-socket"
# The service variants (one per device kind) and the profile that enables each.
VARIANTS = {"litetopk": None, "litetopk-cuda": "cuda", "litetopk-rocm": "rocm"}
PROFILES = ("cuda", "rocm", "demo")


def env(service: dict) -> dict[str, str]:
    value = service.get("environment") or {}
    if isinstance(value, list):
        value = dict(item.split("=", 1) for item in value)
    return {k: str(v) for k, v in value.items()}


def mounts(service: dict) -> dict[str, str]:
    """{source: target} of the service's short-syntax volumes."""
    return dict(entry.split(":")[:2] for entry in service.get("volumes", []))


def seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 1e-3}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration))


def test_plain_up_starts_only_the_cpu_service():
    default = sorted(name for name, service in SERVICES.items() if not service.get("profiles"))
    assert default == ["litetopk"], default
    assert env(SERVICES["litetopk"])["LITETOPK_DEVICE"] == "cpu"


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_has_a_service(profile):
    assert any(profile in service.get("profiles", []) for service in SERVICES.values()), profile


@pytest.mark.parametrize("name", SERVICES)
def test_ports_are_published_on_loopback_only(name):
    for port in SERVICES[name].get("ports", []):
        assert isinstance(port, str) and port.startswith("127.0.0.1:"), f"{name}: {port!r} is not bound to 127.0.0.1"


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_listens_on_all_container_addresses_explicitly(name):
    variables = env(SERVICES[name])
    assert variables.get("LITETOPK_HOST") == "0.0.0.0", f"{name}: LITETOPK_HOST must be set explicitly"
    container_ports = {port.rsplit(":", 1)[1] for port in SERVICES[name]["ports"]}
    assert container_ports == {variables["LITETOPK_PORT"]}, f"{name}: ports {SERVICES[name]['ports']}"


@pytest.mark.parametrize("name", SERVICES)
def test_service_variables_are_settings(name):
    fields = {f"LITETOPK_{field.upper()}" for field in ServiceSettings.model_fields} | {"LITETOPK_URL"}
    unknown = {key for key in env(SERVICES[name]) if key.startswith("LITETOPK_")} - fields
    assert not unknown, f"{name}: {unknown} are not ServiceSettings fields (nor the client's LITETOPK_URL)"


def test_variants_do_not_collide():
    sockets = [env(SERVICES[name])["LITETOPK_UDS"] for name in VARIANTS]
    host_ports = [port.split(":")[1] for name in VARIANTS for port in SERVICES[name]["ports"]]
    assert len(set(sockets)) == len(sockets) and len(set(host_ports)) == len(host_ports), (sockets, host_ports)


@pytest.mark.parametrize("name", VARIANTS)
def test_socket_directory_is_the_named_volume(name):
    assert SOCKET_VOLUME in COMPOSE["volumes"], "the socket volume is not declared"
    directory = posixpath.dirname(env(SERVICES[name])["LITETOPK_UDS"])
    assert mounts(SERVICES[name]).get(SOCKET_VOLUME) == directory, f"{name}: mount {SOCKET_VOLUME} at {directory}"


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_keeps_the_image_healthcheck_and_shuts_down_gracefully(name):
    service = SERVICES[name]
    assert not (service.get("healthcheck") or {}).get("disable"), f"{name} disables the health check"
    assert IMAGE.runtime.last("HEALTHCHECK"), "the image defines the health check"
    grace = ServiceSettings.model_fields["shutdown_timeout_s"].default
    assert seconds(service["stop_grace_period"]) > grace, f"{name}: stop_grace_period must exceed {grace} s"


@pytest.mark.parametrize("name", VARIANTS)
def test_build_arguments_exist_in_the_dockerfile(name):
    args = SERVICES[name]["build"]["args"]
    assert set(args) <= IMAGE.args(), f"{name}: {set(args) - IMAGE.args()} are not Dockerfile ARGs"


@pytest.mark.parametrize(
    "name, base", [("litetopk", "python:"), ("litetopk-cuda", "nvidia/cuda:"), ("litetopk-rocm", "rocm/")]
)
def test_variant_base_and_torch_build(name, base):
    args = SERVICES[name]["build"]["args"]
    assert args["BASE"].startswith(base), args
    flavour = {"litetopk": "/cpu", "litetopk-cuda": "/cu", "litetopk-rocm": "/rocm"}[name]
    assert flavour in args["TORCH_INDEX_URL"], args


# The GPU packages each variant's image installs (its EXTRAS), and none of the test tools.
VARIANT_GPU_PACKAGES = {"litetopk": set(), "litetopk-cuda": {"triton"}, "litetopk-rocm": {"flydsl"}}


@pytest.mark.parametrize("name", VARIANTS)
def test_variant_installs_runtime_extras_only(name):
    extras = SERVICES[name]["build"]["args"]["EXTRAS"].split(",")
    assert set(extras) <= set(OPTIONAL), f"{name}: {set(extras) - set(OPTIONAL)} are not extras of pyproject.toml"
    packages = {requirement.split("=")[0] for extra in extras for requirement in OPTIONAL[extra]}
    assert packages & {"triton", "flydsl"} == VARIANT_GPU_PACKAGES[name], f"{name}: {packages}"
    assert not packages & {"pytest", "schemathesis", "matplotlib"}, f"{name} installs test or bench tools: {packages}"


def test_cpu_variant_builds_the_dockerfile_defaults():
    builder_args = dict(arg.split("=", 1) for arg in IMAGE.stages[0].all("ARG") if "=" in arg)
    assert SERVICES["litetopk"]["build"]["args"]["EXTRAS"] == builder_args["EXTRAS"]


def test_cuda_profile_reserves_one_nvidia_gpu_and_shares_ipc():
    service = SERVICES["litetopk-cuda"]
    assert service["profiles"] == ["cuda"]
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"], device
    assert len(device["device_ids"]) == 1, "one service per GPU"
    assert service["ipc"] == "host" and service["pid"] == "host", "CUDA IPC across containers"
    assert env(service)["LITETOPK_DEVICE"] == "cuda:0"


def test_rocm_profile_exposes_kfd_and_dri():
    service = SERVICES["litetopk-rocm"]
    assert service["profiles"] == ["rocm"]
    assert {"/dev/kfd", "/dev/dri"} <= set(service["devices"]), service["devices"]
    assert "video" in service["group_add"]
    assert service["ipc"] == "host" and service["pid"] == "host"
    assert env(service)["LITETOPK_DEVICE"] == "cuda:0"


def test_demo_worker_reaches_the_cpu_service_through_the_socket_volume():
    worker, server = SERVICES["demo-worker"], SERVICES["litetopk"]
    assert worker["profiles"] == ["demo"]
    url = env(worker)["LITETOPK_URL"]
    assert url == "unix:" + env(server)["LITETOPK_UDS"], url
    assert mounts(worker).get(SOCKET_VOLUME) == posixpath.dirname(url[len("unix:") :])
    assert worker["depends_on"]["litetopk"]["condition"] == "service_healthy"
    # shared memory is opened by name in the service's /dev/shm; the owner pid must be the worker's
    assert server["ipc"] == "shareable" and worker["ipc"] == "service:litetopk"
    assert worker["pid"] == "service:litetopk"
    assert worker["healthcheck"] == {"disable": True}
    script = next(word for word in worker["command"] if word.endswith(".py"))
    assert (ROOT / script).is_file(), f"{script} does not exist"


@functools.cache
def compose_plugin() -> str | None:
    docker = shutil.which("docker")
    if docker is None:
        return None
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=20)
    return docker if probe.returncode == 0 else None


@pytest.mark.parametrize("profile", [None, *PROFILES])
def test_docker_compose_config(profile):
    docker = compose_plugin()
    if docker is None:
        pytest.skip(
            "no `docker compose` here (docker CLI without the compose plugin): "
            "compose.yaml is checked by the parse tests above only"
        )
    argv = [docker, "compose", "-f", str(ROOT / "compose.yaml")]
    argv += ["--profile", profile] if profile else []
    result = subprocess.run([*argv, "config", "--quiet"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, f"profile {profile}: {result.stderr}"
