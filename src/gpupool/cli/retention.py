"""Deleting from the lease store what the gateway no longer needs, while it runs: leases and tickets
that ended more than the controller's ``ended_retention_s`` ago (one hour by default).

Role: a task of `serve_forever` (so of the leader only: a standby never writes its store). Before
it, nothing deleted an ended lease while the gateway ran (a restart purged only tickets), so the
store grew with every lease ever taken, labels included, until the disk was full. It calls
`LeaseStore.purge_ended` / `purge_tickets` (on etcd each delete compares the revision it read, then
etcd's history is compacted).

Invariants:
- an active lease is never deleted, nor one that ended less than ``ended_retention_s`` ago (kept
  for idempotent answers and history: ``GET /v1/leases/{id}``, a second release);
- the store's calls block, so they run in a worker thread (the SQLite store serialises them with
  its commits under its own lock; the etcd client keeps one connection per thread);
- a failure (a store that refuses, etcd unreachable) is logged and the next pass tries again.
"""

from __future__ import annotations

import asyncio
import logging

from gpupool.core.controller import LeaseController

PURGE_EVERY_S = 300.0
"""Seconds between two passes (the first one comes `FIRST_PURGE_S` after the start)."""
FIRST_PURGE_S = 10.0

log = logging.getLogger(__name__)


def purge_once(controller: LeaseController) -> tuple[int, int]:
    """(leases, tickets) deleted now: those that ended before now - ``ended_retention_s``."""
    before_s = controller.clock.now() - controller.config.ended_retention_s
    store = controller.store
    return store.purge_ended(before_s=before_s), store.purge_tickets(before_s=before_s)


async def purge_loop(
    controller: LeaseController, *, period_s: float = PURGE_EVERY_S, first_s: float = FIRST_PURGE_S
) -> None:
    """`purge_once` in a worker thread after ``first_s``, then every ``period_s``, until cancelled."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(first_s)
    while True:
        try:
            leases, tickets = await loop.run_in_executor(None, purge_once, controller)
        except Exception as exc:
            log.warning("gpupool: deleting ended leases from the store failed (retried later): %s", exc)
        else:
            if leases or tickets:
                log.info(
                    "gpupool: deleted %d ended leases and %d ended tickets from the store", leases, tickets
                )
        await asyncio.sleep(period_s)


__all__ = ["FIRST_PURGE_S", "PURGE_EVERY_S", "purge_loop", "purge_once"]
