"""Status lines of the long-running commands (`gpupool run`, `gpupool serve`): one line each, prefixed
with the local wall-clock time in ISO 8601 (``2026-05-01T18:00:05+08:00``), so a line in a terminal
or a log says when it happened. Errors keep their own format (`gpupool.cli.errors`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime

import typer


def stamp(clock: Callable[[], float] = time.time) -> str:
    return datetime.fromtimestamp(clock()).astimezone().isoformat(timespec="seconds")


def say(message: str, *, clock: Callable[[], float] = time.time) -> None:
    """Print one status line with its timestamp."""
    typer.echo(f"{stamp(clock)} {message}")
