"""Client for the CUDA MPS control daemon (``nvidia-cuda-mps-control``), one line per command.

Role: sets the per-client limits a lease grants on an MPS share -- pinned device memory
(``set_device_pinned_mem_limit``) and active thread percentage (``set_active_thread_percentage``),
their ``set_default_*`` forms for future servers -- and builds the environment an MPS client needs
(`client_env`). gpu-facts section 4 is the reference.

Transports (both send exactly one command line and read the reply until EOF):
- `BinaryTransport` runs the control program with ``CUDA_MPS_PIPE_DIRECTORY`` set and writes the
  line to its stdin (the documented interface: ``echo get_server_list | nvidia-cuda-mps-control``);
- `SocketTransport` connects to a unix socket speaking the same line protocol (the stand-in daemon
  used by tests and by the demo on machines without a GPU).

Invariants:
- Commands are built from validated values only: percentages are integers in 1..100, memory is a
  positive integer of MiB written as ``<n>M``, devices are ordinals or ``GPU-``/``MIG-`` UUIDs, pids
  are positive integers. Bad input raises `InvalidInput` naming the field; nothing is sent.
- A reply the daemon marks as an error (or a transport failure) raises `MpsError` carrying the exact
  command line, so the agent can report it.
- The pipe directory is configurable per daemon (one per GPU or MIG device).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpupool.core.errors import GpupoolError, InvalidInput
from gpupool.hardware.units import COMPUTE_MILLI_PER_GPU

DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # noqa: S108 - NVIDIA's documented product default
CONTROL_BINARY = "nvidia-cuda-mps-control"
_UUID_RE = re.compile(r"(GPU|MIG)-[0-9A-Za-z-]+")  # fullmatch: "$" also matches before a final newline
_ERROR_PREFIXES = ("error", "invalid", "unrecognized", "failed")


class MpsError(GpupoolError):
    def __init__(self, command: str, reply: str) -> None:
        self.command = command
        self.reply = reply
        super().__init__(f"MPS control command {command!r} failed: {reply}")


class Transport(Protocol):
    def send(self, line: str) -> str:
        """Send one command line, return the daemon's reply (stripped)."""
        ...


class BinaryTransport:
    def __init__(self, pipe_directory: str, *, binary: str = CONTROL_BINARY, timeout_s: float = 10.0) -> None:
        self.pipe_directory = pipe_directory
        self.binary = binary
        self.timeout_s = timeout_s

    def send(self, line: str) -> str:
        env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=self.pipe_directory)
        try:
            proc = subprocess.run(
                [self.binary],
                input=line + "\n",
                capture_output=True,
                text=True,
                env=env,
                timeout=self.timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise MpsError(line, f"{self.binary}: {type(exc).__name__}: {exc}") from exc
        if proc.returncode != 0:
            raise MpsError(line, f"exit {proc.returncode}: {(proc.stderr or proc.stdout).strip()}")
        return proc.stdout.strip()


class SocketTransport:
    def __init__(self, path: str | Path, *, timeout_s: float = 5.0) -> None:
        self.path = str(path)
        self.timeout_s = timeout_s

    def send(self, line: str) -> str:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout_s)
                s.connect(self.path)
                s.sendall((line + "\n").encode())
                s.shutdown(socket.SHUT_WR)
                chunks: list[bytes] = []
                while chunk := s.recv(65536):
                    chunks.append(chunk)
        except OSError as exc:
            raise MpsError(line, f"{self.path}: {type(exc).__name__}: {exc}") from exc
        return b"".join(chunks).decode().strip()


# ------------------------------------------------------------------------------------------ values
def _device(dev: int | str) -> str:
    if type(dev) is int and dev >= 0:
        return str(dev)
    if isinstance(dev, str) and ((dev.isascii() and dev.isdigit()) or _UUID_RE.fullmatch(dev)):
        return dev
    raise InvalidInput("mps.device", dev, "must be a device ordinal or a GPU-/MIG- UUID")


def _pct(pct: int) -> str:
    if type(pct) is not int or not 1 <= pct <= 100:
        raise InvalidInput("mps.active_thread_percentage", pct, "must be an integer in [1, 100]")
    return str(pct)


def _mem(mib: int) -> str:
    if type(mib) is not int or mib <= 0:
        raise InvalidInput("mps.pinned_mem_limit_mib", mib, "must be an integer > 0 MiB")
    return f"{mib}M"


def _pid(pid: int, field: str = "mps.server_pid") -> str:
    if type(pid) is not int or pid <= 0:
        raise InvalidInput(field, pid, "must be a positive integer pid")
    return str(pid)


@dataclass(frozen=True, slots=True)
class MpsLimits:
    """What one MPS client may use: pinned device memory (MiB) and an SM share (percent, a cap)."""

    pinned_mem_limit_mib: int
    active_thread_percentage: int

    def __post_init__(self) -> None:
        _mem(self.pinned_mem_limit_mib)
        _pct(self.active_thread_percentage)

    @classmethod
    def from_grant(cls, *, vram_mib: int, compute_milli: int) -> MpsLimits:
        """A lease grant's VRAM becomes the memory cap; its compute (rounded up to whole percent,
        at least 1) the thread percentage. MPS itself rounds the percentage down to its granularity."""
        pct = -(-compute_milli * 100 // COMPUTE_MILLI_PER_GPU)
        return cls(vram_mib, min(100, max(1, pct)))


def client_env(pipe_directory: str, device: int | str, limits: MpsLimits) -> dict[str, str]:
    """The environment of an MPS client process for one lease on one device.

    ``device`` is as the *client* sees it (ordinal after ``CUDA_VISIBLE_DEVICES`` remapping, or UUID).
    The client-side variables can only lower what the server allows.
    """
    return {
        "CUDA_MPS_PIPE_DIRECTORY": pipe_directory,
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{_device(device)}={_mem(limits.pinned_mem_limit_mib)}",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": _pct(limits.active_thread_percentage),
    }


# ------------------------------------------------------------------------------------------ client
class MpsControl:
    """One control daemon (one pipe directory)."""

    def __init__(
        self, pipe_directory: str = DEFAULT_PIPE_DIRECTORY, *, transport: Transport | None = None
    ) -> None:
        self.pipe_directory = pipe_directory
        self.transport: Transport = transport or BinaryTransport(pipe_directory)

    def command(self, line: str) -> str:
        reply = self.transport.send(line)
        if reply.lower().startswith(_ERROR_PREFIXES):
            raise MpsError(line, reply)
        return reply

    # defaults for future servers
    def set_default_active_thread_percentage(self, pct: int) -> None:
        self.command(f"set_default_active_thread_percentage {_pct(pct)}")

    def get_default_active_thread_percentage(self) -> float:
        return float(self.command("get_default_active_thread_percentage"))

    def set_default_device_pinned_mem_limit(self, device: int | str, mib: int) -> None:
        self.command(f"set_default_device_pinned_mem_limit {_device(device)} {_mem(mib)}")

    def get_default_device_pinned_mem_limit(self, device: int | str) -> str:
        return self.command(f"get_default_device_pinned_mem_limit {_device(device)}")

    # per server (applies to clients created later on it)
    def set_active_thread_percentage(self, server_pid: int, pct: int) -> None:
        self.command(f"set_active_thread_percentage {_pid(server_pid)} {_pct(pct)}")

    def get_active_thread_percentage(self, server_pid: int) -> float:
        return float(self.command(f"get_active_thread_percentage {_pid(server_pid)}"))

    def set_device_pinned_mem_limit(self, server_pid: int, device: int | str, mib: int) -> None:
        self.command(f"set_device_pinned_mem_limit {_pid(server_pid)} {_device(device)} {_mem(mib)}")

    def get_device_pinned_mem_limit(self, server_pid: int, device: int | str) -> str:
        return self.command(f"get_device_pinned_mem_limit {_pid(server_pid)} {_device(device)}")

    # servers and clients
    def get_server_list(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.command("get_server_list").split() if x.isdigit())

    def start_server(self, uid: int) -> None:
        if type(uid) is not int or uid < 0:
            raise InvalidInput("mps.uid", uid, "must be an integer >= 0")
        self.command(f"start_server -uid {uid}")

    def terminate_client(self, server_pid: int, client_pid: int) -> None:
        self.command(f"terminate_client {_pid(server_pid)} {_pid(client_pid, 'mps.client_pid')}")

    def quit(self) -> None:
        self.command("quit")

    def apply(
        self,
        limits: MpsLimits,
        *,
        device: int | str,
        server_pid: int | None = None,
    ) -> tuple[str, ...]:
        """Apply ``limits`` to one server (``server_pid``) or as the defaults for future servers.

        Returns the exact command lines sent, in order (memory first, then threads).
        """
        if server_pid is None:
            lines = (
                f"set_default_device_pinned_mem_limit {_device(device)} {_mem(limits.pinned_mem_limit_mib)}",
                f"set_default_active_thread_percentage {_pct(limits.active_thread_percentage)}",
            )
        else:
            lines = (
                f"set_device_pinned_mem_limit {_pid(server_pid)} {_device(device)} "
                f"{_mem(limits.pinned_mem_limit_mib)}",
                f"set_active_thread_percentage {_pid(server_pid)} {_pct(limits.active_thread_percentage)}",
            )
        for line in lines:
            self.command(line)
        return lines


def env_for(pipe_directory: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The daemon's own environment (pipe directory + optional ``CUDA_VISIBLE_DEVICES`` etc.)."""
    return {"CUDA_MPS_PIPE_DIRECTORY": pipe_directory, **(extra or {})}


@dataclass(frozen=True, slots=True)
class ContainerMps:
    """What a container needs to be a client of one MPS daemon (the k8s Allocate response's part)."""

    env: dict[str, str]
    mounts: tuple[tuple[str, str], ...]
    """(host path, container path), read-write."""
    host_ipc: bool
    """True when the daemon shares the host's ``/dev/shm`` (no dedicated shm directory to mount)."""


def container_mps(
    pipe_directory: str, device: int | str, limits: MpsLimits, *, shm_directory: str = ""
) -> ContainerMps:
    """The container side of an MPS share, as NVIDIA's k8s-device-plugin gives it: the daemon's pipe
    directory mounted at the same path with ``CUDA_MPS_PIPE_DIRECTORY`` pointing at it, the daemon's
    shm directory mounted as ``/dev/shm`` (or ``hostIPC`` when the daemon uses the host's), and the
    per-client ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` / ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` of the lease."""
    if not pipe_directory.startswith("/"):
        raise InvalidInput("mps.pipe_directory", pipe_directory, "must be an absolute path")
    if shm_directory and not shm_directory.startswith("/"):
        raise InvalidInput("mps.shm_directory", shm_directory, "must be an absolute path")
    mounts = [(pipe_directory, pipe_directory)]
    if shm_directory:
        mounts.append((shm_directory, "/dev/shm"))  # noqa: S108 - the container's shm mount point
    return ContainerMps(client_env(pipe_directory, device, limits), tuple(mounts), host_ipc=not shm_directory)
