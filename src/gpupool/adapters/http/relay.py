"""`Relay`: the body of a proxied stream, whose clean-up runs exactly once however the stream ends.

Role: the proxy (`proxy.forward`) hands a backend's streamed response to the client through it; the
native path (`native.NativeCycle._stream`) and the ASGI path (`proxy.ProxyFastPath`) both close it
when they are done with it, whether or not they ever asked for a chunk.

Invariant: ``finish`` (the proxy's: release the request lease, record the metrics) runs exactly once,
after the backend connection was closed (a response not read to its end is never pooled: the
backend sees its client go and, as vLLM does, aborts the request).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpupool.adapters.http.upstream import UpstreamResponse


class Relay:
    """The body of a proxied stream: the backend's chunks as they come, then ``finish`` (release the
    lease, record the metrics) exactly once, with the backend connection closed first, however the
    stream ends: its last chunk, a failure, or `aclose`. Why not an async generator with a
    ``finally``: a generator closed before its first chunk was asked for never runs its body, so a
    client that left before the response head (the native path then only closes the iterator)
    left the lease held until its TTL and the backend generating into an unread socket."""

    __slots__ = ("_chunks", "_closed", "_finish", "_on_chunk", "_upstream")

    def __init__(
        self, upstream: UpstreamResponse, on_chunk: Callable[[bytes], None], finish: Callable[[], None]
    ) -> None:
        self._upstream, self._on_chunk, self._finish = upstream, on_chunk, finish
        self._chunks: AsyncGenerator[bytes, None] = upstream.aiter_raw()
        self._closed = False

    def __aiter__(self) -> Relay:
        return self

    async def __anext__(self) -> bytes:
        try:
            chunk = await self._chunks.__anext__()
        except BaseException:  # the end (StopAsyncIteration), a failure or a cancel
            await self.aclose()
            raise
        self._on_chunk(chunk)
        return chunk

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._chunks.aclose()
        finally:
            try:
                await self._upstream.aclose()  # a response not read to its end closes the connection
            finally:
                self._finish()
