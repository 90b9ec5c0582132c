"""One place that turns expected user errors into a one-line message and exit code 2 (no traceback)."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from gpupool.core.errors import GpupoolError

P = ParamSpec("P")
R = TypeVar("R")

EXIT_BAD_INPUT = 2


class UserError(Exception):
    """Raised by CLI code for bad input that is not a core error (missing file, malformed YAML)."""


def fail(message: str) -> None:
    print(f"gpupool: error: {message}", file=sys.stderr)
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
