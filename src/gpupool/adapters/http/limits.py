"""`BodyLimit`: an ASGI middleware that caps request bodies per route family, answering 413.

Limits (bytes, configurable through `create_app`): `DEFAULT_MAX_BODY_BYTES` (1 MiB) for the lease,
admin and agent API; `DEFAULT_MAX_PROXY_BODY_BYTES` (32 MiB) for the OpenAI-compatible routes
(``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``).

Invariants: a request whose ``Content-Length`` exceeds its limit is answered 413 before its body is
read and before the application sees it; a chunked body is counted as it arrives and the request
is cut off (`BodyTooLarge`, a 413 through the app's exception handlers) once the count exceeds the limit, so
at most limit + one chunk is ever buffered. The 413 body has the route family's error shape.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException as StarletteHTTPException

from gpupool.adapters.http.errors import is_openai_path

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_MAX_PROXY_BODY_BYTES = 32 * 1024 * 1024

Scope = dict[str, Any]
Message = dict[str, Any]


class BodyTooLarge(StarletteHTTPException):
    """Raised from ``receive`` once a chunked body passes its limit; the app's handlers answer 413."""

    def __init__(self, path: str, limit: int) -> None:
        super().__init__(413, _text(path, limit))


class BodyLimit:
    def __init__(self, app: Any, *, max_body_bytes: int, max_proxy_body_bytes: int) -> None:
        for name, v in (("max_body_bytes", max_body_bytes), ("max_proxy_body_bytes", max_proxy_body_bytes)):
            if type(v) is not int or v < 1:
                raise ValueError(f"{name}={v!r}: must be a positive integer number of bytes")
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_proxy_body_bytes = max_proxy_body_bytes

    def limit_for(self, path: str) -> int:
        return self.max_proxy_body_bytes if is_openai_path(path) else self.max_body_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        limit = self.limit_for(path)
        chunked = False
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                try:
                    n = int(v)
                except ValueError:
                    n = -1
                if n > limit:
                    await _send_413(send, path, limit)
                    return
            elif k == b"transfer-encoding":
                chunked = True
        if not chunked:  # no body, or one the server's parser holds to its Content-Length
            await self.app(scope, receive, send)
            return
        seen = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal seen
            msg: Message = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(path, limit)
            return msg

        async def tracked_send(msg: Message) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            if not started:
                await _send_413(send, path, limit)


def _text(path: str, limit: int) -> str:
    return f"request body larger than {limit} bytes (the limit for {path})"


def body_413(path: str, limit: int) -> bytes:
    """The 413 body for ``path``: OpenAI's error shape on the proxy routes, the gateway's elsewhere."""
    text = _text(path, limit)
    if is_openai_path(path):
        doc: dict[str, Any] = {
            "error": {
                "message": text,
                "type": "invalid_request_error",
                "param": None,
                "code": "body_too_large",
            }
        }
    else:
        doc = {"error": text, "code": "body_too_large", "field": "body"}
    return json.dumps(doc).encode("utf-8")


async def _send_413(send: Any, path: str, limit: int) -> None:
    body = body_413(path, limit)
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
