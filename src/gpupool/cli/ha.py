"""Replicated `gpupool serve` on etcd: one leader, standbys that follow it, take-over on leader loss.

Composition root of the high-availability mode (``gpupool serve --store etcd://...``; every
replica runs the same command on the same etcd prefix, with the same ``--auth-file``):

1. the listening socket is bound once, at start, and kept for the life of the process; the
   standby server and later the leader server accept on it in turn, so a client's connection
   attempt during the switch waits in the socket's backlog instead of being refused;
2. standby: the store is fenced off (`EtcdLeaseStore.set_fence` to a revision no key has: nothing
   this replica sends can land), a `Follower` mirrors the store by watch, `StandbyApp` answers lease
   reads from it and forwards everything else to the leader, and the replica campaigns
   (`Election`, etcd lease of ``ttl_s``) whenever its view shows no leader (the leader key's delete
   wakes it at once), and every `RECHECK_S` in any case;
3. on winning: the store's writes carry the election revision (the fence), the ledger is rebuilt
   from the store (`LeaseController.recover`: every acknowledged lease, queued tickets resumed, no
   view older than the election is used; the batch jobs the old leader left running are requeued),
   and the full gateway replaces the standby app on the same socket, with the leader-only services
   beside it (``leader_services``: the tidal plane and batch runner, the extender's reconciler and
   preemptor), which stop when it stops leading;
   with ``--kubernetes`` the extender port is bound once too and served for the whole process: by
   a relay to the leader's extender while standing by (`gpupool.adapters.k8s.forwarding`; the
   leader key's value carries the leader's extender URL: ``API-URL#replica-id#EXTENDER-URL``), by
   the leader's own extender after winning, answering only while the etcd lease is held;
4. a leader that loses its etcd lease (could not renew within ``ttl_s``: paused, partitioned, etcd
   unreachable) or sees a write whose outcome etcd left unknown (its in-memory ledger may differ
   from the store) stops serving and the process exits with `EXIT_LOST_LEADERSHIP`; its writes
   were already fenced off inside etcd. Its batch runner steps down without a write or a wait on
   the event loop (`BatchService.step_down`: SIGKILL after the grace period, off the loop). A
   supervisor (Kubernetes, systemd) restarts it as a standby. Exiting rather than demoting in
   place keeps one rule: a ledger in memory is only ever built from the store right after winning
   an election;
5. SIGTERM / Ctrl-C: a leader resigns (deletes its key at once, a standby takes over without
   waiting for the TTL); a standby just stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import signal
import socket
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpupool.adapters.http.auth import TokenTable
from gpupool.adapters.http.standby import LeaderOnly, StandbyApp
from gpupool.adapters.store.etcd import EtcdLeaseStore
from gpupool.adapters.store.etcd_client import EtcdError
from gpupool.adapters.store.etcd_election import Election
from gpupool.adapters.store.etcd_follower import Follower
from gpupool.cli.console import say
from gpupool.cli.errors import UserError, check_url
from gpupool.cli.stopping import stop_requested

EXIT_LOST_LEADERSHIP = 3
CAMPAIGN_POLL_S = 0.25
RECHECK_S = 2.0
BACKLOG = 2048


def advertise_url_of(url: str | None, host: str, port: int) -> str:
    """``--advertise-url`` (None or empty: not given, then `default_advertise_url`), or `UserError` naming it:
    the standbys forward to it, so it must be an http(s) URL with a host, and without '#' (the leader
    key's value is ``URL#replica-id#EXTENDER-URL``). Checked before anything connects."""
    if not url:
        return default_advertise_url(host, port)
    check_url("--advertise-url", url)
    if "#" in url:
        raise UserError(f"invalid --advertise-url={url!r}: must not contain '#'")
    return url


def default_advertise_url(host: str, port: int) -> str:
    """``http://HOST:PORT``; for a wildcard bind address, this machine's host name instead."""
    wildcard = host in ("", "::") or host == "0.0.0.0"  # noqa: S104 (a comparison, not a bind)
    return f"http://{socket.gethostname() if wildcard else host}:{port}"


def leader_url_of(candidate: str | None) -> str | None:
    """The base URL in a leader key's value (``URL#replica-id[#EXTENDER-URL]``)."""
    return candidate.partition("#")[0] if candidate else None


def extender_url_of(candidate: str | None) -> str | None:
    """The extender URL in a leader key's value (None: the leader serves no extender)."""
    parts = (candidate or "").split("#", 2)
    return parts[2] if len(parts) == 3 and parts[2] else None


def default_extender_url(advertise_url: str, port: int, prefix: str) -> str:
    """The advertised API URL's host with the extender's port and prefix."""
    from urllib.parse import urlsplit

    parts = urlsplit(advertise_url)
    host = parts.hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
    return f"{parts.scheme or 'http'}://{host}:{port}{prefix}"


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


async def run_replica(
    *,
    store: EtcdLeaseStore,
    tokens: TokenTable,
    build_leader: Callable[[EtcdLeaseStore], Any],
    serve_leader: Callable[..., Any],
    host: str,
    port: int,
    advertise_url: str,
    ttl_s: int,
    server_options: dict[str, Any],
    extender: Any = None,
    extender_url: str = "",
) -> int:
    """Run one replica until a signal (0) or a lost leadership (`EXIT_LOST_LEADERSHIP`).

    ``build_leader(store)``: the gateway `Bundle` rebuilt from the store (called once, after
    winning); ``serve_leader(bundle, sockets=..., stop_event=..., gate=...)``: serve it, with the
    leader-only services, until a signal or ``stop_event`` (``gate()``: this replica still holds
    its etcd lease). ``extender``: the bound extender server (`ExtenderServer`, ``--kubernetes``),
    served by this replica for its whole life: as a relay to the leader while standing by, by the
    leader's own extender after winning; ``extender_url``: its URL as other replicas reach it
    (published in the leader key)."""
    from gpupool.adapters.k8s.forwarding import Forwarder
    from gpupool.cli.serving import uvicorn_server

    loop = asyncio.get_running_loop()
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        raise UserError(f"--port {port}: cannot listen on {host}:{port}: {exc}") from None
    candidate = f"{advertise_url.rstrip('/')}#{uuid.uuid4().hex[:12]}"
    if extender is not None:
        candidate += f"#{extender_url.rstrip('/')}"
    lost = asyncio.Event()
    doubt: list[str] = []

    def lose(why: str) -> None:
        if not doubt:
            doubt.append(why)
        loop.call_soon_threadsafe(lost.set)

    election = Election(store, candidate=candidate, ttl_s=ttl_s, on_lost=lambda: lose("etcd lease lost"))
    store.set_fence(election.key, -1)  # a standby can write nothing
    wake = asyncio.Event()

    apps: list[StandbyApp] = []

    def on_leader(value: str | None) -> None:
        if value is None:
            loop.call_soon_threadsafe(wake.set)
        for app in apps:  # (forwards in flight to the previous leader end: 503, the client retries)
            app.leader_changed()

    follower = Follower(store, on_leader=on_leader)
    await asyncio.to_thread(follower.start)
    standby = StandbyApp(
        view=follower,
        tokens=tokens,
        leader_url=lambda: leader_url_of(follower.leader()),
        self_url=advertise_url,
    )
    apps.append(standby)
    if extender is not None:
        extender.use(Forwarder(lambda: extender_url_of(follower.leader()), self_url=extender_url))
        extender.start()
    won = False
    if follower.leader() is None:  # nobody leads: try first (the first replica serves as leader at once)
        with contextlib.suppress(EtcdError):
            won = await asyncio.to_thread(election.try_acquire)
    server = uvicorn_server(standby, host=host, port=port, **server_options)
    serving = None if won else asyncio.create_task(server.serve(sockets=[sock.dup()]))
    stopping = asyncio.Event()
    handled = (signal.SIGINT, signal.SIGTERM)

    def stop() -> None:
        stopping.set()
        wake.set()

    for sig in handled:
        loop.add_signal_handler(sig, stop)
    if stop_requested():  # a signal during start-up is never lost (cli/stopping.py)
        stop()
    if not won:
        say(f"gpupool: standby on http://{host}:{port} (replica {candidate}); campaigning")
    last_try = -math.inf
    try:
        while not won and not stopping.is_set():
            # campaign when the view shows no leader (its delete wakes this loop at once), and every
            # `RECHECK_S` whatever the view says (a view that lost its watch may be stale)
            if follower.leader() is None or loop.time() - last_try >= RECHECK_S:
                last_try = loop.time()
                try:
                    won = await asyncio.to_thread(election.try_acquire)
                except EtcdError:
                    won = False
            if won:
                break
            wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CAMPAIGN_POLL_S):
                    await wake.wait()
    except BaseException:
        for sig in handled:
            loop.remove_signal_handler(sig)
        raise
    if not won:
        for sig in handled:
            loop.remove_signal_handler(sig)
        server.should_exit = True
        if serving is not None:
            await serving
        follower.close()
        sock.close()
        if extender is not None:
            await asyncio.to_thread(extender.stop)
        return 0
    say(f"gpupool: elected leader (election revision {election.revision}); rebuilding the ledger")
    store.on_write_doubt = lambda exc: lose(f"a write's outcome is unknown ({exc})")
    t0 = loop.time()
    try:
        bundle = await asyncio.to_thread(build_leader, store)
        bundle.app = LeaderOnly(bundle.app, lambda: election.is_leader)
    except BaseException:
        election.resign()
        raise
    follower.close()
    server.should_exit = True  # the standby stops accepting; the leader accepts on the same socket
    if serving is not None:
        await serving
    for sig in handled:  # (kept through the rebuild: a SIGTERM meanwhile resigns, see below)
        loop.remove_signal_handler(sig)
    if lost.is_set() or stopping.is_set():
        election.resign()
        if extender is not None:
            await asyncio.to_thread(extender.stop)
        if stopping.is_set():
            return 0
        say(f"gpupool: lost the leadership while starting ({doubt[0]}); exiting")
        return EXIT_LOST_LEADERSHIP
    say(f"gpupool: leader serving on http://{host}:{port} (ledger rebuilt in {loop.time() - t0:.2f} s)")
    try:
        # (the leader-only services stop leading too once the leadership is lost or in doubt)
        leading = lambda: election.is_leader and not lost.is_set()  # noqa: E731
        await serve_leader(bundle, sockets=[sock.dup()], stop_event=lost, gate=leading)
    finally:
        sock.close()
        if extender is not None:
            await asyncio.to_thread(extender.stop)
    election.resign()
    if lost.is_set():
        say(f"gpupool: lost the leadership ({doubt[0]}); exiting so that this replica restarts as a standby")
        return EXIT_LOST_LEADERSHIP
    return 0


def prewarm(cluster: Path, workloads: Path) -> None:
    """Import and plan now what a take-over needs (measured: the first `build` of a process takes
    ~1 s, mostly imports; a second ~0.1 s), so a standby that wins serves sooner."""
    import gpupool.adapters.http.app
    import gpupool.adapters.http.proxy
    import gpupool.adapters.metrics.gateway
    import gpupool.adapters.simulated
    import gpupool.hardware.memory
    from gpupool.cli.serve import plan_cluster

    del gpupool  # (imported for their side effect: loaded modules)
    plan_cluster(cluster, workloads)


def serve_replicated(
    *,
    make_bundle: Callable[[EtcdLeaseStore], Any],
    store_url: str,
    store_options: dict[str, Any],
    data_dir: Path,
    auth_file: Path | None,
    cluster: Path,
    workloads: Path,
    host: str,
    port: int,
    advertise_url: str,
    ttl_s: int,
    server_options: dict[str, Any],
    leader_services: Callable[[Any, Callable[[], bool]], list[Any]] | None = None,
    extender: Any = None,
    extender_url: str = "",
) -> int:
    """`gpupool serve` with an etcd store: check every argument, open the store, run one replica;
    the process's exit status (`run_replica`). ``leader_services(bundle, gate)``: the coroutines
    that run on the leader only, beside its server (the tidal plane and batch runner, the
    extender's reconciler and preemptor): started once the ledger is rebuilt after winning,
    cancelled when the leader stops or steps down."""
    from gpupool.adapters.store.etcd import open_etcd_store
    from gpupool.cli.serve import load_tokens
    from gpupool.cli.serving import run_loop, serve_forever
    from gpupool.cli.store_options import open_lease_store
    from gpupool.core.errors import InvalidInput

    prewarm(cluster, workloads)  # (also: exit 2 on a bad spec before anything connects)
    entries, new_admin = load_tokens(auth_file, data_dir)
    try:
        tokens = TokenTable(entries)
    except InvalidInput as exc:
        raise UserError(f"{auth_file or 'tokens'}: {exc}") from None
    if auth_file is None:
        say(
            "gpupool: warning: no --auth-file: each replica has its own generated admin token; "
            "give every replica the same --auth-file"
        )
    opener = functools.partial(open_etcd_store, store_url, **store_options)
    store = open_lease_store(store_url, opener, data_dir=data_dir, new_admin=new_admin)
    if new_admin:
        say(f"admin token (stored in {data_dir / 'admin.token'}, shown once): {new_admin}")
    code: list[int] = [0]

    async def serve_leader(
        bundle: Any, *, sockets: list[socket.socket], stop_event: asyncio.Event, gate: Callable[[], bool]
    ) -> None:
        opts: dict[str, Any] = {
            "server_options": server_options,
            "sockets": sockets,
            "stop_event": stop_event,
            "extra": leader_services(bundle, gate) if leader_services is not None else [],
        }
        await serve_forever(bundle, host=host, port=port, **opts)

    async def main() -> None:
        code[0] = await run_replica(
            store=store,
            tokens=tokens,
            build_leader=make_bundle,
            serve_leader=serve_leader,
            host=host,
            port=port,
            advertise_url=advertise_url,
            ttl_s=ttl_s,
            server_options=server_options,
            extender=extender,
            extender_url=extender_url,
        )

    try:
        with contextlib.suppress(KeyboardInterrupt):
            run_loop(main())
    finally:
        store.close()
    return code[0]


__all__ = [
    "EXIT_LOST_LEADERSHIP",
    "bind_socket",
    "default_extender_url",
    "extender_url_of",
    "leader_url_of",
    "run_replica",
    "serve_replicated",
]
