"""A gateway that misbehaves, for the agent's robustness tests: a real HTTP server on 127.0.0.1 whose
``mode`` decides every answer.

- ``ok``: the agent protocol's happy path (readings, events, ``GET /v1/leases`` from `leases`,
  ``PUT`` slices), every request recorded in `requests`;
- ``deep``: a 200 whose JSON body nests deeper than any decoder recursion limit;
- ``list``: a 200 whose JSON body is a list where an object is expected;
- ``redirect``: a 302 back to the same path (a redirect loop, if followed);
- ``trickle``: a 200 announcing 100 MB that sends one byte every 50 ms, until the client leaves;
- ``huge``: a 200 with a 48 MiB body sent as fast as the client reads it;
- ``refuse``: a 422 naming a field, as the gateway refuses a request that will never pass;
- ``no-ledger``: as ``ok``, but ``GET /v1/leases`` answers 500.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

DEEP = b"[" * 100_000 + b"]" * 100_000


class HostileGateway:
    def __init__(self) -> None:
        self.mode = "ok"
        self.leases: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str]] = []
        self.events: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def count(self, method: str, path: str) -> int:
        with self.lock:
            return self.requests.count((method, path))

    def start(self) -> HostileGateway:
        gw = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                return

            def _answer(self, method: str) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with gw.lock:
                    gw.requests.append((method, self.path))
                mode = gw.mode
                if mode == "deep":
                    return self._send(200, DEEP)
                if mode == "list":
                    return self._send(200, b"[1, 2, 3]")
                if mode in ("trickle", "huge"):
                    return self._stream(trickle=mode == "trickle")
                if mode == "refuse":
                    return self._send(422, b'{"error": "no such GPU", "code": "invalid_input"}')
                if mode == "redirect":
                    return self._send(302, b"", location=self.path)
                if method == "GET" and self.path == "/v1/leases":
                    if mode == "no-ledger":
                        return self._send(500, b'{"error": "boom", "code": "internal"}')
                    return self._send(200, json.dumps({"leases": gw.leases}).encode())
                if method == "POST" and self.path.endswith("/events"):
                    with gw.lock:
                        gw.events.extend(json.loads(raw)["events"])
                if method in ("POST", "PUT"):
                    return self._send(200, b"{}")
                self._send(404, b'{"error": "no route", "code": "not_found"}')

            def _send(self, code: int, data: bytes, *, location: str = "") -> None:
                self.send_response(code)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, *, trickle: bool) -> None:
                size = 100_000_000 if trickle else 48 << 20
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(size))
                self.end_headers()
                chunk = b" " if trickle else b" " * (1 << 20)
                try:
                    for _ in range(size // len(chunk)):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        if trickle:
                            time.sleep(0.05)
                except OSError:  # the client gave up
                    return

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def do_PUT(self) -> None:
                self._answer("PUT")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
