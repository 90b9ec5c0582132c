"""`Gateway`: what every part of the gateway app shares (the controller, tokens, group commit, event
hub, sizer, metrics, background tasks), and the ports it is built with (`Sizer`, `Metrics`).

Role: a small module that the app (`app.py`), the proxy (`proxy.py`) and the views import, so none
of them imports another for its types (no import circle). One `Gateway` per app, on
``app.state.gateway``; no module-level state.
"""

from __future__ import annotations

import asyncio
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
    reported (grants whose memory is still being freed; every other lease is ``usable``)."""
    agent_listeners: list[Callable[[str, list[Any]], None]] = field(default_factory=list)
    """Called with (node, events) for every ``POST /v1/nodes/{node}/events`` (the events as parsed:
    ``kind``, ``lease_id``, ``reason``, ``latency_ms`` ...): the tidal plane's engine reports."""
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
