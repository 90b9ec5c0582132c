"""`ProxyHost` and `ProxyCore`: what the OpenAI proxy (`proxy.add_proxy_routes`) needs of the process
that runs it, as Protocols.

Role: the same proxy code runs in the leader's gateway (host: the gateway's `context.Gateway`,
core: its `LeaseController`) and in a proxy replica (host: `replica.ReplicaHost`, core: a
`core.replica.ProxyReplica` granting inside delegated KV shares). Nothing else of either is visible
to the proxy, so neither needs to pretend to be the other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.http.context import Metrics, Sizer
from gpupool.core.clock import Clock
from gpupool.core.model import Lease, Request
from gpupool.core.outcome import Outcome
from gpupool.core.ports import Backend
from gpupool.core.tickets import TicketStatus


class WaitLimit(Protocol):
    @property
    def max_wait_s(self) -> float: ...


class ProxyConfig(Protocol):
    @property
    def retry_after_s(self) -> float: ...

    @property
    def admission(self) -> WaitLimit: ...


class SessionRouter(Protocol):
    """Where a session's turn goes and the prompt tokens waiting for a first token per instance
    (`core.sessions.SessionTable`; a replica's `core.replica.NoSessions`)."""

    def route(
        self,
        session: str,
        need_mib: int,
        prompt_tokens: int,
        instances: list[str],
        load: Callable[[str], tuple[int, int]],
    ) -> tuple[str, int]: ...

    def holder(self, session: str, prompt_tokens: int, need_mib: int) -> tuple[str, int, float]: ...

    def prefill_begin(self, instance: str, tokens: int) -> None: ...

    def prefill_done(self, instance: str, tokens: int, elapsed_s: float = 0.0) -> None: ...

    def note_routed(self, session: str, instance: str) -> None: ...


class KvLoads(Protocol):
    def load(self, slice_id: str) -> tuple[int, int]: ...


class TicketWaits(Protocol):
    async def wait_ticket(self, ticket: str, timeout_s: float) -> None: ...


class ProxyCore(Protocol):
    """The request-lease calls of the proxy (a `LeaseController` or a `ProxyReplica`)."""

    @property
    def clock(self) -> Clock: ...

    @property
    def config(self) -> ProxyConfig: ...

    @property
    def sessions(self) -> SessionRouter: ...

    @property
    def lane(self) -> KvLoads: ...

    def models(self) -> Mapping[str, list[Backend]]: ...

    def kv_capacity_mib(self, backend: Backend) -> int: ...

    def acquire(
        self,
        request: Request,
        *,
        wait_s: float | None = None,
        gpu_id: str = "",
        prefer: str = "",
        session: str = "",
        holder: str = "",
        patience_s: float = 0.0,
    ) -> Outcome: ...

    def kv_load(self, slice_id: str) -> tuple[int, int]: ...

    def session_begin(self, session: str, lease: Lease) -> None: ...

    def session_end(self, session: str, slice_id: str, prefix_mib: int) -> None: ...

    def release(self, lease_id: str, *, tenant: str | None = None, reason: str = "") -> Outcome: ...

    def ticket(self, ticket: str, *, tenant: str | None = None) -> TicketStatus: ...

    def cancel(self, ticket: str, *, tenant: str | None = None) -> TicketStatus: ...

    def backend_of(self, lease: Lease) -> Backend | None: ...


class ProxyHost(Protocol):
    """What the proxy reads of its process (the gateway's `Gateway` or a replica's host)."""

    @property
    def controller(self) -> ProxyCore: ...

    @property
    def tokens(self) -> TokenTable: ...

    @property
    def hub(self) -> TicketWaits: ...

    @property
    def sizer(self) -> Sizer | None: ...

    @property
    def metrics(self) -> Metrics | None: ...

    @property
    def default_max_tokens(self) -> int: ...

    @property
    def closers(self) -> list[Callable[[], Awaitable[None]]]: ...
