"""Pausers (see `gpupool.core.pausers`): POSIX signals, the cgroup v2 freezer, vLLM sleep/wake and
pause/resume over HTTP (httpx, imported lazily), and cuda-checkpoint when detected.

`default_pausers` builds the registry the agent uses, keyed by pauser name. They share their clock,
check-first and result bookkeeping through `base.PauserBase`.
"""

from __future__ import annotations

from gpupool.adapters.pause.cgroup import CgroupFreezerPauser
from gpupool.adapters.pause.cuda_checkpoint import CheckpointSupport, CudaCheckpointPauser, detect
from gpupool.adapters.pause.signals import SignalPauser
from gpupool.adapters.pause.vllm import VllmControl, VllmPausePauser, VllmSleepPauser
from gpupool.core.clock import Clock
from gpupool.core.pausers import Pauser


def availability(pausers: dict[str, Pauser]) -> dict[str, str]:
    """Pauser name -> '' when usable on this machine, else why not (detected, never assumed)."""
    from gpupool.adapters.pause.cgroup import cgroup_v2_root

    out: dict[str, str] = {}
    for name, p in sorted(pausers.items()):
        if isinstance(p, CudaCheckpointPauser):
            out[name] = "" if p.support.available else p.support.reason
        elif isinstance(p, CgroupFreezerPauser):
            out[name] = "" if cgroup_v2_root() is not None else "no cgroup v2 hierarchy mounted"
        else:
            out[name] = ""
    return out


def default_pausers(
    *, clock: Clock | None = None, checkpoint: CheckpointSupport | None = None
) -> dict[str, Pauser]:
    control = VllmControl()
    found: list[Pauser] = [
        SignalPauser(clock=clock),
        CgroupFreezerPauser(clock=clock),
        VllmSleepPauser(control=control, clock=clock),
        VllmPausePauser(control=control, clock=clock),
        CudaCheckpointPauser(support=checkpoint or detect(), clock=clock),
    ]
    return {p.name: p for p in found}


__all__ = [
    "CgroupFreezerPauser",
    "CheckpointSupport",
    "CudaCheckpointPauser",
    "SignalPauser",
    "VllmControl",
    "VllmPausePauser",
    "VllmSleepPauser",
    "availability",
    "default_pausers",
    "detect",
]
