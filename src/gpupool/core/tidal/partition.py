"""MIG re-partition planner for tidal lending (level 3): merge a GPU's idle online slices into large
batch instances at NIGHT (e.g. 3g+2g+1g+1g -> 7g) and plan the exact reverse before DAY.

Role: pure planning. It decides whether a GPU may be re-partitioned and lists the steps an
adapter applies (NVML create/destroy on real hardware, the simulated cluster otherwise):
``drain`` every instance (its engine stops or is requeued), ``destroy`` every GPU instance, then
``create`` the target instances largest first at explicit start slots (creation order matters on
real drivers: gpu-facts 1.4 "order pitfall").

Invariants:
- Only a fully drainable GPU is planned: every instance on it must be idle (no active online
  work) or hold preemptible P2 work only; otherwise `plan_merge` returns a `Refusal` naming the
  busy instances. MIG reconfiguration destroys everything on the GPU (gpu-facts 1.6).
- Both layouts are validated with the hardware layer's rules (`gpupool.hardware.mig`); an illegal
  target or source is a `Refusal`, never a plan.
- `RepartitionPlan.reverse()` restores the source layout exactly (same profiles, same starts).
- Deterministic: instances are drained and destroyed in (start, profile) order and created largest
  first (SM count descending, then start, then profile) at their explicit start slots.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpupool.hardware.mig import (
    IllegalLayoutError,
    MigInstance,
    find_placement,
    layout_problems,
    mig_profile,
)


@dataclass(frozen=True, slots=True)
class Step:
    action: str
    """``drain`` | ``destroy`` | ``create``."""
    instance: MigInstance

    def __str__(self) -> str:
        return f"{self.action} {self.instance}"


@dataclass(frozen=True, slots=True)
class RepartitionPlan:
    gpu_id: str
    gpu_model: str
    source: tuple[MigInstance, ...]
    target: tuple[MigInstance, ...]
    steps: tuple[Step, ...]

    def reverse(self) -> RepartitionPlan:
        """The plan that puts the source layout back (applied before DAY)."""
        return _plan(self.gpu_id, self.gpu_model, self.target, self.source)

    @property
    def target_sm_count(self) -> int:
        return sum(mig_profile(self.gpu_model, i.profile).sm_count for i in self.target)


@dataclass(frozen=True, slots=True)
class Refusal:
    gpu_id: str
    reason: str


def _plan(
    gpu_id: str, gpu_model: str, source: tuple[MigInstance, ...], target: tuple[MigInstance, ...]
) -> RepartitionPlan:
    ordered = sorted(source, key=lambda i: (i.start, i.profile))
    steps = [Step("drain", i) for i in ordered] + [Step("destroy", i) for i in ordered]
    largest_first = sorted(
        target, key=lambda i: (-mig_profile(gpu_model, i.profile).sm_count, i.start, i.profile)
    )
    steps += [Step("create", i) for i in largest_first]
    return RepartitionPlan(gpu_id, gpu_model, tuple(source), tuple(target), tuple(steps))


def plan_merge(
    gpu_id: str,
    gpu_model: str,
    source: Iterable[MigInstance],
    *,
    idle: Mapping[MigInstance, bool],
    target_profiles: Iterable[str] = ("7g.80gb",),
) -> RepartitionPlan | Refusal:
    """Plan ``source`` -> ``target_profiles`` on one GPU whose instances are all idle.

    ``idle[i]`` is True when instance ``i`` holds no online work (nothing or only P2). Missing
    instances count as busy (fail closed).
    """
    src = tuple(source)
    problems = layout_problems(gpu_model, src)
    if problems:
        return Refusal(gpu_id, f"source layout is illegal: {problems[0]}")
    busy = [str(i) for i in src if not idle.get(i, False)]
    if busy:
        return Refusal(gpu_id, f"not drainable: online work on {', '.join(busy)}")
    try:
        target = find_placement(gpu_model, tuple(target_profiles))
    except IllegalLayoutError as exc:
        return Refusal(gpu_id, f"target is illegal: {exc}")
    if target is None:
        return Refusal(gpu_id, f"target {list(target_profiles)} does not fit one {gpu_model}")
    if sorted(target) == sorted(src):
        return Refusal(gpu_id, "target equals the current layout: nothing to do")
    return _plan(gpu_id, gpu_model, src, tuple(target))


__all__ = ["Refusal", "RepartitionPlan", "Step", "plan_merge"]
