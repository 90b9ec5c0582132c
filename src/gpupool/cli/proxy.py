"""`gpupool proxy`: a proxy replica: the OpenAI-compatible proxy in its own process, in front of the
backends a leader (`gpupool serve`) registered, granting request leases inside the KV shares the
leader delegates to it (`gpupool.adapters.http.replica`, `gpupool.core.replica`). Run as many as
the request rate needs, behind one load balancer; each calls the leader once every
``--share-ttl-s / 3`` s, whatever the request rate.

Composition root: it wires the HTTP adapter (replica app, share calls) and the KV-cache sizer of
`gpupool serve` around one core `ProxyReplica`. Every argument is checked before anything starts
(exit 2 naming the option); the first share call is made before the server starts, and a leader
that refuses ``--leader-token`` then (HTTP 401/403) is exit 2 naming it, while a leader that does
not answer is retried every share period (it may come up later).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from pathlib import Path

import typer

from gpupool.cli.console import say
from gpupool.cli.errors import (
    UserError,
    check_listen,
    check_port,
    check_range,
    check_token,
    check_url,
    user_errors,
)
from gpupool.core.clock import FunctionClock
from gpupool.core.errors import InvalidInput
from gpupool.core.ids import random_lease_id
from gpupool.core.kvshares import MAX_ID_CHARS, MAX_TTL_S, MIN_TTL_S


@user_errors
def proxy(  # noqa: PLR0917 (typer options)
    leader: str = typer.Option(..., "--leader", help="The leader gateway's URL (http://HOST:PORT)."),
    auth_file: Path = typer.Option(
        ..., "--auth-file", help="tokens: [{token, tenant, role}] YAML (the leader's file: clients' tokens)."
    ),
    leader_token: str = typer.Option(
        ...,
        "--leader-token",
        envvar="GPUPOOL_LEADER_TOKEN",
        help="An admin token of the leader, for the share calls (or $GPUPOOL_LEADER_TOKEN).",
    ),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind."),
    port: int = typer.Option(8090, "--port", help="TCP port."),
    replica_id: str = typer.Option("", "--replica-id", help="Name in the leader's books (default HOST-PID)."),
    share_ttl_s: float = typer.Option(
        3.0, "--share-ttl-s", help="Lifetime of a share without renewal; calls every third of it."
    ),
    max_wait_s: float = typer.Option(
        2.0, "--max-wait-s", help="Longest wait for room in a share before a request gets 429."
    ),
    workloads: Path | None = typer.Option(
        None, "--workloads", help="Workload spec YAML (the leader's: per-model weight format for sizing)."
    ),
    objectives: Path | None = typer.Option(
        None, "--objectives", help="objectives: [{name, priority}] YAML (as for gpupool serve)."
    ),
    header_timeout_s: float = typer.Option(
        10.0, "--header-timeout-s", help="Close a connection whose request head is not complete in time."
    ),
    max_connections: int = typer.Option(
        1000, "--max-connections", help="Open connections + running requests; past it new requests get 503."
    ),
    max_proxy_body_kib: int = typer.Option(
        32 * 1024, "--max-proxy-body-kib", help="OpenAI-route body limit (413 above)."
    ),
) -> None:
    """Serve the OpenAI-compatible proxy as a replica of a leader's (request leases granted locally)."""
    from gpupool.cli.serve import KvSizer, load_tokens
    from gpupool.cli.serving import run_loop, tune_gc, uvicorn_server

    check_port("--port", port)
    check_range("--share-ttl-s", share_ttl_s, lo=MIN_TTL_S, hi=MAX_TTL_S)
    check_range("--max-wait-s", max_wait_s, lo=0, hi=600, lo_open=True)
    check_range("--header-timeout-s", header_timeout_s, lo=0, lo_open=True)
    for flag, v in (("--max-connections", max_connections), ("--max-proxy-body-kib", max_proxy_body_kib)):
        if v < 1:
            raise UserError(f"{flag} {v}: must be >= 1")
    check_url("--leader", leader, schemes=("http",))
    if not leader_token.strip():
        raise UserError("--leader-token: empty")
    check_token("--leader-token", leader_token.strip())
    check_listen("--host/--port", host, port)
    from gpupool.cli.stopping import catch_early_stop, stop_requested

    catch_early_stop()  # a Ctrl-C / SIGTERM during start-up is noted, never lost
    rid = replica_id or f"{socket.gethostname()}-{os.getpid()}"
    if len(rid) > MAX_ID_CHARS or not rid.isprintable() or "/" in rid or any(c.isspace() for c in rid):
        raise UserError(f"--replica-id {rid!r}: 1-{MAX_ID_CHARS} printable characters, no '/' or spaces")
    from gpupool.adapters.http.auth import TokenTable
    from gpupool.adapters.http.replica import ShareLoop, create_replica_app
    from gpupool.cli.serve import _load_objectives_file
    from gpupool.core.replica import ProxyReplica, ReplicaConfig

    entries, _ = load_tokens(auth_file, Path())
    try:
        tokens = TokenTable(entries)
    except InvalidInput as exc:
        raise UserError(f"{auth_file}: {exc}") from None
    quant: dict[str, str] = {}
    if workloads is not None:
        from gpupool.cli.specfiles import load_workload_file

        quant = {w.model: w.quant for w in load_workload_file(workloads) if w.model}
    table = _load_objectives_file(objectives) if objectives is not None else None
    core = ProxyReplica(
        clock=FunctionClock(time.monotonic),
        lease_ids=random_lease_id,
        ticket_ids=random_lease_id,
        config=ReplicaConfig(max_wait_s=max_wait_s),
    )
    loop = ShareLoop(core, leader_url=leader, token=leader_token.strip(), replica=rid, ttl_s=share_ttl_s)
    app = create_replica_app(
        core, loop, tokens=tokens, sizer=KvSizer(quant), max_proxy_body_bytes=max_proxy_body_kib * 1024
    )
    if table is not None:
        from gpupool.adapters.http.surface import set_objectives

        set_objectives(app, table)
    say(f"gpupool proxy replica {rid} on http://{host}:{port} (leader {leader}, share ttl {share_ttl_s:g} s)")
    opts = {"header_timeout_s": header_timeout_s, "max_connections": max_connections}

    async def main() -> None:
        import signal

        server = uvicorn_server(app, host=host, port=port, **opts)
        tune_gc()

        def stop() -> None:
            server.force_exit = server.force_exit or server.should_exit  # a second Ctrl-C: no grace
            server.should_exit = True

        ev = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            ev.add_signal_handler(sig, stop)
        if stop_requested():
            return
        await loop.call(quiet=True)  # the first share call: a token the leader refuses stops the start here
        if loop.refused:
            await loop.pool.aclose()
            raise UserError(f"--leader-token: the leader at {leader} refused it ({loop.refused})")
        await server.serve()

    with contextlib.suppress(KeyboardInterrupt):
        run_loop(main())
