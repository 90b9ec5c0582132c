"""CUDA MPS: the control-daemon client, per-lease limits and the client environment (stdlib only)."""

from gpupool.adapters.mps.control import (
    DEFAULT_PIPE_DIRECTORY,
    BinaryTransport,
    ContainerMps,
    MpsControl,
    MpsError,
    MpsLimits,
    SocketTransport,
    client_env,
    container_mps,
)

__all__ = [
    "DEFAULT_PIPE_DIRECTORY",
    "BinaryTransport",
    "ContainerMps",
    "MpsControl",
    "MpsError",
    "MpsLimits",
    "SocketTransport",
    "client_env",
    "container_mps",
]
