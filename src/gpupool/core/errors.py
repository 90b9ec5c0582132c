"""Exceptions for misuse and broken invariants only; an expected "no" is an `Outcome`, not an error.

Every message names the offending field or id and its value, so that adapters can show it verbatim
(HTTP 4xx body, CLI one-line error with exit code 2). The value is shown as JSON, as clients and
config files send it (``true``, ``null``, ``"x"``; the repr only for what JSON cannot hold), and
abridged (`show_value`): a client that sends a megabyte-long name gets a short error, at a bounded
cost.
"""

from __future__ import annotations

from gpupool.hardware.abridge import json_abridger

show_value = json_abridger(items=20, chars=200, levels=2)
"""``value`` as JSON text (``true``, ``null``, ``"x"``; the repr for a value JSON cannot hold); past
200 characters per string, 20 items per container or 2 levels of nesting, abridged with ``...`` (so
at most 400 elements are ever walked)."""


class GpupoolError(Exception):
    """Base of every gpupool error."""


class StoreDamaged(GpupoolError):
    """The lease store holds damaged data (a store adapter raises a subclass naming file, table/row
    and the command to run); servers answer it 503 with that message, never 500."""


class StoreUnreachable(GpupoolError):
    """A networked lease store did not take a write (unreachable, or this replica no longer leads);
    the write was undone in memory. Servers answer it 503 with Retry-After (the caller retries,
    possibly on the replica that leads now), never 500."""


class StoreRefused(GpupoolError):
    """A local store did not take a write (disk full, an I/O error, a lock held past its timeout);
    nothing of the write was kept. Servers answer it 503 with Retry-After, never 500."""


class InvalidInput(GpupoolError, ValueError):
    """A caller passed a value that can never be valid. ``field`` names it (dotted path)."""

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {field}={show_value(value)}: {reason}")


class DuplicateId(InvalidInput):
    """An id that must be unique is already taken."""

    def __init__(self, field: str, value: object) -> None:
        super().__init__(field, value, "already exists")


class UnknownId(GpupoolError, KeyError):
    """A lease, slice, GPU or node id that the core has never seen."""

    def __init__(self, kind: str, value: object) -> None:
        self.kind = kind
        self.value = value
        super().__init__(f"unknown {kind} {show_value(value)}")

    def __str__(self) -> str:
        return str(self.args[0])


class InvariantViolation(GpupoolError, AssertionError):
    """The core found its own state inconsistent. Always a bug; the message carries ids and numbers."""
