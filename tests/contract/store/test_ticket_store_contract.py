"""Tickets in every `LeaseStore` (memory = reference, SQLite and etcd = durable): codec, upsert, atomic with
the lease writes of the same batch, purge of old ended tickets, survival across a reopen."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from tests.builders import a_request

from gpupool.adapters.store import SqliteLeaseStore
from gpupool.core.errors import InvalidInput
from gpupool.core.model import Grant, Lease
from gpupool.core.ports import (
    LeaseStore,
    RevisionConflict,
    StoreWrite,
    TicketRecord,
    decode_ticket,
    encode_ticket,
    ticket_from_dict,
)
from gpupool.hardware.units import Resources

Factory = Callable[[], LeaseStore]


def lease(lid: str) -> Lease:
    r = a_request(f"r-{lid}", vram_mib=1024, nodes=("n1",))
    grants = (Grant("n1/0/a", "n1/0", Resources(1024, 0)),)
    return Lease(id=lid, request=r, node="n1", grants=grants, granted_at=0.5, expires_at=60.5)


def ticket(tid: str, *, state: str = "queued", ended_at: float | None = None) -> TicketRecord:
    return TicketRecord(
        ticket=tid,
        state=state,
        request=lease("x").request,
        enqueued_at=1.0 / 3.0,
        deadline_at=3600.125,
        gpu_id="n1/0",
        lease_id="L1" if state == "granted" else "",
        reason="" if state == "queued" else "why",
        ended_at=ended_at,
    )


def test_ticket_codec_round_trips_and_names_a_malformed_ticket() -> None:
    for t in (ticket("a"), ticket("b", state="granted", ended_at=7.25)):
        assert decode_ticket(encode_ticket(t)) == t
    with pytest.raises(InvalidInput, match='ticket="t9"'):
        ticket_from_dict({"ticket": "t9", "state": "queued"})


def test_tickets_upsert_list_sorted_and_get(make_store: Factory) -> None:
    s = make_store()
    s.apply([ticket("b"), ticket("a")])
    granted = ticket("b", state="granted", ended_at=5.0)
    s.apply([granted])
    assert [t.ticket for t in s.tickets()] == ["a", "b"]
    assert s.get_ticket("b") == granted and s.get_ticket("nope") is None


def test_a_ticket_lands_with_the_lease_writes_of_its_batch_or_not_at_all(make_store: Factory) -> None:
    s = make_store()
    s.apply([StoreWrite(lease("L1"), None), ticket("t", state="granted", ended_at=2.0)])
    assert s.get("L1") == lease("L1") and s.get_ticket("t") is not None
    with pytest.raises(RevisionConflict):
        s.apply([ticket("u"), StoreWrite(lease("L1"), None)])  # the lease exists: nothing lands
    assert s.get_ticket("u") is None


def test_purge_tickets_only_old_ended_ones(make_store: Factory) -> None:
    s = make_store()
    s.apply(
        [ticket("q"), ticket("old", state="shed", ended_at=10.0), ticket("new", state="shed", ended_at=20.0)]
    )
    assert s.purge_tickets(before_s=10.0) == 0
    assert s.purge_tickets(before_s=15.0) == 1
    assert [t.ticket for t in s.tickets()] == ["new", "q"]


def test_sqlite_tickets_survive_a_reopen(tmp_path: Path) -> None:
    p = tmp_path / "t.db"
    s1 = SqliteLeaseStore(p)
    s1.apply([ticket("a")])
    s1.close()
    s2 = SqliteLeaseStore(p)
    assert s2.tickets() == [ticket("a")]
    s2.apply([replace(ticket("a"), state="cancelled", ended_at=4.0)])
    assert s2.get_ticket("a") == replace(ticket("a"), state="cancelled", ended_at=4.0)
    s2.close()
