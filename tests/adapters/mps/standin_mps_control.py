#!/usr/bin/env python3
"""Stand-in for ``nvidia-cuda-mps-control`` (client mode): reads command lines on stdin and forwards
each to the stand-in daemon at ``$CUDA_MPS_PIPE_DIRECTORY/control.sock``, printing the replies."""

import os
import socket
import sys


def main() -> int:
    pipe_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if not pipe_dir:
        print("CUDA_MPS_PIPE_DIRECTORY not set", file=sys.stderr)
        return 1
    for raw in sys.stdin:
        line = raw.strip()
        if not line:
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(os.path.join(pipe_dir, "control.sock"))
            s.sendall((line + "\n").encode())
            s.shutdown(socket.SHUT_WR)
            out = b""
            while chunk := s.recv(4096):
                out += chunk
        sys.stdout.write(out.decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
