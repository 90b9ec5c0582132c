"""A real process that holds simulated VRAM: the stand-in for a batch job or an engine on a
`SimulatedCluster` GPU (``python -m gpupool.adapters.simulated.holder``).

Role: benchmarks, demos and tests start it as a child to make preemption observable. It records
``--mib`` MiB on ``--gpu`` in the registry (`gpupool.adapters.simulated.vram`), prints ``ready`` on
stdout and then idles until killed. Behaviour on SIGTERM (``--on-term``): ``exit`` (drop the record
and exit 0, a well-behaved job), ``ignore`` (keep running: only SIGKILL frees it) or ``slow-exit``
(exit after ``--term-delay-ms``). With ``--port`` it also serves vLLM's sleep API on 127.0.0.1:
``POST /sleep?level=1|2`` shrinks its record to ``--sleep-mib`` (a sleeping engine keeps its CUDA
context), ``POST /wake_up`` restores ``--mib``, ``GET /is_sleeping`` answers ``{"is_sleeping": b}``.

Invariants: memory is counted only while the process lives (the registry ignores dead pids), so a
SIGKILL frees it without any cooperation; the HTTP port actually bound is printed on the ready line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType
from urllib.parse import parse_qs, urlparse

from gpupool.adapters.simulated.vram import hold, release


class _State:
    def __init__(self, registry: Path, gpu: str, mib: int, sleep_mib: int) -> None:
        self.registry, self.gpu, self.mib, self.sleep_mib = registry, gpu, mib, sleep_mib
        self.sleeping = False
        self.lock = threading.Lock()

    def set_sleep(self, sleeping: bool) -> None:
        with self.lock:
            self.sleeping = sleeping
            hold(self.registry, self.gpu, self.sleep_mib if sleeping else self.mib)


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def _reply(self, code: int, body: object) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            url = urlparse(self.path)
            if url.path == "/sleep":
                level = parse_qs(url.query).get("level", ["1"])[0]
                if level not in ("1", "2"):
                    self._reply(400, {"error": f"level: {level!r} must be 1 or 2"})
                    return
                state.set_sleep(True)
                self._reply(200, {"ok": True})
            elif url.path == "/wake_up":
                state.set_sleep(False)
                self._reply(200, {"ok": True})
            else:
                self._reply(404, {"error": f"no route {url.path}"})

        def do_GET(self) -> None:
            if urlparse(self.path).path == "/is_sleeping":
                self._reply(200, {"is_sleeping": state.sleeping})
            else:
                self._reply(404, {"error": f"no route {self.path}"})

    return Handler


def start_holder(
    registry: Path,
    gpu: str,
    mib: int,
    *,
    on_term: str = "exit",
    term_delay_ms: int = 0,
    sleep_api: bool = False,
    sleep_mib: int = 0,
    ready_timeout_s: float = 30.0,
) -> tuple[subprocess.Popen[str], int]:
    """Start a holder child in its own session (its pid is its process group id); return it and the
    port of its sleep API (0 without one) once its memory is recorded. The caller kills and reaps it."""
    cmd = [sys.executable, "-m", "gpupool.adapters.simulated.holder", "--registry", str(registry)]
    cmd += ["--gpu", gpu, "--mib", str(mib), "--on-term", on_term, "--term-delay-ms", str(term_delay_ms)]
    if sleep_api:
        cmd += ["--port", "0", "--sleep-mib", str(sleep_mib)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout is not None
    ready: list[str] = []
    reader = threading.Thread(target=lambda: ready.append(proc.stdout.readline() if proc.stdout else ""))
    reader.start()
    reader.join(ready_timeout_s)
    line = ready[0] if ready else ""
    if not line.startswith("ready"):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"holder did not start: {line!r} (exit {proc.returncode})")
    port = int(line.rsplit("port=", 1)[1])
    return proc, port


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpupool-sim-holder", description=__doc__)
    ap.add_argument("--registry", required=True, type=Path)
    ap.add_argument("--gpu", required=True, help="GPU or slice id of the simulated cluster")
    ap.add_argument("--mib", required=True, type=int)
    ap.add_argument("--on-term", choices=("exit", "ignore", "slow-exit"), default="exit")
    ap.add_argument("--term-delay-ms", type=int, default=0)
    ap.add_argument("--port", type=int, default=-1, help="serve the sleep API (0: any free port)")
    ap.add_argument("--sleep-mib", type=int, default=0)
    args = ap.parse_args(argv)
    if args.mib < 0 or args.sleep_mib < 0 or args.term_delay_ms < 0:
        sys.stderr.write("holder: --mib, --sleep-mib and --term-delay-ms must be >= 0\n")
        return 2
    state = _State(args.registry, args.gpu, args.mib, args.sleep_mib)
    state.set_sleep(False)

    def on_term(signum: int, frame: FrameType | None) -> None:
        if args.on_term == "ignore":
            return
        if args.on_term == "slow-exit":
            time.sleep(args.term_delay_ms / 1000)
        release(args.registry)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    port = 0
    if args.port >= 0:
        server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(state))
        port = server.server_address[1]
        threading.Thread(target=server.serve_forever, daemon=True).start()
    sys.stdout.write(f"ready pid={os.getpid()} port={port}\n")
    sys.stdout.flush()
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    raise SystemExit(main())
