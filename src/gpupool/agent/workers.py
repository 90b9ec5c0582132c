"""`KeyedPool`: the agent's worker threads, where the calls that share a key (an engine's address) run
one at a time.

Role: slow pauser calls (HTTP to an engine, cuda-checkpoint) run off the tick thread on a few workers.
An engine that answers slowly must not take all of them and stall the other engines' pauses, wakes
and evictions: the calls to one engine queue here, without a thread, behind the one in flight.

Invariants:
- At most one call per key runs at a time; calls with the same key start in submission order. A call
  without a key (None or '') runs as soon as a worker is free.
- Every `submit` returns a future that completes exactly once with the call's result or exception;
  after `shutdown` a queued call completes with `RuntimeError` instead of running.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit


def engine_key(endpoint: str) -> str:
    """The address that calls to ``endpoint`` share (``scheme://host:port``); '' when it has none."""
    if not endpoint.startswith(("http://", "https://")):
        return ""
    try:
        u = urlsplit(endpoint)
    except ValueError:
        return ""
    return f"{u.scheme}://{u.netloc.lower()}"


class KeyedPool:
    def __init__(self, workers: int, *, name: str = "gpupool-pauser") -> None:
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._queued: dict[str, deque[tuple[Callable[[], Any], Future[Any]]]] = {}
        """Key -> the calls waiting behind the one in flight (a key is present while one runs)."""

    def submit(self, fn: Callable[[], Any], key: str = "") -> Future[Any]:
        if not key:
            return self._pool.submit(fn)
        out: Future[Any] = Future()
        with self._lock:
            waiting = self._queued.get(key)
            if waiting is not None:
                waiting.append((fn, out))
                return out
            self._queued[key] = deque()
        self._run(key, fn, out)
        return out

    def _run(self, key: str, fn: Callable[[], Any], out: Future[Any]) -> None:
        try:
            inner = self._pool.submit(fn)
        except RuntimeError as exc:  # shut down
            self._finish(key, out, None, exc)
            return
        inner.add_done_callback(lambda f: self._finish(key, out, f, None))

    def _finish(
        self, key: str, out: Future[Any], done: Future[Any] | None, exc: BaseException | None
    ) -> None:
        if done is not None:
            exc = done.exception()
        if exc is not None:
            out.set_exception(exc)
        else:
            assert done is not None
            out.set_result(done.result())
        with self._lock:
            waiting = self._queued[key]
            if not waiting:
                del self._queued[key]
                return
            fn, nxt = waiting.popleft()
        self._run(key, fn, nxt)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


__all__ = ["KeyedPool", "engine_key"]
