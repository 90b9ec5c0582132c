"""The lease API's hot pair and the no-op pair that measures it: one handler each, two ways in.

Role: ``POST /v1/leases`` (acquire) and ``DELETE /v1/leases/{id}`` (release) are what every batch
job, model instance and benchmark client calls per use of a GPU; ``POST /v1/noop`` and ``DELETE
/v1/noop/{id}`` are the same requests with no core and no store (`gpupool bench gateway` compares
the two). The handlers live here (`acquire`, `release`, `noop_acquire`, `noop_release`); the FastAPI
routes in `app` call them, and so does `LeaseFastPath`, an ASGI middleware that answers these four
routes below FastAPI's routing, dependency solving and exception middleware. Why: profiled under
``gpupool bench gateway --store etcd`` (py-spy on ``gpupool serve``), FastAPI's and Starlette's own
frames were about 37 % of the server's CPU on the lease path, more than the core and the store.

Rule: the fast path answers only a request it can answer exactly as the route would, i.e. one whose
route, principal and body are certain: exact path (no ``root_path``), a ``Bearer`` token the token
table knows, for a POST a ``Content-Type`` whose media type is ``application/json`` (FastAPI's own
test, `email.message` style: the part before ``;``, stripped, lower-cased), no
``Content-Encoding``, and a non-empty body that the gateway's bounded decoder (`jsonbody.loads`,
unique keys) reads and `LeaseIn` validates. Every other request (no or unknown token, another
content type, an encoded or malformed body, one that does not validate, a disconnect while reading)
goes to the app below with the messages already read replayed first, so FastAPI gives its own
answer (the same 401/400/415/422 as without this path). Neither the token lookup nor the parse
changes anything, so a request handed on is processed exactly once.

An exception raised by a handler goes to the app's exception handlers as Starlette's
``ExceptionMiddleware`` would route it (`errors.handled`); one without a handler propagates to the
server-error middleware above (500), as from the route.

Invariants: a request is answered once, by this middleware or by the app below, never both; the
FastAPI routes stay registered (OpenAPI, ``/docs``, requests the fast path hands on).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response

from gpupool.adapters.http import jsonbody
from gpupool.adapters.http import schemas as s
from gpupool.adapters.http.auth import Principal
from gpupool.adapters.http.context import Gateway, forget_ticket
from gpupool.adapters.http.disconnect import done_or_gone
from gpupool.adapters.http.errors import handled
from gpupool.adapters.http.leasereq import build_request
from gpupool.adapters.http.views import FastJSONResponse, lease_json, outcome_response
from gpupool.core.outcome import OutcomeCode

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


# ---------------------------------------------------------------------- the handlers (both ways in)
async def acquire(gw: Gateway, body: s.LeaseIn, who: Principal, receive: Receive) -> Response:
    """``POST /v1/leases``: grant, queue (``wait_s`` long-polls the ticket) or refuse; answered once
    the change is durable. A client that hangs up while its ticket waits is never told it: the
    ticket is cancelled (and a lease granted meanwhile released), answer 499."""
    c = gw.controller
    out = c.acquire(build_request(gw, body, who), wait_s=body.queue_timeout_s, gpu_id=body.gpu_id or "")
    await gw.committer.durable()
    queued = out.code is OutcomeCode.QUEUED and out.ticket
    waits = queued and body.wait_s > 0 and c.ticket(str(out.ticket)).state == "queued"
    if waits and await done_or_gone(gw.hub.wait_ticket(str(out.ticket), body.wait_s), receive):
        forget_ticket(gw, str(out.ticket))  # the client hung up: it never learned the ticket
        return Response(status_code=499)  # (nobody reads it)
    return outcome_response(gw, out, who)


async def release(gw: Gateway, lease_id: str, who: Principal) -> Response:
    """``DELETE /v1/leases/{id}`` (idempotent): the lease as it ended, once that is durable."""
    out = gw.controller.release(lease_id, tenant=None if who.is_admin else who.tenant)
    await gw.committer.durable()
    assert out.lease is not None
    return FastJSONResponse(lease_json(gw, out.lease))


def noop_acquire(who: Principal) -> Response:
    """``POST /v1/noop``: the acquire's auth and body validation, no core, no store."""
    return FastJSONResponse({"id": "noop", "tenant": who.tenant}, status_code=201)


def noop_release(noop_id: str) -> Response:
    """``DELETE /v1/noop/{id}``: the release's auth, no core, no store."""
    return FastJSONResponse({"id": noop_id, "state": "released"})


# ---------------------------------------------------------------------- the fast path
_POSTS = {"/v1/leases": "lease", "/v1/noop": "noop"}
_DELETES = (("/v1/leases/", "lease"), ("/v1/noop/", "noop"))


class LeaseFastPath:
    """Pure ASGI middleware: the four routes above answered by their handlers directly when the
    request is certain (module docstring); everything else passes to ``app`` untouched."""

    def __init__(self, app: ASGIApp, *, gateway: Gateway) -> None:
        self.app, self.gw = app, gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            method, path = scope["method"], scope["path"]
            if method == "POST" and path in _POSTS:
                await self._post(_POSTS[path], scope, receive, send)
                return
            if method == "DELETE":
                for prefix, kind in _DELETES:
                    rest = path[len(prefix) :]
                    if path.startswith(prefix) and rest and "/" not in rest:
                        await self._delete(kind, rest, scope, receive, send)
                        return
        await self.app(scope, receive, send)

    async def _delete(self, kind: str, item: str, scope: Scope, receive: Receive, send: Send) -> None:
        auth, _, _ = _heads(scope)
        who = self._principal(auth)
        if who is None:
            await self.app(scope, receive, send)
            return
        if kind == "noop":
            response = noop_release(item)
        else:
            try:
                response = await release(self.gw, item, who)
            except Exception as exc:
                response = await handled(Request(scope, receive), exc)
        await response(scope, receive, send)

    async def _post(self, kind: str, scope: Scope, receive: Receive, send: Send) -> None:
        auth, ctype, encoded = _heads(scope)
        who = self._principal(auth)
        if who is None or encoded or not _is_json(ctype):
            await self.app(scope, receive, send)
            return
        read: list[Message] = []
        body = await _body(receive, read)
        lease_in = _lease_in(body) if body else None
        if lease_in is None:
            await self.app(scope, _replay(read, receive), send)
            return
        if kind == "noop":
            response = noop_acquire(who)
        else:
            try:
                response = await acquire(self.gw, lease_in, who, receive)
            except Exception as exc:
                response = await handled(Request(scope, receive), exc)
        await response(scope, receive, send)

    def _principal(self, auth: str | None) -> Principal | None:
        """`app.current_principal`'s accepting case; None where it would refuse."""
        if auth is None or not auth.lower().startswith("bearer "):
            return None
        return self.gw.tokens.lookup(auth[7:].strip())


def _heads(scope: Scope) -> tuple[str | None, str | None, bool]:
    """The first ``Authorization`` and ``Content-Type`` values (as Starlette's ``Headers.get``) and
    whether any ``Content-Encoding`` was sent."""
    auth = ctype = None
    encoded = False
    for k, v in scope["headers"]:
        name = k.lower()
        if name == b"authorization":
            if auth is None:
                auth = v.decode("latin-1")
        elif name == b"content-type":
            if ctype is None:
                ctype = v.decode("latin-1")
        elif name == b"content-encoding":
            encoded = True
    return auth, ctype, encoded


def _is_json(ctype: str | None) -> bool:
    """FastAPI reads a body as JSON when the media type is ``application/json`` (among others)."""
    return ctype is not None and ctype.split(";", 1)[0].strip().lower() == "application/json"


async def _body(receive: Receive, read: list[Message]) -> bytes:
    """The whole body; every message taken is kept in ``read`` (to replay). ``b""`` on a
    disconnect (the request is then handed on and fails there as it would have)."""
    chunks: list[bytes] = []
    while True:
        msg = await receive()
        read.append(msg)
        if msg["type"] != "http.request":
            return b""
        chunks.append(msg.get("body", b""))
        if not msg.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _lease_in(body: bytes) -> s.LeaseIn | None:
    """The validated body, or None for anything the route would answer otherwise (it is then
    handed on, and the route's own decoder and validation give their answer)."""
    try:
        return s.LeaseIn.model_validate(jsonbody.loads(body, unique_keys=True))
    except (jsonbody.JsonBodyError, ValidationError, ValueError, RecursionError):
        return None


def _replay(read: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that gives the messages already taken, in order, then the connection's own."""
    pending = list(read)

    async def again() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return again
