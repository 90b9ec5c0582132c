"""The real `gpupool serve` as a subprocess for the gateway's end-to-end tests: its command line, and
a start that waits for ``/healthz`` (or says why the process exited)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import httpx


def serve_argv(data: Path, auth: Path, port: int, *extra: str) -> list[str]:
    """``gpupool serve`` on ``port`` with its data dir and auth file, no simulated readings."""
    argv = [sys.executable, "-m", "gpupool.cli.main", "serve", "--port", str(port), "--data-dir", str(data)]
    return [*argv, "--auth-file", str(auth), "--no-simulate-readings", *extra]


def start_serve(data: Path, auth: Path, port: int, *extra: str) -> subprocess.Popen[bytes]:
    """Start it and wait up to 60 s until ``/healthz`` answers 200; `RuntimeError` with its stderr if it
    exits first."""
    p = subprocess.Popen(
        serve_argv(data, auth, port, *extra), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise RuntimeError(f"serve exited {p.returncode}: {p.stderr.read().decode() if p.stderr else ''}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5).status_code == 200:
                return p
        time.sleep(0.1)
    p.kill()
    raise RuntimeError("serve did not come up")
