"""`MpsLimitTable`: keeps the MPS control daemon of each MPS-shared GPU in line with the leases on it.

Role: for every GPU the agent is told is shared by MPS (``--mps gpu=<id>,pipe=<dir>``), the leases
the gateway granted on it become (a) a per-client environment (`client_env_for`: pipe directory,
``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` from the lease's VRAM
and compute) and (b) server-side caps sent to the daemon: the largest lease's limits, as defaults for
future servers and on every running server (``get_server_list``). MPS limits are per server (one per
UID), and a client's own variables can only lower them, so the server gets the widest cap and each
client its own, tighter one.

Invariants:
- Commands are sent only when the wanted caps of a GPU change (a ledger that did not change costs no
  I/O); a failure is reported and retried at the next change or `resync`.
- With no lease on a GPU nothing is sent (the last caps stay; MPS has no "unset").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpupool.adapters.mps import BinaryTransport, MpsControl, MpsError, MpsLimits, SocketTransport, client_env
from gpupool.core.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class MpsGpu:
    gpu_id: str
    pipe_directory: str
    device: str = "0"
    """The device as the daemon's clients see it: ordinal or UUID."""
    socket: str = ""
    """Talk to a daemon speaking the line protocol on this unix socket instead of the control binary."""


def parse_mps_spec(spec: str) -> MpsGpu:
    """``gpu=<id>,pipe=<dir>[,device=<ordinal|UUID>][,socket=<path>]`` (CLI ``--mps``)."""
    fields: dict[str, str] = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise InvalidInput("mps", spec, "expected gpu=<id>,pipe=<dir>[,device=..][,socket=..]")
        fields[key.strip()] = value.strip()
    unknown = sorted(set(fields) - {"gpu", "pipe", "device", "socket"})
    if unknown:
        raise InvalidInput(f"mps.{unknown[0]}", fields[unknown[0]], "unknown key")
    if not fields.get("gpu"):
        raise InvalidInput("mps.gpu", fields.get("gpu", ""), "must name the GPU")
    if not fields.get("pipe", "").startswith("/"):
        raise InvalidInput("mps.pipe", fields.get("pipe", ""), "must be an absolute directory")
    return MpsGpu(fields["gpu"], fields["pipe"], fields.get("device", "0") or "0", fields.get("socket", ""))


class MpsLimitTable:
    def __init__(self, gpus: Sequence[MpsGpu], *, controls: Mapping[str, MpsControl] | None = None) -> None:
        self.gpus = {g.gpu_id: g for g in gpus}
        self.controls: dict[str, MpsControl] = dict(controls or {})
        for g in gpus:
            if g.gpu_id not in self.controls:
                transport = SocketTransport(g.socket) if g.socket else BinaryTransport(g.pipe_directory)
                self.controls[g.gpu_id] = MpsControl(g.pipe_directory, transport=transport)
        self._applied: dict[str, MpsLimits] = {}
        self._env: dict[str, dict[str, str]] = {}

    def client_env_for(self, lease_id: str) -> dict[str, str] | None:
        env = self._env.get(lease_id)
        return dict(env) if env is not None else None

    def applied(self, gpu_id: str) -> MpsLimits | None:
        return self._applied.get(gpu_id)

    def resync(self) -> None:
        """Forget what was sent, so the next `sync` re-sends (after a daemon restart)."""
        self._applied.clear()

    def sync(self, leases: Sequence[Mapping[str, object]]) -> list[tuple[str, str, str]]:
        """Apply the ledger. Returns (kind, gpu_id, detail) with kind ``mps_applied``/``mps_failure``."""
        wanted: dict[str, MpsLimits] = {}
        env: dict[str, dict[str, str]] = {}
        for lease in leases:
            gpu = str(lease.get("gpu_id", ""))
            g = self.gpus.get(gpu)
            vram, compute = lease.get("vram_mib", 0), lease.get("compute_milli", 0)
            if g is None or type(vram) is not int or type(compute) is not int or vram <= 0:
                continue
            limits = MpsLimits.from_grant(vram_mib=vram, compute_milli=compute)
            env[str(lease.get("lease_id", ""))] = client_env(g.pipe_directory, g.device, limits)
            cur = wanted.get(gpu)
            wanted[gpu] = (
                limits
                if cur is None
                else MpsLimits(
                    max(cur.pinned_mem_limit_mib, limits.pinned_mem_limit_mib),
                    max(cur.active_thread_percentage, limits.active_thread_percentage),
                )
            )
        self._env = env
        out: list[tuple[str, str, str]] = []
        for gpu, limits in sorted(wanted.items()):
            if self._applied.get(gpu) == limits:
                continue
            control, device = self.controls[gpu], self.gpus[gpu].device
            try:
                sent = list(control.apply(limits, device=device))
                for pid in control.get_server_list():
                    sent.extend(control.apply(limits, device=device, server_pid=pid))
            except (MpsError, InvalidInput) as exc:
                out.append(("mps_failure", gpu, str(exc)))
                continue
            self._applied[gpu] = limits
            out.append(("mps_applied", gpu, "; ".join(sent)))
        return out
