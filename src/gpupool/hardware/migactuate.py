"""MIG re-partition: one actuator port, the NVML-call interface a bare node offers, and the
actuator that drives those calls (drain check, destroy, create with placement, verify).

Role: the hand that changes a node's MIG layout to what a `Plan` says. Two adapters implement
`MigActuator`: the GPU Operator's mig-manager (``gpupool.adapters.k8s.migmanager``: ConfigMap + node
label, wait for ``nvidia.com/mig.config.state``) and `NvmlMigActuator` here, over any `MigHardware`
(``gpupool.adapters.nvml.mig`` for real GPUs, `SimulatedCluster.mig_hardware` for simulated ones).

`MigHardware` mirrors NVML's calls and error codes: ``nvmlDeviceCreateGpuInstanceWithPlacement``,
``nvmlGpuInstanceCreateComputeInstance``, ``nvmlComputeInstanceDestroy``, ``nvmlGpuInstanceDestroy``,
failing with `NvmlMigError` carrying ``NVML_ERROR_NOT_SUPPORTED`` (MIG mode off),
``NVML_ERROR_INVALID_ARGUMENT`` (unknown profile or illegal start), ``NVML_ERROR_INSUFFICIENT_RESOURCES``
(overlap, instance or SM budget exhausted) or ``NVML_ERROR_IN_USE`` (processes or compute instances
still on the instance).

Invariants:
- Drain first: `NvmlMigActuator.apply` asks its ``busy`` hook which leases still sit on the
  instances it would destroy; if any do, nothing is touched (``ok=False``, the lease ids named).
- Minimal change: instances already at the wanted (profile, start) are kept; only the difference is
  destroyed (compute instances first) and created (GPU instance with placement, then its full-size
  compute instance). The result is read back from the hardware and compared with the wish.
- The caller changes its ledger only from an ``ok`` `ApplyOutcome` (the hardware changed first).
- Standard library only; no clock reads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpupool.hardware.mig import MigInstance

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_ERROR_NAMES = {
    NVML_ERROR_INVALID_ARGUMENT: "NVML_ERROR_INVALID_ARGUMENT",
    NVML_ERROR_NOT_SUPPORTED: "NVML_ERROR_NOT_SUPPORTED",
    NVML_ERROR_IN_USE: "NVML_ERROR_IN_USE",
    NVML_ERROR_INSUFFICIENT_RESOURCES: "NVML_ERROR_INSUFFICIENT_RESOURCES",
}


class NvmlMigError(Exception):
    """An NVML MIG call failed; ``code`` is NVML's return code."""

    def __init__(self, code: int, call: str, detail: str) -> None:
        self.code = code
        self.call = call
        super().__init__(f"{call}: {NVML_ERROR_NAMES.get(code, f'NVML error {code}')}: {detail}")


@dataclass(frozen=True, slots=True)
class GpuInstanceInfo:
    gi_id: int
    profile: str
    start: int
    compute_instances: tuple[int, ...] = ()
    processes: tuple[int, ...] = ()
    """pids running on the instance (NVML: ``nvmlDeviceGetComputeRunningProcesses`` of the MIG device)."""


class MigHardware(Protocol):
    """The NVML MIG calls of one node (GPU index = NVML device index)."""

    def mig_enabled(self, index: int) -> bool: ...

    def gpu_instances(self, index: int) -> tuple[GpuInstanceInfo, ...]: ...

    def create_gpu_instance(self, index: int, profile: str, start: int) -> int:
        """``nvmlDeviceCreateGpuInstanceWithPlacement``; returns the new GPU instance id."""
        ...

    def create_compute_instance(self, index: int, gi_id: int) -> int:
        """``nvmlGpuInstanceCreateComputeInstance`` with the full-size profile; returns its id."""
        ...

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None: ...

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None: ...


@dataclass(frozen=True, slots=True)
class GpuChange:
    index: int
    destroy: tuple[MigInstance, ...]
    create: tuple[MigInstance, ...]

    @property
    def empty(self) -> bool:
        return not self.destroy and not self.create


@dataclass(frozen=True, slots=True)
class ApplyOutcome:
    ok: bool
    actuator: str
    node: str
    changes: tuple[GpuChange, ...]
    detail: str
    busy: tuple[str, ...] = ()
    """Lease ids that blocked the change (drain not finished)."""


class MigActuator(Protocol):
    name: str

    def apply(self, node: str, wanted: Mapping[int, Sequence[MigInstance]]) -> ApplyOutcome:
        """Make each listed GPU of ``node`` hold exactly ``wanted[index]`` (empty: MIG with no
        instances); GPUs not listed are left alone."""
        ...


def diff_layout(current: Sequence[MigInstance], wanted: Sequence[MigInstance], index: int) -> GpuChange:
    """Destroy what is not wanted, create what is missing; an instance at the same (profile, start)
    is kept."""
    cur, want = set(current), set(wanted)
    return GpuChange(index, tuple(sorted(cur - want)), tuple(sorted(want - cur)))


def render_change(c: GpuChange) -> str:
    if c.empty:
        return f"gpu {c.index}: unchanged"
    parts = [f"-{i}" for i in c.destroy] + [f"+{i}" for i in c.create]
    return f"gpu {c.index}: " + " ".join(parts)


BusyHook = Callable[[str, int, Sequence[MigInstance]], Sequence[str]]
"""(node, GPU index, instances to destroy) -> lease ids still on them after asking for a drain."""


def _no_leases(node: str, index: int, doomed: Sequence[MigInstance]) -> Sequence[str]:
    return ()


class NvmlMigActuator:
    """`MigActuator` for bare nodes, over a `MigHardware` (see the module docstring)."""

    name = "nvml"

    def __init__(self, hw: MigHardware, *, busy: BusyHook = _no_leases) -> None:
        self.hw = hw
        self.busy = busy

    def current(self, index: int) -> tuple[MigInstance, ...]:
        return tuple(sorted(MigInstance(g.profile, g.start) for g in self.hw.gpu_instances(index)))

    def plan_changes(self, wanted: Mapping[int, Sequence[MigInstance]]) -> tuple[GpuChange, ...]:
        return tuple(diff_layout(self.current(i), w, i) for i, w in sorted(wanted.items()))

    def apply(self, node: str, wanted: Mapping[int, Sequence[MigInstance]]) -> ApplyOutcome:
        for index in sorted(wanted):
            if not self.hw.mig_enabled(index):
                why = f"gpu {index}: MIG mode is off (enable it first; gpupool never toggles MIG mode)"
                return ApplyOutcome(False, self.name, node, (), why)
        changes = self.plan_changes(wanted)
        blocked: list[str] = []
        for c in changes:
            if c.destroy:
                blocked += self.busy(node, c.index, c.destroy)
        if blocked:
            why = f"drain first: leases still on instances to destroy: {', '.join(sorted(blocked))}"
            return ApplyOutcome(False, self.name, node, changes, why, tuple(sorted(blocked)))
        done: list[str] = []
        try:
            for c in changes:
                by_place = {(g.profile, g.start): g for g in self.hw.gpu_instances(c.index)}
                for inst in c.destroy:
                    g = by_place[(inst.profile, inst.start)]
                    if g.processes:
                        pids = ", ".join(map(str, g.processes))
                        raise NvmlMigError(
                            NVML_ERROR_IN_USE, "nvmlGpuInstanceDestroy", f"processes {pids} on {inst}"
                        )
                    for ci in g.compute_instances:
                        self.hw.destroy_compute_instance(c.index, g.gi_id, ci)
                    self.hw.destroy_gpu_instance(c.index, g.gi_id)
                    done.append(f"gpu {c.index} -{inst}")
                for inst in sorted(c.create, key=lambda i: i.start):
                    gi = self.hw.create_gpu_instance(c.index, inst.profile, inst.start)
                    self.hw.create_compute_instance(c.index, gi)
                    done.append(f"gpu {c.index} +{inst}")
        except NvmlMigError as exc:
            partial = f" (done before it: {'; '.join(done)})" if done else ""
            return ApplyOutcome(False, self.name, node, changes, f"{exc}{partial}")
        for i, w in wanted.items():
            got = self.current(i)
            if got != tuple(sorted(w)):
                have = ", ".join(map(str, got))
                return ApplyOutcome(False, self.name, node, changes, f"gpu {i}: read back [{have}]")
        return ApplyOutcome(True, self.name, node, changes, "; ".join(done) or "already as planned")
