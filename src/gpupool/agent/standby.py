"""`EngineSleeps`: the agent's side of the control plane's engine directives (tidal standby instances).

Role: the gateway names, per node, the engines it wants asleep or awake (``GET /v1/nodes/{node}/engines``,
fetched by the reporter with the ledger; `gpupool.core.tidal.standby` decides). Each tick the agent
converges on them with the pauser the directive names (``vllm-sleep``: ``POST /sleep?level=N`` /
``POST /wake_up`` on the engine's endpoint, then ``GET /is_sleeping`` to confirm) and reports the
outcome as an event: ``engine_asleep`` / ``engine_awake`` (``latency_ms``: the pauser call and its
confirmation) or ``engine_sleep_failed`` / ``engine_wake_failed`` (the reason), with ``lease_id`` = the
engine id. A failed action is retried after ``retry_s``; a failure that lasts is reported as the
agent's other persisting failures are (`gpupool.agent.repeats`): when it starts, then at most once
per ``remind_s`` with the count of repeats not reported, and one ``failure_cleared`` when the engine
reaches the state or is told the other one (forgotten silently when its directive goes). A wake
waits while ``blocked(gpu_id)``: the agent is still freeing memory on that GPU (evictions of the
batch work that had the slice), so an engine never loads its weights back onto memory another
process still holds.

Invariants: all state is touched on the agent's tick thread; the pauser calls run on the agent's
worker pool (`submit`, given the engine's endpoint) and their outcome is read in a later `step`; at
most one action per engine is in flight; an engine absent from a newer directive list is forgotten
(left as it is); a bad directive is reported once for as long as it stays in the lists.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from gpupool.agent.repeats import Repeats
from gpupool.core.pausers import Pauser, PauseResult, Workload

STATES = ("awake", "asleep")
LEVELS = (1, 2)
"""vLLM's sleep levels (1: weights to host memory; 2: weights dropped)."""


@dataclass(frozen=True, slots=True)
class Directive:
    id: str
    gpu_id: str
    endpoint: str
    pauser: str
    level: int
    state: str


@dataclass(slots=True)
class _Engine:
    want: Directive
    actual: str = "unknown"
    future: Future[tuple[PauseResult, bool | None]] | None = None
    doing: str = ""
    retry_at: float = -math.inf


def parse_directives(raw: Sequence[Mapping[str, object]]) -> tuple[list[Directive], list[str]]:
    """(valid directives, one reason per invalid entry)."""
    out, bad = [], []
    for i, x in enumerate(raw):
        level = x.get("level", 1)
        fields = [x.get(k) for k in ("id", "gpu_id", "endpoint", "pauser", "state")]
        if not all(isinstance(f, str) and f for f in fields) or type(level) is not int:
            bad.append(f"engines[{i}]: needs string id, gpu_id, endpoint, pauser, state and integer level")
            continue
        if level not in LEVELS:
            bad.append(f"engines[{i}].level: {level!r} must be one of {', '.join(map(str, LEVELS))}")
            continue
        if x["state"] not in STATES:
            bad.append(f"engines[{i}].state: {x['state']!r} must be one of {', '.join(STATES)}")
            continue
        out.append(
            Directive(
                str(x["id"]), str(x["gpu_id"]), str(x["endpoint"]), str(x["pauser"]), level, str(x["state"])
            )
        )
    return out, bad


class EngineSleeps:
    def __init__(
        self,
        pausers: Mapping[str, Pauser],
        *,
        submit: Callable[
            [Callable[[], tuple[PauseResult, bool | None]], str], Future[tuple[PauseResult, bool | None]]
        ],
        emit: Callable[..., None],
        retry_s: float = 2.0,
        blocked: Callable[[str], bool] | None = None,
    ) -> None:
        self.pausers = pausers
        self.submit = submit
        self.emit = emit
        self.retry_s = retry_s
        self.blocked = blocked
        self.engines: dict[str, _Engine] = {}
        self.repeats = Repeats(emit)
        """Failing actions, keyed (engine id, state it is told): reported when they start and end."""
        self._bad: set[str] = set()
        """The bad directives of the last list, already reported."""

    def take(self, raw: Sequence[Mapping[str, object]], now: float) -> None:
        """A new directive list from the gateway (replaces the previous one)."""
        good, bad = parse_directives(raw)
        for why in bad:
            if why not in self._bad:  # the list is fetched every second: say it once
                self.emit("engine_sleep_failed", now, reason=f"bad directive: {why}")
        self._bad = set(bad)
        seen = set()
        for d in good:
            seen.add(d.id)
            e = self.engines.get(d.id)
            if e is None:
                self.engines[d.id] = _Engine(d)
            elif e.want != d:
                if e.want.state != d.state:  # a failure to reach the old state is over
                    self.repeats.clear((d.id, e.want.state), now)
                e.want = d
                e.retry_at = -math.inf
        for gone in [k for k, e in self.engines.items() if k not in seen and e.future is None]:
            for state in STATES:
                self.repeats.forget((gone, state))
            del self.engines[gone]

    def step(self, now: float) -> None:
        """Harvest finished actions; start the next one where an engine is not where it should be."""
        for e in self.engines.values():
            if e.future is not None and e.future.done():
                self._harvest(e, now)
            if e.future is None and e.actual != e.want.state and now >= e.retry_at:
                self._start(e, now)

    def _start(self, e: _Engine, now: float) -> None:
        d = e.want
        pauser = self.pausers.get(d.pauser)
        kind = "engine_sleep_failed" if d.state == "asleep" else "engine_wake_failed"
        if pauser is None:
            e.retry_at = math.inf
            self._failed(kind, now, d, d.state, reason=f"unknown pauser {d.pauser!r}")
            return
        w = Workload(d.id, d.gpu_id, d.pauser, priority=0, endpoint=d.endpoint, sleep_level=d.level)
        why = pauser.check(w)
        if why is not None:
            e.retry_at = math.inf
            self._failed(kind, now, d, d.state, reason=why)
            return
        if d.state == "awake" and self.blocked is not None and self.blocked(d.gpu_id):
            return  # memory on the GPU is still being freed: wake on a later tick
        act = pauser.pause if d.state == "asleep" else pauser.resume

        def work() -> tuple[PauseResult, bool | None]:
            r = act(w)
            return r, (pauser.is_paused(w) if r.ok else None)

        e.doing = d.state
        e.future = self.submit(work, d.endpoint)

    def _harvest(self, e: _Engine, now: float) -> None:
        assert e.future is not None
        fut, e.future = e.future, None
        d, target = e.want, e.doing
        kind_ok = "engine_asleep" if target == "asleep" else "engine_awake"
        kind_bad = "engine_sleep_failed" if target == "asleep" else "engine_wake_failed"
        exc = fut.exception()
        if exc is not None:
            e.retry_at = now + self.retry_s
            self._failed(kind_bad, now, d, target, reason=f"{type(exc).__name__}: {exc}")
            return
        r, sleeping = fut.result()
        confirmed = r.ok and sleeping is (target == "asleep")
        if not confirmed:
            e.retry_at = now + self.retry_s
            why = r.reason if not r.ok else f"is_sleeping reads {sleeping} after the call"
            self._failed(kind_bad, now, d, target, reason=why, latency_ms=r.latency_ms)
            return
        e.actual = target
        self._say(
            kind_ok, now, d, frees=r.frees.value, reason=f"{d.endpoint}: {r.reason}", latency_ms=r.latency_ms
        )
        self.repeats.clear((d.id, target), now)

    def _failed(self, kind: str, now: float, d: Directive, target: str, **fields: Any) -> None:
        """A failed action taking ``d``'s engine to ``target``: reported through `Repeats`; once
        only when the directive changed while it ran (no condition is left open to clear)."""
        if target != d.state:
            self._say(kind, now, d, **fields)
            return
        self.repeats.fail(
            (d.id, target), kind, now, gpu_id=d.gpu_id, lease_id=d.id, pauser=d.pauser, **fields
        )

    def _say(self, kind: str, now: float, d: Directive, **fields: Any) -> None:
        """An event about directive ``d``'s engine (its GPU, lease id and pauser named)."""
        self.emit(kind, now, gpu_id=d.gpu_id, lease_id=d.id, pauser=d.pauser, **fields)


__all__ = ["Directive", "EngineSleeps", "parse_directives"]
