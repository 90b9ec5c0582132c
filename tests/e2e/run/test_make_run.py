"""`gpupool run` (what `make run` starts) as a user runs it: a real subprocess, real HTTP.

Checks that the gateway comes up on the simulated example cluster, that one node agent per node
reports readings over HTTP (not the in-process feed), and that Ctrl-C stops everything cleanly.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pool(url: str, token: str) -> dict[str, object]:
    req = urllib.request.Request(f"{url}/v1/pool", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())  # type: ignore[no-any-return]


def test_run_starts_gateway_and_agents_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port = _free_port()
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "run", "--port", str(port), "--data-dir", str(data),
         "--no-traffic", "--tidal-speed", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        pool: dict[str, object] = {}
        while time.monotonic() < deadline:
            time.sleep(0.5)
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            token_file = data / "admin.token"
            if not token_file.exists():
                continue
            try:
                pool = _pool(url, token_file.read_text().strip())
            except OSError:
                continue
            gpus = [g for n in pool["nodes"] for g in n["gpus"]]  # type: ignore[attr-defined]
            if gpus and all(g.get("reading") for g in gpus):
                break
        else:
            raise AssertionError(f"no readings for every GPU: {pool}")
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "node agents: 2" in out
    assert "gpupool: stopped" in out
