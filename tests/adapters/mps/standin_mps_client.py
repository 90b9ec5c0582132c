"""A real MPS client stand-in: connects to its server through ``$CUDA_MPS_PIPE_DIRECTORY`` and holds
the connection; prints ``ready``, and exits 1 with ``CUDA_ERROR_MPS_SERVER_NOT_READY`` when the
server goes away (what every client of a faulted MPS server sees)."""

import os
import socket
import sys

s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.path.join(os.environ["CUDA_MPS_PIPE_DIRECTORY"], "control.sock"))
s.sendall(f"client {os.getpid()}\n".encode())
s.recv(16)
print("ready", os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", ""), flush=True)
while s.recv(4096):
    pass
print("CUDA_ERROR_MPS_SERVER_NOT_READY", flush=True)
sys.exit(1)
