"""Error responses of the gateway: one shape per route family, never a 5xx for bad input.

Lease/admin/agent routes answer ``{"error": text, "code": code, "field": dotted-path-or-null}``
(+ ``retry_after_s`` and a ``Retry-After`` header where retrying helps); the OpenAI-compatible
routes (`OPENAI_PREFIXES`) answer OpenAI's ``{"error": {"message", "type", "param", "code"}}``.

Invariants: texts carry values rendered as JSON (``kinds=["time-slice"]``, ``priority="P7"``), never
Python reprs; every text is made UTF-8-safe before encoding (a lone surrogate in a path parameter or
a value is shown escaped), so building an error response cannot itself fail. Malformed JSON and
bodies the bounded decoder (`gpupool.adapters.http.jsonbody`) refuses are 400 naming the field or
``body``; schema violations are 422 naming the field and the value received; a body sent with a
Content-Type that is not JSON (``text/plain``, a form) is 422 naming that Content-Type, not the bytes;
one sent with a ``Content-Encoding`` (the gateway decodes none) is 415 naming it (`unsupported_encoding`).
"""

from __future__ import annotations

import enum
import json
from inspect import isawaitable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from gpupool.adapters.http.jsonbody import JsonBodyError
from gpupool.core.errors import InvalidInput, UnknownId

OPENAI_PREFIXES = ("/v1/chat/", "/v1/completions", "/v1/embeddings", "/v1/models")
SHOW_MAX_CHARS = 120


def is_openai_path(path: str) -> bool:
    return path.startswith(OPENAI_PREFIXES)


def safe(text: str) -> str:
    """``text`` with lone surrogates shown as ``\\udXXX`` escapes, so it encodes to UTF-8."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def show(value: object) -> str:
    """A value as JSON text (enums by value, sets sorted), cut at `SHOW_MAX_CHARS` characters."""
    try:
        text = json.dumps(_plain(value), ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError):
        text = str(value)
    return clip(safe(text))


def unsupported_encoding(value: str | None) -> str | None:
    """The 415 text for a body sent with the ``Content-Encoding`` ``value`` (gzip, br, ...: the
    gateway decodes none), or None when there is none (absent, empty or ``identity``)."""
    if value is None or value.strip().lower() in ("", "identity"):
        return None
    return f"Content-Encoding {show(value)} is not supported: send the body uncompressed"


def clip(text: str) -> str:
    """``text`` cut at `SHOW_MAX_CHARS` characters (``...`` marks the cut): an error names what it
    got without echoing a megabyte a client sent."""
    return text if len(text) <= SHOW_MAX_CHARS else text[: SHOW_MAX_CHARS - 3] + "..."


def _plain(v: object) -> Any:
    if isinstance(v, enum.Enum):
        return _plain(v.value)
    if isinstance(v, set | frozenset):
        return sorted((_plain(x) for x in v), key=str)
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if v is None or isinstance(v, str | int | float | bool):
        return v
    return str(v)


class HttpError(Exception):
    """Raise from a handler or dependency to answer ``status`` in the lease API's error shape."""

    def __init__(
        self,
        status: int,
        msg: str,
        code: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(msg)
        self.status, self.msg, self.code, self.field, self.headers = status, msg, code, field, headers


class BadJson(StarletteHTTPException):
    """The bounded decoder refused a body (an HTTPException so FastAPI's body parsing re-raises it)."""

    def __init__(self, err: JsonBodyError) -> None:
        super().__init__(400, str(err))
        self.err = err


class BadEncoding(StarletteHTTPException):
    """A body sent with a content coding (`unsupported_encoding`'s text); an HTTPException like
    `BadJson`, so FastAPI's body parsing re-raises it."""

    def __init__(self, text: str) -> None:
        super().__init__(415, text)


def err(
    status: int, msg: str, code: str, *, field: str | None = None, retry: float | None = None
) -> JSONResponse:
    body: dict[str, Any] = {"error": safe(msg), "code": code}
    if field is not None:
        body["field"] = safe(field)
    headers = {}
    if retry is not None:
        body["retry_after_s"] = retry
        headers["Retry-After"] = str(max(1, round(retry)))
        headers["x-gpupool-dropped-reason"] = code
    return JSONResponse(body, status_code=status, headers=headers)


def openai_err(status: int, msg: str, code: str, *, param: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "api_error"
    body = {"error": {"message": safe(msg), "type": kind, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


def family_err(
    request: Request, status: int, msg: str, code: str, *, field: str | None = None
) -> JSONResponse:
    """`err` or `openai_err`, by the route family of ``request``'s path."""
    if is_openai_path(request.url.path):
        return openai_err(status, msg, code, param=field)
    return err(status, msg, code, field=field)


def invalid_input_text(exc: InvalidInput) -> str:
    return f"invalid {exc.field}={show(exc.value)}: {exc.reason}"


_HTTP_CODES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}


async def handled(request: Request, exc: Exception) -> Response:
    """The response of the app's exception handler for ``exc``, for the paths that answer below
    Starlette's ``ExceptionMiddleware`` (the lease API's and the proxy's fast paths, the native proxy
    path), chosen as that middleware chooses it: a status-code handler for an ``HTTPException``, else
    the first class of the exception's MRO that has one (``Exception`` and 500 belong to the
    server-error middleware above). Re-raises ``exc`` where there is none."""
    handlers: dict[Any, Any] = request.app.exception_handlers
    handler = handlers.get(exc.status_code) if isinstance(exc, StarletteHTTPException) else None
    if handler is None:
        handler = next((handlers[t] for t in type(exc).__mro__ if t in handlers and t is not Exception), None)
    if handler is None:
        raise exc
    out = handler(request, exc)
    response: Response = await out if isawaitable(out) else out
    return response


def install(app: FastAPI) -> None:
    """Register the exception handlers that give every error its family's shape."""

    @app.exception_handler(HttpError)
    async def http_error(_: Request, exc: HttpError) -> JSONResponse:
        r = err(exc.status, exc.msg, exc.code, field=exc.field)
        for k, v in (exc.headers or {}).items():
            r.headers[k] = v
        return r

    @app.exception_handler(BadJson)
    async def bad_json(request: Request, exc: BadJson) -> JSONResponse:
        e = exc.err
        text = e.problem if e.field == "body" else f"invalid {e}"
        return family_err(request, 400, text, "invalid_json", field=e.field)

    @app.exception_handler(BadEncoding)
    async def bad_encoding(request: Request, exc: BadEncoding) -> JSONResponse:
        return family_err(request, 415, exc.detail, "unsupported_content_encoding", field="content-encoding")

    @app.exception_handler(StarletteHTTPException)
    async def starlette_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "http_error")
        text = f"{request.method} {request.url.path}: {exc.detail}"
        r = family_err(request, exc.status_code, text, code, field="body" if exc.status_code == 413 else None)
        for k, v in (exc.headers or {}).items():
            r.headers[k] = v
        return r

    @app.exception_handler(InvalidInput)
    async def invalid(_: Request, exc: InvalidInput) -> JSONResponse:
        return err(422, invalid_input_text(exc), "invalid_input", field=exc.field)

    @app.exception_handler(UnknownId)
    async def unknown(_: Request, exc: UnknownId) -> JSONResponse:
        return err(404, f"unknown {exc.kind} {show(exc.value)}", "not_found")

    @app.exception_handler(RequestValidationError)
    async def bad_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        first = errs[0] if errs else {}
        loc = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        where = loc or "body"
        got = f"={show(first['input'])}" if "input" in first and first.get("type") != "missing" else ""
        msg = f"invalid {where}{got}: {first.get('msg', 'bad input')}"
        if where == "body" and isinstance(first.get("input"), bytes | bytearray):  # not parsed as JSON
            ctype = show(request.headers.get("content-type", ""))
            msg = f"invalid body: Content-Type {ctype} is not JSON (send Content-Type: application/json)"
        return JSONResponse(
            {"error": safe(msg), "code": "invalid_input", "field": safe(where), "detail": _jsonable(errs)},
            status_code=422,
        )


def _jsonable(errs: Any) -> Any:
    """Validation errors without the offending input (it may be NaN, huge or binary): loc, msg, type."""
    return [
        {
            "loc": [safe(str(x)) for x in e.get("loc", ())],
            "msg": safe(str(e.get("msg", ""))),
            "type": str(e.get("type", "")),
        }
        for e in errs
    ]
