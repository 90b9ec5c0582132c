"""A real `gpupool serve` closes connections that never finish a request head (silent sockets and
slow-header senders) and keeps serving while they are open; its limit and metrics flags reach the
app (``--max-body-kib`` -> 413, ``--metrics-tenant-labels``); a bad limit flag is exit 2."""

from __future__ import annotations

import contextlib
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow

ADMIN = "e2e-half-open-admin-1"
SOCKETS = 300
HEADER_TIMEOUT_S = 1.0
WAIT_BOUND_S = 30.0  # generous bound on the wait for the server to close them: not a timing claim


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _serve(tmp: Path, *extra: str) -> list[str]:
    auth = tmp / "auth.yaml"
    auth.write_text(f"tokens:\n  - {{token: {ADMIN}, tenant: ops, role: admin}}\n")
    return [
        sys.executable,
        "-m",
        "gpupool.cli.main",
        "serve",
        "--data-dir",
        str(tmp / "data"),
        "--auth-file",
        str(auth),
        "--no-simulate-readings",
        *extra,
    ]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    tmp_path = tmp_path_factory.mktemp("serve")
    cmd = _serve(
        tmp_path,
        "--port",
        str(port),
        "--header-timeout-s",
        str(HEADER_TIMEOUT_S),
        "--max-body-kib",
        "1",
        "--metrics-tenant-labels",
    )
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            if p.poll() is not None:
                raise RuntimeError(
                    f"serve exited {p.returncode}: {p.stderr.read().decode() if p.stderr else ''}"
                )
            try:
                if httpx.get(f"{url}/healthz", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def test_half_open_connections_are_closed_by_the_server(server: str) -> None:
    port = int(server.rsplit(":", 1)[1])
    socks: list[socket.socket] = []
    try:
        for i in range(SOCKETS):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            if i % 3 == 1:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # head never finished
            elif i % 3 == 2:
                s.sendall(b"POST /v1/leases HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # a slow header
            socks.append(s)
        # the server keeps answering while they are open
        r = httpx.get(f"{server}/v1/pool", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10)
        assert r.status_code == 200
        open_ = {s.fileno(): (i, s) for i, s in enumerate(socks)}
        deadline = time.monotonic() + WAIT_BOUND_S
        while open_ and time.monotonic() < deadline:
            ready, _, _ = select.select(list(open_), [], [], 0.5)
            for fd in ready:
                s = open_[fd][1]
                try:
                    data = s.recv(4096)
                except ConnectionError:
                    data = b""
                if not data:  # EOF: the server closed it
                    del open_[fd]
            for i, s in open_.values():
                if i % 3 == 2:
                    with contextlib.suppress(OSError):
                        s.sendall(b"a")  # a header byte now and then must not keep it alive
        assert not open_, f"{len(open_)} of {SOCKETS} half-open connections still open after {WAIT_BOUND_S} s"
        r = httpx.get(f"{server}/healthz", timeout=10)
        assert r.status_code == 200 and r.json() == {"ok": True}
    finally:
        for s in socks:
            s.close()


def test_limit_and_metrics_flags_reach_the_app(server: str) -> None:
    with httpx.Client(base_url=server, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10) as cl:
        r = cl.post("/v1/leases", json={"vram_mib": 1024, "labels": {"k": "v" * 2000}})
        assert r.status_code == 413 and r.json()["code"] == "body_too_large", r.text
        r = cl.post("/v1/leases", json={"vram_mib": 1024})
        assert r.status_code == 201, r.text
        assert 'tenant="ops"' in cl.get("/metrics").text
        cl.delete(f"/v1/leases/{r.json()['id']}")


def test_bad_limit_flags_exit_2_naming_the_flag_before_anything_starts(tmp_path: Path) -> None:
    for flag, value in (("--max-body-kib", "0"), ("--max-connections", "-1"), ("--header-timeout-s", "nan")):
        p = subprocess.run(_serve(tmp_path, flag, value), capture_output=True, timeout=60, check=False)
        assert p.returncode == 2, (flag, p.returncode, p.stderr)
        assert flag in p.stderr.decode(), p.stderr
    assert not (tmp_path / "data" / "leases.db").exists()
