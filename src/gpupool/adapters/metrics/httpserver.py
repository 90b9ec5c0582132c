"""`bounded_server_class`: the node agent's ``/metrics`` HTTP server, a thread per connection with
bounds on what clients can hold.

prometheus_client's threading WSGI server starts a thread for every connection and reads without a
timeout, so each connection that sends nothing (or half a request) held a thread and a file
descriptor for ever, and a client opening connections grew both without limit. Here:

- `MAX_CONNECTIONS` (64): at most this many connections are served at once; the next one is
  answered 503 (``Retry-After: 1``) from the accepting thread, which never waits on it, and closed
  (`gpupool.adapters.boundedserver.ConnectionBound`);
- `IDLE_TIMEOUT_S` (10 s): a read that waits longer than this closes the connection (a request
  stalled before its head is complete, or a connection that sends nothing).

Invariant: the number of handler threads (and of their sockets) never exceeds ``max_connections``.
A scrape is one short request per connection (HTTP/1.0), so Prometheus needs one slot per target.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.exposition import ThreadingWSGIServer

from gpupool.adapters.boundedserver import ConnectionBound

MAX_CONNECTIONS = 64
IDLE_TIMEOUT_S = 10.0


def bounded_server_class(family: int, *, max_connections: int = MAX_CONNECTIONS) -> type[ThreadingWSGIServer]:
    """A ``ThreadingWSGIServer`` subclass for address ``family`` serving at most ``max_connections``
    connections at once (the handler class sets the read timeout: its ``timeout`` attribute)."""
    if type(max_connections) is not int or max_connections < 1:
        raise ValueError(f"max_connections={max_connections!r}: must be an integer >= 1")

    class BoundedMetricsServer(ConnectionBound, ThreadingWSGIServer):
        address_family = family

        def handle_error(self, request: Any, client_address: Any) -> None:
            """A client that timed out or went away is not the server's error: nothing to print."""

    BoundedMetricsServer.max_connections = max_connections
    return BoundedMetricsServer
