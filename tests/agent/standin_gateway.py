"""A stand-in gateway for the agent tests: a real HTTP server on 127.0.0.1 that implements
``POST /v1/nodes/{node}/readings`` as described in `gpupool.agent.gateway_client`, records every
post, checks the bearer token and answers with a lease list the test sets. It can be stopped and
restarted on the same port to simulate an outage."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class StandinGateway:
    def __init__(self, token: str = "t0ken") -> None:
        self.token = token
        self.posts: list[dict[str, Any]] = []
        self.leases: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        gw = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return

            def do_POST(self) -> None:
                if self.headers.get("Authorization") != f"Bearer {gw.token}":
                    self._send(401, {"detail": "bad token"})
                    return
                parts = self.path.strip("/").split("/")
                if len(parts) != 4 or parts[:2] != ["v1", "nodes"] or parts[3] != "readings":
                    self._send(404, {"detail": "not found"})
                    return
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                if body.get("node") != parts[2]:
                    self._send(400, {"detail": "node mismatch"})
                    return
                with gw.lock:
                    gw.posts.append(body)
                    leases = list(gw.leases)
                self._send(200, {"leases": leases})

            def _send(self, code: int, obj: object) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def events(self) -> list[dict[str, Any]]:
        with self.lock:
            return [e for p in self.posts for e in p["events"]]
