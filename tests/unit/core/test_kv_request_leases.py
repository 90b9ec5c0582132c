"""Request leases (KV budget) with nothing queued: a grant is counted once and leaves one lease; a
request no backend's budget could ever hold is still UNRESOLVABLE; a full budget still queues."""

from __future__ import annotations

import os
import time

from gpupool.adapters.store import MemoryLeaseStore
from gpupool.cli.demo import seed_example_pool
from gpupool.core.clock import FunctionClock
from gpupool.core.controller import LeaseController
from gpupool.core.model import Request
from gpupool.core.outcome import OutcomeCode
from gpupool.core.ports import Backend
from gpupool.hardware.units import Resources

MODEL = "qwen2.5-0.5b"


def _controller() -> LeaseController:
    c = LeaseController(seed_example_pool(), clock=FunctionClock(time.time), store=MemoryLeaseStore())
    c.register_backend(
        Backend("be", MODEL, "http://127.0.0.1:9", node="gpu-b", gpu_id="gpu-b/0", kv_budget_mib=100)
    )
    return c


def _req(mib: int) -> Request:
    return Request(
        id=os.urandom(8).hex(), tenant="t", priority=1, demand=Resources(mib, 0), ttl_s=60.0, model=MODEL
    )


def test_kv_grant_with_an_empty_queue_is_counted_once() -> None:
    c = _controller()
    before = dict(c.outcomes)
    out = c.acquire(_req(60))
    assert out.code is OutcomeCode.GRANTED and out.lease is not None
    assert c.request_lease_count() == 1 and c.backend_of(out.lease) is not None
    grew = {k: v - before.get(k, 0) for k, v in c.outcomes.items() if v != before.get(k, 0)}
    assert list(grew.values()) == [1] and next(iter(grew))[1] == "granted"
    c.release(out.lease.id)
    assert c.request_lease_count() == 0
    c.check_invariants()


def test_kv_never_fitting_is_unresolvable_and_a_full_budget_queues() -> None:
    c = _controller()
    out = c.acquire(_req(101))
    assert out.code is OutcomeCode.UNRESOLVABLE and "model" in out.reason
    held = c.acquire(_req(80))
    assert held.granted
    waiting = c.acquire(_req(50), wait_s=5.0)
    assert waiting.code is OutcomeCode.QUEUED and waiting.ticket
    assert held.lease is not None
    c.release(held.lease.id)
    st = c.ticket(waiting.ticket)
    assert st.state == "granted" and st.lease is not None  # the freed budget went to the queue
    c.check_invariants()
