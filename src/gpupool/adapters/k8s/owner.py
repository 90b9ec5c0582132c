"""Who runs the extender's calls on the one `LeaseController`: the controller is single-threaded, the
extender's HTTP server, reconciler, preemptor and inventory loop are threads.

- `LockOwner`: the standalone extender (``gpupool extender``): one re-entrant lock around every call;
  a call that changed leases flushes them to the store before it returns (``controller.flush``).
- `LoopOwner`: ``gpupool serve --kubernetes``: the gateway's asyncio loop owns the controller, so each
  call is handed to that loop (``run_coroutine_threadsafe``) and runs between two of its handlers,
  never beside one. A write then waits for the gateway's group commit (``durable``), so bind answers
  only once its lease is in the store; a read only kicks the commit of whatever it changed (expiry).
  A call made on the loop's own thread runs inline (it cannot wait for its own loop).

Invariant: no two calls on one controller ever run at the same time, and a write returns only after
its changes are durable (or raises the store's error, the controller having undone them).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from gpupool.core.controller import LeaseController

T = TypeVar("T")


class Owner(Protocol):
    def read(self, fn: Callable[[], T]) -> T: ...

    def write(self, fn: Callable[[], T]) -> T: ...


class LockOwner:
    def __init__(self, controller: LeaseController) -> None:
        self.controller = controller
        self._lock = threading.RLock()

    def read(self, fn: Callable[[], T]) -> T:
        return self.write(fn)

    def write(self, fn: Callable[[], T]) -> T:
        with self._lock:
            out = fn()
            if self.controller.dirty:
                self.controller.flush()
            return out


class LoopOwner:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        durable: Callable[[], Awaitable[None]],
        kick: Callable[[], None],
    ) -> None:
        self.loop = loop
        self._durable = durable
        self._kick = kick
        self._thread: int | None = None
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here:
            self._thread = threading.get_ident()
        else:
            loop.call_soon_threadsafe(self._learn_thread)

    def _learn_thread(self) -> None:
        self._thread = threading.get_ident()

    def read(self, fn: Callable[[], T]) -> T:
        return self._call(fn, wait=False)

    def write(self, fn: Callable[[], T]) -> T:
        return self._call(fn, wait=True)

    def _call(self, fn: Callable[[], T], *, wait: bool) -> T:
        if threading.get_ident() == self._thread:
            out = fn()
            self._kick()
            return out

        async def run() -> T:
            out = fn()
            if wait:
                await self._durable()
            else:
                self._kick()
            return out

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result()
