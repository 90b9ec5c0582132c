"""Simulated device memory held by real processes: a registry directory of one file per pid.

Role: lets real child processes "allocate" memory on a `SimulatedCluster` GPU, so that freeing it
(exit, SIGKILL, an engine going to sleep) is observable from device readings exactly as NVML shows
it: the memory is in ``memory_used_mib`` and in the per-process list while the process lives.

Format: ``<registry>/<pid>.json`` holding ``{"gpu_id": <GPU or slice id>, "mib": <int >= 0>}``,
written atomically (temp file + rename) by the holder itself (`hold`).

Invariants:
- A record counts only while its pid is alive and not a zombie (``/proc/<pid>/stat``): the driver
  frees a process's device memory when it exits, before its parent reaps it. Records of dead pids are
  ignored (never deleted by readers), so a reader never races a writer.
- A record that cannot be parsed is ignored (a half-written file is impossible: writes are renames).
- Standard library only; no clock reads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

REGISTRY_ENV = "GPUPOOL_SIM_VRAM_DIR"


def _record(registry: Path, pid: int) -> Path:
    return registry / f"{pid}.json"


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie (its device memory would be freed by then)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    state = stat[stat.rfind(")") + 2 : stat.rfind(")") + 3]
    return state not in ("Z", "X", "")


def hold(registry: Path, gpu_id: str, mib: int, *, pid: int | None = None) -> Path:
    """Record that ``pid`` (default: this process) holds ``mib`` MiB on ``gpu_id``; replaces any
    earlier record of that pid (an engine shrinking on sleep writes a smaller figure)."""
    if type(mib) is not int or mib < 0:
        raise ValueError(f"vram.mib: {mib!r} must be an integer >= 0")
    if not gpu_id:
        raise ValueError(f"vram.gpu_id: {gpu_id!r} must name a GPU or slice")
    owner = os.getpid() if pid is None else pid
    registry.mkdir(parents=True, exist_ok=True)
    path = _record(registry, owner)
    tmp = registry / f".{owner}.tmp"
    tmp.write_text(json.dumps({"gpu_id": gpu_id, "mib": mib}))
    tmp.replace(path)
    return path


def release(registry: Path, *, pid: int | None = None) -> None:
    """Drop the record of ``pid`` (default: this process); missing records are fine."""
    owner = os.getpid() if pid is None else pid
    _record(registry, owner).unlink(missing_ok=True)


def held(registry: Path | None) -> dict[str, tuple[tuple[int, int], ...]]:
    """GPU or slice id -> ((pid, mib), ...) of the live holders, pids ascending."""
    if registry is None:
        return {}
    out: dict[str, list[tuple[int, int]]] = {}
    try:
        names = sorted(p.name for p in registry.iterdir())
    except OSError:
        return {}
    for name in names:
        stem, dot, ext = name.partition(".")
        if not dot or ext != "json" or not stem.isdigit():
            continue
        pid = int(stem)
        try:
            doc = json.loads((registry / name).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict):
            continue
        gpu, mib = doc.get("gpu_id"), doc.get("mib")
        if not isinstance(gpu, str) or type(mib) is not int or mib < 0 or not pid_alive(pid):
            continue
        out.setdefault(gpu, []).append((pid, mib))
    return {k: tuple(sorted(v)) for k, v in out.items()}
