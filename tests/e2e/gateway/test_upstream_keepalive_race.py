"""`UpstreamPool`'s one retry on a fresh connection never re-sends a request the backend took.

The retry happens when a reused keep-alive connection fails before any answer came. The risk: a
non-idempotent POST the engine already admitted would run twice (an orphan the gateway does not
count, taking KV the red line does not see). Against a real uvicorn backend (vLLM's server, and the
emulated one here) the only such failure is the server closing the connection on its keep-alive
timeout, before it read the request: this test makes that race frequent (a keep-alive of 20 ms,
the gateway's loop made to lag past it, as under CPU load), checks the retry path really ran,
and counts what the engine admitted."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gpupool.adapters.http.upstream import UpstreamPool
from gpupool.bench.httpload import stop, wait_http

KEEP_ALIVE_S = 0.02
SERVER = r"""
import socket, sys, uvicorn
from pathlib import Path
from gpupool.adapters.backends import EmulatedEngine, Roofline
from gpupool.adapters.backends.app import create_backend_app
roof = Roofline(
    params=1e9, bytes_per_param=2, kv_bytes_per_token=131072, mem_bw_bytes_s=2e12, peak_flops=3e14
)
app = create_backend_app(EmulatedEngine(roof, kv_budget_mib=4096, speed=100.0), model="m")
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(64)
Path(sys.argv[1]).write_text(str(sock.getsockname()[1]))
config = uvicorn.Config(app, log_level="warning", timeout_keep_alive=float(sys.argv[2]))
uvicorn.Server(config).run(sockets=[sock])
"""


def _prompt_tokens(url: str) -> int:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    line = next(x for x in text.splitlines() if x.startswith("vllm:prompt_tokens_total"))
    return int(float(line.rsplit(" ", 1)[1]))


@pytest.mark.timeout(120)
def test_a_retried_request_is_admitted_once(tmp_path: Path) -> None:
    port_file = tmp_path / "port"
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port_file), str(KEEP_ALIVE_S)], env=os.environ)
    try:
        for _ in range(600):
            if port_file.exists() and port_file.read_text():
                break
            assert proc.poll() is None
            time.sleep(0.1)
        url = f"http://127.0.0.1:{port_file.read_text()}"
        wait_http(url + "/health", proc)
        body = json.dumps({"model": "m", "prompt": "hello world " * 50, "max_tokens": 2, "stream": True})
        n, retries = 200, [0]

        async def main() -> int:
            pool = UpstreamPool(timeout_s=30.0)
            idle = pool._idle_conn
            looks = [0]

            def idle_conn(key: tuple[str, int]) -> object:  # once per attempt: twice when retried
                looks[0] += 1
                return idle(key)

            pool._idle_conn = idle_conn  # type: ignore[method-assign,assignment]
            ok = 0
            rng = random.Random(7)
            for _ in range(n):
                r = await pool.request(
                    "POST",
                    url + "/v1/completions",
                    content=body.encode(),
                    headers={"content-type": "application/json"},
                )
                async for _chunk in r.aiter_raw():
                    pass
                ok += r.status_code == 200
                # the gateway's loop busy (CPU load) past the backend's keep-alive: the backend's close
                # is not seen yet when the next request takes the connection (every other request)
                if rng.random() < 0.5:
                    time.sleep(KEEP_ALIVE_S * 3)
                else:
                    await asyncio.sleep(KEEP_ALIVE_S * rng.uniform(0.5, 1.5))
            await pool.aclose()
            retries[0] = looks[0] - n
            return ok

        assert asyncio.run(main()) == n
        assert retries[0] > 0, "the keep-alive race never happened: the retry path was not exercised"
        one = _prompt_tokens(url) // n
        assert _prompt_tokens(url) == n * one  # every request admitted exactly once
    finally:
        stop([proc])
