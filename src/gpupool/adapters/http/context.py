"""`Gateway`: what every part of the gateway app shares (the controller, tokens, group commit, event
hub, sizer, metrics, background tasks), and the ports it is built with (`Sizer`, `Metrics`).

Role: a small module that the app (`app.py`), the proxy (`proxy.py`) and the views import, so none
of them imports another for its types (no import circle). One `Gateway` per app, on
``app.state.gateway``; no module-level state.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.http.runtime import EventHub, GroupCommitter
from gpupool.core.controller import LeaseController


class Sizer(Protocol):
    """Token counts -> MiB for a model (the KV-cache estimator). Raises ValueError for unknown models."""

    def request_mib(self, model: str, tokens: int) -> int: ...

    def instance_mib(self, model: str, tokens: int) -> int: ...


class Metrics(Protocol):
    def render(self) -> tuple[bytes, str]: ...

    def observe_proxy(self, model: str, status: int, ttft_s: float | None, latency_s: float) -> None: ...


DEVICE_STATES_META = "device_states"
"""Store meta key: JSON ``{node: {lease id: device state}}`` (`Gateway.device_states`)."""


def parse_device_states(text: str | None) -> dict[str, dict[str, str]]:
    """The stored `DEVICE_STATES_META` value; ``{}`` for none or a damaged one (a damaged hint
    reads ``usable`` until the node's agent reports again: it reports every few seconds)."""
    try:
        doc = json.loads(text) if text else {}
    except ValueError:
        return {}
    if not isinstance(doc, dict):
        return {}
    return {
        str(node): {str(k): str(v) for k, v in states.items()}
        for node, states in doc.items()
        if isinstance(states, dict)
    }


DRAINED_META = "drained_gpus"
"""Store meta key: JSON list of the GPUs an admin drained (``POST /v1/admin/gpus/{gpu_id}/drain``),
written before each such drain or undrain takes effect, so that it outlives a restart
(`restore_drained`). GPUs the pool drains on its own (tidal re-partitioning) are not in it."""


CLOSED_META = "closed_slices"
"""Store meta key: JSON list of the slices an admin marked unhealthy (``POST
/v1/admin/slices/{slice_id}/health``), written like `DRAINED_META` (`restore_closed`)."""


def stored_drained(controller: LeaseController, key: str = DRAINED_META) -> set[str]:
    """The ids of the controller's stored ``key`` list (`DRAINED_META`: GPUs, `CLOSED_META`:
    slices; none for a missing or damaged value)."""
    text = controller.store.get_meta(key)
    try:
        doc = json.loads(text) if text else []
    except ValueError:
        return set()
    return {g for g in doc if isinstance(g, str)} if isinstance(doc, list) else set()


def reopen_refused(controller: LeaseController, slice_id: str) -> str | None:
    """Why marking ``slice_id`` healthy is refused (HTTP 409): its GPU is drained, and a slice of a
    drained GPU reopens only with its GPU (else it would take leases on the drained GPU until the
    next restart drains it again). `UnknownId` for an unknown slice."""
    gpu = controller.allocator.slice_state(slice_id).slice.gpu_id
    if gpu not in controller.drained:
        return None
    return f'slice {slice_id} is on drained GPU {gpu}: undrain the GPU ({{"undo": true}}) to reopen it'


def restore_drained(controller: LeaseController) -> list[str]:
    """Drain again (revoking nothing) every stored admin-drained GPU still in the pool, and close
    again every stored admin-closed slice still in it; returns the GPUs."""
    again = sorted(stored_drained(controller) & set(controller.allocator.ledger.gpu_ids()))
    for gpu in again:
        controller.drain_gpu(gpu)
    for sid in sorted(stored_drained(controller, CLOSED_META) & set(controller.allocator.ledger.slice_ids())):
        controller.mark_slice(sid, healthy=False)
    return again


@dataclass
class Gateway:
    controller: LeaseController
    tokens: TokenTable
    committer: GroupCommitter
    hub: EventHub
    sizer: Sizer | None = None
    metrics: Metrics | None = None
    tick_s: float = 0.1
    default_max_tokens: int = 256
    agent_events: int = 0
    device_states: dict[str, dict[str, str]] = field(default_factory=dict)
    """node -> lease id -> ``granted-pending-free`` | ``free-failed``, as that node's agent last
    reported (grants whose memory is still being freed; every other lease is ``usable``). Also
    kept in the store's meta key `DEVICE_STATES_META` (written when it changes), so standby
    replicas and a new leader read the same."""
    device_states_saved: bool = True
    """False when the last write of `device_states` to the store failed (the next report retries)."""
    node_slices: dict[str, list[Any]] | None = None
    """node -> its published slice list as last written to the store (`gpupool.adapters.http.node_slices`);
    None until read, or after a failed write."""
    agent_listeners: list[Callable[[str, list[Any]], None]] = field(default_factory=list)
    """Called with (node, events) for every ``POST /v1/nodes/{node}/events`` (the events as parsed:
    ``kind``, ``lease_id``, ``reason``, ``latency_ms`` ...): the tidal plane's engine reports."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


def forget_ticket(gw: Gateway, ticket: str) -> None:
    """The client of a waiting ``POST /v1/leases`` hung up before it was told ``ticket``: cancel the
    ticket, and release the lease if it was granted meanwhile (nobody would ever use or release it,
    and it would hold its capacity until its TTL). Written like any change (the next group commit)."""
    c = gw.controller
    st = c.cancel(ticket)
    if st.state == "granted" and st.lease is not None:
        c.release(st.lease.id, reason="the client hung up before it was told of the lease")
    gw.committer.kick()
