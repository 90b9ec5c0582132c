"""Capability choice: which isolation scheme a GPU gets (MIG, MPS, whole card, time-slicing).

Role: the rule of the mission's "isolation technologies" table, in one function.

Public API:
- ``GpuMode``: ``mig`` | ``mps`` | ``whole`` | ``time-slice`` (the ``mode`` field of plan JSON).
- ``choose_mode(model, *, wants_hard_isolation, allow_time_slicing=False)`` -> ``ModeChoice`` with a
  one-line ``reason`` and ``flagged`` (True for the no-memory-isolation last resort).
- ``supported_modes(model)``: the modes a model can run, strongest isolation first.

Invariants:
- MIG only on MIG-capable models (Ampere A100/A30, Hopper, Blackwell datacenter parts) and only when the
  workload asks for hard isolation; MPS on Volta and newer otherwise; time-slicing only when nothing
  else is possible and the caller allows it; it is always ``flagged``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpupool.hardware.catalogue import GpuModel, gpu_model


class GpuMode(StrEnum):
    MIG = "mig"
    MPS = "mps"
    WHOLE = "whole"
    TIME_SLICE = "time-slice"


class NoCapabilityError(ValueError):
    """No isolation scheme is possible on this GPU under the caller's constraints."""


@dataclass(frozen=True, slots=True)
class ModeChoice:
    mode: GpuMode
    reason: str
    flagged: bool = False


def supported_modes(model: GpuModel | str) -> tuple[GpuMode, ...]:
    m = model if isinstance(model, GpuModel) else gpu_model(model)
    modes: list[GpuMode] = []
    if m.mig_capable:
        modes.append(GpuMode.MIG)
    if m.mps_capable:
        modes.append(GpuMode.MPS)
    modes += [GpuMode.WHOLE, GpuMode.TIME_SLICE]
    return tuple(modes)


def choose_mode(
    model: GpuModel | str, *, wants_hard_isolation: bool, allow_time_slicing: bool = False
) -> ModeChoice:
    """The best scheme for a GPU shared by several workloads."""
    m = model if isinstance(model, GpuModel) else gpu_model(model)
    if wants_hard_isolation:
        if m.mig_capable:
            return ModeChoice(GpuMode.MIG, f"MIG: hard isolation requested and {m.name} supports MIG")
        if not m.mps_capable and not allow_time_slicing:
            raise NoCapabilityError(f"{m.name} has neither MIG nor MPS and time-slicing is not allowed")
    if m.mps_capable:
        why = "no MIG on this model" if not m.mig_capable else "no workload here needs hard isolation"
        return ModeChoice(
            GpuMode.MPS,
            f"MPS: {why}; {m.arch.value} supports MPS with per-client memory limits",
        )
    if allow_time_slicing:
        return ModeChoice(
            GpuMode.TIME_SLICE,
            f"TIME-SLICE (last resort): {m.name} ({m.arch.value}) has no MIG and no MPS; no memory isolation",
            flagged=True,
        )
    raise NoCapabilityError(f"{m.name} has no MPS (pre-Volta) and time-slicing is not allowed")
