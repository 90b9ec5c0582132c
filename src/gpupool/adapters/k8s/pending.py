"""`PendingQueue`: this node's placements that are bound but not yet handed to a container.

Kubelet's Allocate names device IDs, never the pod. The queue matches an Allocate to a bound lease
without a node-wide lock (the HAMi node lock serialises pod starts and breaks gangs):

1. `prefer` (GetPreferredAllocation): the oldest waiting placement of the requested card count whose
   cards all have a free device ID; the answer is one device ID on each of its cards.
2. `take` (Allocate): the oldest waiting placement of that card count whose cards equal the cards of
   the allocated device IDs (kubelet followed our preference); else the oldest of that count (kubelet
   chose other IDs: the env still names the lease's cards, and `verify` will check). It moves to
   ``taken`` until the PodResources API confirms which pod actually got it.
3. `verify` compares PodResources' device IDs per pod with the placements taken for those pods and
   returns the mismatches as drift.

Two waiting placements of one card count could therefore swap pods; the extender never binds a
second one while the first waits (`gpupool.adapters.k8s.bindguard`).

Order: oldest ``bound_at`` first, ties by pod UID (total). Each operation holds the queue's own lock
for a few dict operations only. `feed` applies one pod watch event (a pure function of the event).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from gpupool.adapters.k8s.annotations import Placement, decode_placement
from gpupool.adapters.k8s.resources import DEFAULT_NAMES, ResourceNames
from gpupool.core.errors import InvalidInput

DONE_CAPACITY = 100_000


class PendingQueue:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiting: dict[str, Placement] = {}
        self._taken: dict[str, Placement] = {}
        self._done: OrderedDict[str, None] = OrderedDict()
        """Pods that started or ended (bounded): a late watch event must not queue them again."""

    def offer(self, p: Placement) -> bool:
        """Queue a bound placement unless it was already taken or finished. True if queued now."""
        with self._lock:
            if p.pod_uid in self._taken or p.pod_uid in self._done:
                return False
            new = p.pod_uid not in self._waiting
            self._waiting[p.pod_uid] = p
            return new

    def drop(self, pod_uid: str) -> None:
        """The pod started, finished or was deleted: forget it everywhere."""
        with self._lock:
            self._waiting.pop(pod_uid, None)
            self._taken.pop(pod_uid, None)
            self._finish(pod_uid)

    def _finish(self, pod_uid: str) -> None:
        self._done[pod_uid] = None
        self._done.move_to_end(pod_uid)
        while len(self._done) > DONE_CAPACITY:
            self._done.popitem(last=False)

    def waiting(self) -> list[Placement]:
        with self._lock:
            return sorted(self._waiting.values(), key=_order)

    def taken(self) -> list[Placement]:
        with self._lock:
            return sorted(self._taken.values(), key=_order)

    def prefer(self, count: int, available: dict[str, list[str]], must: Iterable[str] = ()) -> list[str]:
        """Device IDs (one per card) for the oldest waiting placement of ``count`` cards.

        ``available``: gpu_id -> free device IDs on it. When kubelet names devices that must be
        included (``must``), or no waiting placement fits, the answer is ``must`` plus the first free
        IDs up to ``count``.
        """
        must = list(must)
        with self._lock:
            for p in sorted(self._waiting.values(), key=_order) if not must else ():
                if p.gpu_count != count or not all(available.get(g) for g in p.gpu_ids):
                    continue
                return sorted(available[g][0] for g in p.gpu_ids)
        flat = [d for ids in available.values() for d in ids]
        rest = [d for d in flat if d not in must]
        return (must + rest)[:count]

    def take(self, gpu_ids: frozenset[str], count: int) -> Placement | None:
        with self._lock:
            same = [p for p in self._waiting.values() if p.gpu_count == count]
            if not same:
                return None
            exact = [p for p in same if p.gpu_ids == gpu_ids]
            p = min(exact or same, key=_order)
            del self._waiting[p.pod_uid]
            self._taken[p.pod_uid] = p
            return p

    def untake(self, p: Placement) -> None:
        """Put a taken placement back (the Allocate that took it failed as a whole)."""
        with self._lock:
            if self._taken.pop(p.pod_uid, None) is not None:
                self._waiting[p.pod_uid] = p

    def verify(self, seen: dict[tuple[str, str], frozenset[str]]) -> list[str]:
        """``seen``: (namespace, pod) -> cards per PodResources. Returns drift lines; confirms the rest."""
        drift = []
        with self._lock:
            for uid, p in list(self._taken.items()):
                got = seen.get((p.namespace, p.name))
                if got is None:
                    continue
                del self._taken[uid]
                self._finish(uid)
                if got != p.gpu_ids:
                    drift.append(
                        f"pod {p.namespace}/{p.name} got devices on {sorted(got)} but its lease "
                        f"{p.lease_id} is on {sorted(p.gpu_ids)}"
                    )
        return drift


def _order(p: Placement) -> tuple[float, str]:
    return (p.bound_at, p.pod_uid)


def _started(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") not in (None, "", "Pending"):
        return True
    return any("running" in (c.get("state") or {}) for c in status.get("containerStatuses") or [])


def feed(
    queue: PendingQueue,
    kind: str,
    pod: dict[str, Any],
    *,
    node: str,
    names: ResourceNames = DEFAULT_NAMES,
    on_error: Callable[[str], None] | None = None,
) -> None:
    """Apply one pod event of this node's watch to the queue."""
    meta = pod.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    if kind == "DELETED" or _started(pod):
        queue.drop(uid)
        return
    text = (meta.get("annotations") or {}).get(names.placement)
    if text is None or (pod.get("spec") or {}).get("nodeName") != node:
        return
    try:
        p = decode_placement(text)
    except InvalidInput as exc:
        if on_error is not None:
            on_error(str(exc))
        return
    if p.node == node and p.pod_uid == uid:
        queue.offer(p)
    elif on_error is not None:
        on_error(f"pod {meta.get('namespace')}/{meta.get('name')}: placement is for {p.node}/{p.pod_uid}")
