"""MPS share rendering: per-client environment and the control-daemon commands for a plan.

Role: turns the MPS GPUs of a ``Plan`` into what an operator (or the node agent) runs (fact sheet 4.1-4.2).

Public API:
- ``client_env(slice, *, device="0", pipe_dir=...)`` -> env dict for one MPS client
  (``CUDA_MPS_PIPE_DIRECTORY``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` = ``<device>=<MiB>M``,
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``).
- ``pipe_dir(gpu, *, root=DEFAULT_PIPE_ROOT)``: one pipe directory per GPU (one daemon per GPU).
- ``mps_commands(plan, *, root=...)`` -> shell lines per MPS GPU: compute mode, daemon start with its
  own pipe/log directory, and one ``export ...`` line per client.

Invariants:
- One control daemon per GPU, each with its own ``CUDA_MPS_PIPE_DIRECTORY`` (a fault stays on that GPU).
- The device key in the pinned limit is the card's UUID when known, else ``0`` (the daemon sees only its
  own card through ``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

from gpupool.hardware.capability import GpuMode
from gpupool.hardware.plantypes import GpuPlan, Plan, PlannedSlice

DEFAULT_PIPE_ROOT = "/var/run/gpupool/mps"
DEFAULT_LOG_ROOT = "/var/log/gpupool/mps"


def pipe_dir(gpu: GpuPlan, *, root: str = DEFAULT_PIPE_ROOT) -> str:
    return f"{root}/{gpu.node}-{gpu.index}"


def client_env(s: PlannedSlice, *, device: str = "0", pipe: str = "") -> dict[str, str]:
    env = {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{device}={s.vram_mib}M",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(s.thread_pct),
    }
    if pipe:
        env["CUDA_MPS_PIPE_DIRECTORY"] = pipe
    return env


def mps_commands(plan: Plan, *, root: str = DEFAULT_PIPE_ROOT, log_root: str = DEFAULT_LOG_ROOT) -> list[str]:
    """Shell lines that start one MPS control daemon per MPS GPU and the env of each client."""
    lines: list[str] = []
    for g in plan.gpus:
        if g.mode is not GpuMode.MPS:
            continue
        pipe = pipe_dir(g, root=root)
        log = f"{log_root}/{g.node}-{g.index}"
        visible = g.uuid or str(g.index)
        lines += [
            f"# {g.gpu_id} ({g.model.name}) on node {g.node}: {g.reason}",
            f"nvidia-smi -i {g.index} -c EXCLUSIVE_PROCESS",
            f"mkdir -p {pipe} {log}",
            f"CUDA_VISIBLE_DEVICES={visible} CUDA_MPS_PIPE_DIRECTORY={pipe} CUDA_MPS_LOG_DIRECTORY={log} "
            "nvidia-cuda-mps-control -d",
        ]
        for s in g.slices:
            env = client_env(s, device="0", pipe=pipe)
            label = f"client {s.workload} replica {s.replica}" if not s.pool else "P2 pool share"
            exports = " ".join(f"{k}={v}" for k, v in env.items())
            lines.append(f"# {label} ({s.id})")
            lines.append(f"export {exports}")
        lines.append("")
    return lines
