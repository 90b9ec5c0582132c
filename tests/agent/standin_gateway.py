"""A stand-in gateway for the agent tests: a real HTTP server on 127.0.0.1 speaking the protocol of
`gpupool.agent.gateway_client` -- ``POST /v1/nodes/{node}/readings`` (strict: only the gateway's
``ReadingsIn`` fields), ``POST /v1/nodes/{node}/events`` (can be switched off to mimic a gateway
without it), ``GET /v1/leases`` and ``DELETE /v1/leases/{id}``. It records everything, checks the
bearer token, and can be stopped and restarted on the same port to simulate an outage."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

GPU_FIELDS = {"gpu_id", "vram_used_mib", "vram_total_mib", "temperature_c", "util_pct", "health", "xids"}


class StandinGateway:
    def __init__(self, token: str = "t0ken", *, events_route: bool = True) -> None:
        self.token = token
        self.events_route = events_route
        self.readings: list[dict[str, Any]] = []
        self.event_posts: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.leases: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.port = 0
        self._server: ThreadingHTTPServer | None = None

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
                    self._send(401, {"detail": "bad token"})
                    return False
                return True

            def do_GET(self) -> None:
                if not self._authorised():
                    return
                if self.path != "/v1/leases":
                    self._send(404, {"detail": "not found"})
                    return
                with gw.lock:
                    self._send(200, {"leases": list(gw.leases)})

            def do_DELETE(self) -> None:
                if not self._authorised():
                    return
                lease_id = self.path.removeprefix("/v1/leases/")
                with gw.lock:
                    known = [x for x in gw.leases if x["id"] == lease_id]
                    gw.deleted.append(lease_id)
                    gw.leases = [x for x in gw.leases if x["id"] != lease_id]
                self._send(200 if known else 404, {"id": lease_id, "state": "released"})

            def do_POST(self) -> None:
                if not self._authorised():
                    return
                parts = self.path.strip("/").split("/")
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                if len(parts) == 4 and parts[:2] == ["v1", "nodes"] and parts[3] == "readings":
                    extra = set(body) - {"gpus"} or {k for g in body["gpus"] for k in g} - GPU_FIELDS
                    if extra:
                        self._send(422, {"field": sorted(extra)[0]})
                        return
                    with gw.lock:
                        gw.readings.append(body)
                    self._send(200, {"accepted": len(body["gpus"]), "signals": [], "paused_gpus": []})
                elif (
                    len(parts) == 4
                    and parts[:2] == ["v1", "nodes"]
                    and parts[3] == "events"
                    and gw.events_route
                ):
                    with gw.lock:
                        gw.event_posts.append(body)
                    self._send(200, {"accepted": len(body["events"])})
                else:
                    self._send(404, {"detail": "not found"})

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
