"""Settings: one class, LITETOPK_* variables, flags beating variables, the Unix socket directory,
its permissions and group, and devices named by GPU UUID."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from pydantic import ValidationError

from litetopk.clients.transport import default_socket_path as client_default_socket_path
from litetopk.service.__main__ import bind_unix, main
from litetopk.service.settings import ServiceSettings, default_socket_path, gpu_index_by_uuid, parse_cli

UUIDS = ["5a6b7c8d-1111-2222-3333-444455556666", "GPU-0F1E2D3C-aaaa-bbbb-cccc-ddddeeeeffff"]


def test_defaults(monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4242")
    s = ServiceSettings()
    assert (s.host, s.port, s.device, s.backend) == ("127.0.0.1", 8471, "auto", "auto")
    assert s.uds == "/run/user/4242/litetopk/litetopk.sock" == default_socket_path() == client_default_socket_path()
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert ServiceSettings().uds == "/tmp/litetopk/litetopk.sock"


@pytest.mark.parametrize(
    "calibration, backend, want",
    [
        ("sample", "reference", "sample"),
        ("sample", "triton", "sample"),
        ("scan", "triton", "scan"),
        ("scan", "reference", None),
        ("scan", "flydsl", None),
    ],
)
def test_calibration_becomes_the_operator_tuning(calibration, backend, want):
    """Every operator call of the service takes settings.tuning(backend): the calibration it names, or
    a ValueError that fails the start where the backend has no self-calibrating scan."""
    from litetopk.kernels import LiteTopKTuning

    settings = parse_cli(["--calibration", calibration])
    if want is None:
        with pytest.raises(
            ValueError, match=f"calibration='scan' needs the triton backend; this service runs '{backend}'"
        ):
            settings.tuning(backend)
    else:
        assert settings.tuning(backend) == LiteTopKTuning(calibration=want), f"{calibration} on {backend}"


def test_a_calibration_the_backend_cannot_run_fails_the_start(tmp_path):
    import asyncio

    from litetopk.service.app import create_app

    settings = ServiceSettings(host="", uds=str(tmp_path / "s.sock"), device="cpu", calibration="scan")
    app = create_app(settings)

    async def start():
        async with app.router.lifespan_context(app):
            pass

    with pytest.raises(ValueError, match="calibration='scan' needs the triton backend; this service runs 'reference'"):
        asyncio.run(start())


def test_environment_then_flags(monkeypatch):
    monkeypatch.setenv("LITETOPK_QUEUE_SIZE", "7")
    monkeypatch.setenv("LITETOPK_PORT", "9000")
    s = parse_cli(["--port", "9001", "--uds", "", "--no-warmup"])
    assert (s.queue_size, s.port, s.uds, s.warmup) == (7, 9001, "", False)


def test_every_field_has_a_flag():
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parse_cli(["--help"])
    for name in ServiceSettings.model_fields:
        assert "--" + name.replace("_", "-") in out.getvalue(), name


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "mps", "GPU-1234", "gpu-5a6b7c8d-1111-2222-3333-444455556666"])
def test_bad_device_is_refused(device):
    with pytest.raises(ValidationError):
        ServiceSettings(device=device)


def test_device_resolution():
    assert ServiceSettings(device="cpu").torch_device() == torch.device("cpu")
    assert ServiceSettings(device="cuda").torch_device() == torch.device("cuda", 0)
    want = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert ServiceSettings().torch_device() == want


def test_socket_directory_is_private(tmp_path):
    s = ServiceSettings(uds=str(tmp_path / "run" / "litetopk.sock"))
    directory = s.socket_dir()
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700


# ------------------------------------------------------------------------- devices by GPU UUID


@pytest.mark.parametrize(
    "name,index",
    [
        ("GPU-5a6b7c8d-1111-2222-3333-444455556666", 0),  # torch spells it without GPU-
        ("GPU-5A6B7C8D-1111-2222-3333-444455556666", 0),  # case does not matter
        ("GPU-0f1e2d3c-aaaa-bbbb-cccc-ddddeeeeffff", 1),  # nvidia-smi -L spelling in the list
    ],
)
def test_gpu_uuid_resolves_to_its_index(name, index):
    assert gpu_index_by_uuid(name, UUIDS) == index
    assert ServiceSettings(device=name).torch_device(visible_uuids=UUIDS) == torch.device("cuda", index)


def test_unknown_gpu_uuid_names_the_visible_ones():
    with pytest.raises(ValueError) as err:
        ServiceSettings(device="GPU-99999999-1111-2222-3333-444455556666").torch_device(visible_uuids=UUIDS)
    message = str(err.value)
    assert "no visible GPU has this UUID" in message and "cuda:1 GPU-0f1e2d3c" in message, message


def test_unknown_gpu_uuid_fails_the_start_clearly(capsys, tmp_path):
    if torch.cuda.is_available():
        pytest.skip("needs a machine where the made-up UUID cannot be visible (no CUDA)")
    code = main(
        ["--device", "GPU-99999999-1111-2222-3333-444455556666", "--uds", str(tmp_path / "s.sock"), "--host", ""]
    )
    assert code == 2
    assert "no visible GPU has this UUID (visible: none)" in capsys.readouterr().err
    assert not (tmp_path / "s.sock").exists(), "nothing is bound before the device resolves"


# ------------------------------------------------------------------ Unix socket mode and group


@pytest.mark.parametrize("given,mode", [("0660", 0o660), ("660", 0o660), ("0o640", 0o640), (0o600, 0o600)])
def test_socket_mode_is_octal(given, mode, monkeypatch):
    monkeypatch.setenv("LITETOPK_UDS_MODE", str(given) if isinstance(given, str) else oct(given))
    assert ServiceSettings().uds_mode == mode
    assert parse_cli(["--uds-mode", given if isinstance(given, str) else oct(given)]).uds_mode == mode


@pytest.mark.parametrize("given", ["0400", "9", "rw", "01600"])
def test_socket_mode_must_be_octal_and_keep_owner_access(given):
    with pytest.raises(ValidationError):
        ServiceSettings(uds_mode=given)


@pytest.mark.parametrize("mode,directory", [(0o600, 0o700), (0o660, 0o710), (0o666, 0o711), (0o606, 0o701)])
def test_directory_gets_search_permission_where_the_socket_lets_others_in(mode, directory, tmp_path):
    s = ServiceSettings(uds=str(tmp_path / "run" / "litetopk.sock"), uds_mode=mode)
    assert s.socket_dir_mode() == directory
    assert stat.S_IMODE(s.socket_dir().stat().st_mode) == directory


def test_socket_gets_its_mode_and_group(tmp_path):
    group = str(os.getgroups()[-1] if os.getgroups() else os.getgid())  # a group this user is in
    s = ServiceSettings(uds=str(tmp_path / "run" / "litetopk.sock"), uds_mode="0660", uds_group=group)
    sock = bind_unix(s)
    try:
        info = os.stat(s.uds)
        assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o660, oct(info.st_mode)
        assert info.st_gid == int(group)
        parent = os.stat(tmp_path / "run")
        assert stat.S_IMODE(parent.st_mode) == 0o710 and parent.st_gid == int(group)
    finally:
        sock.close()


def test_default_socket_is_private(tmp_path):
    s = ServiceSettings(uds=str(tmp_path / "run" / "litetopk.sock"))
    sock = bind_unix(s)
    try:
        assert stat.S_IMODE(os.stat(s.uds).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(tmp_path / "run").st_mode) == 0o700
    finally:
        sock.close()


def test_unknown_socket_group_is_refused(tmp_path):
    s = ServiceSettings(uds=str(tmp_path / "litetopk.sock"), uds_group="litetopk-no-such-group")
    with pytest.raises(ValueError, match="no such group"):
        s.socket_group_id()


def _http_protocol():
    from litetopk.service.principals import peer_protocol_class

    return peer_protocol_class()


def _on_httptools(protocol) -> bool:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    return issubclass(protocol, HttpToolsProtocol)


def _event_loop():
    from litetopk.service.__main__ import event_loop

    return event_loop()


@pytest.mark.parametrize(
    "module, resolve, named, dependency",
    [
        ("uvicorn.protocols.http.httptools_impl", _http_protocol, _on_httptools, "httptools"),  # not h11 (Python)
        ("uvloop", _event_loop, lambda loop: loop == "uvloop", "uvloop"),  # not asyncio's loop
    ],
)
def test_the_http_server_runs_on_its_pinned_c_dependencies(monkeypatch, module, resolve, named, dependency):
    """The HTTP parser and the event loop are named, not left to uvicorn's auto-detection: without the pinned C
    library the service refuses to start with a message instead of serving on uvicorn's slower fallback."""
    import builtins

    assert named(resolve())
    real_import = builtins.__import__

    def without(name, *args, **kwargs):
        if name == module:
            raise ImportError(f"No module named {module!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without)
    with pytest.raises(RuntimeError, match=f"needs {dependency}"):
        resolve()


def test_a_missing_pinned_dependency_fails_the_start_before_any_socket(monkeypatch, tmp_path, capsys):
    """main() resolves uvloop and httptools before binding: without one it exits 2 with the reason, leaving no socket
    file behind."""
    from litetopk.service import __main__ as service_main

    def missing():
        raise RuntimeError("the service needs uvloop (pinned in pyproject.toml: pip install uvloop==0.22.1)")

    monkeypatch.setattr(service_main, "event_loop", missing)
    path = tmp_path / "s" / "litetopk.sock"
    assert service_main.main(["--uds", str(path), "--host", "", "--device", "cpu"]) == 2
    assert "needs uvloop" in capsys.readouterr().err and not path.exists()
