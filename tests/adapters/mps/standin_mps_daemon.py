"""Stand-in for the MPS control daemon: the same one-line-per-command protocol on a unix socket.

Run as ``python standin_mps_daemon.py SOCKET LOG``. Every command received is appended verbatim to
LOG (one per line) so tests can check the exact commands; set_* commands are remembered so the
matching get_* returns them. Prints ``ready`` once listening.
"""

from __future__ import annotations

import os
import socket
import sys


def reply_for(line: str, state: dict[str, str]) -> str:
    parts = line.split()
    if not parts:
        return "Error: empty command"
    cmd, args = parts[0], parts[1:]
    if cmd == "quit":
        return ""
    if cmd == "get_server_list":
        return "4242"
    if cmd == "start_server":
        return ""
    if cmd == "terminate_client":
        return "" if len(args) == 2 else "Error: usage terminate_client <server PID> <client PID>"
    if cmd.startswith("set_"):
        key = "get_" + cmd[4:] + " " + " ".join(args[:-1])
        state[key.strip()] = args[-1] if args else ""
        return "" if args else f"Error: missing value for {cmd}"
    if cmd.startswith("get_"):
        default = "100.0" if "thread_percentage" in cmd else "N/A"
        return state.get(line.strip(), default)
    return f"Unrecognized command {cmd}"


def main() -> None:
    sock_path, log_path = sys.argv[1], sys.argv[2]
    state: dict[str, str] = {}
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(sock_path)
    srv.listen(16)
    print("ready", flush=True)
    while True:
        conn, _ = srv.accept()
        with conn:
            data = b""
            while chunk := conn.recv(4096):
                data += chunk
            line = data.decode().strip()
            with open(log_path, "a") as log:
                log.write(line + "\n")
            reply = reply_for(line, state)
            conn.sendall((reply + "\n").encode())
        if line == "quit":
            srv.close()
            os.unlink(sock_path)
            return


if __name__ == "__main__":
    main()
