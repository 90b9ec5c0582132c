"""`EventHub` replay: ids, ``Last-Event-ID`` resume within the retention window, gaps, slow
subscribers (their stream ends instead of silently losing events) and tenant filtering."""

from __future__ import annotations

import asyncio

from gpupool.adapters.http.auth import Principal
from gpupool.adapters.http.runtime import EventHub, Gap
from gpupool.core.ports import GatewayEvent

A, B, OPS = Principal("a", "tenant"), Principal("b", "tenant"), Principal("ops", "admin")


def ev(i: int, tenant: str = "a") -> GatewayEvent:
    return GatewayEvent(kind="queued", at=float(i), ticket=f"t{i}", tenant=tenant)


def drain(q: asyncio.Queue[object]) -> list[object]:
    out = []
    while not q.empty():
        out.append(q.get_nowait())
    return out


def test_resume_replays_exactly_the_visible_events_after_the_id() -> None:
    async def main() -> None:
        hub = EventHub(retain=10)
        for i in range(1, 7):
            hub(ev(i, "a" if i % 2 else "b"))  # a: 1, 3, 5; b: 2, 4, 6
        _, q = hub.subscribe(A, hub.event_id(1))
        assert [(seq, e.ticket) for seq, e in drain(q)] == [(3, "t3"), (5, "t5")]
        _, q = hub.subscribe(OPS, hub.event_id(4))
        assert [seq for seq, _ in drain(q)] == [5, 6]
        _, q = hub.subscribe(B, hub.event_id(6))
        assert drain(q) == []
        hub(ev(7, "b"))
        assert [seq for seq, _ in drain(q)] == [7]

    asyncio.run(main())


def test_ids_outside_the_window_or_from_another_process_get_a_gap() -> None:
    async def main() -> None:
        hub = EventHub(retain=3)
        for i in range(1, 8):
            hub(ev(i))
        _, q = hub.subscribe(A, hub.event_id(2))  # 3 and 4 fell out of the window (5, 6, 7 kept)
        first, *rest = drain(q)
        assert (
            isinstance(first, Gap) and "2 events" in first.reason and first.oldest_event_id == hub.event_id(5)
        )
        assert [seq for seq, _ in rest] == [5, 6, 7]
        _, q = hub.subscribe(A, hub.event_id(4))  # just inside: no gap
        assert [seq for seq, _ in drain(q)] == [5, 6, 7]
        for bad in ("other-3", "garbage", f"{hub.epoch}-99", f"{hub.epoch}--1", ""):
            _, q = hub.subscribe(A, bad)
            items = drain(q)
            assert len(items) == 1 and isinstance(items[0], Gap), bad

    asyncio.run(main())


def test_a_slow_subscriber_is_marked_overflowed_and_can_resume_without_loss() -> None:
    async def main() -> None:
        hub = EventHub(queue_size=2, retain=100)
        sub, q = hub.subscribe(A)
        for i in range(1, 6):
            hub(ev(i))
        assert hub.overflowed(sub)
        got = [seq for seq, _ in drain(q)]
        assert got == [1, 2]  # what was queued before it overflowed, in order, nothing after
        hub.unsubscribe(sub)
        _, q = hub.subscribe(A, hub.event_id(got[-1]))
        assert [seq for seq, _ in drain(q)] == [3, 4, 5]

    asyncio.run(main())
