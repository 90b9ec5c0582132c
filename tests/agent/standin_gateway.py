"""A stand-in gateway for the agent tests: a real HTTP server on 127.0.0.1 speaking the protocol of
`gpupool.agent.gateway_client`, with the gateway's own schemas (`gpupool.adapters.http.schemas`):

- ``POST /v1/nodes/{node}/readings``: the body is validated by ``ReadingsIn`` (422 naming the field
  otherwise), the reply has the real route's keys (``accepted``, ``signals``, ``paused_gpus``);
- ``POST /v1/nodes/{node}/events``: validated by ``NodeEventsIn``; can be switched off to mimic a
  gateway without it (404);
- ``GET /v1/leases``: every lease is a ``LeaseOut`` (the setter of `leases` validates them; build
  them with `lease_out`); ``DELETE /v1/leases/{id}`` answers the released ``LeaseOut``;
- errors are ``ErrorOut`` bodies; a wrong bearer token is a 401.

It records everything, and can be stopped and restarted on the same port to simulate an outage.
``tests/agent/test_standin_matches_gateway.py`` checks these routes and replies against the real app,
so a change of the gateway's protocol fails a test instead of leaving the agent tests green.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import ValidationError

from gpupool.adapters.http.schemas import ErrorOut, LeaseOut, NodeEventsIn, ReadingsIn
from gpupool.core.priority import band

ROUTES = {
    ("POST", "/v1/nodes/{node}/readings"),
    ("POST", "/v1/nodes/{node}/events"),
    ("GET", "/v1/leases"),
    ("DELETE", "/v1/leases/{lease_id}"),
}
"""What the stand-in serves (checked against the real app's routes)."""


def lease_out(
    lease_id: str, *, node: str, gpu_id: str, priority: int, vram_mib: int, **fields: Any
) -> dict[str, Any]:
    """A ``LeaseOut`` as the real ``GET /v1/leases`` returns it; ``fields`` override the defaults."""
    body: dict[str, Any] = {
        "id": lease_id,
        "state": "active",
        "tenant": "t",
        "priority": priority,
        "band": band(priority),
        "node": node,
        "slice_id": gpu_id,
        "gpu_id": gpu_id,
        "vram_mib": vram_mib,
        "compute_milli": 0,
        "grants": [{"slice_id": gpu_id, "gpu_id": gpu_id, "vram_mib": vram_mib, "compute_milli": 0}],
        "granted_at": 0.0,
        "expires_at": 1e9,
        "revision": 1,
    }
    body.update(fields)
    return LeaseOut.model_validate(body).model_dump()


def _error(msg: str, code: str, field: str | None = None) -> dict[str, Any]:
    return ErrorOut(error=msg, code=code, field=field).model_dump(exclude_none=True)


class StandinGateway:
    def __init__(self, token: str = "t0ken", *, events_route: bool = True) -> None:
        self.token = token
        self.events_route = events_route
        self.readings: list[dict[str, Any]] = []
        self.event_posts: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.gets: list[str] = []
        self._leases: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.port = 0
        self._server: ThreadingHTTPServer | None = None

    @property
    def leases(self) -> list[dict[str, Any]]:
        with self.lock:
            return list(self._leases)

    @leases.setter
    def leases(self, leases: list[dict[str, Any]]) -> None:
        checked = [LeaseOut.model_validate(x).model_dump() for x in leases]
        with self.lock:
            self._leases = checked

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        gw = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return

            def _authorised(self) -> bool:
                if self.headers.get("Authorization") != f"Bearer {gw.token}":
                    self._send(401, _error("missing or unknown bearer token", "unauthorized"))
                    return False
                return True

            def do_GET(self) -> None:
                if not self._authorised():
                    return
                with gw.lock:
                    gw.gets.append(self.path)
                if self.path != "/v1/leases":
                    self._send(404, _error(f"no route {self.path}", "not_found"))
                    return
                self._send(200, {"leases": gw.leases})

            def do_DELETE(self) -> None:
                if not self._authorised():
                    return
                lease_id = self.path.removeprefix("/v1/leases/")
                with gw.lock:
                    known = [x for x in gw._leases if x["id"] == lease_id]
                    gw.deleted.append(lease_id)
                    gw._leases = [x for x in gw._leases if x["id"] != lease_id]
                if known:
                    self._send(200, {**known[0], "state": "released"})
                else:
                    self._send(404, _error(f"unknown lease {lease_id!r}", "not_found"))

            def do_POST(self) -> None:
                if not self._authorised():
                    return
                parts = self.path.strip("/").split("/")
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                is_node = len(parts) == 4 and parts[:2] == ["v1", "nodes"]
                try:
                    if is_node and parts[3] == "readings":
                        readings = ReadingsIn.model_validate(body)
                        with gw.lock:
                            gw.readings.append(body)
                        self._send(200, {"accepted": len(readings.gpus), "signals": [], "paused_gpus": []})
                    elif is_node and parts[3] == "events" and gw.events_route:
                        events = NodeEventsIn.model_validate(body)
                        with gw.lock:
                            gw.event_posts.append(body)
                        self._send(200, {"accepted": len(events.events), "revoked": []})
                    else:
                        self._send(404, _error(f"no route {self.path}", "not_found"))
                except ValidationError as exc:
                    err = exc.errors()[0]
                    field = ".".join(str(x) for x in err["loc"])
                    self._send(422, _error(f"{field}: {err['msg']}", "invalid_input", field))

            def _send(self, code: int, obj: object) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [e for p in self.event_posts for e in p["events"]]
