"""`gpupool run` prints a console link that opens the console signed in: a real subprocess, real HTTP.
The link's page is served and the token it carries is the admin token the gateway accepts."""

from __future__ import annotations

import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_run_prints_a_signed_in_console_link(tmp_path: Path) -> None:
    port = _free_port()
    data = tmp_path / "data"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli.main", "run", "--port", str(port), "--data-dir", str(data),
         "--no-traffic", "--tidal-speed", "0", "--no-agents"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        link = ""
        deadline = time.monotonic() + 90
        while not link and time.monotonic() < deadline:
            try:
                line = lines.get(timeout=1)
            except queue.Empty:
                assert proc.poll() is None, "gpupool run exited"
                continue
            if "console: " in line:  # (after the status line's timestamp)
                link = line.split("console: ", 1)[1].strip()
        assert link, "no console link printed"
        parts = urlsplit(link)
        assert (parts.scheme, parts.netloc, parts.path) == ("http", f"127.0.0.1:{port}", "/")
        token = parse_qs(parts.query)["token"][0]
        assert token == (data / "admin.token").read_text().strip()

        base = f"http://127.0.0.1:{port}"
        page = None
        while time.monotonic() < deadline:
            try:
                page = httpx.get(link, timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.3)
        assert page is not None and page.status_code == 200
        assert "/ui/app.js" in page.text
        pool = httpx.get(f"{base}/v1/pool", headers={"Authorization": f"Bearer {token}"}, timeout=5)
        assert pool.status_code == 200 and pool.json()["nodes"]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
