"""Running the gateway's servers: the event loop (uvloop), uvicorn servers that leave signals to
`serve_forever`, one Ctrl-C / SIGTERM handler that stops every server and coroutine at once, and the
GC tuning measured for the lease path.

Role: process plumbing shared by `gpupool serve`, `gpupool run`, `gpupool proxy` and the HA
supervisor (`cli/ha.py`); what is served is built elsewhere (`cli/serve.build`).
Invariant: a signal during start-up is never lost (`cli/stopping.py`); after one, in-flight requests
get at most `SHUTDOWN_GRACE_S`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Coroutine, Iterable
from typing import TYPE_CHECKING, Any

from gpupool.cli.console import say
from gpupool.cli.retention import purge_loop
from gpupool.cli.stopping import stop_requested

if TYPE_CHECKING:
    from gpupool.cli.serve import Bundle


def tune_gc() -> None:
    """Freeze start-up objects and collect the young generation less often.

    Measured (gateway bench, 32 clients): with CPython's defaults a full collection over the lease
    tables and the framework's objects stalls the event loop for ~100 ms (lease p99 ~100 ms); after
    this, p99 ~35 ms and +45 % round trips/s. The gateway keeps few cyclic structures, so fewer
    collections cost little memory."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` on uvloop when it is installed (the gateway extra pins it), else asyncio's loop.

    ``uvicorn.Server.serve()`` runs on whatever loop it is awaited in; uvicorn's own ``loop="auto"``
    applies only to ``uvicorn.run``. Measured (proxy-peers bench): uvloop's transports cut the
    proxy's per-request CPU markedly against asyncio's selector loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


SHUTDOWN_GRACE_S = 1.0
"""After Ctrl-C / SIGTERM, in-flight requests (streams, long-polls, /v1/events) get this long, then
are cancelled: without a bound an open event stream would keep the server up forever."""


def uvicorn_server(app: Any, *, host: str, port: int, **options: Any) -> Any:
    """A uvicorn server that leaves signals to `serve_forever` (one handler stops all servers at once:
    uvicorn's own handlers would stop them one after the other, each waiting for its connections).
    ``options``: `server_config`'s limits (header_timeout_s, keep_alive_s, max_connections)."""
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

    # access_log off: at level warning nothing was logged anyway; this skips the per-request call.
    # Measured (proxy-peers bench, alternating rounds): granian 2.8's embedded ASGI server cost
    # about twice uvicorn + httptools' CPU per proxied request here, so uvicorn stays.
    from gpupool.adapters.http.server import server_config

    config = server_config(
        app,
        host=host,
        port=port,
        access_log=False,
        timeout_graceful_shutdown=int(SHUTDOWN_GRACE_S),
        **options,
    )
    return _Server(config)


async def serve_forever(
    bundle: Bundle,
    *,
    host: str,
    port: int,
    extra: Iterable[Any] = (),
    feed_readings: bool = True,
    server_options: dict[str, Any] | None = None,
    sockets: list[socket.socket] | None = None,
    stop_event: asyncio.Event | None = None,
    listening: asyncio.Event | None = None,
    before_stop: Callable[[], None] | None = None,
) -> None:
    """Run the gateway server (+ any extra `uvicorn_server`s / coroutines) until Ctrl-C or SIGTERM.

    On the signal every coroutine is cancelled and every server stops at once, in-flight requests
    bounded by `SHUTDOWN_GRACE_S`; a second Ctrl-C skips the grace period.
    ``feed_readings``: push the simulated cluster's readings in-process; `gpupool run` turns it off
    when real node agents report them over HTTP instead. ``server_options``: `server_config`'s
    (header_timeout_s, keep_alive_s, max_connections). ``sockets``: listen on these (already bound)
    instead of host:port; ``stop_event``: stop as on a signal once it is set (`gpupool.cli.ha`);
    ``listening``: set once the gateway server accepts connections (`gpupool run` starts its node
    agents then, so their first report does not meet a refused connection); ``before_stop``: run (in
    a thread, the servers still serving) when the stop begins, before any server closes (`gpupool
    run` stops its node agents there, so their last report does not meet a closed gateway either);
    a second signal meanwhile stops the servers at once."""
    import logging
    import signal

    import uvicorn

    server = uvicorn_server(bundle.app, host=host, port=port, **(server_options or {}))
    tune_gc()
    servers = [server, *(x for x in extra if isinstance(x, uvicorn.Server))]
    serving = [asyncio.create_task(server.serve(sockets=sockets))]
    serving += [asyncio.create_task(s.serve()) for s in servers[1:]]
    tasks = []
    if bundle.sim is not None and feed_readings:
        from gpupool.cli.serve import feed_simulated_readings

        tasks.append(asyncio.create_task(feed_simulated_readings(bundle)))
    tasks.append(asyncio.create_task(purge_loop(bundle.controller)))  # ended leases leave the store
    keeper = getattr(bundle, "keeper", None)
    if keeper is not None:  # registered backends keep their placement leases (cli/instances.py)
        tasks.append(asyncio.create_task(keeper.run(bundle.app.state.gateway.committer)))
    for x in extra:
        if not isinstance(x, uvicorn.Server):
            tasks.append(asyncio.create_task(x))
    if listening is not None:

        async def set_when_started(event: asyncio.Event) -> None:
            while not server.started:  # (uvicorn sets it once its sockets listen)
                await asyncio.sleep(0.02)
            event.set()

        tasks.append(asyncio.create_task(set_when_started(listening)))

    loop = asyncio.get_running_loop()
    draining: list[asyncio.Future[None]] = []

    def stop() -> None:
        if before_stop is not None and not draining and not server.should_exit:
            say(f"gpupool: stopping (in-flight requests get {SHUTDOWN_GRACE_S:g} s)")
            draining.append(loop.run_in_executor(None, before_stop))
            draining[0].add_done_callback(lambda _: None if server.should_exit else halt())
            return
        halt()

    def halt() -> None:
        if not server.should_exit and not draining:
            say(f"gpupool: stopping (in-flight requests get {SHUTDOWN_GRACE_S:g} s)")
        # NOTE: uvicorn logs each request it cancels at the end of the grace period with a traceback
        logging.getLogger("uvicorn.error").setLevel(logging.CRITICAL)
        for s in servers:
            s.force_exit = s.force_exit or s.should_exit  # NOTE: a second Ctrl-C: no grace period
            s.should_exit = True
        for t in tasks:
            t.cancel()

    handled = (signal.SIGINT, signal.SIGTERM)
    for sig in handled:
        loop.add_signal_handler(sig, stop)
    if stop_requested():  # a signal arrived during start-up: it must not be lost (cli/stopping.py)
        stop()
    if stop_event is not None:

        async def stop_on_event(event: asyncio.Event) -> None:
            await event.wait()
            stop()

        tasks.append(asyncio.create_task(stop_on_event(stop_event)))
    try:
        await serving[0]
    finally:
        halt()
        await asyncio.gather(*draining, *tasks, *serving[1:], return_exceptions=True)
        for sig in handled:
            loop.remove_signal_handler(sig)
