"""`GatewayReporter`: sends the agent's readings and events to the gateway, with an outbox, reconnect
and exponential backoff, and hands the gateway's lease ledger back to the control loop.

Wire protocol (JSON over HTTP, ``Authorization: Bearer <token>``; the token needs the gateway's
``admin`` role), per flush:

1. ``POST {gateway}/v1/nodes/{node}/readings`` -- the gateway's own schema (`gpupool.adapters.http`)::

       {"gpus": [{"gpu_id": "gpu-a/0", "vram_used_mib": 30000, "vram_total_mib": 81920,
                  "temperature_c": 61, "util_pct": 40, "health": "ok" | "failed", "xids": [79]}]}

   ``vram_used_mib`` is the *effective* use the agent's watermarks see (NVML minus unused engine KV
   reservations, floored by the ledger; `gpupool.agent.pressure`), so the gateway's watermark bank
   and the agent's agree; it is never more than ``vram_total_mib`` (the gateway refuses that).
   ``health`` is ``failed`` once the agent saw an NVML error or a device XID: the gateway then
   revokes the GPU's leases. Readings are state, not deltas: the first post after
   an outage resynchronises the gateway by itself.
2. Events, when the outbox is not empty: ``POST {gateway}/v1/nodes/{node}/events`` with
   ``{"resync": bool, "dropped_events": int, "workloads": [{"lease_id", "gpu_id", "state"}],
   "events": [{"seq", "kind", "at_s", "gpu_id", "lease_id", "reason", "pauser", "frees",
   "latency_ms"}]}`` (kinds: watermark_pause, watermark_resume, paused, resumed, pauser_failure,
   revoke, unhealthy, source_error). A gateway without this route (404/405) is remembered; then
   only ``revoke`` events are delivered, as ``DELETE /v1/leases/{lease_id}`` (the capacity returns
   to the pool; the job's owner requeues it), and the other events are counted in ``unsent_events``.
3. Every ``config_every_s``: ``GET {gateway}/v1/pool`` -> ``watermarks`` (``vram_high``, ``vram_low``,
   ``temp_high_c``, ``temp_low_c``, ``early_warning``): the thresholds the loop enforces, kept (and
   enforced locally) while the gateway is unreachable.
4. Every ``ledger_every_s``: ``GET {gateway}/v1/leases`` -> ``{"leases": [{"id", "node", "gpu_id",
   "priority", "vram_mib", "state", "labels"?}]}``, filtered to this node's active leases; the loop
   takes it with `take_ledger` (lease labels name the pauser, see `gpupool.agent.workloads`).
5. With the ledger: ``GET {gateway}/v1/nodes/{node}/engines`` -> ``{"engines": [{"id", "gpu_id",
   "endpoint", "pauser", "level", "state"}]}``: the engines the control plane wants asleep or awake
   (tidal standby instances); the loop takes it with `take_engines` (`gpupool.agent.standby`). A
   gateway without the route (404/405) is asked again only every ``engines_retry_s`` (60 s).

Invariants:
- One request holds the sending thread at most ``deadline_s`` (plus one read's ``timeout_s``) and
  reads at most ``max_body_bytes`` of its answer (`bounded_request`); more is a failed request.
- Calling the reporter (the loop's observer) never blocks on the network: it stores the newest
  snapshot and appends events to a bounded outbox (oldest dropped, counted in ``dropped_events``).
- Events leave the outbox only after a 2xx (or an accepted fallback); in ``seq`` order, at most
  ``batch`` per post.
- After a failure the next attempt waits ``min(backoff_max_s, backoff_initial_s * 2**(failures-1))``.
  No jitter: one agent per node, and the schedule must be reproducible.
- The first failure of an outage, its end, and a refusal for good (once while it repeats) are
  logged (warnings of ``gpupool.agent.gateway``).
- A 3xx is a failure like a 5xx (nothing was delivered; the gateway URL redirects).
- A 4xx other than 401/403/404/405/408/429 means the request itself is bad: the batch is dropped and
  counted, so one malformed event cannot block the outbox.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpupool.agent.loop import AgentEvent, NodeSnapshot

if TYPE_CHECKING:
    import httpx

log = logging.getLogger("gpupool.agent.gateway")

RETRYABLE_4XX = frozenset({401, 403, 408, 429})
UNSUPPORTED = frozenset({404, 405})


def _clamp(v: int | None, lo: int, hi: int) -> int | None:
    return None if v is None else min(max(v, lo), hi)


def readings_json(snap: NodeSnapshot) -> dict[str, Any]:
    """The gateway's ``ReadingsIn`` body for one snapshot (no other fields: its schema is strict)."""
    gpus = []
    for g in snap.gpus:
        s = g.sample
        used = g.reading.vram_used_mib if g.reading is not None else s.vram_used_mib
        gpus.append(
            {
                "gpu_id": s.gpu_id,
                "vram_used_mib": min(max(0, used), max(1, s.vram_total_mib)),  # (more is refused)
                "vram_total_mib": max(1, s.vram_total_mib),
                "temperature_c": _clamp(s.temperature_c, -50, 200),
                "util_pct": _clamp(s.util_pct, 0, 100),
                "health": "ok" if g.healthy else "failed",
                "xids": [x for x in s.xids if x >= 1][:64],  # (the gateway refuses XIDs below 1)
            }
        )
    return {"gpus": gpus}


def events_json(
    snap: NodeSnapshot | None, events: Sequence[AgentEvent], *, resync: bool, dropped: int
) -> dict[str, Any]:
    return {
        "resync": resync,
        "dropped_events": dropped,
        "workloads": []
        if snap is None
        else [{"lease_id": lid, "gpu_id": gpu, "state": st} for lid, gpu, st in snap.workloads],
        "events": [e.to_json() for e in events],
    }


def bounded_request(
    client: httpx.Client, method: str, url: str, *, deadline_s: float, max_body_bytes: int, **kw: Any
) -> httpx.Response | str:
    """One request whose whole answer must arrive within ``deadline_s`` and ``max_body_bytes``
    (decoded): the client's timeout bounds each read only, so a body that trickles in forever or
    never ends would otherwise hold the sending thread for good. A transport error, an answer over
    either bound, is returned as the text of the failure; otherwise the answer, fully read."""
    import httpx

    deadline = time.monotonic() + deadline_s
    try:
        with client.stream(method, url, **kw) as resp:
            body = bytearray()
            for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > max_body_bytes:
                    return f"{method} {url}: answer over {max_body_bytes} bytes: not read"
                if time.monotonic() > deadline:
                    return f"{method} {url}: no complete answer within {deadline_s:g} s"
    except httpx.HTTPError as exc:
        return f"{method} {url}: {type(exc).__name__}: {exc}"
    headers = [
        (k, v)
        for k, v in resp.headers.multi_items()
        if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]
    return httpx.Response(resp.status_code, headers=headers, content=bytes(body), request=resp.request)


def json_body(resp: httpx.Response) -> Any:
    """The decoded JSON body, or None when it is not JSON (or is nested deeper than the decoder
    goes: that is a `RecursionError`, not a `ValueError`, and must not end the sending thread)."""
    try:
        return resp.json()
    except (ValueError, RecursionError):
        return None


def ledger_from(body: Any, *, node: str) -> list[Mapping[str, object]] | None:
    """This node's active leases from a ``GET /v1/leases`` body, in the loop's lease shape."""
    if not isinstance(body, dict) or not isinstance(body.get("leases"), list):
        return None
    out: list[Mapping[str, object]] = []
    for x in body["leases"]:
        if not isinstance(x, dict) or x.get("node") != node or x.get("state", "active") != "active":
            continue
        out.append(
            {
                "lease_id": x.get("id", x.get("lease_id", "")),
                "gpu_id": x.get("gpu_id", ""),
                "slice_id": x.get("slice_id", ""),
                "priority": x.get("priority", 0),
                "vram_mib": x.get("vram_mib", 0),
                "compute_milli": x.get("compute_milli", 0),
                "labels": x.get("labels") or {},
            }
        )
    return out


class GatewayReporter:
    def __init__(
        self,
        gateway_url: str,
        *,
        node: str,
        token: str,
        send_every_s: float = 0.2,
        ledger_every_s: float = 1.0,
        config_every_s: float = 5.0,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 10.0,
        outbox_limit: int = 10_000,
        batch: int = 500,
        timeout_s: float = 2.0,
        deadline_s: float = 5.0,
        max_body_bytes: int = 64 * 2**20,
    ) -> None:
        if not gateway_url.startswith(("http://", "https://")):
            raise ValueError(f"invalid gateway={gateway_url!r}: must be an http(s) URL")
        base = gateway_url.rstrip("/")
        self.base = base
        self.readings_url = f"{base}/v1/nodes/{node}/readings"
        self.events_url = f"{base}/v1/nodes/{node}/events"
        self.node = node
        self._headers = {"Authorization": f"Bearer {token}"}
        self.send_every_s = send_every_s
        self.ledger_every_s = ledger_every_s
        self.config_every_s = config_every_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.batch = batch
        self.timeout_s = timeout_s
        """Bound of each connect / read / write."""
        self.deadline_s = deadline_s
        """Bound of one whole request, its answer fully read."""
        self.max_body_bytes = max_body_bytes
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._outbox: deque[AgentEvent] = deque(maxlen=outbox_limit)
        self._latest: NodeSnapshot | None = None
        self._ledger: list[Mapping[str, object]] | None = None
        self._thread: threading.Thread | None = None
        self._client: httpx.Client | None = None
        self.dropped_events = 0
        self.unsent_events = 0
        """Events the gateway has no route for (only when it lacks the events route)."""
        self.events_supported: bool | None = None
        self.failures = 0
        """Consecutive failed flushes (0 = connected)."""
        self.posts_ok = 0
        self.ledger_failures = 0
        """Consecutive failed reads of the lease ledger (the readings may go through meanwhile)."""
        self.last_error = ""
        self._refusal_logged = ""
        self._resync = True
        self._next_try = 0.0
        self._next_ledger = 0.0
        self._next_config = 0.0
        self._watermarks: dict[str, Any] | None = None
        self._engines: list[Mapping[str, object]] | None = None
        self.engines_supported: bool | None = None
        self.engines_retry_s = 60.0
        self._next_engines = 0.0

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

    def take_watermarks(self) -> dict[str, Any] | None:
        """The gateway's watermark thresholds (``GET /v1/pool`` -> ``watermarks``) when newly fetched."""
        with self._lock:
            wm, self._watermarks = self._watermarks, None
            return wm

    def take_engines(self) -> Sequence[Mapping[str, object]] | None:
        """The gateway's engine directives when newly fetched (None: nothing new)."""
        with self._lock:
            engines, self._engines = self._engines, None
            return engines

    @property
    def connected(self) -> bool:
        return self.posts_ok > 0 and self.failures == 0

    def pending(self) -> int:
        with self._lock:
            return len(self._outbox)

    # ----------------------------------------------------------------- sender side
    def _request(self, method: str, url: str, **kw: Any) -> httpx.Response | str:
        import httpx

        if self._client is None:
            self._client = httpx.Client(timeout=self.timeout_s)
        return bounded_request(
            self._client,
            method,
            url,
            deadline_s=self.deadline_s,
            max_body_bytes=self.max_body_bytes,
            headers=self._headers,
            **kw,
        )

    def flush_once(self, *, now_s: float | None = None) -> bool:
        """Readings, then queued events, then (when due) the ledger. True when all went through."""
        with self._lock:
            snap = self._latest
            events = list(self._outbox)[: self.batch]
            dropped = self.dropped_events
            resync = self._resync
        if snap is None:
            return True
        if snap.gpus:  # a tick whose source failed has no GPUs: nothing to say (the schema needs >= 1)
            resp = self._request("POST", self.readings_url, json=readings_json(snap))
            if not self._ok(resp, what="readings"):
                return False
        if events and not self._send_events(snap, events, resync=resync, dropped=dropped):
            return False
        now = time.monotonic() if now_s is None else now_s
        if now >= self._next_ledger:
            resp = self._request("GET", f"{self.base}/v1/leases")
            ledger = None
            if not isinstance(resp, str) and resp.status_code < 300:
                ledger = ledger_from(json_body(resp), node=self.node)
                if ledger is not None:
                    with self._lock:
                        self._ledger = ledger
                self._next_ledger = now + self.ledger_every_s
            self._ledger_outcome(ledger is not None, resp)
            if self.engines_supported is not False or now >= self._next_engines:
                self._fetch_engines(now)
        if now >= self._next_config:
            resp = self._request("GET", f"{self.base}/v1/pool")
            if not isinstance(resp, str) and resp.status_code < 300:
                pool = json_body(resp)
                wm = pool.get("watermarks") if isinstance(pool, dict) else None
                if isinstance(wm, dict):
                    with self._lock:
                        self._watermarks = dict(wm)
                self._next_config = now + self.config_every_s
        with self._lock:
            self._resync = False
            recovered, self.failures = self.failures, 0
            self.posts_ok += 1
        if recovered:
            log.warning(
                "gateway %s answers again after %d failed attempts: resynchronised", self.base, recovered
            )
        return True

    def _ledger_outcome(self, ok: bool, resp: httpx.Response | str) -> None:
        """Log the first failed read of the lease ledger and the first good one after it: while it
        fails, evictions and pauses act on the last ledger read, though readings go through."""
        if ok:
            if self.ledger_failures:
                log.warning(
                    "gateway %s lease ledger read again after %d failures", self.base, self.ledger_failures
                )
            self.ledger_failures = 0
            return
        self.ledger_failures += 1
        if self.ledger_failures == 1:
            why = resp if isinstance(resp, str) else f"HTTP {resp.status_code} or an answer not in its shape"
            log.warning(
                "gateway %s: cannot read the lease ledger (%s): evictions and pauses act on the last"
                " ledger read until it can",
                self.base,
                why,
            )

    def _fetch_engines(self, now: float) -> None:
        resp = self._request("GET", f"{self.base}/v1/nodes/{self.node}/engines")
        if isinstance(resp, str):
            return
        if resp.status_code in UNSUPPORTED:
            self.engines_supported = False
            self._next_engines = now + self.engines_retry_s
            return
        if resp.status_code >= 300:
            return
        body = json_body(resp)
        engines = body.get("engines") if isinstance(body, dict) else None
        if isinstance(engines, list):
            self.engines_supported = True
            with self._lock:
                self._engines = [x for x in engines if isinstance(x, dict)]

    def _ok(self, resp: httpx.Response | str, *, what: str) -> bool:
        """True for 2xx. Retryable failures count towards backoff; a bad request is recorded only."""
        if isinstance(resp, str):
            return self._failed(resp)
        code = resp.status_code
        if code < 300:
            return True
        if code < 400:  # not delivered: httpx does not follow it, and the outbox must keep the events
            where = resp.headers.get("location", "")
            return self._failed(f"{what}: HTTP {code} redirect to {where!r}: --gateway must not redirect")
        if code >= 500 or code in RETRYABLE_4XX:
            return self._failed(f"{what}: HTTP {code}: {resp.text[:200]}")
        self.last_error = f"{what}: HTTP {code}: {resp.text[:200]}"
        if self.last_error != self._refusal_logged:  # the same refusal comes back at every flush
            self._refusal_logged = self.last_error
            log.warning("gateway %s refused %s (not retried)", self.base, self.last_error)
        return True  # a 4xx for this request: never retried (it would fail forever)

    def _send_events(
        self, snap: NodeSnapshot, events: list[AgentEvent], *, resync: bool, dropped: int
    ) -> bool:
        if self.events_supported is not False:
            resp = self._request(
                "POST", self.events_url, json=events_json(snap, events, resync=resync, dropped=dropped)
            )
            if not isinstance(resp, str) and resp.status_code in UNSUPPORTED:
                self.events_supported = False
            else:
                if not self._ok(resp, what="events"):
                    return False
                bad = not isinstance(resp, str) and resp.status_code >= 400
                self.events_supported = True
                self._pop(len(events), dropped=len(events) if bad else 0)
                return True
        # Fallback: a gateway without the events route still learns about revocations.
        unsent = 0
        for ev in events:
            if ev.kind != "revoke" or not ev.lease_id:
                unsent += 1
                continue
            resp = self._request("DELETE", f"{self.base}/v1/leases/{ev.lease_id}")
            if not isinstance(resp, str) and resp.status_code == 404:
                continue  # the gateway never had (or already forgot) this lease
            if not self._ok(resp, what=f"revoke {ev.lease_id}"):
                return False
        self._pop(len(events), unsent=unsent)
        return True

    def _pop(self, n: int, *, dropped: int = 0, unsent: int = 0) -> None:
        with self._lock:
            for _ in range(n):
                self._outbox.popleft()
            self.dropped_events += dropped
            self.unsent_events += unsent

    def _failed(self, why: str) -> bool:
        with self._lock:
            self.failures += 1
            self.last_error = why
            self._resync = True
        if self.failures == 1:  # once per outage; gateway_connected and last_error follow it
            log.warning("gateway %s: %s; enforcing locally, events kept, retrying", self.base, why)
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
