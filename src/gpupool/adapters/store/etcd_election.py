"""`Election`: one leader among the gateway replicas sharing an etcd store, on an etcd lease, with
fencing.

Role: a replica campaigns; the winner owns the ledger and grants, the others stand by (they follow
the store with `EtcdLeaseStore.snapshot` + `watch`). Section 3 of the HA design; the serving side
(standbys forwarding writes) builds on this module.

Invariants:
- the leader key is ``PREFIX leader``; its value is the candidate's id, and it is attached to an etcd
  lease of ``ttl_s`` seconds that only the leader renews (every ``ttl_s / 3``). It is created with a
  Txn "only if absent", so at most one replica holds it at a time; when the leader stops renewing
  (crash, ``kill -9``, ``SIGSTOP``, partition), etcd deletes it after ``ttl_s`` and a standby wins;
- fencing: on winning, the store's writes start to carry the compare "leader key's create_revision
  == the one this replica created" (`EtcdLeaseStore.set_fence`). After the key expired or another
  replica created it anew, every write of the old leader, lease batches, tickets, meta and job
  changes alike, fails with `NotLeader` inside etcd's Txn, whatever the old leader believes. A
  paused leader that wakes up cannot write, even before it notices;
- the local view is conservative: `is_leader` turns False once ``ttl_s`` have passed since the last
  renewal that etcd confirmed was *sent* (not answered), or when a renewal says the lease is gone;
  then ``on_lost`` is called once and the fence is set to a revision no key has (so nothing this
  replica sends lands any more, even while etcd still holds its key);
- `resign` revokes the etcd lease: the key goes at once and a standby takes over without waiting.
Time comes from the injected ``clock`` (monotonic seconds).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from gpupool.adapters.store.etcd import EtcdLeaseStore
from gpupool.adapters.store.etcd_client import EtcdError, compare, put_op, range_op
from gpupool.core.errors import InvalidInput

MIN_TTL_S = 2  # etcd refuses leases shorter than its minimum TTL (1.5 s with default timings)


class Election:
    def __init__(
        self,
        store: EtcdLeaseStore,
        *,
        candidate: str,
        ttl_s: int = 3,
        clock: Callable[[], float] = time.monotonic,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        if not candidate:
            raise InvalidInput("candidate", candidate, "must be a non-empty id")
        if type(ttl_s) is not int or ttl_s < MIN_TTL_S:
            raise InvalidInput("ttl_s", ttl_s, f"must be an integer >= {MIN_TTL_S}")
        self.store = store
        self.client = store.client
        self.key = store.prefix + b"leader"
        self.candidate = candidate
        self.ttl_s = ttl_s
        self.clock = clock
        self.on_lost = on_lost
        self.revision = 0
        """The leader key's create_revision while this replica leads (its election revision)."""
        self._lease_id = 0
        self._valid_until = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ queries
    @property
    def is_leader(self) -> bool:
        with self._lock:
            return self.revision != 0 and self.clock() < self._valid_until

    def leader(self) -> str | None:
        """The current leader's candidate id as etcd has it (None: no leader)."""
        kvs, _ = self.client.range(self.key)
        return kvs[0].value.decode() if kvs else None

    # ------------------------------------------------------------------ campaign
    def try_acquire(self) -> bool:
        """One attempt: become leader if nobody is. True when this replica leads now."""
        if self.is_leader:
            return True
        sent = self.clock()
        lease_id = self.client.lease_grant(self.ttl_s)
        ok, _, revision = self.client.txn(
            [compare(self.key, "VERSION", 0)],
            [put_op(self.key, self.candidate.encode(), lease=lease_id)],
            [range_op(self.key)],
        )
        if not ok:
            self.client.lease_revoke(lease_id)
            return False
        with self._lock:
            self._lease_id = lease_id
            self.revision = revision  # the Txn created the key: its create_revision is this revision
            self._valid_until = sent + self.ttl_s
        self.store.set_fence(self.key, revision)
        self._stop.clear()
        self._thread = threading.Thread(target=self._keep_alive, name="gpupool-election", daemon=True)
        self._thread.start()
        return True

    def campaign(self, *, timeout_s: float | None = None, poll_s: float = 0.2) -> bool:
        """Try until this replica leads (True) or ``timeout_s`` passed (False)."""
        deadline = None if timeout_s is None else self.clock() + timeout_s
        while True:
            try:
                if self.try_acquire():
                    return True
            except EtcdError:
                pass  # etcd unreachable: keep trying, we are not the leader meanwhile
            if deadline is not None and self.clock() >= deadline:
                return False
            time.sleep(poll_s)

    # ------------------------------------------------------------------ keep-alive
    def _keep_alive(self) -> None:
        period = self.ttl_s / 3
        while not self._stop.wait(period):
            sent = self.clock()
            try:
                ttl = self.client.lease_keepalive(self._lease_id)
            except EtcdError:
                ttl = -1  # unknown: try again next period unless the lease ran out meanwhile
            with self._lock:
                if ttl > 0:
                    self._valid_until = sent + self.ttl_s
                lost = ttl == 0 or self.clock() >= self._valid_until
            if lost:
                self._step_down()
                return

    def _step_down(self) -> None:
        with self._lock:
            was = self.revision != 0
            self.revision = 0
            self._valid_until = 0.0
        # fence every later write off for good (a key's create_revision is never 0 - 1): even if
        # etcd still holds our key for a moment, nothing this replica sends lands any more
        self.store.set_fence(self.key, -1)
        if was and self.on_lost is not None:
            self.on_lost()

    def resign(self) -> None:
        """Give the leadership up now (the key is deleted; a standby can win at once)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        lease_id = self._lease_id
        with self._lock:
            self.revision = 0
            self._valid_until = 0.0
            self._lease_id = 0
        self.store.set_fence(self.key, -1)
        if lease_id:
            with contextlib.suppress(EtcdError):  # (else it expires by itself within ttl_s)
                self.client.lease_revoke(lease_id)

    def close(self) -> None:
        self.resign()


__all__ = ["MIN_TTL_S", "Election"]
