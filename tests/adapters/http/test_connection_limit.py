"""The gateway's connection limit (`server_config`'s ``max_connections``, uvicorn's
``limit_concurrency``): past it a request is answered 503 at once, in its route family's error shape
and with ``Retry-After``, so a client (the `openai` SDK among them) can read why and when to retry."""

from __future__ import annotations

import contextlib
import socket
import time
from typing import Any

import httpx
import openai

from tests.adapters.http.servers import running

LIMIT = 2


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _fill(url: str) -> list[socket.socket]:
    """Open ``LIMIT`` idle connections (they count towards the limit) and wait until they do."""
    host, port = url.removeprefix("http://").split(":")
    socks = [socket.create_connection((host, int(port)), timeout=10) for _ in range(LIMIT)]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until the server has accepted them all
        if httpx.get(url + "/x", timeout=10).status_code == 503:
            return socks
        time.sleep(0.05)
    raise AssertionError("the connection limit was never reached")


def test_past_the_connection_limit_the_503_has_retry_after_and_the_family_error_shape() -> None:
    # Before: uvicorn's own answer, text/plain "Service Unavailable" with no Retry-After: the SDK
    # raised InternalServerError with no message and retried on its own schedule.
    with running(_app, max_connections=LIMIT) as url:
        socks = _fill(url)
        try:
            r = httpx.post(url + "/v1/chat/completions", json={"model": "m"}, timeout=10)
            assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["code"] == "overloaded"
            assert "max-connections" in err["message"]
            r = httpx.get(url + "/v1/leases", timeout=10)
            assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
            assert r.json()["code"] == "overloaded" and "max-connections" in r.json()["error"]
            sdk = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=10)
            try:
                sdk.models.list()
            except openai.InternalServerError as exc:
                assert exc.status_code == 503 and exc.code == "overloaded"
                assert "max-connections" in exc.message
            else:
                raise AssertionError("no 503")
        finally:
            for s in socks:
                with contextlib.suppress(OSError):
                    s.close()
