"""The README's quick start, run as written against a real service process on the CPU.

The shell block's first line (`make run &`) is what the test starts itself: the Makefile's `run`
target, `python -m litetopk.service`, with the default settings but a private XDG_RUNTIME_DIR and a
free TCP port (so it cannot collide with a service already running here). The second shell line
(waiting for readiness) and the Python block then run verbatim, with the same environment, so
`TopKClient()` has to find the service's default socket by itself.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.servers import ServiceProcess

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def quick_start_blocks() -> tuple[str, str]:
    """(sh block, python block) of the README's '## Quick start' section."""
    text = README.read_text()
    match = re.search(r"^## Quick start\n(.*?)^## ", text, flags=re.S | re.M)
    assert match, "README.md has no '## Quick start' section"
    blocks = re.findall(r"```(\w+)\n(.*?)```", match.group(1), flags=re.S)
    kinds = [kind for kind, _ in blocks]
    assert kinds == ["sh", "python"], f"the quick start should be one sh and one python block, found {kinds}"
    return blocks[0][1], blocks[1][1]


def code_lines(block: str) -> list[str]:
    return [line for line in block.splitlines() if line.strip()]


def test_the_quick_start_is_at_most_ten_lines():
    sh, python = quick_start_blocks()
    lines = code_lines(sh) + code_lines(python)
    assert len(lines) <= 10, f"the quick start has {len(lines)} lines of code:\n" + "\n".join(lines)


def test_the_quick_start_starts_what_make_run_starts():
    sh, _ = quick_start_blocks()
    first = code_lines(sh)[0].split("#")[0].strip()
    assert first == "make run &", first
    recipe = re.search(r"^run:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), flags=re.M)
    assert recipe and recipe.group(1).strip() == "$(BIN)/python -m litetopk.service", recipe


@pytest.fixture
def private_runtime_dir(monkeypatch):
    # A short directory: Unix socket paths are limited to ~107 bytes.
    directory = tempfile.TemporaryDirectory(prefix="ltk-qs-", dir="/tmp")
    monkeypatch.setenv("XDG_RUNTIME_DIR", directory.name)
    monkeypatch.delenv("LITETOPK_URL", raising=False)
    yield Path(directory.name)
    directory.cleanup()


def test_the_quick_start_gets_a_checked_answer_from_a_real_service(private_runtime_dir):
    from litetopk.clients.transport import resolve_endpoint
    from litetopk.service.settings import default_socket_path

    socket = default_socket_path()
    assert socket == str(private_runtime_dir / "litetopk" / "litetopk.sock"), "the README's socket path is wrong"
    sh, python = quick_start_blocks()
    service = ServiceProcess(private_runtime_dir, uds=socket)
    try:
        wait = code_lines(sh)[1].split("#")[0].replace(".venv/bin/python", sys.executable)
        subprocess.run(["timeout", "60", "bash", "-c", wait], cwd=ROOT, check=True)
        assert resolve_endpoint(None, None).uds == socket, "TopKClient() would not take the service's socket"
        done = subprocess.run([sys.executable, "-c", python], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, (
            f"the quick start failed:\n{done.stdout}\n{done.stderr}\nservice log:\n{service.log()}"
        )
    finally:
        service.stop()


def test_a_client_without_arguments_takes_the_default_socket_when_it_exists(private_runtime_dir):
    from litetopk.clients.transport import resolve_endpoint
    from litetopk.service.settings import default_socket_path

    socket = Path(default_socket_path())
    assert resolve_endpoint(None, None).base_url == "http://127.0.0.1:8471", "no socket: TCP on the default port"
    socket.parent.mkdir()
    import socket as sockets

    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as listener:  # a live socket (a stale file is skipped)
        listener.bind(str(socket))
        listener.listen(1)
        assert resolve_endpoint(None, None).uds == str(socket), "the client does not look where the service listens"
