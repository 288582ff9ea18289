"""Settings: one class, LITETOPK_* variables, flags beating variables, the Unix socket directory."""

from __future__ import annotations

import stat

import pytest
import torch
from pydantic import ValidationError

from litetopk.clients.transport import default_socket_path as client_default_socket_path
from litetopk.service.settings import ServiceSettings, default_socket_path, parse_cli


def test_defaults(monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4242")
    s = ServiceSettings()
    assert (s.host, s.port, s.device, s.backend) == ("127.0.0.1", 8471, "auto", "auto")
    assert s.uds == "/run/user/4242/litetopk/litetopk.sock" == default_socket_path() == client_default_socket_path()
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert ServiceSettings().uds == "/tmp/litetopk/litetopk.sock"


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


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "mps"])
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
