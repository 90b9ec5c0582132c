"""`Follower`: a standby replica's read-only view of the ledger in etcd, kept current by watch.

Role: while another replica leads (`gpupool.adapters.store.etcd_election`), a standby answers lease
reads from this view and forwards writes to the leader named by the leader key. The view never
writes and is never used to grant: the replica that wins the election rebuilds its ledger from the
store itself (`LeaseController.recover`), not from this view.

Invariants:
- the view starts from one `EtcdLeaseStore.snapshot` (leases, tickets, meta keys and the leader
  key read at one revision) and applies the watch's changes from that revision + 1, in revision
  order: at any time it equals the store as of `revision` (nothing missed, nothing applied twice);
- when the watch fails for good (etcd unreachable past the watch's retry window, or the revision
  it needs was compacted away), the view is rebuilt from a fresh snapshot, retried every
  ``retry_s`` until etcd answers; meanwhile reads keep answering the last view (`revision` says
  how old it is);
- ``on_leader`` is called (from the watch thread) with the leader key's new value, or None when it
  was deleted (the leader resigned or its etcd lease expired), so a standby can campaign at once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from gpupool.adapters.store.etcd import EtcdLeaseStore, StoreChange
from gpupool.adapters.store.etcd_client import EtcdError, Watch, prefix_end
from gpupool.core.model import Lease
from gpupool.core.ports import TicketRecord


class Follower:
    def __init__(
        self,
        store: EtcdLeaseStore,
        *,
        on_leader: Callable[[str | None], None] | None = None,
        retry_s: float = 0.5,
    ) -> None:
        self.store = store
        self.on_leader = on_leader
        self.retry_s = retry_s
        self.revision = 0
        """The etcd revision the view is current as of (0: not read yet)."""
        self._leases: dict[str, Lease] = {}
        self._tickets: dict[str, TicketRecord] = {}
        self._meta: dict[str, str] = {}
        self._leader: str | None = None
        self._lock = threading.Lock()
        self._watch: Watch | None = None
        self._stopped = threading.Event()
        self._resync: threading.Thread | None = None

    # ------------------------------------------------------------------ queries
    def leader(self) -> str | None:
        """The leader key's value (the leading replica's candidate id) in this view; None: no leader."""
        with self._lock:
            return self._leader

    def get(self, lease_id: str) -> Lease | None:
        with self._lock:
            return self._leases.get(lease_id)

    def leases(self, *, tenant: str | None = None) -> list[Lease]:
        with self._lock:
            out = [x for x in self._leases.values() if tenant is None or x.request.tenant == tenant]
        return sorted(out, key=lambda x: x.id)

    def meta(self, key: str) -> str | None:
        """A meta key's value in this view (e.g. the leader's device states), None if unset."""
        with self._lock:
            return self._meta.get(key)

    def ticket(self, ticket: str) -> TicketRecord | None:
        with self._lock:
            return self._tickets.get(ticket)

    # ------------------------------------------------------------------ following
    def start(self) -> Follower:
        """Read the snapshot and start the watch (`EtcdError` if etcd does not answer now)."""
        self._load()
        return self

    def _load(self) -> None:
        snap = self.store.snapshot()
        kvs, _ = self.store.client.range(self.store.prefix + b"leader", revision=snap.revision)
        leader = kvs[0].value.decode(errors="replace") if kvs else None
        meta_start = self.store.prefix + b"meta/"
        metas, _ = self.store.client.range(meta_start, prefix_end(meta_start), revision=snap.revision)
        with self._lock:
            self._leases = {x.id: x for x in snap.leases}
            self._tickets = {t.ticket: t for t in snap.tickets}
            self._meta = {
                kv.key[len(meta_start) :].decode(errors="replace"): kv.value.decode(errors="replace")
                for kv in metas
            }
            before, self._leader = self._leader, leader
            self.revision = snap.revision
        if self._stopped.is_set():
            return
        self._watch = self.store.watch(self._apply, start_revision=snap.revision + 1, on_error=self._failed)
        if before != leader and self.on_leader is not None:
            self.on_leader(leader)

    def _apply(self, changes: list[StoreChange], revision: int) -> None:
        leader_changes: list[str | None] = []
        with self._lock:
            for ch in changes:
                if ch.kind == "lease":
                    if isinstance(ch.value, Lease):
                        self._leases[ch.id] = ch.value
                    else:
                        self._leases.pop(ch.id, None)
                elif ch.kind == "ticket":
                    if isinstance(ch.value, TicketRecord):
                        self._tickets[ch.id] = ch.value
                    else:
                        self._tickets.pop(ch.id, None)
                elif ch.kind == "meta":
                    if isinstance(ch.value, str):
                        self._meta[ch.id] = ch.value
                    else:
                        self._meta.pop(ch.id, None)
                elif ch.kind == "leader":
                    self._leader = ch.value if isinstance(ch.value, str) else None
                    leader_changes.append(self._leader)
            self.revision = max(self.revision, revision)
        if self.on_leader is not None:
            for v in leader_changes:
                self.on_leader(v)

    def _failed(self, exc: BaseException) -> None:
        if self._stopped.is_set():
            return
        self._resync = threading.Thread(target=self._reload, name="gpupool-follower-resync", daemon=True)
        self._resync.start()

    def _reload(self) -> None:
        while not self._stopped.is_set():
            try:
                self._load()
                return
            except EtcdError:
                self._stopped.wait(self.retry_s)

    def close(self) -> None:
        """Stop following (no callback starts after this returns). The store stays open."""
        self._stopped.set()
        w = self._watch
        if w is not None:
            with contextlib.suppress(Exception):
                w.cancel()
        t = self._resync
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5.0)


__all__ = ["Follower"]
