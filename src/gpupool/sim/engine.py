"""One FGD-style placement experiment, driving the real core allocator on a manual clock.

Role: for one (nodes, pods, policy, seed) build the core `Allocator` with one WHOLE `Slice` per GPU
(capacity ``Resources(NOMINAL_VRAM_MIB, 1000)``), the vectorised `MirrorLedger` and `FragTable`,
then submit the arrival order one pod at a time: filter, let the policy choose, COMMIT through
`Allocator.place`, book the mirror, record metrics. A pod that fits nowhere is dropped (counted as
arrived, never retried). Nothing departs. No I/O; the result is a pure function of the inputs.

Mapping trace pods onto core requests (documented choice):
- a sharing pod (1 GPU, < 1000 milli) is ``Request(gpu_count=1, demand=Resources(1, gpu_milli))``,
  a whole-card pod ``Resources(1, 1000)``, an N-GPU pod ``gpu_count=N`` (the core grants N entire
  WHOLE slices on one node);
- VRAM: the trace has no VRAM column, so each pod asks for a nominal 1 MiB and slices hold
  `NOMINAL_VRAM_MIB`; VRAM never binds and compute_milli carries the trace's GPU share one to one;
- CPU-only pods and node CPU / memory / GPU model live only in the mirror (see `gpupool.sim.mirror`).

Cross-check: with ``cross_check=True`` (tests) every step compares the chosen node's slices in the
core ledger with the mirror and runs ``Allocator.check_invariants`` every `CHECK_EVERY` pods; a run
always ends with a full comparison. A core refusal of a placement the mirror accepted raises
`InvariantViolation`.

Recorded per pod event: cumulative arrived GPU milli, allocated GPU milli, cluster fragmentation
(expected milli) and idle GPU milli, as numpy arrays in `RunRecord`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.core import Allocator, InvariantViolation, ManualClock, Request, Resources, Slice, SliceKind
from gpupool.core.ids import LeaseId
from gpupool.sim.frag import FragModel, FragTable
from gpupool.sim.mirror import MirrorLedger
from gpupool.sim.policies import get_sim_policy
from gpupool.sim.policies.base import PodView, SimContext
from gpupool.sim.trace import MILLI_PER_GPU, NodeSpec, PodSpec
from gpupool.sim.workload import (
    TUNE_RATIO,
    TargetWorkload,
    arrival_order,
    node_tie_order,
    sorted_by_name,
    streams,
    target_workload,
)

NOMINAL_VRAM_MIB = 16_384
POD_VRAM_MIB = 1
TTL_S = 365 * 24 * 3600.0
CHECK_EVERY = 500
PROGRESS_EVERY = 1000
"""Pods between two calls of a run's ``progress`` callback."""


@dataclass(frozen=True, slots=True)
class RunRecord:
    policy: str
    seed: int
    capacity_milli: int
    arrived_milli: np.ndarray
    allocated_milli: np.ndarray
    frag_milli: np.ndarray
    idle_milli: np.ndarray
    num_pods: int
    num_failed: int


def _counter_ids() -> object:
    state = {"n": 0}

    def next_id() -> LeaseId:
        state["n"] += 1
        return LeaseId(f"lease-{state['n']:06d}")

    return next_id


def build_allocator(mirror: MirrorLedger, policy: str = "seed-bestfit") -> Allocator:
    slices = [
        Slice(
            id=mirror.slice_id(n, g),
            node=nd.name,
            gpu_id=mirror.slice_id(n, g),
            kind=SliceKind.WHOLE,
            capacity=Resources(NOMINAL_VRAM_MIB, MILLI_PER_GPU),
            gpu_index=g,
            gpu_model=nd.gpu_model,
        )
        for n, nd in enumerate(mirror.nodes)
        for g in range(nd.gpu_count)
    ]
    ids = _counter_ids()
    return Allocator(slices, clock=ManualClock(), policy=policy, lease_ids=ids)  # type: ignore[arg-type]


def cross_check(allocator: Allocator, mirror: MirrorLedger, nodes: Sequence[int] | None = None) -> None:
    """Assert that the core ledger's free compute equals the mirror's free share on every GPU."""
    rows = range(len(mirror)) if nodes is None else nodes
    for n in rows:
        for g in range(int(mirror.gpu_count[n])):
            core = allocator.slice_state(mirror.slice_id(n, g)).free.compute_milli
            mine = int(mirror.gpu_free[n, g])
            if core != mine:
                raise InvariantViolation(f"mirror/core mismatch on {mirror.slice_id(n, g)}: {mine} != {core}")


def _model_masks(pods: Sequence[PodSpec], models: Sequence[str]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for p in pods:
        key = p.spec_key
        if key not in out:
            out[key] = np.array([bool(m) and (not p.gpu_spec or m in p.gpu_spec) for m in models])
    return out


def run(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    *,
    policy: str,
    seed: int,
    tune_ratio: float = TUNE_RATIO,
    target: TargetWorkload | None = None,
    cross_check_steps: bool = False,
    stop_arrived_pct: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> RunRecord:
    """Run one experiment; see the module docstring. With ``stop_arrived_pct`` the run ends after
    the first pod that takes the arrived GPU request past ``stop_arrived_pct + 0.5`` % of capacity:
    nothing departs, so every event whose arrived % rounds to at most ``stop_arrived_pct`` is the
    same as in the full run (the variant matrix needs only the value at 100 %). ``progress(done,
    total)`` is called every `PROGRESS_EVERY` pods and at the end (pods placed or failed so far, of
    the run's arrivals)."""
    arrivals_rng, nodes_rng, policy_rng = streams(seed)
    gpu_nodes = [nd for nd in nodes if nd.gpu_count > 0]
    mirror = MirrorLedger(node_tie_order(gpu_nodes, rng=nodes_rng))
    pods_by_name = sorted_by_name(pods)
    order = arrival_order(
        pods_by_name, capacity_milli=mirror.capacity_milli, rng=arrivals_rng, tune_ratio=tune_ratio
    )
    target = target if target is not None else target_workload(pods)
    frag = FragTable(FragModel(target, mirror.models), mirror)
    population = target_workload(pods, popularity=1.0)
    ctx = SimContext(mirror=mirror, frag=frag, target=target, rng=policy_rng, population=population)
    pol = get_sim_policy(policy)
    core_policy: str | None = getattr(pol, "core_policy", None)
    allocator = build_allocator(mirror, core_policy or "seed-bestfit")
    row_of = {nd.name: n for n, nd in enumerate(mirror.nodes)}
    masks = _model_masks(pods_by_name, mirror.models)

    n_events = len(order)
    arrived = np.zeros(n_events, dtype=np.int64)
    allocated = np.zeros(n_events, dtype=np.int64)
    frag_milli = np.zeros(n_events, dtype=np.float64)
    idle = np.zeros(n_events, dtype=np.int64)
    arrived_total = 0
    allocated_total = 0
    failed = 0
    gpu_free, cpu_free, mem_free = mirror.gpu_free, mirror.cpu_free, mirror.mem_free
    model_of = mirror.model
    for step, idx in enumerate(order.tolist()):
        spec = pods_by_name[idx]
        pod = PodView(
            index=step,
            cpu_milli=spec.cpu_milli,
            memory_mib=spec.memory_mib,
            num_gpu=spec.num_gpu,
            gpu_milli=spec.gpu_milli,
            spec_key=spec.spec_key,
        )
        arrived_total += pod.total_gpu_milli
        ok = (cpu_free >= pod.cpu_milli) & (mem_free >= pod.memory_mib)
        if pod.num_gpu:
            ok &= masks[pod.spec_key][model_of]
            ok &= (gpu_free >= pod.gpu_milli).sum(axis=1) >= pod.num_gpu
        feasible = np.flatnonzero(ok)
        if len(feasible) == 0:
            failed += 1
        else:
            if core_policy is not None and pod.num_gpu:
                node, gpus = _core_choice(allocator, mirror, row_of, step=step, pod=pod, feasible=feasible)
            else:
                node, gpus = pol.choose(ctx, pod, feasible)
                if pod.num_gpu:
                    _commit(allocator, mirror, step=step, pod=pod, node=node, gpus=gpus)
            mirror.apply(
                node, gpus, gpu_milli=pod.gpu_milli, cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib
            )
            frag.refresh(node)
            pol.placed(ctx, pod, (node, gpus))
            allocated_total += pod.total_gpu_milli
            if cross_check_steps:
                cross_check(allocator, mirror, [node])
                if step % CHECK_EVERY == 0:
                    allocator.check_invariants()
        arrived[step] = arrived_total
        allocated[step] = allocated_total
        frag_milli[step] = frag.cluster_frag_milli()
        idle[step] = mirror.capacity_milli - allocated_total
        if progress is not None and step % PROGRESS_EVERY == 0:
            progress(step, len(order))
        if stop_arrived_pct is not None and arrived_total * 200 > mirror.capacity_milli * (
            2 * stop_arrived_pct + 1
        ):
            n_events = step + 1
            arrived, allocated = arrived[:n_events], allocated[:n_events]
            frag_milli, idle = frag_milli[:n_events], idle[:n_events]
            break
    if progress is not None:
        progress(n_events, n_events)
    cross_check(allocator, mirror)
    if cross_check_steps:
        allocator.check_invariants()
    return RunRecord(
        policy=policy,
        seed=seed,
        capacity_milli=mirror.capacity_milli,
        arrived_milli=arrived,
        allocated_milli=allocated,
        frag_milli=frag_milli,
        idle_milli=idle,
        num_pods=n_events,
        num_failed=failed,
    )


def _request(step: int, pod: PodView, nodes: frozenset[str] = frozenset()) -> Request:
    share = pod.gpu_milli if pod.num_gpu == 1 else MILLI_PER_GPU
    return Request(
        id=f"pod-{step:06d}",
        tenant="trace",
        priority=0,
        demand=Resources(POD_VRAM_MIB, share),
        ttl_s=TTL_S,
        kinds=frozenset({SliceKind.WHOLE}),
        gpu_count=pod.num_gpu,
        nodes=nodes,
    )


def _core_choice(
    allocator: Allocator,
    mirror: MirrorLedger,
    row_of: dict[str, int],
    *,
    step: int,
    pod: PodView,
    feasible: np.ndarray,
) -> tuple[int, tuple[int, ...]]:
    """The core allocator places the pod itself, restricted to the feasible nodes (CPU, memory and
    GPU model are the mirror's filter); returns the (node row, GPU indices) its lease took."""
    nodes = frozenset(mirror.nodes[int(n)].name for n in feasible)
    out = allocator.allocate(_request(step, pod, nodes), preempt=False)
    if out.lease is None:
        raise InvariantViolation(f"core found no slice for pod-{step:06d} on {len(nodes)} feasible nodes")
    node = row_of[out.lease.node]
    if node not in feasible:
        raise InvariantViolation(
            f"core placed pod-{step:06d} on {out.lease.node}, outside the feasible nodes"
        )
    prefix = f"{out.lease.node}/gpu"
    gpus = tuple(sorted(int(sid[len(prefix) :]) for sid in out.lease.slice_ids))
    return node, gpus


def _commit(
    allocator: Allocator, mirror: MirrorLedger, *, step: int, pod: PodView, node: int, gpus: tuple[int, ...]
) -> None:
    request = _request(step, pod)
    out = allocator.place(request, tuple(mirror.slice_id(node, g) for g in gpus))
    if not out.granted:
        raise InvariantViolation(
            f"core refused {request.id} on {mirror.nodes[node].name} GPUs {gpus}: {out.code} {out.reason}"
        )
