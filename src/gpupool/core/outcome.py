"""`Outcome`: the value every public core call returns. The code says what the caller does next.

Adapters map codes to HTTP statuses / extender fields in exactly one place each.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpupool.core.model import Lease


class OutcomeCode(StrEnum):
    GRANTED = "granted"
    """The lease is active: use ``outcome.lease``; renew before ``expires_at``."""
    PREEMPTED_VICTIMS = "preempted_victims"
    """Granted after preempting ``outcome.victims``: signal their holders to stop now."""
    QUEUED = "queued"
    """Admission put the request in a queue: poll or wait on ``outcome.ticket``."""
    NO_CAPACITY = "no_capacity"
    """A slice could hold it, but none has room now and nothing may be preempted: retry later or queue."""
    UNRESOLVABLE = "unresolvable"
    """No healthy slice of an accepted kind could ever hold it: change the request; retrying won't help."""
    BACKPRESSURE = "backpressure"
    """Held back by a watermark (VRAM or temperature): retry after ``outcome.retry_after_s``."""
    RELEASED = "released"
    """The lease ended now; its capacity is free."""
    ALREADY_ENDED = "already_ended"
    """Idempotent no-op: the lease had already ended (``outcome.lease.state`` says how)."""
    RENEWED = "renewed"
    """The lease's expiry moved to ``outcome.lease.expires_at``."""
    SHED = "shed"
    """Admission dropped the request (queue full or deadline passed): the caller may resubmit later."""

    @property
    def granted(self) -> bool:
        return self in (OutcomeCode.GRANTED, OutcomeCode.PREEMPTED_VICTIMS)


@dataclass(frozen=True, slots=True)
class Outcome:
    code: OutcomeCode
    lease: Lease | None = None
    victims: tuple[Lease, ...] = ()
    reason: str = ""
    retry_after_s: float | None = None
    early_warning: bool = False
    """Projected use of the chosen GPU after this grant reached the early-warning ratio (85 %)."""
    ticket: str | None = None

    @property
    def granted(self) -> bool:
        return self.code.granted


@dataclass(frozen=True, slots=True)
class Refusal:
    """An admission hook's refusal that knows how long the wait lasts (e.g. until the tidal NIGHT)."""

    reason: str
    retry_after_s: float
    """Real seconds until retrying can succeed (the ``Retry-After`` a server sends)."""


def shed(why: str | Refusal, retry_after_s: float) -> Outcome:
    """SHED with ``why``'s reason, retrying after ``why``'s own wait, else after ``retry_after_s``."""
    if isinstance(why, Refusal):
        return Outcome(OutcomeCode.SHED, reason=why.reason, retry_after_s=why.retry_after_s)
    return Outcome(OutcomeCode.SHED, reason=why, retry_after_s=retry_after_s)
