"""`Repeats`: failure events that would repeat at the tick rate are reported on their transitions.

Role: a failing device source, bad watermarks from the gateway, a lease the agent cannot read, an
MPS daemon that refuses its limits or a pause that keeps failing are seen again on every tick, ledger
read or retry. The loop reports each condition when it starts, then at most once per ``remind_s``
while it lasts (the reason says how many repeats were not reported), and once more when it clears:
``failure_cleared`` naming the failure kind, how long it lasted and how often it was seen. The
gateway's event stream and the agent's log stay readable while a condition persists for hours.

Invariants:
- A condition is identified by its key (the caller's: what failed and for which GPU or lease); its
  first occurrence is always reported, and so is its clearing, exactly once.
- At most ``limit`` conditions are tracked; beyond that the oldest is forgotten (not reported as
  cleared), so a stream of distinct failures cannot grow the agent's memory.
- Time comes from the caller (the loop's injected clock).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

CLEARED = "failure_cleared"


@dataclass(slots=True)
class _Open:
    kind: str
    first_s: float
    said_s: float
    fields: dict[str, object] = field(default_factory=dict)
    seen: int = 1
    quiet: int = 0
    """Occurrences since the last one reported."""


class Repeats:
    def __init__(self, emit: Callable[..., None], *, remind_s: float = 60.0, limit: int = 1024) -> None:
        self.emit = emit
        self.remind_s = remind_s
        self.limit = limit
        self._open: dict[Hashable, _Open] = {}

    def fail(self, key: Hashable, kind: str, now: float, **fields: object) -> None:
        """One occurrence of a failure condition: reported if new, or if it was last reported
        ``remind_s`` ago; otherwise counted."""
        o = self._open.get(key)
        if o is None:
            if len(self._open) >= self.limit:
                del self._open[next(iter(self._open))]
            self._open[key] = _Open(kind, now, now, dict(fields))
            self.emit(kind, now, **fields)
            return
        o.seen += 1
        o.fields = dict(fields)
        if now - o.said_s < self.remind_s:
            o.quiet += 1
            return
        quiet = f"{o.quiet} repeats in {now - o.said_s:.0f} s unreported"
        reason = f"{fields.get('reason', '')} (still failing: {quiet})"
        o.said_s, o.quiet = now, 0
        self.emit(kind, now, **{**fields, "reason": reason})

    def update(self, key: Hashable, kind: str, now: float, reason: str, **fields: object) -> None:
        """`fail` when ``reason`` is not empty, else `clear`."""
        if reason:
            self.fail(key, kind, now, reason=reason, **fields)
        else:
            self.clear(key, now)

    def clear(self, key: Hashable, now: float) -> None:
        """The condition ``key`` is over: one ``failure_cleared`` event if it was open."""
        o = self._open.pop(key, None)
        if o is None:
            return
        keep = {k: v for k, v in o.fields.items() if k in ("gpu_id", "lease_id", "pauser")}
        last = o.fields.get("reason", "")
        why = f"{o.kind} cleared after {now - o.first_s:.1f} s, seen {o.seen} times; last: {last}"
        self.emit(CLEARED, now, reason=why, **keep)

    def clear_all(
        self, now: float, *, kind_of_key: str, keep: set[Hashable] | frozenset[Hashable] = frozenset()
    ) -> None:
        """Clear every open condition whose key is a tuple starting with ``kind_of_key``, except ``keep``."""
        for key in [k for k in self._open if isinstance(k, tuple) and k[:1] == (kind_of_key,)]:
            if key not in keep:
                self.clear(key, now)

    def forget(self, key: Hashable) -> None:
        """Stop tracking ``key`` without a report (its subject is gone: a revoked lease)."""
        self._open.pop(key, None)

    def __contains__(self, key: object) -> bool:
        return key in self._open


__all__ = ["CLEARED", "Repeats"]
