"""`ShareLoop` (a proxy replica's share calls) against a stand-in leader on loopback: cancelling its
task always ends it, whatever step of a share call the cancellation lands on (a lost cancellation
left a replica unable to stop: on SIGTERM, or after its port failed to bind)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time

from gpupool.adapters.http.replica import ShareLoop
from gpupool.core.clock import FunctionClock
from gpupool.core.replica import ProxyReplica

ANSWER = json.dumps({"seq": 1, "ttl_s": 3.0, "backends": {}, "shares": {}}).encode()
STEPS = 40
"""Event-loop steps swept between the leader's answer and the cancellation."""


async def _cancel_after(steps: int) -> bool:
    """Run a share loop against a leader that answers at once; ``steps`` loop steps after the
    leader wrote its answer, cancel the loop's task. True when the task then ended."""
    answered = asyncio.Event()

    async def leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                request = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
                length = int(request.split("content-length:")[1].split("\r\n")[0])
                await reader.readexactly(length)
                writer.write(head + str(len(ANSWER)).encode() + b"\r\n\r\n" + ANSWER)
                answered.set()

    server = await asyncio.start_server(leader, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    ids = (f"id-{n}" for n in itertools.count())
    core = ProxyReplica(clock=FunctionClock(time.monotonic), lease_ids=ids.__next__, ticket_ids=ids.__next__)
    loop = ShareLoop(core, leader_url=f"http://127.0.0.1:{port}", token="t", replica="r", ttl_s=3.0)
    task = asyncio.create_task(loop.run())
    try:
        await answered.wait()
        for _ in range(steps):
            await asyncio.sleep(0)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5.0)  # a hang detector, not a timing bound
        return task in done
    finally:
        task.cancel()
        server.close()
        await loop.pool.aclose()


def test_cancelling_the_share_loop_ends_it_at_every_step_of_a_call() -> None:
    async def sweep() -> list[int]:
        return [steps for steps in range(STEPS) if not await _cancel_after(steps)]

    assert asyncio.run(sweep()) == []


async def _one_call(status: str, body: bytes) -> ShareLoop:
    """One share call to a leader that answers ``status`` with ``body``."""

    async def leader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        await reader.readexactly(int(request.split("content-length:")[1].split("\r\n")[0]))
        writer.write(f"HTTP/1.1 {status}\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body)
        await writer.drain()

    server = await asyncio.start_server(leader, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    ids = (f"id-{n}" for n in itertools.count())
    core = ProxyReplica(clock=FunctionClock(time.monotonic), lease_ids=ids.__next__, ticket_ids=ids.__next__)
    loop = ShareLoop(core, leader_url=f"http://127.0.0.1:{port}", token="t", replica="r", ttl_s=3.0)
    try:
        assert not await loop.call()
    finally:
        server.close()
        await loop.pool.aclose()
    return loop


def test_a_refused_or_failed_share_call_is_one_line_of_text_not_a_bytes_repr() -> None:
    refused = asyncio.run(
        _one_call("401 Unauthorized", b'{"error":"invalid token","code":"unauthenticated"}')
    )
    assert (refused.last_error, refused.refused) == ("HTTP 401: invalid token", "HTTP 401: invalid token")
    failed = asyncio.run(_one_call("502 Bad Gateway", b"<html>\n  upstream\n  down</html>"))
    assert (failed.last_error, failed.refused) == ("HTTP 502: <html> upstream down</html>", "")
