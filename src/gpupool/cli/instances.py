"""`InstanceKeeper`: every registered backend's model instance holds a placement lease in the ledger,
or takes no request.

Role: `gpupool serve --backends` and `gpupool run` register backends (model instances the gateway
routes requests to), each on one planned slice. The one ledger must record that use of the GPU:
each instance holds a placement lease on its slice (tenant `SYSTEM_TENANT`, label
``instance=<backend id>``). That lease can end while the gateway runs: a drain or a health mark
with ``revoke``, an agent's changed slice, or the end of its TTL. A backend serving on then would
use a slice the ledger calls free, and another lease could be granted on it.

Invariants:
- a backend whose placement lease ends is taken out of routing at once (reason ``unplaced``, on
  the lease's end event; the requests it holds run on), and it stays out until a new placement
  lease is granted on its slice;
- every `RECHECK_S` (and at registration) the keeper places each unplaced backend again on its
  slice, which succeeds only when the slice is open and has room (after an undrain, a recovery, the
  lease holding it ended), and renews each held lease with less than half its TTL left;
- it runs on the leader only (`serve_forever`); its writes are committed like every other write.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

from gpupool.cli.console import say
from gpupool.core.controller import LeaseController
from gpupool.core.errors import GpupoolError
from gpupool.core.model import Lease, Request
from gpupool.core.outcome import OutcomeCode
from gpupool.core.ports import Backend, GatewayEvent
from gpupool.hardware.slices import Slice
from gpupool.hardware.units import Resources

SYSTEM_TENANT = "gpupool-system"
INSTANCE_TTL_S = 7 * 24 * 3600.0
RECHECK_S = 2.0
"""Seconds between two passes of the keeper (re-placing unplaced backends, renewing leases)."""
UNPLACED = "unplaced"

log = logging.getLogger(__name__)


def placement_request(b: Backend, s: Slice, priority: int) -> Request:
    """The placement lease request of backend ``b``'s model instance: the whole of its slice."""
    return Request(
        id=f"instance-{b.id}",
        tenant=SYSTEM_TENANT,
        priority=priority,
        demand=Resources(s.capacity.vram_mib, s.capacity.compute_milli),
        ttl_s=INSTANCE_TTL_S,
        kinds=frozenset({s.kind}),
        preemptible=False,
        model=b.model,
        labels=(("instance", b.id),),
    )


class InstanceKeeper:
    def __init__(self, controller: LeaseController) -> None:
        self.c = controller
        self.requests: dict[str, tuple[Request, str]] = {}
        """backend id -> (its placement request, its slice id)."""
        self.committer: Any = None
        """The gateway's `GroupCommitter` once `run` started: a pass made on an event is committed."""
        self._soon = False

    def held(self) -> Mapping[str, Lease]:
        """Backend id -> its active placement lease on its own slice."""
        out = {}
        for x in self.c.leases(tenant=SYSTEM_TENANT):
            bid = dict(x.request.labels).get("instance")
            if bid in self.requests and x.slice_ids == (self.requests[bid][1],) and not x.state.ended:
                out[bid] = x
        return out

    def add(self, b: Backend, request: Request) -> None:
        """Keep ``b`` placed from now on (placing its lease now if it holds none)."""
        self.requests[b.id] = (request, b.slice_id)
        self.tick(only=b.id)

    def on_event(self, e: GatewayEvent) -> None:
        """A hub listener: a backend's placement lease ended or was granted (by an operator, the
        tidal plane): a pass runs next on the loop (not inside the delivery of a commit)."""
        x = e.lease
        if x is None or x.request.tenant != SYSTEM_TENANT or self._soon:
            return
        if dict(x.request.labels).get("instance") not in self.requests:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # (no loop yet: `run`'s first pass comes before any request)
        self._soon = True
        loop.call_soon(self._pass)

    def _pass(self) -> None:
        self._soon = False
        try:
            self.tick()
        except Exception as exc:
            log.warning("gpupool: keeping model instances placed: %s", exc)
        if self.committer is not None:
            self.committer.kick()

    def tick(self, only: str | None = None) -> None:
        """One pass: renew the leases past half their TTL; take a backend without a lease out of
        routing and place it again (a sleeping one is left to the tidal plane, which lends and
        takes back its slice)."""
        c = self.c
        held = self.held()
        now = c.clock.now()
        for bid, (req, sid) in self.requests.items():
            if only is not None and bid != only:
                continue
            why = c.unroutable_reasons(bid)
            lease = held.get(bid)
            if lease is not None:
                if lease.expires_at - now < req.ttl_s / 2:
                    c.renew(lease.id, ttl_s=req.ttl_s)
                if UNPLACED in why:
                    c.set_backend_routable(bid, True, reason=UNPLACED)
                continue
            placed = False
            if not why - {UNPLACED}:
                try:
                    out = c.place(req, (sid,))
                except GpupoolError:  # its slice is gone (an agent's new layout, a night layout)
                    out = None
                placed = out is not None and out.code is OutcomeCode.GRANTED
            if placed != (UNPLACED not in why):  # (switched when it changes, not on every pass)
                c.set_backend_routable(bid, placed, reason=UNPLACED)
                if why - {UNPLACED}:
                    continue  # asleep: the tidal plane lends its slice and says so
                say(
                    f"gpupool: backend {bid} placed on slice {sid}: it takes requests"
                    if placed
                    else f"gpupool: backend {bid} holds no placement lease on slice {sid}: it takes no"
                    " requests until the slice is open and free (every 2 s it is placed again)"
                )

    async def run(self, committer: Any, period_s: float = RECHECK_S) -> None:
        """A pass now and every ``period_s``, each committed, until cancelled."""
        self.committer = committer
        while True:
            try:
                self.tick()
                await committer.durable()
            except Exception as exc:  # a store that refuses: the next pass tries again
                log.warning("gpupool: keeping model instances placed: %s", exc)
            await asyncio.sleep(period_s)


__all__ = ["INSTANCE_TTL_S", "RECHECK_S", "SYSTEM_TENANT", "InstanceKeeper", "placement_request"]
