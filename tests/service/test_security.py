"""Security scenarios against real service processes (issue 16): shutdown paths, socket directory,
another uid, sealed memory its owner cannot shrink, takeover attempts by another principal, /livez
while a large body is parsed."""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import json
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from litetopk.clients.memfd import FD_SOCKET_NAME, hand_over_fd
from litetopk.service.wire import assemble_result, decode_result_json, dtype_name
from tests.problems import make_problem, results_equal
from tests.servers import ServiceProcess
from tests.service.test_topk import ref_topk


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_every_socket_file_is_removed_on_shutdown(tmp_path, sig):
    process = ServiceProcess(tmp_path, warmup=False)
    directory = Path(process.uds).parent
    assert {p.name for p in directory.iterdir()} == {"litetopk.sock", "fds.sock", "ipc.sock", "token"}
    assert (directory / "token").stat().st_mode & 0o777 == 0o600
    process.process.send_signal(sig)
    process.stop()
    assert list(directory.iterdir()) == [], f"{sig.name} left {list(directory.iterdir())} behind"


def test_symlinked_socket_directory_is_refused(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    (tmp_path / "sock").symlink_to(target)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "litetopk.service",
            "--device",
            "cpu",
            "--port",
            "0",
            "--uds",
            str(tmp_path / "sock" / "litetopk.sock"),
            "--no-warmup",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "symbolic link" in result.stderr, result.stderr[-2000:]
    assert target.stat().st_mode & 0o777 == 0o755, "the link's target was not chmodded"
    assert os.listdir(target) == []


NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _as_nobody(code: str, *args: str, pass_fds: tuple[int, ...] = ()) -> subprocess.CompletedProcess:
    """Run Python `code` as uid/gid 65534 (CI runs as root), with httpx importable, `pass_fds` inherited."""
    return subprocess.run(
        [*NOBODY, sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HOME": "/tmp"},
        pass_fds=pass_fds,
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid (CI runs as root)")
def test_another_uid_on_tcp_gets_no_region_and_no_token(tmp_path):
    """The confused-deputy and listing scenarios of issue 16, as `nobody` against a real service: TCP
    without the token answers 401 to every region operation and to /v1/topk, the token file cannot be
    read, the Unix socket cannot be reached, and the owner's regions are untouched."""
    tmp_path.chmod(0o755)
    process = ServiceProcess(tmp_path, warmup=False)
    try:
        with httpx.Client(base_url=process.url, headers=process.auth) as owner:
            before = owner.get("/v1/regions").json()
        probe = r"""
import json, sys, httpx
url, token_file, uds = sys.argv[1:4]
out = {}
with httpx.Client(base_url=url) as c:
    out["list"] = c.get("/v1/regions").status_code
    out["register"] = c.post("/v1/regions", json={"kind": "memfd", "ticket": "x" * 32, "size": 64}).status_code
    out["delete"] = c.delete("/v1/regions/1").status_code
    out["topk"] = c.post("/v1/topk", json={}).status_code
    out["forged"] = c.get("/v1/regions", headers={"authorization": "Bearer " + "0" * 64}).status_code
try:
    open(token_file).read(); out["token"] = "read"
except PermissionError:
    out["token"] = "refused"
try:
    with httpx.Client(transport=httpx.HTTPTransport(uds=uds), base_url="http://litetopk") as c:
        out["uds"] = c.get("/v1/regions").status_code
except (httpx.TransportError, PermissionError):
    out["uds"] = "refused"
print(json.dumps(out))
"""
        result = _as_nobody(probe, process.url, str(Path(process.uds).parent / "token"), process.uds)
        assert result.returncode == 0, result.stderr[-2000:]
        seen = __import__("json").loads(result.stdout.strip().splitlines()[-1])
        assert seen == {
            "list": 401,
            "register": 401,
            "delete": 401,
            "topk": 401,
            "forged": 401,
            "token": "refused",
            "uds": "refused",
        }, seen
        with httpx.Client(base_url=process.url, headers=process.auth) as owner:
            assert owner.get("/v1/regions").json() == before, "the owner's regions changed"
        assert process.process.poll() is None, "the service died"
        assert "Traceback" not in process.log(), process.log()[-3000:]
    finally:
        process.stop()


# ------------------------------------------------------------- sealed memory, takeover attempts

FATAL = ("SIGBUS", "Fatal Python error", "Segmentation fault")
INPUT_NAMES = ("q_fp4", "q_scale", "kv_cache", "weights")


def _uds_http(uds: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=uds), base_url="http://litetopk", timeout=60)


def _sealed_memfd(data: bytes) -> tuple[int, mmap.mmap]:
    """(fd, shared writable mapping) of a new memfd holding `data`, sealed against shrinking only."""
    fd = os.memfd_create("owner", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, len(data))
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
    mapping = mmap.mmap(fd, len(data))
    mapping[:] = data
    return fd, mapping


def _register_memfd(http: httpx.Client, uds: str, fd: int, size: int, access: str) -> dict:
    ticket = hand_over_fd(str(Path(uds).parent / FD_SOCKET_NAME), fd)
    response = http.post(
        "/v1/regions", json={"kind": "memfd", "ticket": ticket, "size": size, "access": access, "pid": os.getpid()}
    )
    assert response.status_code == 201, response.text
    return response.json()


def _problem_blob(p) -> tuple[bytes, dict[str, dict]]:
    """The problem's large inputs laid out in one buffer (64-byte aligned), and a /v1/topk body
    naming them in a region "REGION" (generation 1), metadata inline."""
    chunks, body, offset = [], {}, 0
    for name in INPUT_NAMES:
        tensor = getattr(p, name).contiguous()
        raw = tensor.view(torch.uint8).numpy().tobytes()
        body[name] = {
            "region": "REGION",
            "generation": 1,
            "offset": offset,
            "dtype": dtype_name(tensor.dtype),
            "shape": list(tensor.shape),
        }
        chunks.append(raw + b"\0" * (-len(raw) % 64))
        offset += len(chunks[-1])
    for name in ("block_table", "row_to_batch", "starts", "ends"):
        tensor = getattr(p, name)
        body[name] = {"dtype": "int32", "shape": list(tensor.shape), "data": tensor.flatten().tolist()}
    body["topk"] = p.topk
    return b"".join(chunks), body


def _naming(body: dict, region: dict) -> dict:
    """`body` with its inputs in `region` (id and generation)."""
    return {
        n: {**v, "region": region["id"], "generation": region["generation"]} if n in INPUT_NAMES else v
        for n, v in body.items()
    }


def _answer(http: httpx.Client, body: dict):
    response = http.post("/v1/topk", json=body)
    assert response.status_code == 200, response.text
    return assemble_result(decode_result_json(response.json())[0])


def _punch_hole(fd: int, size: int) -> None:
    """fallocate(PUNCH_HOLE | KEEP_SIZE): the owner frees its pages (they read as zeros); the seals allow it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    if libc.fallocate(fd, 0x02 | 0x01, 0, size) != 0:
        raise OSError(ctypes.get_errno(), "fallocate(PUNCH_HOLE)")


def test_the_owner_cannot_shrink_sealed_memory_under_the_service(service, seed):
    """Issue 16 'crash', over the Unix socket: the owner registers a sealed memfd, then tries to
    truncate it (refused by F_SEAL_SHRINK: an unsealed memfd is refused at registration,
    test_errors.py::test_unsealed_memory), frees its pages (they read as zeros) and unmaps and
    closes it: every /v1/topk naming it answers what the memory holds, never a fault."""
    p = make_problem(seed, seq_lens=[700, 690], rows_per_seq=4)
    blob, body = _problem_blob(p)
    fd, mapping = _sealed_memfd(blob)
    with _uds_http(service.uds) as http:
        region = _register_memfd(http, service.uds, fd, len(blob), "read_only")
        body = _naming(body, region)
        for length in (0, 4096, len(blob) - 1):
            with pytest.raises(PermissionError):
                os.ftruncate(fd, length)
        assert os.fstat(fd).st_size == len(blob)
        assert results_equal(_answer(http, body), ref_topk(p)) == [], "after the truncate attempts"
        _punch_hole(fd, len(blob))
        assert mapping[:] == b"\0" * len(blob)
        zeros = dataclasses.replace(
            p,
            q_fp4=torch.zeros_like(p.q_fp4),
            q_scale=torch.zeros_like(p.q_scale),
            kv_cache=torch.zeros_like(p.kv_cache),
            weights=torch.zeros_like(p.weights),
        )
        want = ref_topk(zeros)
        assert results_equal(_answer(http, body), want) == [], "after the owner freed its pages"
        mapping.close()
        os.close(fd)
        assert results_equal(_answer(http, body), want) == [], "after the owner unmapped and closed it"
        assert http.delete(f"/v1/regions/{region['id']}").status_code == 204
    assert service.process.poll() is None, "the service died"
    assert not any(word in service.log() for word in FATAL), service.log()[-3000:]


TAKEOVER = r"""
import json, sys, httpx
from litetopk.clients.memfd import hand_over_fd
uds, fds, a = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
rid, seen = a["region"]["id"], {}

def outcome(response):
    return [response.status_code, response.json().get("code") if response.status_code >= 400 else None]

def naming(body, region):
    return {n: {**v, "region": region["id"], "generation": region["generation"]} if n in a["inputs"] else v
            for n, v in body.items()}

with httpx.Client(transport=httpx.HTTPTransport(uds=uds), base_url="http://litetopk", timeout=60) as c:
    seen["get"] = outcome(c.get(f"/v1/regions/{rid}"))
    seen["listed"] = rid in [r["id"] for r in c.get("/v1/regions").json()["regions"]]
    seen["delete"] = outcome(c.delete(f"/v1/regions/{rid}"))
    seen["delete_generation"] = outcome(c.delete(f"/v1/regions/{rid}", params={"generation": 1}))
    seen["stolen_ticket"] = outcome(c.post("/v1/regions", json={"kind": "memfd", "ticket": a["ticket"],
                                                                "size": a["size"], "access": "read_write"}))
    seen["use"] = outcome(c.post("/v1/topk", json=a["body"]))
    # B holds the same memory (an fd it inherited) and registers it again: B's own region
    ticket = hand_over_fd(fds, a["fd"])
    mine = c.post("/v1/regions", json={"kind": "memfd", "ticket": ticket, "size": a["size"],
                                       "access": "read_only"}).json()
    seen["reregister"] = [mine["id"] != rid, mine["generation"]]
    own = naming(a["body"], mine)
    seen["own"] = outcome(c.post("/v1/topk", json=own))
    seen["write"] = outcome(c.post("/v1/topk", json={**own, "out": {"counts": a["counts"]}}))
    seen["write_inputs"] = outcome(c.post("/v1/topk", json={**own, "out": {"counts": a["into_inputs"]}}))
    seen["mine"] = mine["id"]
print(json.dumps(seen))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid (CI runs as root)")
def test_another_principal_cannot_take_over_a_region(seed):
    """Issue 16 'takeover', over the Unix socket (mode 0666: every uid may connect): principal A
    (root) registers a read-write memfd holding a problem; principal B (`nobody`, holding an fd of
    the same memory) tries to see, unregister, re-register, use and write into A's region. Every
    attempt is refused with a code, B's registration of the same memory is B's own, A's region and
    generation are unchanged, A's memory unwritten, A's request answers, and A's unregister works."""
    directory = tempfile.TemporaryDirectory(prefix="ltk-", dir="/tmp")
    os.chmod(directory.name, 0o711)
    process = ServiceProcess(directory.name, uds_mode="0666", warmup=False)
    p = make_problem(seed, seq_lens=[700, 690], rows_per_seq=4)
    rows = p.q_fp4.shape[0]
    blob, body = _problem_blob(p)
    fd, mapping = _sealed_memfd(blob)
    results_fd, results = _sealed_memfd(b"\0" * 4 * rows)
    try:
        with _uds_http(process.uds) as http:
            region = _register_memfd(http, process.uds, fd, len(blob), "read_write")
            output = _register_memfd(http, process.uds, results_fd, 4 * rows, "read_write")
            body = _naming(body, region)
            unused = hand_over_fd(str(Path(process.uds).parent / FD_SOCKET_NAME), os.dup(fd))  # leaked to B
            counts = {"region": output["id"], "generation": 1, "offset": 0, "dtype": "int32", "shape": [rows]}
            written = http.post("/v1/topk", json={**body, "out": {"counts": counts}})
            assert written.status_code == 200 and written.json()["written"] == ["counts"], written.text
            assert results[:] == ref_topk(p).counts.numpy().tobytes(), "A's own write into its region"
            results[:] = b"\0" * (4 * rows)
            into_inputs = {**counts, "region": region["id"], "offset": len(blob) - 4 * rows}
            attacker = {
                "region": region,
                "body": body,
                "ticket": unused,
                "size": len(blob),
                "fd": fd,
                "counts": counts,
                "into_inputs": into_inputs,
                "inputs": list(INPUT_NAMES),
            }
            result = _as_nobody(
                TAKEOVER,
                process.uds,
                str(Path(process.uds).parent / FD_SOCKET_NAME),
                json.dumps(attacker),
                pass_fds=(fd,),
            )
            assert result.returncode == 0, result.stderr[-3000:]
            seen = json.loads(result.stdout.strip().splitlines()[-1])
            theirs = seen.pop("mine")
            assert seen == {
                "get": [404, "unknown_region"],
                "listed": False,
                "delete": [404, "unknown_region"],
                "delete_generation": [404, "unknown_region"],
                "stolen_ticket": [422, "unknown_ticket"],
                "use": [404, "unknown_region"],
                "reregister": [True, 1],
                "own": [200, None],
                "write": [404, "unknown_region"],
                "write_inputs": [404, "unknown_region"],
            }, seen
            assert http.get(f"/v1/regions/{region['id']}").json() == region, "A's region changed"
            assert http.get(f"/v1/regions/{output['id']}").json() == output, "A's output region changed"
            assert {r["id"] for r in http.get("/v1/regions").json()["regions"]} == {region["id"], output["id"]}
            assert http.get(f"/v1/regions/{theirs}").json()["code"] == "unknown_region", "B's region is B's"
            assert mapping[:] == blob and results[:] == b"\0" * (4 * rows), "A's memory was written"
            assert results_equal(_answer(http, body), ref_topk(p)) == []
            assert http.delete(f"/v1/regions/{region['id']}", params={"generation": 1}).status_code == 204
            assert http.get(f"/v1/regions/{region['id']}").json()["code"] == "stale_region"
        assert process.process.poll() is None, "the service died"
        log = process.log()
        assert "Traceback" not in log and not any(word in log for word in FATAL), log[-3000:]
    finally:
        for memory, descriptor in ((mapping, fd), (results, results_fd)):
            memory.close()
            os.close(descriptor)
        process.stop()
        directory.cleanup()


# ------------------------------------------------------------------- /livez while a body is parsed

BODY_BYTES = 16 * 2**20
PROBE_INTERVAL_S = 0.005  # the probing test leaves the CPU to the service between probes


def _sixteen_mib_body(kind: str) -> bytes:
    """A /v1/topk body of just under 16 MiB (the default MAX_REQUEST_BYTES): `too_long` holds one
    inline tensor of ~1.5 million values (refused once parsed: at most INLINE_VALUES_MAX);
    `valid` four inline tensors of INLINE_VALUES_MAX values padded with whitespace (it parses, then
    names a region that does not exist)."""
    from litetopk.service.schemas import INLINE_VALUES_MAX

    ref = {"region": "rnothere", "generation": 1, "offset": 0, "dtype": "uint8", "shape": [1]}
    body = {n: ref for n in ("q_fp4", "q_scale", "kv_cache", "weights")} | {"topk": 512}
    if kind == "too_long":
        n = (BODY_BYTES - 4096) // 11
        body |= {n: ref for n in ("row_to_batch", "starts", "ends")}
        body["block_table"] = {"dtype": "int32", "shape": [n], "data": [1234567890] * n}
    else:
        for name in ("block_table", "row_to_batch", "starts", "ends"):
            body[name] = {"dtype": "int32", "shape": [INLINE_VALUES_MAX], "data": [-123456789] * INLINE_VALUES_MAX}
    raw = json.dumps(body, separators=(",", ":")).encode()
    return raw[:-1] + b" " * (BODY_BYTES - len(raw)) + b"}"


def _livez_while_posting(service, body: bytes) -> tuple[list[float], httpx.Response]:
    """Latencies of /livez probes sent on a second connection while `body` is posted to /v1/topk."""
    done, answer = threading.Event(), {}

    def post():
        try:
            with httpx.Client(base_url=service.url, headers=service.auth, timeout=60) as http:
                answer["response"] = http.post("/v1/topk", content=body, headers={"content-type": "application/json"})
        finally:
            done.set()

    latencies = []
    with httpx.Client(base_url=service.url, timeout=10) as probe:
        probe.get("/livez")  # the probe's connection is open before the body is sent
        sender = threading.Thread(target=post)
        sender.start()
        while not done.is_set():
            started = time.perf_counter()
            assert probe.get("/livez").status_code == 200
            latencies.append(time.perf_counter() - started)
            time.sleep(PROBE_INTERVAL_S)
        sender.join()
    return latencies, answer["response"]


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@pytest.mark.parametrize("kind, code", [("too_long", "validation_error"), ("valid", "unknown_region")])
def test_livez_answers_while_a_16_mib_body_is_parsed(service, kind, code):
    """Issue 16: large /v1/topk bodies are parsed off the event loop, in the parser process (pydantic
    holds the GIL: from a thread /livez stalled ~250 ms, on the event loop ~0.5 s). Ordered by
    events, not timed: the parse happens in the parser process (its CPU time grows by the parse),
    and /livez probes on a second connection are answered while the body is in flight."""
    body = _sixteen_mib_body(kind)
    assert len(body) == BODY_BYTES
    _livez_while_posting(service, body)  # the parser process exists (started with the service) and is warm
    (parser,) = _parser_processes(service)
    before = _cpu_ticks(parser)
    latencies, response = _livez_while_posting(service, body)
    assert response.json()["code"] == code, response.text[:500]
    assert _cpu_ticks(parser) > before, "the body was parsed in the parser process"
    assert len(latencies) >= 5, f"only {len(latencies)} probes answered while the body was in flight"
    assert service.process.poll() is None


def _parser_processes(service) -> list[int]:
    """Pids of the service's parser processes (its spawned children, not the resource tracker)."""
    children = subprocess.run(["pgrep", "-P", str(service.pid)], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in children if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()]


def test_a_killed_parser_process_is_replaced(service):
    """The body parser is a process of its own: killed, the next large body starts another and answers."""
    body = _sixteen_mib_body("valid")
    with httpx.Client(base_url=service.url, headers=service.auth, timeout=60) as http:

        def post() -> httpx.Response:
            return http.post("/v1/topk", content=body, headers={"content-type": "application/json"})

        assert post().json()["code"] == "unknown_region"
        (parser,) = _parser_processes(service)
        os.kill(parser, signal.SIGKILL)
        assert post().json()["code"] == "unknown_region", "the body is parsed by a new parser process"
        assert _parser_processes(service) not in ([], [parser])
    assert service.process.poll() is None
    assert "the body parser process died" in service.log()
