"""Online serving per model group: arrivals routed to instances, FCFS prefill, batched decode.

Role: the per-request half of the tidal simulation. For one role (main, guard, embed, rerank) it
routes each request to the instance that would start it first (earliest finish of its prefill),
then records start, first token and end. An instance's prefill server is FCFS and compute-bound;
decode overlaps later prefills (continuous batching) and costs ``output * t_iter`` of wall time.

Availability comes from `Availability`: which instances are awake at each instant (mode changes
put the lent ones to sleep; morning or a night surge wakes them, paying the pauser costs). Each
night request is labelled with its service path: ``free`` (an awake instance was idle),
``holdback`` (an awake instance was running lent P2 work: stop P2 admission, wait for the current
iteration), ``queued`` (waited behind online work) or ``pauser`` (served by an instance woken for
the surge, after the batch engine on its slice was put to sleep).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpupool.sim.tidal import perf
from gpupool.sim.tidal.platform import Instance

F = npt.NDArray[np.float64]
WAKE_TRIGGER_S = 0.5
"""A night P0 request that would wait longer than this on the awake instances wakes a lent one."""
P2_CHUNK_TOKENS = 512
"""Prefill chunk of lent P2 work in an online engine: the iteration a P0 arrival may have to wait."""


@dataclass(slots=True)
class Availability:
    """Per instance: awake from ``ready_at``; asleep in ``[sleep_from, ready_at)`` windows."""

    night: list[tuple[float, float]]
    lent: dict[str, str]
    wake_cost_s: dict[str, float]
    repartition_s: float
    day_lending: frozenset[str] = frozenset()
    """What-if only: instances that also take P2 work at request level by DAY (holdback on P0)."""
    p2_active: dict[str, npt.NDArray[np.bool_]] | None = None
    """Per request-lent instance and minute (from ``t0_s``): was lent P2 work running? None: assume
    yes (first pass); the second pass uses what the batch drain actually ran."""
    t0_s: float = 86400.0
    day_level: npt.NDArray[np.float64] | None = None
    """``tidal-lending``: the SLO guard's lending level per minute (from ``t0_s``); the P2 capacity a
    day-lent instance offers is its idle time x the level, and a P0 arrival on an engine free of
    online work meets lent P2 with probability = the level. None: level 1 (the what-if)."""

    def p2_on(self, name: str, t: float) -> bool:
        if self.p2_active is None:
            return True
        arr = self.p2_active.get(name)
        m = int((t - self.t0_s) // 60)
        return arr is not None and 0 <= m < len(arr) and bool(arr[m])

    def level_at(self, t: float) -> float:
        """The day-lending level at ``t`` (1 without a guard: the what-if lends all idle time)."""
        if self.day_level is None:
            return 1.0
        m = int((t - self.t0_s) // 60)
        return float(self.day_level[m]) if 0 <= m < len(self.day_level) else 0.0

    sleeps: dict[str, list[list[float]]] = field(default_factory=dict)
    """instance -> [[asleep_from, ready_again_at, woken_by_surge(0/1)], ...]."""


@dataclass(frozen=True, slots=True)
class Served:
    arrival: F
    start: F
    first_token: F
    end: F
    instance: npt.NDArray[np.int64]
    kv_bytes: F
    night_path: npt.NDArray[np.int64]
    """-1 outside NIGHT, else index into ``PATHS``."""


PATHS = ("free", "holdback", "queued", "pauser")


def serve(
    role_instances: tuple[Instance, ...],
    model: perf.ModelSpec,
    arrival: F,
    prompt: F,
    output: F,
    *,
    avail: Availability | None,
    rng: np.random.Generator,
    allow_surge: bool,
) -> Served:
    n, k = len(arrival), len(role_instances)
    speed = np.array([i.spec.flops for i in role_instances])
    prefill_work = perf.forward_flops(model, prompt)  # FLOPs
    t_iter = np.array(
        [perf.decode_iter_s(model, i.spec, batch=8, ctx_tokens=float(np.mean(prompt)) if n else 1.0)
         for i in role_instances]
    )  # fmt: skip
    p2_iter = np.array(
        [float(perf.prefill_s(model, i.spec, np.array([float(P2_CHUNK_TOKENS)]))[0]) for i in role_instances]
    )
    free_at = np.zeros(k)
    start = np.empty(n)
    first = np.empty(n)
    end = np.empty(n)
    inst = np.empty(n, dtype=np.int64)
    path = np.full(n, -1, dtype=np.int64)
    nights = avail.night if avail else []
    lent = [avail.lent.get(i.name, "never") if avail else "never" for i in role_instances]
    names = [i.name for i in role_instances]
    asleep_from = [np.inf] * k  # current sleep window of each instance
    ready_at = [0.0] * k
    night_idx = 0
    in_night = False
    surge_woken = [False] * k
    cur_night_end = 0.0
    for r in range(n):
        a = float(arrival[r])
        # -- mode transitions up to this arrival
        while night_idx < len(nights) and (
            (in_night and a >= nights[night_idx][1]) or (not in_night and a >= nights[night_idx][0])
        ):
            t0, t1 = nights[night_idx]
            if not in_night:
                in_night, cur_night_end = True, t1
                for j in range(k):
                    if lent[j] in ("engine", "partition"):
                        asleep_from[j] = max(t0, float(free_at[j]))
                        ready_at[j] = np.inf
                        surge_woken[j] = False
            else:
                in_night = False
                for j in range(k):
                    if lent[j] in ("engine", "partition") and asleep_from[j] != np.inf:
                        assert avail is not None
                        cost = avail.wake_cost_s[names[j]]
                        if lent[j] == "partition":
                            cost += avail.repartition_s
                        wake = max(t1, asleep_from[j]) if not surge_woken[j] else t1
                        if not surge_woken[j]:
                            ready_at[j] = wake + cost
                            avail.sleeps.setdefault(names[j], []).append([asleep_from[j], ready_at[j], 0.0])
                        asleep_from[j] = np.inf
                night_idx += 1
        # -- pick the instance that finishes this prefill first
        best_j, best_fin, best_start = -1, np.inf, np.inf
        work = float(prefill_work[r])
        for j in range(k):
            if ready_at[j] == np.inf:
                continue
            s = max(a, float(free_at[j]), ready_at[j])
            fin = s + work / float(speed[j])
            if fin < best_fin:
                best_j, best_fin, best_start = j, fin, s
        label = -1
        if in_night and allow_surge and best_start - a > WAKE_TRIGGER_S and avail is not None:
            for j in range(k):
                if ready_at[j] == np.inf and lent[j] == "engine":
                    ready = max(a, asleep_from[j]) + avail.wake_cost_s[names[j]]
                    avail.sleeps.setdefault(names[j], []).append([asleep_from[j], ready, 1.0])
                    ready_at[j], surge_woken[j] = ready, True
                    fin = ready + work / float(speed[j])
                    if fin < best_fin:
                        best_j, best_fin, best_start, label = j, fin, ready, 3
                    break
        j = best_j
        if j < 0:
            raise RuntimeError(f"no awake instance for {role_instances[0].role} at t={a:.0f}s")
        s = best_start
        p2_here = avail is not None and avail.p2_on(names[j], a)
        day_lent = avail is not None and not in_night and names[j] in avail.day_lending and p2_here
        if day_lent and avail is not None and avail.day_level is not None:
            # at level L, lent P2 fills the fraction L of the engine's idle time: a P0 arrival that
            # finds the engine free of online work meets a running P2 chunk with probability L
            day_lent = float(rng.random()) < avail.level_at(a)
        if day_lent and not (s > a and free_at[j] > a):
            s += perf.HOLDBACK_S + float(rng.random()) * float(p2_iter[j])
        if in_night and label < 0:
            if s > a and free_at[j] > a:
                label = 2
            elif lent[j] == "request" and p2_here:
                s += perf.HOLDBACK_S + float(rng.random()) * float(p2_iter[j])
                label = 1
            else:
                label = 0
        pf = work / float(speed[j])
        free_at[j] = s + pf
        start[r], first[r] = s, s + pf
        end[r] = s + pf + float(output[r]) * float(t_iter[j])
        inst[r], path[r] = j, label
    kv = (prompt + output) * model.kv_bytes_per_token
    if avail is not None:
        for j in range(k):  # a night still open at the end of the run
            if asleep_from[j] != np.inf and ready_at[j] == np.inf:
                avail.sleeps.setdefault(names[j], []).append([asleep_from[j], cur_night_end, 0.0])
    return Served(arrival, start, first, end, inst, kv, path)


def coverage(starts: F, ends: F, edges: F) -> F:
    """Busy seconds of the union of ``[start, end)`` intervals inside each ``[edges[i], edges[i+1])``."""
    if len(starts) == 0:
        return np.zeros(len(edges) - 1)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > e[:-1]
    seg_id = np.cumsum(new) - 1
    seg_s = s[new]
    seg_e = np.zeros(len(seg_s))
    np.maximum.at(seg_e, seg_id, e)
    lengths = seg_e - seg_s
    cum_before = np.concatenate([[0.0], np.cumsum(lengths)[:-1]])
    xs = np.empty(2 * len(seg_s))
    ys = np.empty(2 * len(seg_s))
    xs[0::2], xs[1::2] = seg_s, seg_e
    ys[0::2], ys[1::2] = cum_before, cum_before + lengths
    c = np.interp(edges, xs, ys, left=0.0, right=float(ys[-1]))
    return np.diff(c)
