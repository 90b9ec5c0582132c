"""`Forwarder`: a standby replica's extender verbs, relayed to the leading replica's extender.

Role: with several ``gpupool serve --kubernetes`` replicas on one etcd, kube-scheduler is given one
extender address (a Service over every replica). Only the leader owns the ledger, so a standby
relays each call (``filter``, ``prioritize``, ``bind``, ``preempt``, ``<prefix>/state``) to the
leader's extender URL (read from the leader key, `gpupool.cli.ha`) and sends its answer back byte
for byte. A new leader serves the verbs from its own ledger, rebuilt from the store.

Why relay the reads too (filter, prioritize) instead of answering them from the standby's followed
view of the store: filter's answer is what bind is checked against, and the leader's card index is
the one kept current by every grant as it happens, while a standby's view lags by a watch round
trip, so a standby's "fits" could send kube-scheduler to a node the leader then refuses at bind (a
wasted scheduling cycle for the pod); and without a Kubernetes API (``--no-kube``) bind can only
find the pod's demand where filter saw it. A relay costs one loopback-or-LAN hop and no second copy
of the card index per standby. Hand-rolled on ``http.client`` (standard library) because the
extender server itself is standard-library ``http.server`` and the relay is one request / one
answer, no streaming.

Invariants:
- a standby never answers a verb itself: it relays or answers 503 (`Unavailable`: no leader, the
  leader is this very replica and still starting, a relayed call arriving at a replica that does not
  lead (no loops: ``x-gpupool-forwarded-by``), or the leader unreachable or failing mid-answer);
- bind through a relay keeps the leader's guarantees: a compare-and-set keyed by pod UID, so a bind
  retried after an answer was lost (the leader died between commit and reply) finds the lease the
  store kept and grants nothing twice.
"""

from __future__ import annotations

import http.client
from collections.abc import Callable
from urllib.parse import urlsplit

FORWARDED_BY = "x-gpupool-forwarded-by"
RELAY_TIMEOUT_S = 4.0
"""Below kube-scheduler's default extender ``httpTimeout`` (5 s, the chart's too): a relay that
would take longer ends with our 503 before kube-scheduler's own call times out."""


class Unavailable(Exception):
    """The call cannot be relayed now (the message says why); answered 503, retryable."""


class Forwarder:
    def __init__(
        self, leader_url: Callable[[], str | None], *, self_url: str, timeout_s: float = RELAY_TIMEOUT_S
    ) -> None:
        """``leader_url``: the leading replica's extender base URL now (with its prefix; None: no
        leader); ``self_url``: this replica's own extender URL (never relayed to)."""
        self.leader_url = leader_url
        self.self_url = self_url.rstrip("/")
        self.timeout_s = timeout_s
        self.relayed = 0

    def forward(self, method: str, path: str, body: bytes) -> tuple[int, bytes]:
        """Send ``method path`` (the path as received, prefix included) with ``body`` to the leader;
        its (status, body). `Unavailable` when there is no leader to send it to or it fails."""
        leader = (self.leader_url() or "").rstrip("/")
        if not leader:
            raise Unavailable("no leader is elected now; retry")
        if leader == self.self_url:
            raise Unavailable("this replica was elected and is starting; retry")
        parts = urlsplit(leader)
        host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
        conn_type = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = conn_type(host, port, timeout=self.timeout_s)
        headers = {FORWARDED_BY: self.self_url}
        if method == "POST":
            headers["Content-Type"] = "application/json"
        try:
            conn.request(method, path, body=body if method == "POST" else None, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise Unavailable(f"cannot reach the leader's extender {leader}: {exc}; retry") from None
        finally:
            conn.close()
        self.relayed += 1
        return resp.status, data


__all__ = ["FORWARDED_BY", "RELAY_TIMEOUT_S", "Forwarder", "Unavailable"]
