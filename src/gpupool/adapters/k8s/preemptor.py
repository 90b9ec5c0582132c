"""`Preemptor`: evict P2 pods for pending higher-priority pods that fit nowhere (``kubernetes`` client).

Why: kube-scheduler asks an extender to ``preempt`` only on nodes where its in-tree plugins already
found victims, and VRAM / compute are extender-only resources, so a P0 pod waiting for VRAM never
starts a preemption through kube-scheduler. This loop closes the gap, the way KAI's and Volcano's
schedulers preempt for their own resources.

One round (`plan`, pure over the pool; `run_once` then evicts):
1. pending pods (no ``spec.nodeName``) that ask for gpupool resources, with priority >= 0 and
   ``preemptionPolicy`` not ``Never``, highest priority first, then oldest (``creationTimestamp``),
   then namespace/name: a total order;
2. skip a pod that fits some node now (the scheduler will place it), or that was acted for less
   than ``cooldown_s`` ago (its victims are still terminating);
3. ask the pool's exact planner (`ExtenderPool.preempt`, the core's victim rules: preemptible and
   strictly lower priority, minimal set) for every node that failed resolvably; take the plan with
   the fewest victims, then the lowest highest-victim priority, then the node name;
4. evict (policy/v1 Eviction, so PodDisruptionBudgets are honoured) the victims not already being
   evicted. The reconciler releases their leases when the pods are gone; the scheduler retries.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

from gpupool.adapters.k8s.kubeapi import KubeApi, KubeApiError
from gpupool.adapters.k8s.pool import ExtenderPool
from gpupool.adapters.k8s.resources import DEFAULT_NAMES, PodDemand, ResourceNames, parse_pod
from gpupool.core.errors import InvalidInput

log = logging.getLogger("gpupool.preemptor")


@dataclass(frozen=True, slots=True)
class Eviction:
    for_pod: str
    node: str
    victims: tuple[tuple[str, str, str], ...]
    """(uid, namespace, name) per victim pod."""


class Preemptor:
    def __init__(
        self, pool: ExtenderPool, *, names: ResourceNames = DEFAULT_NAMES, cooldown_s: float = 30.0
    ) -> None:
        self.pool = pool
        self.names = names
        self.cooldown_s = cooldown_s
        self._acted: dict[str, float] = {}
        self._evicting: set[str] = set()
        self.evicted: deque[Eviction] = deque(maxlen=1000)

    def _pending(self, pods: list[dict[str, Any]]) -> list[tuple[tuple[int, str, str], PodDemand]]:
        out = []
        for pod in pods:
            spec = pod.get("spec") or {}
            if spec.get("nodeName") or spec.get("preemptionPolicy") == "Never":
                continue
            if (pod.get("status") or {}).get("phase", "Pending") != "Pending":
                continue
            try:
                demand = parse_pod(pod, self.names)
            except InvalidInput:
                continue
            if demand is None or demand.priority < 0:
                continue
            created = str((pod.get("metadata") or {}).get("creationTimestamp") or "")
            out.append(((-demand.priority, created, demand.key), demand))
        return sorted(out, key=lambda item: item[0])

    def plan(self, pods: list[dict[str, Any]]) -> list[Eviction]:
        """What one round would evict, given the listed pods. Reads the pool; changes nothing."""
        now = self.pool.allocator.clock.now()
        nodes = self.pool.nodes()
        out = []
        for _, demand in self._pending(pods):
            if now - self._acted.get(demand.uid, -1e18) < self.cooldown_s:
                continue
            verdict = self.pool.filter(demand, nodes)
            if verdict.passed or not verdict.failed:
                continue
            plans = self.pool.preempt(demand, sorted(verdict.failed))
            best: tuple[tuple[int, int, str], str, list[str]] | None = None
            for node, uids in plans.items():
                leases = [self.pool.lease_of(u) for u in uids]
                top = max((lease.priority for lease in leases if lease is not None), default=0)
                key = (len(uids), top, node)
                if best is None or key < best[0]:
                    best = (key, node, uids)
            if best is None:
                continue
            victims = []
            for uid in best[2]:
                lease = self.pool.lease_of(uid)
                pod = dict(lease.request.labels).get("pod", "") if lease is not None else ""
                ns, _, name = pod.partition("/")
                if name:
                    victims.append((uid, ns, name))
            out.append(Eviction(for_pod=demand.key, node=best[1], victims=tuple(victims)))
            self._acted[demand.uid] = now
        return out

    def run_once(self, api: KubeApi) -> list[Eviction]:
        pods, _ = api.list_pods(field_selector="spec.nodeName=")
        done = []
        for ev in self.plan(pods):
            for uid, ns, name in ev.victims:
                if uid in self._evicting:
                    continue
                try:
                    api.evict_pod(ns, name)
                    self._evicting.add(uid)
                    log.info("evicted %s/%s on %s for pending %s", ns, name, ev.node, ev.for_pod)
                except KubeApiError as exc:
                    log.warning("could not evict %s/%s for %s: %s", ns, name, ev.for_pod, exc)
            done.append(ev)
            self.evicted.append(ev)
        live = set(self.pool.pod_uids())
        self._evicting &= live
        return done

    def run(self, api: KubeApi, stop: threading.Event, *, interval_s: float = 5.0) -> None:
        while not stop.wait(interval_s):
            try:
                self.run_once(api)
            except KubeApiError as exc:
                log.warning("preemptor: %s", exc)
            except Exception:  # one bad pod or a bug must not end the loop: logged, next round
                log.exception("preemptor round failed")
