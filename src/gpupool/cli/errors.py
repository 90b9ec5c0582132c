"""One place that turns expected user errors into a one-line message and exit code 2 (no traceback).

Also the shared checks of numeric, URL, token, domain and log-level options (`check_port`,
`check_range`, `check_url`, `check_token`, `check_domain`, `check_log_level`):
commands call them first, before opening a store or binding a socket, so a bad value changes
nothing. Messages name the option and the value: ``invalid --port=70000: must be in [0, 65535]``,
``invalid --gateway='http://gw:abc': Port could not be cast to integer value as 'abc'``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import ParamSpec, TypeVar
from urllib.parse import urlsplit

import typer

from gpupool.core.errors import GpupoolError, InvalidInput

P = ParamSpec("P")
R = TypeVar("R")

EXIT_BAD_INPUT = 2


class UserError(Exception):
    """Raised by CLI code for bad input that is not a core error (missing file, malformed YAML)."""


def check_range(
    option: str, value: float, *, lo: float | None = None, hi: float | None = None, lo_open: bool = False
) -> None:
    """`UserError` unless ``value`` is a finite number in [lo, hi] (``lo_open``: in (lo, hi])."""
    bad = not math.isfinite(value)
    if lo is not None:
        bad = bad or value < lo or (lo_open and value == lo)
    if hi is not None:
        bad = bad or value > hi
    if not bad:
        return
    if lo is not None and hi is not None:
        want = f"in {'(' if lo_open else '['}{_num(lo)}, {_num(hi)}]"
    elif lo is not None:
        want = f"{'>' if lo_open else '>='} {_num(lo)}"
    else:
        want = f"<= {_num(hi)}"
    raise UserError(f"invalid {option}={_num(value)}: must be {want}")


def ensure_dir(option: str, path: Path, *, create: bool = True) -> Path:
    """``path`` as a directory (``--data-dir``, ``--out``, ...): `UserError` naming ``option`` when
    it is a file; with ``create``, made with its parents, the same error when that fails."""
    if path.exists() and not path.is_dir():
        raise UserError(f"invalid {option}={str(path)!r}: not a directory")
    if not create:
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"invalid {option}={str(path)!r}: cannot create it: {exc.strerror or exc}") from None
    return path


def _num(value: float | None) -> str:
    return str(value) if isinstance(value, int) or value is None else repr(value)


def check_port(option: str, port: int, *, allow_off: bool = False) -> None:
    """A TCP port option: 0..65535 (0 = any free port); ``allow_off`` also accepts -1 (= off)."""
    check_range(option, port, lo=-1 if allow_off else 0, hi=65535)


def check_listen(option: str, host: str, port: int) -> None:
    """Bind ``host:port`` once and close it, so an address that cannot be served (a host that does
    not resolve or is not this machine's, a port in use) is one line naming ``option`` (exit 2)
    before anything starts, instead of the server's own error after the services came up."""
    import socket

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
    except OSError as exc:
        raise UserError(f"{option}: cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def check_url(option: str, url: str, *, schemes: tuple[str, ...] = ("http", "https")) -> str:
    """A base URL option (``--gateway``, ``--leader``, ``--kube-api``, ``--url``): one of ``schemes``,
    a host, and a port (if any) that is a number in [0, 65535]; else `UserError` naming the option.
    Checked at start: a bad one never reaches an HTTP client (a traceback there, or a retry loop)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parsing the port is the check: ValueError when it is not one)
    except ValueError as exc:
        raise UserError(f"invalid {option}={url!r}: {exc}") from None
    if parts.scheme not in schemes or not parts.hostname:
        want = " or ".join(f"{s}://HOST[:PORT]" for s in schemes)
        raise UserError(f"invalid {option}={url!r}: expected {want}")
    return url


_HEADER_TOKEN = re.compile(r"[!-~]+")


def check_token(option: str, token: str) -> str:
    """A bearer token option (``--token``, ``--leader-token``): visible ASCII characters only, since it
    travels in an ``Authorization`` header, which cannot carry anything else (an HTTP client's
    traceback on every call otherwise); else `UserError` naming ``option``, never echoing the secret."""
    if not _HEADER_TOKEN.fullmatch(token):
        raise UserError(
            f"invalid {option}: must be visible ASCII characters (no spaces, control characters or"
            " non-ASCII letters); the value is not shown"
        )
    return token


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_DOMAIN_CHARS = 253


def check_domain(option: str, domain: str) -> str:
    """A resource / annotation domain (``--domain``): a DNS subdomain (RFC 1123: lower-case letters,
    digits, '-' and '.', at most 253 characters), as Kubernetes requires of the prefix of an
    extended resource or annotation name; else `UserError` naming the option. (Kubelet and the API
    server refuse ``a b/gpu`` or ``/gpu`` only later, far from the option that caused it.)"""
    if len(domain) > MAX_DOMAIN_CHARS or not _DNS_SUBDOMAIN.fullmatch(domain):
        shown = domain if len(domain) <= 80 else domain[:77] + "..."
        raise UserError(
            f"invalid {option}={shown!r}: must be a DNS subdomain (lower-case letters, digits, '-' and"
            f" '.', at most {MAX_DOMAIN_CHARS} characters), e.g. gpupool.io"
        )
    return domain


LOG_LEVELS = ("debug", "info", "warning", "error")


def check_log_level(option: str, level: str) -> str:
    """A ``--log-level`` option: one of `LOG_LEVELS` in any case, returned as `logging` spells it
    (``INFO``); else `UserError` naming ``option`` (logging's own ``Unknown level: ''`` names neither)."""
    if level.lower() not in LOG_LEVELS:
        raise UserError(f"invalid {option}={level!r}: expected debug, info, warning or error")
    return level.upper()


@contextlib.contextmanager
def options_named(options: dict[str, str]) -> Iterator[None]:
    """Inside: an `InvalidInput` about a field that an option of the command sets (``options``: the
    core's field name -> the option as typed) becomes a `UserError` naming the option, not the field:
    ``gpus`` -> ``invalid --gpus=0: ...``; a sub-field of a repeatable spec option, ``engine.url``
    -> ``invalid --engine url='': ...``. Other errors pass unchanged."""
    try:
        yield
    except InvalidInput as exc:
        head, _, rest = exc.field.partition(".")
        option = options.get(exc.field) or options.get(head)
        if option is None:
            raise
        named = f"{option} {rest}" if option == options.get(head) and rest else option
        raise UserError(f"invalid {named}={exc.value!r}: {exc.reason}") from None


def usage_line(exc: typer.TyperException, argv: list[str]) -> str:
    """One line for an error the parser finds in the command line (a value of the wrong type, a
    choice that is not one, an unknown or missing option): ``invalid --port='abc': ...`` like the
    commands' own checks, or ``gpupool sim variants: Missing option '--out' (see --help)``. The value
    is taken from ``argv`` (``--opt=value`` or ``--opt value``): the parser keeps only the reason."""
    param = getattr(exc, "param", None)
    missing = type(exc).__name__ == "MissingParameter"
    if isinstance(exc, typer.BadParameter) and not missing and param is not None and param.opts:
        opts = [*param.opts, *param.secondary_opts]
        value = next(
            (
                a.partition("=")[2] if "=" in a else argv[i + 1]
                for i, a in enumerate(argv)
                if a.partition("=")[0] in opts and ("=" in a or i + 1 < len(argv))
            ),
            None,
        )
        shown = "" if value is None else f"={value!r}"
        reason = exc.message.removeprefix("Value error, ")
        return f"invalid {max(opts, key=len)}{shown}: {reason}"
    ctx = getattr(exc, "ctx", None)
    where = f"{ctx.command_path}: " if ctx is not None else ""
    return f"{where}{exc.format_message().rstrip('.')} (see --help)"


def error_line(message: str) -> str:
    """``message`` as the one line `fail` prints (a line break in a value it quotes as typed, such
    as a file name, is escaped)."""
    one_line = message.replace("\r", "\\r").replace("\n", "\\n")
    return f"gpupool: error: {one_line}"


def fail(message: str) -> None:
    """Print ``message`` as one line (`error_line`) and exit 2."""
    print(error_line(message), file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


def user_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorator for subcommands: `GpupoolError`, `UserError` and `ValueError` exit 2 with one line."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (GpupoolError, UserError, ValueError, FileNotFoundError) as exc:
            fail(str(exc))
            raise  # unreachable: fail() exits

    return wrapper
