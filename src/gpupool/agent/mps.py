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

`MpsSupervisor` runs the daemons themselves: one ``nvidia-cuda-mps-control -d`` per MPS GPU with its
own ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY`` (and ``CUDA_VISIBLE_DEVICES`` = the GPU's
UUID), restarted with its limits re-applied when it exits or a client fault XID (13, 31, 43) hits its
GPU (the MPS fault domain: one client's fatal fault resets all of them), stopped when the GPU leaves
MPS. Supervision runs on the agent's tick thread (`supervise`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.adapters.mps import BinaryTransport, MpsControl, MpsError, MpsLimits, SocketTransport, client_env
from gpupool.core.errors import InvalidInput
from gpupool.hardware.slices import Slice, SliceKind


@dataclass(frozen=True, slots=True)
class MpsGpu:
    gpu_id: str
    pipe_directory: str
    device: str = "0"
    """The device as the daemon's clients see it: ordinal or UUID."""
    socket: str = ""
    """Talk to a daemon speaking the line protocol on this unix socket instead of the control binary."""


def mps_gpus_of(slices: Sequence[Slice], pipe_root: str) -> list[MpsGpu]:
    """One daemon per GPU that has an MPS slice in the node's discovered slices: pipe directory
    ``<pipe_root>/<index>`` (one daemon, so one pipe directory, per GPU), device the GPU's UUID (the
    daemon then sees only that GPU) or, without one, its ordinal. ``--mps-daemons`` without
    ``--mps`` uses this, so a node needs no per-GPU flags."""
    if not pipe_root.startswith("/"):
        raise InvalidInput("mps_pipe_dir", pipe_root, "must be an absolute directory")
    root = pipe_root.rstrip("/")
    by_gpu: dict[str, MpsGpu] = {}
    for s in sorted(slices, key=lambda s: (s.gpu_index, s.id)):
        if s.kind is SliceKind.MPS and s.gpu_id not in by_gpu:
            by_gpu[s.gpu_id] = MpsGpu(s.gpu_id, f"{root}/{s.gpu_index}", s.uuid or str(s.gpu_index))
    return list(by_gpu.values())


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


# ------------------------------------------------------------------------------------------ daemons
MPS_FAULT_XIDS = frozenset({13, 31, 43})
"""Client faults (graphics engine exception, MMU fault, GPU stopped processing) that, on an MPS GPU,
reset every client of that GPU's server (gpu-facts 4.3)."""
PID_FILE = "nvidia-cuda-mps-control.pid"


@dataclass(frozen=True, slots=True)
class MpsNotice:
    """One thing the supervisor did or saw: ``mps_started`` | ``mps_stopped`` | ``mps_fault`` (per GPU,
    and once per lease on it) | ``mps_recovered`` (``latency_ms`` = the outage) | ``mps_failure``."""

    kind: str
    gpu_id: str
    detail: str
    lease_id: str = ""
    latency_ms: float = 0.0


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 : stat.rfind(")") + 3] not in ("Z", "X", "")


class MpsSupervisor:
    """Starts, supervises and stops one ``nvidia-cuda-mps-control -d`` per MPS GPU, each with its own
    pipe and log directories, and keeps the limits of `MpsLimitTable` applied across restarts.

    Each agent tick calls `supervise` with the tick's samples: a daemon that exited, or an MPS client
    fault XID on its GPU, marks the GPU's shares faulted (one notice per GPU and per lease on it),
    restarts the daemon, re-sends the limits (`MpsLimitTable.resync`) and reports the outage."""

    def __init__(
        self,
        gpus: Sequence[MpsGpu],
        *,
        log_root: str,
        binary: str = "nvidia-cuda-mps-control",
        clock: Callable[[], float] = time.monotonic,
        ready_timeout_s: float = 10.0,
        retry_s: float = 5.0,
    ) -> None:
        self.binary = binary
        self.log_root = log_root
        self.clock = clock
        self.ready_timeout_s = ready_timeout_s
        self.retry_s = retry_s
        self._down: dict[str, float] = {}
        """GPU id -> when to retry a daemon that could not be started (no fault: it never ran)."""
        self.gpus: dict[str, MpsGpu] = {}
        self.table = MpsLimitTable((), controls={})
        self.faulted: dict[str, float] = {}
        """GPU id -> when its shares were marked faulted (until the daemon is back)."""
        self._leases: list[Mapping[str, object]] = []
        self._pending: list[MpsNotice] = []
        self.set_gpus(gpus)

    # -- daemons
    def _env(self, g: MpsGpu) -> dict[str, str]:
        log_dir = str(Path(self.log_root) / g.gpu_id.replace("/", "_"))
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=g.pipe_directory, CUDA_MPS_LOG_DIRECTORY=log_dir)
        if g.device.startswith(("GPU-", "MIG-")):
            env["CUDA_VISIBLE_DEVICES"] = g.device
        Path(g.pipe_directory).mkdir(parents=True, exist_ok=True)
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        return env

    def daemon_pid(self, gpu_id: str) -> int | None:
        g = self.gpus.get(gpu_id)
        if g is None:
            return None
        try:
            pid = int((Path(g.pipe_directory) / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def _start(self, g: MpsGpu) -> str:
        """Start the daemon (``-d`` forks and returns) and wait for its pid file; '' or the error."""
        try:
            proc = subprocess.run(
                [self.binary, "-d"], env=self._env(g), capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{self.binary} -d: {type(exc).__name__}: {exc}"
        if proc.returncode != 0:
            return f"{self.binary} -d: exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()}"
        deadline = self.clock() + self.ready_timeout_s
        while self.daemon_pid(g.gpu_id) is None:
            if self.clock() >= deadline:
                waited = f"{self.ready_timeout_s:g} s"
                return f"{self.binary} -d: no live {PID_FILE} in {g.pipe_directory} after {waited}"
            time.sleep(0.005)
        return ""

    def set_gpus(self, gpus: Sequence[MpsGpu]) -> list[MpsNotice]:
        """The GPUs that are now MPS-shared: start daemons for new ones, stop those that left MPS."""
        out: list[MpsNotice] = []
        wanted = {g.gpu_id: g for g in gpus}
        for gpu_id in sorted(set(self.gpus) - set(wanted)):
            out.append(self._stop(gpu_id))
        for gpu_id, g in sorted(wanted.items()):
            if gpu_id in self.gpus:
                continue
            self.gpus[gpu_id] = g
            self.table.gpus[gpu_id] = g
            transport = (
                SocketTransport(g.socket)
                if g.socket
                else BinaryTransport(g.pipe_directory, binary=self.binary)
            )
            self.table.controls[gpu_id] = MpsControl(g.pipe_directory, transport=transport)
            err = "" if self.daemon_pid(gpu_id) is not None else self._start(g)
            if err:
                self._down[gpu_id] = self.clock() + self.retry_s
            out.append(MpsNotice("mps_failure" if err else "mps_started", gpu_id, err or g.pipe_directory))
        self._pending += out
        return out

    def _stop(self, gpu_id: str) -> MpsNotice:
        running = self.daemon_pid(gpu_id) is not None
        g = self.gpus.pop(gpu_id)
        control = self.table.controls.pop(gpu_id)
        self.table.gpus.pop(gpu_id, None)
        self.faulted.pop(gpu_id, None)
        self._down.pop(gpu_id, None)
        if not running:
            return MpsNotice("mps_stopped", gpu_id, "daemon was not running")
        try:
            control.quit()
        except MpsError as exc:
            return MpsNotice("mps_failure", gpu_id, f"quit: {exc}")
        return MpsNotice("mps_stopped", gpu_id, g.pipe_directory)

    def stop_all(self) -> list[MpsNotice]:
        return [self._stop(gpu_id) for gpu_id in sorted(self.gpus)]

    # -- the agent's hooks
    def client_env_for(self, lease_id: str) -> dict[str, str] | None:
        return self.table.client_env_for(lease_id)

    def sync(self, leases: Sequence[Mapping[str, object]]) -> list[tuple[str, str, str]]:
        self._leases = list(leases)
        return self.table.sync(leases)

    def supervise(self, samples: Sequence[object], now: float) -> list[MpsNotice]:
        out, self._pending = self._pending, []
        xids: dict[str, list[int]] = {}
        for s in samples:
            gpu_id = str(getattr(s, "gpu_id", ""))
            xids[gpu_id] = [x for x in getattr(s, "xids", ()) if x in MPS_FAULT_XIDS]
        for gpu_id, g in sorted(self.gpus.items()):
            if gpu_id in self._down:
                if self.clock() < self._down[gpu_id]:
                    continue
                err = self._start(g)
                if err:
                    self._down[gpu_id] = self.clock() + self.retry_s
                    out.append(MpsNotice("mps_failure", gpu_id, err))
                    continue
                del self._down[gpu_id]
                self.table.resync()
                out += [MpsNotice(k, gpu, d) for k, gpu, d in self.table.sync(self._leases)]
                since = self.faulted.pop(gpu_id, None)
                if since is None:
                    out.append(MpsNotice("mps_started", gpu_id, g.pipe_directory))
                else:
                    ms = (self.clock() - since) * 1000
                    out.append(MpsNotice("mps_recovered", gpu_id, "daemon restarted", latency_ms=ms))
                continue
            died = self.daemon_pid(gpu_id) is None
            faults = xids.get(gpu_id, [])
            if not died and not faults:
                continue
            why = "MPS control daemon exited" if died else f"client fault XID {faults[0]} on an MPS GPU"
            t0 = self.clock()
            self.faulted[gpu_id] = t0
            out.append(MpsNotice("mps_fault", gpu_id, f"{why}: every client of this GPU is reset"))
            for lease in self._leases:
                if str(lease.get("gpu_id", "")) == gpu_id:
                    lid = str(lease.get("lease_id", ""))
                    out.append(MpsNotice("mps_fault", gpu_id, f"{why}: restart the client", lease_id=lid))
            if not died:
                with contextlib.suppress(MpsError):
                    self.table.controls[gpu_id].quit()
            err = self._start(g)
            if err:
                self._down[gpu_id] = self.clock() + self.retry_s
                out.append(MpsNotice("mps_failure", gpu_id, err))
                continue
            self.table.resync()
            for kind, gpu, detail in self.table.sync(self._leases):
                out.append(MpsNotice(kind, gpu, detail))
            del self.faulted[gpu_id]
            out.append(
                MpsNotice(
                    "mps_recovered",
                    gpu_id,
                    "daemon restarted, limits re-applied",
                    latency_ms=(self.clock() - t0) * 1000,
                )
            )
        return out
