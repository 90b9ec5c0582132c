"""`PodReconciler`: keep the extender's leases equal to the pods that hold them (``kubernetes`` client).

Events (from a list + watch of all pods):
- a pod DELETED, or in phase ``Succeeded`` / ``Failed``: release its lease (idempotent);
- a pod bound to a node (``spec.nodeName``) with a placement annotation and no lease in the pool:
  adopt the lease from the annotation (restart of the extender). Only bound pods are adopted: an
  annotation on an unbound pod is a bind in flight or a failed bind being rolled back;
- drift is reported, never silently fixed: an annotation that does not decode or no longer fits the
  inventory, a lease id or node that differs from the pool's, a bound pod that asks for gpupool
  resources but carries no placement (bound by another scheduler).

Resync (at start and whenever a watch ends: its timeout is the resync period): adopt from the full
list, renew the leases of live pods (so placement leases never expire under running pods), and
release leases whose pod is gone, except leases granted after the list started (a bind that raced
the list). The watch loop knows which leases the pool held when it listed (their ids, read just
before the list), so a lease is "older than the list" by identity, whatever the clock; a resync of
a list taken before the pool existed (start-up) compares grant times with the clock reading before
that list instead. Invariant after a resync: every pool lease belongs to a live, unfinished pod of
the list or was granted after it. A pod deleted between one watch's end and the next list is
therefore released by that list's resync, not missed.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from gpupool.adapters.k8s.annotations import decode_placement
from gpupool.adapters.k8s.kubeapi import KubeApi, KubeApiError, WatchExpiredError
from gpupool.adapters.k8s.pool import ExtenderPool
from gpupool.adapters.k8s.resources import DEFAULT_NAMES, ResourceNames, parse_pod
from gpupool.core.errors import InvalidInput

log = logging.getLogger("gpupool.reconciler")

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


@dataclass(frozen=True, slots=True)
class Drift:
    pod: str
    kind: str  # bad-annotation | lease-mismatch | node-mismatch | unmanaged | adopt-failed
    detail: str


class PodReconciler:
    def __init__(
        self, pool: ExtenderPool, *, names: ResourceNames = DEFAULT_NAMES, history: int = 1000
    ) -> None:
        self.pool = pool
        self.names = names
        self.drifts: deque[Drift] = deque(maxlen=history)
        self.counts: dict[str, int] = {}

    def _drift(self, pod: str, kind: str, detail: str) -> str:
        self.drifts.append(Drift(pod, kind, detail))
        log.warning("drift on pod %s: %s: %s", pod, kind, detail)
        return "drift"

    def apply(self, kind: str, pod: dict[str, Any]) -> str:
        """Handle one watch event; returns what was done (released|adopted|ok|drift|ignored)."""
        action = self._apply(kind, pod)
        self.counts[action] = self.counts.get(action, 0) + 1
        return action

    def _apply(self, kind: str, pod: dict[str, Any]) -> str:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        key = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        phase = (pod.get("status") or {}).get("phase", "")
        if kind == "DELETED" or phase in FINISHED_PHASES:
            why = "pod deleted" if kind == "DELETED" else f"pod {phase.lower()}"
            return "released" if self.pool.release_pod(uid, reason=why) is not None else "ignored"
        node = (pod.get("spec") or {}).get("nodeName") or ""
        text = (meta.get("annotations") or {}).get(self.names.placement)
        if text is None:
            if node and self.pool.lease_of(uid) is None:
                try:
                    asks = parse_pod(pod, self.names) is not None
                except InvalidInput:
                    asks = True
                if asks and node in self.pool.nodes():
                    return self._drift(key, "unmanaged", f"bound to {node} without a gpupool placement")
            return "ignored"
        try:
            placement = decode_placement(text, field=f"{key} {self.names.placement}")
        except InvalidInput as exc:
            return self._drift(key, "bad-annotation", str(exc))
        held = self.pool.lease_of(uid)
        if held is not None:
            if held.id != placement.lease_id:
                return self._drift(
                    key, "lease-mismatch", f"pool lease {held.id}, annotation {placement.lease_id}"
                )
            if node and node != held.node:
                return self._drift(key, "node-mismatch", f"bound to {node}, lease on {held.node}")
            return "ok"
        if not node:
            return "ignored"
        if node != placement.node:
            return self._drift(key, "node-mismatch", f"bound to {node}, annotation says {placement.node}")
        try:
            self.pool.adopt(placement)
        except InvalidInput as exc:
            return self._drift(key, "adopt-failed", str(exc))
        return "adopted"

    def held(self) -> frozenset[str]:
        """The ids of the leases the pool's pods hold now (read it before listing, for `resync`)."""
        return frozenset(lease.id for uid in self.pool.pod_uids() if (lease := self.pool.lease_of(uid)))

    def resync(
        self,
        pods: list[dict[str, Any]],
        *,
        held_before: frozenset[str] | None = None,
        listed_at: float | None = None,
    ) -> dict[str, int]:
        """Apply the full list, renew live leases, release leases of pods that are gone.

        A gone pod's lease is released only when it is older than the list: its id is in
        ``held_before`` (`held` read before listing) or, without that, it was granted before
        ``listed_at`` (the pool's clock reading before listing). Exactly one must be given."""
        if (held_before is None) == (listed_at is None):
            raise TypeError("resync needs exactly one of held_before and listed_at")
        live: set[str] = set()
        for pod in pods:
            self.apply("ADDED", pod)
            meta = pod.get("metadata") or {}
            if (pod.get("status") or {}).get("phase", "") not in FINISHED_PHASES:
                live.add(str(meta.get("uid") or ""))
        released = renewed = 0
        for uid in self.pool.pod_uids():
            lease = self.pool.lease_of(uid)
            if lease is None:
                continue
            if uid in live:
                renewed += self.pool.renew_pod(uid)
            elif held_before is not None and lease.id not in held_before:
                continue  # granted after the list started: its pod may be newer than the list
            elif listed_at is not None and lease.granted_at >= listed_at:
                continue
            elif self.pool.release_pod(uid, reason="pod gone", lease_id=lease.id) is not None:
                released += 1
        return {"pods": len(pods), "released": released, "renewed": renewed}

    def run(
        self, api: KubeApi, stop: threading.Event, *, watch_timeout_s: int = 300, backoff_s: float = 2.0
    ) -> None:
        """Until ``stop``: list and resync, then watch until the watch times out (``watch_timeout_s``,
        which is therefore also the resync and lease-renewal period), expires (410) or fails."""
        while not stop.is_set():
            try:
                before = self.held()
                pods, rv = api.list_pods()
                self.resync(pods, held_before=before)
                for kind, obj in api.watch_pods(rv, timeout_s=watch_timeout_s):
                    if kind != "BOOKMARK":
                        self.apply(kind, obj)
                    if stop.is_set():
                        return
            except WatchExpiredError:
                log.info("pod watch expired; listing again")
            except KubeApiError as exc:
                log.warning("pod reconciler: %s; retrying in %.1fs", exc, backoff_s)
                stop.wait(backoff_s)
            except Exception:  # one bad event or a bug must not end the loop: logged, then a relist
                log.exception("pod reconciler failed; listing again in %.1fs", backoff_s)
                stop.wait(backoff_s)
