"""Knowing when the client of a request has hung up, for handlers that wait on something else.

Role: uvicorn does not cancel a handler whose client disconnected; it answers the handler's next
``receive`` with ``http.disconnect``. Once the request body has been read, ``receive`` has nothing
else to give, so waiting on it is waiting for the hang-up. `disconnected` is that wait;
`done_or_gone` races it against the handler's own wait (a forward to the leader, a ticket's grant).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

Receive = Callable[[], Awaitable[Any]]


async def disconnected(receive: Receive) -> None:
    """Return once the client has gone (the request body was read before this is started)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def done_or_gone(wait: Coroutine[Any, Any, None], receive: Receive) -> bool:
    """Run ``wait``; True when the client hung up first (then ``wait`` is cancelled)."""
    waiter, watcher = asyncio.ensure_future(wait), asyncio.ensure_future(disconnected(receive))
    try:
        await asyncio.wait((waiter, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        waiter.cancel()
    if watcher.done() and not watcher.cancelled():
        watcher.exception()  # (retrieved: a receive that failed means the connection is gone too)
        return True
    return False
