#!/usr/bin/env python3
"""Stand-in for the ``nvidia-cuda-mps-control`` program, both modes, installed by tests as an
executable named ``nvidia-cuda-mps-control``:

- ``-d``: daemonize (double fork, like the real one) and serve the one-line control protocol on
  ``$CUDA_MPS_PIPE_DIRECTORY/control.sock``; write ``nvidia-cuda-mps-control.pid`` into the pipe
  directory and log every command to ``$CUDA_MPS_LOG_DIRECTORY/control.log``. ``client <pid>`` keeps
  its connection open as an MPS client would hold its server: when the daemon goes away (a fault, or
  ``quit``) every client sees EOF, as every client of a faulted MPS server gets an error.
- no argument: client mode, one command per stdin line, replies on stdout (the documented interface).
"""

import os
import socket
import sys


def reply_for(line, state):
    parts = line.split()
    if not parts:
        return "Error: empty command"
    cmd, args = parts[0], parts[1:]
    if cmd == "quit":
        return ""
    if cmd == "get_server_list":
        return str(os.getpid())
    if cmd.startswith("set_"):
        key = "get_" + cmd[4:] + " " + " ".join(args[:-1])
        state[key.strip()] = args[-1] if args else ""
        return "" if args else f"Error: missing value for {cmd}"
    if cmd.startswith("get_"):
        return state.get(line.strip(), "100.0" if "thread_percentage" in cmd else "N/A")
    return f"Unrecognized command {cmd}"


def serve(pipe_dir, log_dir):
    sock_path = os.path.join(pipe_dir, "control.sock")
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(64)
    with open(os.path.join(pipe_dir, "nvidia-cuda-mps-control.pid"), "w") as f:
        f.write(str(os.getpid()))
    state = {}
    clients = []
    while True:
        conn, _ = srv.accept()
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
        line = data.decode().strip()
        with open(os.path.join(log_dir, "control.log"), "a") as log:
            log.write(line + "\n")
        if line.startswith("client "):
            clients.append(conn)  # held open: the client lives while its server does
            conn.sendall(b"ok\n")
            continue
        conn.sendall((reply_for(line, state) + "\n").encode())
        conn.close()
        if line == "quit":
            for c in clients:
                c.close()
            srv.close()
            os.unlink(sock_path)
            os.unlink(os.path.join(pipe_dir, "nvidia-cuda-mps-control.pid"))
            os._exit(0)


def client_mode(pipe_dir):
    for raw in sys.stdin:
        line = raw.strip()
        if not line:
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(os.path.join(pipe_dir, "control.sock"))
            s.sendall((line + "\n").encode())
            out = b""
            while chunk := s.recv(4096):
                out += chunk
        sys.stdout.write(out.decode())
    return 0


def main():
    pipe_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if not pipe_dir:
        print("CUDA_MPS_PIPE_DIRECTORY not set", file=sys.stderr)
        return 1
    if sys.argv[1:] == ["-d"]:
        log_dir = os.environ.get("CUDA_MPS_LOG_DIRECTORY", pipe_dir)
        os.makedirs(pipe_dir, exist_ok=True)
        os.makedirs(log_dir, exist_ok=True)
        if os.fork() > 0:
            return 0
        os.setsid()
        if os.fork() > 0:
            os._exit(0)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        serve(pipe_dir, log_dir)
        return 0
    return client_mode(pipe_dir)


if __name__ == "__main__":
    sys.exit(main())
