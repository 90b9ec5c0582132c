"""`gpupool run` on its default path (what `make run` starts): synthetic traffic and tidal both on.

A real subprocess and real HTTP. The only change from the defaults is a faster compressed clock
(``--tidal-speed 1440``: a simulated day per real minute) so that the tidal controller reaches NIGHT
within the test. Proves, from outside the process, that:
- the synthetic agent workload runs: P0 chat and P1 embeddings are proxied to the emulated backends
  with status 200 (``gpupool_proxy_requests_total``), and tenant ``batch`` holds P2 leases;
- the tidal loop runs on the compressed clock: it announces itself, switches day -> night, and
  lends spare capacity to tenant ``tidal-batch`` as P2 leases visible in ``/v1/leases``;
- the node agents start once the gateway listens, so none of their reports is refused.
A coroutine that raises on entry is swallowed by the server's task list, so each of these is checked
by its effect, not by the process staying up.
"""

from __future__ import annotations

import json
import re
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


def _get(url: str, token: str) -> bytes:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return bytes(resp.read())


def _proxied_ok(metrics: str) -> dict[str, float]:
    """model -> count of proxied requests answered 200."""
    out: dict[str, float] = {}
    for m in re.finditer(r"^gpupool_proxy_requests_total\{([^}]*)\} (\S+)$", metrics, re.MULTILINE):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("status") == "200":
            out[labels["model"]] = out.get(labels["model"], 0.0) + float(m.group(2))
    return out


def test_default_run_drives_traffic_and_tidal(tmp_path: Path) -> None:
    port = _free_port()
    data = tmp_path / "data"
    log = tmp_path / "run.log"
    url = f"http://127.0.0.1:{port}"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool.cli.main", "run", "--port", str(port), "--data-dir", str(data),
             "--tidal-speed", "1440"],
            stdout=sink, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    seen_tenants: set[str] = set()
    proxied: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 95  # under the 120 s pytest timeout
        while time.monotonic() < deadline:
            time.sleep(1.0)
            assert proc.poll() is None, log.read_text()
            token_file = data / "admin.token"
            if not token_file.exists():
                continue
            token = token_file.read_text().strip()
            try:
                leases = json.loads(_get(f"{url}/v1/leases", token))["leases"]
                proxied = _proxied_ok(_get(f"{url}/metrics", token).decode())
            except OSError:
                continue
            seen_tenants |= {x["tenant"] for x in leases}
            out = log.read_text()
            if (
                {"batch", "tidal-batch"} <= seen_tenants
                and len(proxied) >= 2
                and "tidal: day -> night" in out
            ):
                break
        else:
            raise AssertionError(
                f"default path not alive: lease tenants {sorted(seen_tenants)}, proxied 200s {proxied}, "
                f"log:\n{log.read_text()}"
            )
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    out = log.read_text()
    assert proc.returncode == 0, out
    assert "tidal: compressed clock x1440" in out
    assert "gpupool: stopped" in out
    # the node agents start once the gateway listens: their first report is not refused (it was,
    # at every start, with two "Connection refused ... retrying" lines). (At the stop the server
    # closes before the agents stop, so a last report may still be refused then.)
    assert re.search(r"node agents: \d+ \(one per simulated node", out), out
    started = out.split("gpupool: stopping")[0]
    assert "Connection refused" not in started and "failed attempts" not in started, out
