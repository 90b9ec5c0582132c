"""``gpupool serve --kubernetes``: kube-scheduler's extender verbs on the gateway's own ledger.

Role: composition only. The extender HTTP server (``filter``, ``prioritize``, ``bind``, ``preempt``,
``/healthz``, ``<prefix>/state``; `gpupool.adapters.k8s.extender`) listens on a second port
(``--extender-port``, 127.0.0.1 unless ``--extender-host`` says otherwise: kube-scheduler runs
beside it), and every call it makes is handed to the gateway's event loop (`LoopOwner`), where it
runs on the same `LeaseController` as the lease API, the OpenAI proxy and the batch runner, between
two of their handlers. A bind answers only after the gateway's group commit made its lease durable
in the same store as every other lease. The pod reconciler, the preemptor and (when the inventory
comes from node annotations: never here, the gateway's inventory is its plan and its node agents)
the inventory loop run in threads exactly as in ``gpupool extender``; the reconciler's first resync
adopts, from pod annotations, only what the store lacks.

Replicas (an etcd store, `gpupool.cli.ha`): every replica binds the extender port at start and
serves it for its whole life; a standby relays the verbs to the leader's extender
(`gpupool.adapters.k8s.forwarding`), the leader serves them from its ledger (`run` with a ``gate``),
and the reconciler and preemptor (they write) run on the leader only.

Start-up order: options are checked and the extender's port is bound before the store opens
(`check`), so a bad flag or a taken port exits 2 with nothing changed; the threads start once the
loop runs (`run`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpupool.cli.errors import UserError, check_port


@dataclass(frozen=True, slots=True)
class KubeOptions:
    host: str = "127.0.0.1"
    port: int = 8888
    prefix: str = ""
    domain: str = "gpupool.io"
    kube_api: str = ""
    kubeconfig: str = ""
    no_kube: bool = False
    preempt_interval_s: float = 5.0


@dataclass
class Prepared:
    server: Any
    extender: Any
    api: Any
    listed: tuple[list[Any], float] | None
    """The pods and the ``time.monotonic()`` reading taken just before listing them."""


def check(opts: KubeOptions) -> Prepared:
    """Validate the options, find the Kubernetes API and bind the extender's port (exit 2 on error)."""
    from gpupool.adapters.k8s.extender import Extender, ExtenderServer
    from gpupool.adapters.k8s.resources import ResourceNames
    from gpupool.cli.extender import kube_api_from_options, list_pods_or_exit

    check_port("--extender-port", opts.port)
    if opts.no_kube and (opts.kube_api or opts.kubeconfig):
        raise UserError("--no-kube excludes --kube-api and --kubeconfig")
    api = None if opts.no_kube else kube_api_from_options(opts.kube_api, opts.kubeconfig)
    ext = Extender(None, api=api, names=ResourceNames(opts.domain))  # type: ignore[arg-type]
    try:
        server = ExtenderServer(ext, host=opts.host, port=opts.port, prefix=opts.prefix)
    except OSError as exc:
        raise UserError(
            f"--extender-host/--extender-port: cannot listen on {opts.host}:{opts.port}: "
            f"{exc.strerror or exc}"
        ) from None
    # listed before the store opens: an unreachable API exits 2 at start-up; the monotonic reading
    # becomes a reading of the controller's clock in `run` (leases granted after it are kept by the
    # first resync)
    now = time.monotonic()
    listed = None if api is None else (list_pods_or_exit(api), now)
    return Prepared(server, ext, api, listed)


async def run(
    bundle: Any, prepared: Prepared, opts: KubeOptions, *, gate: Callable[[], bool] | None = None
) -> None:
    """Serve the extender on the bundle's controller until cancelled (a `serve_forever` extra).

    ``gate`` (replicas, `gpupool.cli.ha`): the server already runs (a standby's relay) on the
    port; the extender takes it over now, answers only while ``gate()`` holds (the etcd lease), and
    on the way out the server is handed a relay that answers 503 until the process exits."""
    from gpupool.adapters.k8s.owner import LoopOwner
    from gpupool.adapters.k8s.pool import ExtenderPool
    from gpupool.cli.console import say
    from gpupool.cli.extender import start_services

    committer = bundle.app.state.gateway.committer
    owner = LoopOwner(asyncio.get_running_loop(), durable=committer.durable, kick=committer.kick)
    prepared.extender.pool = ExtenderPool(bundle.controller, owner=owner)
    stop = threading.Event()
    if gate is None:
        prepared.server.start()
    else:
        prepared.server.use(prepared.extender, gate=gate)
    try:
        await asyncio.to_thread(
            start_services,
            prepared.extender,
            prepared.api,
            source="plan",
            reconcile=True,
            preempt_interval_s=opts.preempt_interval_s,
            inventory_resync_s=0.0,
            stop=stop,
            # a new leader lists the pods again: the list taken at start-up may be old by now
            listed=_on_clock(prepared.listed, bundle.controller.clock) if gate is None else None,
        )
        say(f"gpupool extender on {prepared.server.url} (same ledger as the gateway)")
        await asyncio.Event().wait()
    finally:
        stop.set()
        if gate is None:
            await asyncio.to_thread(prepared.server.stop)
        else:
            from gpupool.adapters.k8s.forwarding import Forwarder

            prepared.server.use(Forwarder(lambda: None, self_url=prepared.server.url))


def _on_clock(listed: tuple[list[Any], float] | None, clock: Any) -> tuple[list[Any], float] | None:
    """``listed`` with its monotonic reading turned into a reading of ``clock``: the lease clock
    (`gpupool.cli.leaseclock`) advances exactly as ``time.monotonic`` does, so the list was taken
    ``monotonic() - reading`` seconds before ``clock.now()``, whatever the wall clock did since."""
    if listed is None:
        return None
    pods, at_monotonic_s = listed
    return pods, clock.now() - (time.monotonic() - at_monotonic_s)
