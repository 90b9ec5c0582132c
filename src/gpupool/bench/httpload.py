"""Shared pieces of the HTTP benchmarks: free ports, waiting for servers, and a raw asyncio
HTTP/1.1 keep-alive load generator (the cheapest client we can write in Python, so that the
client costs as little as possible of the shared cores).

Invariants: every answer is counted, by status (``statuses``), whether or not it is the expected
one; a latency sample is taken only for expected answers after the warm-up; a connection that the
server closes is reopened and counted under status 0 rather than silently ending the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 60.0, what: str = "server") -> None:
    """Wait until ``url`` answers any HTTP status (the server is up) or ``proc`` exits."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=1.0):
                return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer {url} within {timeout_s:.0f} s")


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def runner() -> Callable[[Coroutine[Any, Any, Any]], Any]:
    with contextlib.suppress(ImportError):
        import uvloop

        return uvloop.run
    return asyncio.run


def request_bytes(method: str, path: str, body: bytes = b"", *, host: str, headers: dict[str, str]) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head += f"Content-Length: {len(body)}\r\n\r\n"
    return head.encode("latin-1") + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response framed by Content-Length or chunked transfer encoding."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = -1
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        name = name.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        parts: list[bytes] = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass
                return status, b"".join(parts)
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    return status, (await reader.readexactly(length) if length > 0 else b"")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


@dataclass
class LoadResult:
    latencies_s: list[float] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    duration_s: float = 0.0
    answers_with_warmup: int = 0

    @property
    def ok(self) -> int:
        return len(self.latencies_s)

    def summary(self) -> dict[str, Any]:
        other = {str(k): v for k, v in sorted(self.statuses.items()) if k != 200}
        return {
            "requests_per_s": round(self.ok / self.duration_s, 1) if self.duration_s else 0.0,
            "p50_ms": round(pct(self.latencies_s, 0.50) * 1000, 3),
            "p99_ms": round(pct(self.latencies_s, 0.99) * 1000, 3),
            "ok": self.ok,
            "non_200": sum(other.values()),
            "non_200_by_status": other,
        }


async def post_loop(
    port: int,
    path: str,
    body: bytes,
    headers: dict[str, str],
    *,
    clients: int,
    duration_s: float,
    warmup_s: float,
) -> LoadResult:
    """``clients`` keep-alive connections each POSTing ``body`` back to back for warm-up + duration.
    A 200 after the warm-up is one latency sample; every answer's status is counted."""
    res = LoadResult(duration_s=duration_s)
    host = f"127.0.0.1:{port}"
    req = request_bytes("POST", path, body, host=host, headers=headers)
    t_start = time.perf_counter() + warmup_s
    t_end = t_start + duration_s

    async def one() -> None:
        conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        try:
            while (t0 := time.perf_counter()) < t_end:
                if conn is None:
                    conn = await asyncio.open_connection("127.0.0.1", port)
                conn[1].write(req)
                try:
                    status, _ = await read_response(conn[0])
                except (asyncio.IncompleteReadError, ConnectionError):
                    conn[1].close()
                    conn = None
                    status = 0
                t1 = time.perf_counter()
                res.answers_with_warmup += 1
                if t0 >= t_start:
                    res.statuses[status] += 1
                    if status == 200:
                        res.latencies_s.append(t1 - t0)
        finally:
            if conn is not None:
                conn[1].close()

    await asyncio.gather(*(one() for _ in range(clients)))
    return res


def env_unbuffered() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def tree_cpu_s(pid: int) -> float | None:
    """User+system CPU seconds of ``pid`` and its live descendants (Linux ``/proc``; None elsewhere).

    CPU per request is the figure that survives a shared machine: wall-clock rates move with the
    other jobs on the cores, the CPU a server burns per request much less."""
    try:
        tick = os.sysconf("SC_CLK_TCK")
        kids: dict[int, list[int]] = {}
        stats: dict[int, tuple[int, int]] = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            kids.setdefault(int(fields[1]), []).append(int(d.name))
            stats[int(d.name)] = (int(fields[11]), int(fields[12]))
    except (OSError, ValueError):
        return None
    if pid not in stats:
        return None
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        u, s = stats.get(p, (0, 0))
        total += u + s
        todo.extend(kids.get(p, ()))
    return total / tick


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit (main thread only) so that a killed bench still runs its
    ``finally`` and stops the servers it started instead of orphaning them."""
    import signal
    import sys
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
