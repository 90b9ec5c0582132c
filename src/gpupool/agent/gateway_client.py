"""`GatewayReporter`: sends the agent's readings and events to the gateway, with an outbox, reconnect
and exponential backoff, and hands the gateway's lease ledger back to the control loop.

Wire format (JSON over HTTP, ``Authorization: Bearer <token>``)::

    POST {gateway}/v1/nodes/{node}/readings
    {
      "node": "gpu-a", "agent_time_s": 12.4, "tick": 62, "resync": false, "dropped_events": 0,
      "gpus": [{"gpu_id": "gpu-a/0", "index": 0, "uuid": "GPU-...", "model": "...",
                "vram_used_mib": 70000, "vram_total_mib": 81920, "effective_used_mib": 30000,
                "temperature_c": 61, "util_pct": 40, "power_mw": 250000,
                "mig_profile": "", "gi_id": null,
                "state": "normal" | "paused", "healthy": true, "problem": ""}],
      "workloads": [{"lease_id": "...", "gpu_id": "...", "state": "running|pausing|paused|resuming|revoked"}],
      "events": [{"seq": 7, "kind": "watermark_pause|watermark_resume|paused|resumed|pauser_failure|
                  revoke|unhealthy|source_error", "at_s": 12.2, "gpu_id": "...", "lease_id": "...",
                  "reason": "...", "pauser": "signal", "frees": "compute|compute+vram",
                  "latency_ms": 0.1}]
    }
    -> 200 {"leases": [{"lease_id", "gpu_id", "slice_id", "priority", "vram_mib", "labels": {}}]}

``resync`` is true on the first post after start-up or after an outage: the gateway then replaces
its view of the node (states, paused workloads) instead of applying a delta. ``revoke`` events ask
the gateway to revoke the lease and requeue its job; ``unhealthy`` marks the GPU's slices unhealthy
(the gateway revokes their leases). A response without ``leases`` leaves the ledger unchanged.

Invariants:
- Calling the reporter (the loop's observer) never blocks on the network: it stores the newest
  snapshot and appends events to a bounded outbox (oldest dropped, counted in ``dropped_events``).
- Events leave the outbox only after a 2xx; they are sent in ``seq`` order, at most ``batch`` per post.
- After a failure the next attempt waits ``min(backoff_max_s, backoff_initial_s * 2**(failures-1))``.
  No jitter: one agent per node, and the schedule must be reproducible.
- A 4xx other than 401/403/404/408/429 means the batch itself is bad: it is dropped and counted,
  so one malformed event cannot block the outbox.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpupool.agent.loop import AgentEvent, NodeSnapshot

if TYPE_CHECKING:
    import httpx

RETRYABLE_4XX = frozenset({401, 403, 404, 408, 429})


def snapshot_json(snap: NodeSnapshot) -> dict[str, Any]:
    gpus = []
    for g in snap.gpus:
        s = g.sample
        gpus.append(
            {
                "gpu_id": s.gpu_id,
                "index": s.index,
                "uuid": s.uuid,
                "model": s.model,
                "vram_used_mib": s.vram_used_mib,
                "vram_total_mib": s.vram_total_mib,
                "effective_used_mib": g.reading.vram_used_mib if g.reading is not None else None,
                "temperature_c": s.temperature_c,
                "util_pct": s.util_pct,
                "power_mw": s.power_mw,
                "mig_profile": s.mig_profile,
                "gi_id": s.gi_id,
                "state": "paused" if g.paused else "normal",
                "healthy": g.healthy,
                "problem": g.problem,
            }
        )
    return {
        "node": snap.node,
        "agent_time_s": snap.at_s,
        "tick": snap.tick,
        "gpus": gpus,
        "workloads": [{"lease_id": lid, "gpu_id": gpu, "state": st} for lid, gpu, st in snap.workloads],
    }


class GatewayReporter:
    def __init__(
        self,
        gateway_url: str,
        *,
        node: str,
        token: str,
        send_every_s: float = 0.2,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 10.0,
        outbox_limit: int = 10_000,
        batch: int = 500,
        timeout_s: float = 2.0,
    ) -> None:
        if not gateway_url.startswith(("http://", "https://")):
            raise ValueError(f"invalid gateway={gateway_url!r}: must be an http(s) URL")
        self.url = f"{gateway_url.rstrip('/')}/v1/nodes/{node}/readings"
        self.node = node
        self._headers = {"Authorization": f"Bearer {token}"}
        self.send_every_s = send_every_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.batch = batch
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._outbox: deque[AgentEvent] = deque(maxlen=outbox_limit)
        self._latest: NodeSnapshot | None = None
        self._ledger: list[Mapping[str, object]] | None = None
        self._thread: threading.Thread | None = None
        self._client: httpx.Client | None = None
        self.dropped_events = 0
        self.failures = 0
        """Consecutive failed posts (0 = connected)."""
        self.posts_ok = 0
        self.last_error = ""
        self._resync = True
        self._next_try = 0.0

    # ----------------------------------------------------------------- loop side (never blocks)
    def __call__(self, snap: NodeSnapshot, events: Sequence[AgentEvent]) -> None:
        with self._lock:
            self._latest = snap
            for ev in events:
                if len(self._outbox) == self._outbox.maxlen:
                    self.dropped_events += 1
                self._outbox.append(ev)
        self._wake.set()

    def take_ledger(self) -> Sequence[Mapping[str, object]] | None:
        with self._lock:
            ledger, self._ledger = self._ledger, None
            return ledger

    @property
    def connected(self) -> bool:
        return self.posts_ok > 0 and self.failures == 0

    def pending(self) -> int:
        with self._lock:
            return len(self._outbox)

    # ----------------------------------------------------------------- sender side
    def flush_once(self) -> bool:
        """One post of the newest snapshot and up to ``batch`` queued events. True on success."""
        import httpx

        with self._lock:
            snap = self._latest
            events = list(self._outbox)[: self.batch]
            dropped = self.dropped_events
            resync = self._resync
        if snap is None:
            return True
        body = snapshot_json(snap)
        body["resync"] = resync
        body["dropped_events"] = dropped
        body["events"] = [e.to_json() for e in events]
        try:
            if self._client is None:
                self._client = httpx.Client(timeout=self.timeout_s)
            resp = self._client.post(self.url, json=body, headers=self._headers)
        except httpx.HTTPError as exc:
            return self._failed(f"{type(exc).__name__}: {exc}")
        if resp.status_code >= 500 or resp.status_code in RETRYABLE_4XX:
            return self._failed(f"HTTP {resp.status_code}: {resp.text[:200]}")
        with self._lock:
            for _ in events:
                self._outbox.popleft()
            if resp.status_code >= 400:
                self.dropped_events += len(events)
                self.last_error = f"HTTP {resp.status_code} (batch dropped): {resp.text[:200]}"
            self._resync = False
            self.failures = 0
            self.posts_ok += 1
            if resp.status_code < 300:
                try:
                    data = resp.json()
                except ValueError:
                    data = None
                if isinstance(data, dict) and isinstance(data.get("leases"), list):
                    self._ledger = [x for x in data["leases"] if isinstance(x, dict)]
        return True

    def _failed(self, why: str) -> bool:
        with self._lock:
            self.failures += 1
            self.last_error = why
            self._resync = True
        return False

    def backoff_s(self) -> float:
        if self.failures == 0:
            return 0.0
        return float(min(self.backoff_max_s, self.backoff_initial_s * 2 ** (self.failures - 1)))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.send_every_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            now = time.monotonic()
            if now < self._next_try:
                continue
            ok = self.flush_once()
            while ok and self.pending() >= self.batch and not self._stop.is_set():
                ok = self.flush_once()  # catch up a backlog without waiting a period per batch
            self._next_try = time.monotonic() + (0.0 if ok else self.backoff_s())

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"gpupool-reporter-{self.node}", daemon=True
            )
            self._thread.start()

    def stop(self, *, final_flush: bool = True) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if final_flush:
            self.flush_once()
        if self._client is not None:
            self._client.close()
            self._client = None
