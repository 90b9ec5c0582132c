"""`ConnectionBound`: a mixin for the standard library's thread-per-connection servers
(``socketserver.ThreadingMixIn``: the scheduler extender's ``ThreadingHTTPServer``, the node agent's
``/metrics`` WSGI server) that serves at most ``max_connections`` connections at once.

Such a server starts a thread for every connection it accepts, so a client opening connections
(and sending nothing) grew threads and file descriptors without limit. With the mixin the
connection past the limit is answered at once from the accepting thread, with the subclass's
`busy_answer` (a 503 with ``Retry-After``), without waiting on the client (the answer fits the
socket's send buffer or is dropped), and closed; no thread is started for it.

Invariant: the number of handler threads (and of their sockets) never exceeds ``max_connections``;
a slot is taken before a thread starts and given back when it ends, or at once when none could start.
"""

from __future__ import annotations

import threading
from typing import Any


class ConnectionBound:
    """Put it first in the bases: ``class S(ConnectionBound, ThreadingHTTPServer)``."""

    max_connections: int = 64

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._open = 0
        self._open_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def busy_answer(self) -> bytes:
        """The whole HTTP answer sent to a connection past the limit."""
        body = f"busy: {self.max_connections} connections open; retry\n".encode()
        return (
            "HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Retry-After: 1\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + body

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            busy = self._open >= self.max_connections
            if not busy:
                self._open += 1
        if busy:
            try:
                request.setblocking(False)
                request.send(self.busy_answer())
            except OSError:
                pass
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        try:
            super().process_request(request, client_address)  # type: ignore[misc]
        except BaseException:  # no thread started (none could be): its slot is free again
            self._release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)  # type: ignore[misc]
        finally:
            self._release()

    def _release(self) -> None:
        with self._open_lock:
            self._open -= 1


__all__ = ["ConnectionBound"]
