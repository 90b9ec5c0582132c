"""The ``--ray-address`` option of ``gpupool serve``: checked before anything is created.

Ray takes ``HOST:PORT`` (its GCS), ``ray://HOST:PORT`` (a Ray Client server), ``auto`` (the
cluster named by ``$RAY_ADDRESS`` or the last one started on this machine) and ``local`` (a new
one on this machine). `check_ray_address` refuses anything else, and a concrete address nothing
answers on, with one line naming the option and the value (exit 2), before the data directory,
the store or the admin token exist: Ray's own connect would otherwise fail only after the gateway
came up (``Invalid address format``), or wait minutes for a GCS that is not there.
`connect_error` words a failure of the connect itself (``auto`` with no cluster, a port that
answers but is not Ray's) the same way.
"""

from __future__ import annotations

import importlib.util
import re
import socket

from gpupool.cli.errors import UserError

OPTION = "--ray-address"
REACH_TIMEOUT_S = 5.0
KEYWORDS = ("auto", "local")

_HOST = r"(?P<host>[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
_ADDRESS = re.compile(rf"(?P<scheme>ray://)?{_HOST}:(?P<port>[0-9]{{1,5}})")
WANT = "expected HOST:PORT, ray://HOST:PORT, 'auto' or 'local'"


def check_ray_address(address: str | None, *, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """`UserError` naming ``--ray-address`` unless ``address`` is one Ray takes, Ray is installed,
    and (a concrete address) something accepts a TCP connection on HOST:PORT within ``timeout_s``.
    None or '' (the option not given: batch jobs run as local processes) passes."""
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
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise UserError(f"invalid {OPTION}={shown!r}: cannot reach {host}:{port}: {why}") from None


def connect_error(address: str, exc: BaseException) -> UserError:
    """Ray's failure to connect to ``address`` as one line naming the option."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UserError(f"invalid {OPTION}={address!r}: cannot connect to Ray: {reason}")
