"""The ``--ray-address`` option of ``gpupool serve``: checked before anything is created.

Ray takes ``HOST:PORT`` (its GCS), ``ray://HOST:PORT`` (a Ray Client server), ``auto`` (the
cluster named by ``$RAY_ADDRESS`` or the last one started on this machine) and ``local`` (a new
one on this machine). `check_ray_address` refuses anything else, a concrete address nothing
answers on, and one whose port accepts the connection but does not speak gRPC (Ray's GCS and its
Ray Client server both do: they answer an HTTP/2 preface with a SETTINGS frame), with one line
naming the option and the value (exit 2), before the data directory, the store or the admin token
exist. The whole check is bounded by ``REACH_TIMEOUT_S``: Ray's own connect would otherwise fail
only after the gateway came up (``Invalid address format``), or retry for many minutes against a
GCS that is not there or a port that never answers. With ``RAY_USE_TLS`` on, the gRPC answer is
not checked (the port speaks TLS first): only that it accepts a connection.
`connect` makes the connection (`ray.init`) and words its failure (``auto`` with no cluster, a
server that speaks gRPC but is not Ray) the same way; `gpupool serve` calls it once every option
is checked but still before the data directory is touched, so a refused address changes nothing.
The connect has a deadline too (`CONNECT_TIMEOUT_S`; `LOCAL_START_TIMEOUT_S` for ``local``, which
starts a cluster): against a gRPC server that is not Ray (or a GCS Ray cannot reach: it dials the
node's IP address for ``127.0.0.1``) `ray.init` retries without end, in native code that cannot be
interrupted. A watchdog thread then prints the one line and ends the process at once (exit 2,
`os._exit`: nothing was created yet, and no thread of Ray's can keep it alive). While it connects,
the native log lines Ray writes to standard error (a warning a second while it retries) are held
back: shown after a successful connect, dropped when it is refused (the one line says why).
Ctrl-C (or SIGTERM) while it connects ends the process at once too: Python runs a signal's handler
only when the main thread is back in Python, which `ray.init` delays until it gives up, so the
signal's number also goes to a pipe (`signal.set_wakeup_fd`, written by the C-level handler) that
the watchdog waits on; it prints one line and exits 128 + the signal's number.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import select
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

from gpupool.cli.errors import EXIT_BAD_INPUT, UserError, error_line

OPTION = "--ray-address"
REACH_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 30.0
"""The deadline of `ray.init` to a running cluster (Ray itself gives up on a reachable gRPC server
that is not Ray after about 20 s, and retries for ever when it cannot reach it)."""
LOCAL_START_TIMEOUT_S = 120.0
"""The deadline of ``local``: `ray.init` starts a cluster on this machine first."""
KEYWORDS = ("auto", "local")

_HOST = r"(?P<host>[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
_ADDRESS = re.compile(rf"(?P<scheme>ray://)?{_HOST}:(?P<port>[0-9]{{1,5}})")
WANT = "expected HOST:PORT, ray://HOST:PORT, 'auto' or 'local'"
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")
"""The HTTP/2 client connection preface followed by an empty SETTINGS frame (RFC 9113 3.4)."""
FRAME_HEADER_BYTES = 9
SETTINGS_FRAME = 0x4


def check_ray_address(address: str | None, *, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """`UserError` naming ``--ray-address`` unless ``address`` is one Ray takes, Ray is installed,
    and (a concrete address) something on HOST:PORT accepts a TCP connection and answers as a gRPC
    server, all within ``timeout_s``. None or '' (the option not given: batch jobs run as local
    processes) passes."""
    if not address:
        return
    shown = address if len(address) <= 80 else address[:77] + "..."
    if importlib.util.find_spec("ray") is None:
        raise UserError(f"{OPTION} needs Ray: pip install 'gpupool[ray]'")
    if address in KEYWORDS:
        return
    m = _ADDRESS.fullmatch(address)
    if m is None:
        raise UserError(f"invalid {OPTION}={shown!r}: {WANT}")
    port = int(m["port"])
    if not 1 <= port <= 65535:
        raise UserError(f"invalid {OPTION}={shown!r}: port must be in [1, 65535]")
    host = m["host"].strip("[]")
    deadline = time.monotonic() + timeout_s
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
                return
            why = _not_grpc(sock, deadline, timeout_s)
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise UserError(f"invalid {OPTION}={shown!r}: cannot reach {host}:{port}: {why}") from None
    if why:
        raise UserError(f"invalid {OPTION}={shown!r}: {host}:{port} is not Ray: {why}")


def _not_grpc(sock: socket.socket, deadline: float, timeout_s: float) -> str | None:
    """Why the server on ``sock`` is not a gRPC (HTTP/2) server, or None when its first frame is
    a SETTINGS frame; reads until ``deadline`` at most (a port that never answers)."""
    sock.sendall(HTTP2_PREFACE)
    head = b""
    while len(head) < FRAME_HEADER_BYTES:
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            return f"no gRPC answer within {timeout_s:g} s"
        sock.settimeout(left_s)
        try:
            chunk = sock.recv(FRAME_HEADER_BYTES - len(head))
        except TimeoutError:
            return f"no gRPC answer within {timeout_s:g} s"
        if not chunk:
            return "it closed the connection without a gRPC answer"
        head += chunk
    if head[3] != SETTINGS_FRAME:
        return f"it does not answer as a gRPC server (first bytes {head[:FRAME_HEADER_BYTES]!r})"
    return None


def connect(address: str, *, timeout_s: float | None = None) -> Any:
    """A `RayExecutor` connected to ``address``, or `connect_error`'s `UserError`; past
    ``timeout_s`` (default `CONNECT_TIMEOUT_S`, `LOCAL_START_TIMEOUT_S` for ``local``) the process
    ends with one line naming the option, exit 2 (see the module docstring)."""
    from gpupool.adapters.batch.ray_executor import RayExecutor

    if timeout_s is None:
        timeout_s = LOCAL_START_TIMEOUT_S if address == "local" else CONNECT_TIMEOUT_S
    late = error_line(
        f"invalid {OPTION}={address!r}: cannot connect to Ray: no Ray cluster answered within "
        f"{timeout_s:g} s (is it a Ray GCS or Ray Client address, reachable at this machine's IP address?)"
    )
    stopped = error_line(f"{OPTION}={address!r}: stopped while connecting to Ray; nothing was started")
    done = threading.Event()
    with _stderr_held() as real_stderr_fd, _signals_to_pipe() as wake:
        watchdog = threading.Thread(
            target=_exit_unless,
            args=(done, timeout_s, real_stderr_fd, (late, stopped), wake),
            name="ray-deadline",
            daemon=True,
        )
        watchdog.start()
        try:
            return RayExecutor(address)
        except Exception as exc:  # (ray's refusal: RuntimeError, ValueError, ConnectionError ...)
            raise connect_error(address, exc) from None
        finally:
            done.set()
            with contextlib.suppress(OSError):
                os.write(wake[1], b"\0")  # (0 is no signal: it only wakes the watchdog)
            watchdog.join()


@contextlib.contextmanager
def _signals_to_pipe() -> Iterator[tuple[int, int]]:
    """Inside: the number of each signal that arrives is also written to a pipe (read end, write
    end) by Python's C-level handler, even while the main thread is in native code. Outside the
    main thread (tests calling `connect` from a worker) the pipe only carries the wake-up."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        previous = None
    try:
        yield r, w
    finally:
        if previous is not None:
            signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)


def _exit_unless(
    done: threading.Event, timeout_s: float, fd: int, lines: tuple[str, str], wake: tuple[int, int]
) -> None:
    """The watchdog: unless ``done`` is set within ``timeout_s``, write ``lines[0]`` to ``fd`` (the
    real standard error) and end the process, exit 2; on SIGINT/SIGTERM before that, ``lines[1]``
    and exit 128 + the signal's number."""
    deadline = time.monotonic() + timeout_s
    code, line = EXIT_BAD_INPUT, lines[0]
    while (left := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([wake[0]], [], [], left)
        if done.is_set():
            return
        if ready:
            got = [b for b in os.read(wake[0], 64) if b in (signal.SIGINT, signal.SIGTERM)]
            if got:
                code, line = 128 + got[0], lines[1]
                break
    if done.is_set():
        return
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
    os.write(fd, (line + "\n").encode())
    os._exit(code)


@contextlib.contextmanager
def _stderr_held() -> Iterator[int]:
    """Inside: file descriptor 2 (Ray's native logs and Python's ``sys.stderr`` alike) goes to a
    temporary file; yields a duplicate of the real standard error. On a normal exit what was held
    is written to the real one; on an exception it is dropped."""
    sys.stderr.flush()
    real = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        shown = False
        try:
            yield real
            shown = True
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(real, 2)
            os.close(real)
            if shown:
                held.seek(0)
                data = held.read()
                while data:
                    data = data[os.write(2, data) :]


def connect_error(address: str, exc: BaseException) -> UserError:
    """Ray's failure to connect to ``address`` as one line naming the option."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UserError(f"invalid {OPTION}={address!r}: cannot connect to Ray: {reason}")
