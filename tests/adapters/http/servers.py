"""Real uvicorn servers on 127.0.0.1 (port 0) in a background thread, for tests, configured as
`gpupool serve` configures its own (`server_config`) unless asked for uvicorn's defaults."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn


def config(app: Any, port: int, *, plain: bool = False, **options: Any) -> uvicorn.Config:
    """The gateway's own server configuration (`server_config`: its protocol, limits and the
    native proxy path; ``options``: its limits), or with ``plain`` uvicorn's defaults (every
    request through ASGI)."""
    if plain:
        return uvicorn.Config(app, log_level="warning", lifespan="on")
    from gpupool.adapters.http.server import server_config

    return server_config(app, host="127.0.0.1", port=port, lifespan="on", **options)


@contextlib.contextmanager
def running(app: Any, *, plain: bool = False, **options: Any) -> Iterator[str]:
    """``plain``: uvicorn's defaults instead of the gateway's server configuration; ``options``:
    `server_config`'s limits (header_timeout_s, keep_alive_s, max_connections)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(config(app, port, plain=plain, **options))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        t.join(10)
        sock.close()
