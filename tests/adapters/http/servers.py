"""Real uvicorn servers on 127.0.0.1 for tests: `running`, on a free port in a background thread,
configured as `gpupool serve` configures its own (`server_config`) unless asked for uvicorn's
defaults; `served`, in the test's own event loop (one thread, as `gpupool serve` runs)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
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


@contextlib.asynccontextmanager
async def served(app: Any) -> AsyncIterator[str]:
    """``app`` behind `gpupool serve`'s own server (`uvicorn_server`) on a free loopback port, in the
    running event loop; yields the base URL once it serves, and stops the server on the way out."""
    from gpupool.cli.serving import free_port, uvicorn_server

    port = free_port()
    server = uvicorn_server(app, host="127.0.0.1", port=port)
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving
