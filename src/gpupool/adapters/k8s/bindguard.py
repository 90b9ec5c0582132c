"""`BindGuard`: refuse a bind the device plugin could confuse with a pod still waiting on its node.

Kubelet's Allocate names device IDs, never the pod; the plugin's `PendingQueue` picks among this
node's waiting placements (bound, not yet allocated) of the requested card count only: the exact
card set breaks ties, but GetPreferredAllocation already proposes the oldest placement's cards, and
kubelet may ignore the preference, so any two waiting placements of one node with the same card
count can swap leases (and MPS limits) when kubelet admits their pods in another order than they
were bound. Invariant kept here: a node never has two such placements at once. Before a bind
commits its lease on ``node``, every other pod lease there with the same card count (the "rival")
is checked; one whose pod kubelet has not admitted yet makes the bind fail with ``Error`` naming
that pod, and kube-scheduler retries the pod later (its backoff). Binds of other card counts or
other nodes never look at each other.

Admitted (no longer waiting): kubelet calls Allocate while admitting a pod, before it first writes
the pod's status, so a rival whose status has ``startTime``, a container status or a phase past
``Pending`` was allocated already (or refused: a failed pod). A rival whose pod is gone, or has
another UID, waits for nothing either. A rival that cannot be read counts as waiting (the bind is
retried). Admitted pods are remembered (bounded), so a node's running pods cost one read each.

How long a node can stay blocked for one card count: until kubelet admits the waiting pod (its
status is written within seconds of the Binding on a healthy node), or the pod ends: a deleted or
failed pod's lease is released by the pod reconciler, and a pod bound to a node whose kubelet is
down is evicted by Kubernetes' node lifecycle (5 minutes by default) and then released. A
never-admitted pod on a live kubelet blocks that card count on its node until it is deleted; the
placement lease's TTL (renewed for live pods) does not end it sooner.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from gpupool.adapters.k8s.kubeapi import KubeApi, KubeApiError
from gpupool.adapters.k8s.pool import ExtenderPool
from gpupool.adapters.k8s.resources import PodDemand

ADMITTED_CAPACITY = 100_000


def admitted(pod: dict[str, Any]) -> bool:
    """Kubelet took the pod in (so it called Allocate for it): it wrote the pod's status."""
    status = pod.get("status") or {}
    return bool(
        status.get("startTime")
        or status.get("containerStatuses")
        or status.get("phase") not in (None, "", "Pending")
    )


class BindGuard:
    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self._lock = threading.Lock()
        self._admitted: OrderedDict[str, None] = OrderedDict()

    def waiting_rival(self, pool: ExtenderPool, demand: PodDemand, node: str) -> str | None:
        """The first pod (``namespace/name``) whose waiting placement on ``node`` the device plugin
        could confuse with ``demand``'s, or None. The caller holds ``node``'s bind lock."""
        for uid, key in pool.rivals(node, demand.gpu_count, exclude=demand.uid):
            with self._lock:
                if uid in self._admitted:
                    continue
            if not self._waits(uid, key):
                with self._lock:
                    self._admitted[uid] = None
                    while len(self._admitted) > ADMITTED_CAPACITY:
                        self._admitted.popitem(last=False)
                continue
            return key
        return None

    def _waits(self, uid: str, key: str) -> bool:
        ns, _, name = key.partition("/")
        try:
            pod = self.api.read_pod(ns, name)
        except KubeApiError as exc:
            return exc.status != 404
        meta = pod.get("metadata") or {}
        return meta.get("uid") == uid and not admitted(pod)
