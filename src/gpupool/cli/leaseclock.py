"""The clock of every process that grants leases and tickets (`gpupool serve`, `gpupool run`, the
HA replicas' leader, the standalone `gpupool extender`).

Role: one place that decides which real clock lease expiry follows. It is `AnchoredClock` over
``time.time`` and ``time.monotonic``: anchored to the wall clock when the controller is built (at
start-up; on a replica, when it takes over as leader), then advanced by the monotonic clock only.
Invariant: inside one process a wall-clock step (NTP, ``date -s``) changes no lease's or ticket's
remaining time; stored times stay Unix seconds, meaningful to the next process that reads them.
The tidal day/night schedule is the exception: a time of day, it reads the wall clock itself
(`gpupool.cli.tidalplane.attach_serving`). See "Time" in docs/store.md for what a wall step while
no gateway runs does.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpupool.core.clock import AnchoredClock


def lease_clock(
    wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic
) -> AnchoredClock:
    """A clock anchored to ``wall()`` now, advancing with ``monotonic`` (tests pass their own
    functions to step the wall clock without touching the host's)."""
    return AnchoredClock(wall, monotonic)
