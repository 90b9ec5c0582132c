"""Stand-in vLLM-style engines for the agent tests (real HTTP on 127.0.0.1): ``POST /sleep?level=``,
``POST /wake_up``, ``GET /is_sleeping``, ``POST /pause``, ``POST /resume``, ``GET /is_paused`` and a
``/metrics`` page with ``vllm:kv_cache_usage_perc`` / ``vllm:num_requests_waiting``. Records calls.
`TrickleEngine` and `HeldEngine` answer slowly (a byte at a time; not until released)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse


class LoopbackServer:
    """An HTTP server on 127.0.0.1 (a free port), serving from a daemon thread once constructed;
    subclasses set their state first, then call ``super().__init__()``, and give `_handler`."""

    def __init__(self) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        raise NotImplementedError

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing (the test output stays the test's)."""

    def log_message(self, format: str, *args: object) -> None:
        return


class HeldServer(LoopbackServer):
    """A `LoopbackServer` whose handlers hold their answers until `release` (closing releases:
    ``shutdown`` waits for the handlers)."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self._lock = threading.Lock()
        super().__init__()

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.release()
        super().close()


class StandinEngine(LoopbackServer):
    def __init__(self) -> None:
        self.sleeping = 0  # 0 awake, else the level
        self.paused = False
        self.kv_usage = 0.0
        self.waiting = 0
        self.calls: list[str] = []
        self.fail_sleep = False
        super().__init__()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        eng = self

        class H(QuietHandler):
            def _reply(self, code: int, body: object, ctype: str = "application/json") -> None:
                data = (json.dumps(body) if ctype == "application/json" else str(body)).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                path = urlparse(self.path).path
                if path == "/is_sleeping":
                    self._reply(200, {"is_sleeping": eng.sleeping > 0})
                elif path == "/is_paused":
                    self._reply(200, {"is_paused": eng.paused})
                elif path == "/metrics":
                    text = (
                        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
                        "# TYPE vllm:kv_cache_usage_perc gauge\n"
                        f'vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {eng.kv_usage}\n'
                        "# TYPE vllm:num_requests_waiting gauge\n"
                        f'vllm:num_requests_waiting{{engine="0",model_name="m"}} {eng.waiting}\n'
                        f'vllm:num_requests_running{{engine="0",model_name="m"}} 3.0\n'
                    )
                    self._reply(200, text, "text/plain; version=0.0.4")
                else:
                    self._reply(404, {"detail": "not found"})

            def do_POST(self) -> None:
                u = urlparse(self.path)
                q = parse_qs(u.query)
                eng.calls.append(u.path + (f"?{u.query}" if u.query else ""))
                if u.path == "/sleep":
                    if eng.fail_sleep:
                        self._reply(500, {"detail": "sleep mode not enabled"})
                        return
                    eng.sleeping = int(q.get("level", ["1"])[0])
                    self._reply(200, {})
                elif u.path == "/wake_up":
                    eng.sleeping = 0
                    self._reply(200, {})
                elif u.path == "/pause":
                    eng.paused = True
                    self._reply(200, {})
                elif u.path == "/resume":
                    eng.paused = False
                    self._reply(200, {})
                else:
                    self._reply(404, {"detail": "not found"})

        return H


class TrickleEngine(HeldServer):
    """An engine that accepts every request and answers it one byte per ``every_s`` (a 200 with a
    ``Content-Length`` it takes ``size`` bytes to reach), until `release`: then it ends each answer at
    once."""

    def __init__(self, *, every_s: float = 0.05, size: int = 10_000) -> None:
        self.every_s = every_s
        self.size = size
        self.requests = 0
        super().__init__()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        eng = self

        class H(QuietHandler):
            def do_GET(self) -> None:
                self._trickle()

            def do_POST(self) -> None:
                self._trickle()

            def _trickle(self) -> None:
                with eng._lock:
                    eng.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(eng.size))
                self.end_headers()
                try:
                    for sent in range(eng.size):
                        if eng.released.is_set():
                            self.wfile.write(b" " * (eng.size - sent))
                            return
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        eng.released.wait(eng.every_s)
                except OSError:  # the client hung up
                    return

        return H


class HeldEngine(HeldServer):
    """A ``/metrics`` page that blocks every request until `release`, then answers ``kv_usage``."""

    def __init__(self, kv_usage: float) -> None:
        self.kv_usage = kv_usage
        self.entered = threading.Event()
        self.held = 0
        """Requests now blocked in the handler."""
        super().__init__()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        eng = self

        class H(QuietHandler):
            def do_GET(self) -> None:
                with eng._lock:
                    eng.held += 1
                eng.entered.set()
                eng.released.wait()
                with eng._lock:
                    eng.held -= 1
                data = f'vllm:kv_cache_usage_perc{{model_name="m"}} {eng.kv_usage}\n'.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return H
