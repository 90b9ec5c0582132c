"""kube-scheduler extender over HTTP (standard library ``http.server``, one thread per connection).

Routes (``prefix`` configurable, e.g. ``/gpupool``): ``POST <prefix>/filter``, ``/prioritize``,
``/bind``, ``/preempt``; ``GET /healthz`` and ``/readyz`` (HEAD too, for monitors), ``GET
<prefix>/state`` (pool summary for operators).
Wire types are those of ``k8s.io/kube-scheduler/extender/v1`` with the Go field names as JSON keys:
``ExtenderArgs {Pod, Nodes, NodeNames}``, ``ExtenderFilterResult {Nodes, NodeNames, FailedNodes,
FailedAndUnresolvableNodes, Error}``, ``HostPriorityList [{Host, Score}]``, ``ExtenderBindingArgs
{PodName, PodNamespace, PodUID, Node}``, ``ExtenderBindingResult {Error}``, ``ExtenderPreemptionArgs
{Pod, NodeNameToVictims, NodeNameToMetaVictims}`` and ``ExtenderPreemptionResult
{NodeNameToMetaVictims}``. The answer uses the node mode of the question: ``NodeNames`` when the
scheduler sent names (``nodeCacheCapable: true``), else ``Nodes`` with the passing node objects.

Contract per verb:
- filter: no side effects besides remembering the pod's demand for bind; a reason per failed node.
  A pod that already holds a bound lease (a cycle retried after a bind whose answer was lost)
  passes on that lease's node whatever its room: bind there answers the same lease.
- prioritize: 0..10 per node from the core policy (see `pool`); a bad pod scores 0 everywhere;
  the node of a lease the pod already holds scores 10.
- bind: commit the lease (re-validated), write the placement annotation, then create the Binding;
  any failure releases the lease this call committed, removes the annotation and returns ``Error``
  so the scheduler retries. Without a `KubeApi` (static dry runs) bind only commits the lease.
  Binds of one pod (namespace/name) are serialised: a retry that arrives while the first bind is in
  flight waits for it, then answers from the outcome (bound to that node with its lease: success;
  bound elsewhere: ``Error``), so a pod ends with exactly one lease, on the node it is bound to.
  A Binding that fails but exists afterwards (409, or a lost reply) counts as success. A bind on a
  node where another pod with the same card count is bound but not yet admitted by kubelet is
  refused with ``Error`` naming that pod, before any lease is committed (`bindguard`: the device
  plugin could swap the two pods' leases); binds on one node check and commit one at a time.
- preempt: per candidate node, the minimal set of preemptible strictly-lower-priority pods from
  the core planner; nodes that need no victim or cannot be helped are dropped. kube-scheduler only
  calls preempt for nodes where its in-tree plugins found victims (our VRAM/compute resources are
  ignoredByScheduler), so this verb refines, it cannot start, a preemption: `preemptor` starts them.
Replicas (``gpupool serve --kubernetes`` on etcd): a standby's server holds a `Forwarder` instead
of an `Extender` and relays every verb and ``<prefix>/state`` to the leader's extender, unchanged
(`gpupool.adapters.k8s.forwarding`); ``/healthz`` is answered locally. A call that cannot be relayed
(no leader, a relayed call arriving at a standby, the leader unreachable) gets HTTP 503 with
``Retry-After: 1`` and ``{"Error": ...}``: kube-scheduler treats it as a failed extender call and
schedules the pod again. `ExtenderServer.use` swaps the role on the same listening socket.
Malformed JSON, JSON nested deeper than `boundedjson.MAX_DEPTH` or a non-object body: HTTP 400
with ``{"Error": ...}``; so is a Content-Length that is not a length up to `MAX_BODY_BYTES` (and the
connection is closed: its body is not read); an invalid pod: HTTP 200 with
``Error`` naming the field. Unexpected exceptions: HTTP 500 with ``Error``; the server keeps serving.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpupool.adapters.boundedserver import ConnectionBound
from gpupool.adapters.k8s import boundedjson
from gpupool.adapters.k8s.annotations import Placement, encode_placement
from gpupool.adapters.k8s.bindguard import BindGuard
from gpupool.adapters.k8s.forwarding import FORWARDED_BY, Forwarder, Unavailable
from gpupool.adapters.k8s.kubeapi import KubeApi, KubeApiError
from gpupool.adapters.k8s.pool import ExtenderPool
from gpupool.adapters.k8s.resources import DEFAULT_NAMES, PodDemand, ResourceNames, parse_pod
from gpupool.core.errors import InvalidInput

log = logging.getLogger("gpupool.extender")

MAX_BODY_BYTES = 64 * 1024 * 1024
MAX_SCORE = 10


class BadRequestError(Exception):
    pass


def _nodes_of(args: dict[str, Any]) -> tuple[list[str], dict[str, Any] | None]:
    """Node names in input order (deduplicated) and, in Nodes mode, name -> node object."""
    names = args.get("NodeNames")
    if names is not None:
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise InvalidInput("NodeNames", names, "must be a list of node names")
        return list(dict.fromkeys(names)), None
    nodes = args.get("Nodes")
    if nodes is None:
        raise InvalidInput("Nodes", None, "one of Nodes or NodeNames must be set")
    if not isinstance(nodes, dict):
        raise InvalidInput("Nodes", type(nodes).__name__, "must be a v1.NodeList object")
    items = nodes.get("items") or []
    if not isinstance(items, list):
        raise InvalidInput("Nodes.items", type(items).__name__, "must be a list")
    objs: dict[str, Any] = {}
    for i, node in enumerate(items):
        meta = node.get("metadata") if isinstance(node, dict) else None
        name = meta.get("name") if isinstance(meta, dict) else None
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"Nodes.items[{i}].metadata.name", name, "must be a non-empty string")
        objs.setdefault(name, node)
    return list(objs), objs


class KeyedLocks:
    """One lock per key, created on first use and dropped when its last holder or waiter leaves."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[object, tuple[threading.Lock, int]] = {}

    @contextlib.contextmanager
    def hold(self, key: object) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(key, (None, 0))
            if lock is None:
                lock = threading.Lock()
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users == 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)

    def in_flight(self) -> int:
        """Holders plus waiters over all keys."""
        with self._guard:
            return sum(users for _, users in self._locks.values())


class Extender:
    """The protocol logic, independent of the HTTP plumbing (used in-process by the benchmark)."""

    def __init__(
        self,
        pool: ExtenderPool,
        *,
        api: KubeApi | None = None,
        names: ResourceNames = DEFAULT_NAMES,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.pool = pool
        self.api = api
        self.names = names
        self.wall_clock = wall_clock
        self.status: dict[str, Callable[[], object]] = {}
        """Extra entries of ``GET <prefix>/state`` (the CLI adds reconciler drift and preemptions)."""
        self._bind_locks = KeyedLocks()
        self._node_locks = KeyedLocks()
        self._guard = BindGuard(api) if api is not None else None

    def filter(self, args: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "Nodes": None,
            "NodeNames": None,
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": {},
            "Error": "",
        }
        try:
            nodes, objs = _nodes_of(args)
            demand = parse_pod(args.get("Pod"), self.names)
        except InvalidInput as exc:
            out["Error"] = str(exc)
            return out
        if demand is None:
            passed: tuple[str, ...] = tuple(nodes)
        else:
            self.pool.remember(demand)
            verdict = self.pool.filter(demand, nodes)
            passed = verdict.passed
            failed, unresolvable = dict(verdict.failed), dict(verdict.unresolvable)
            home = self.pool.home_of(demand.uid)
            if home is not None and home in nodes and home not in passed:
                # a scheduling cycle retried after a bind whose answer was lost (e.g. the leader
                # died after committing it): the node holding the pod's lease fits it (bind there
                # answers that lease, granting nothing), however full the node is now
                passed = tuple(n for n in nodes if n in passed or n == home)
                failed.pop(home, None)
                unresolvable.pop(home, None)
            out["FailedNodes"] = failed
            out["FailedAndUnresolvableNodes"] = unresolvable
        if objs is None:
            out["NodeNames"] = list(passed)
        else:
            out["Nodes"] = {
                "apiVersion": "v1",
                "kind": "NodeList",
                "metadata": {},
                "items": [objs[n] for n in passed],
            }
        return out

    def prioritize(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        try:
            nodes, _ = _nodes_of(args)
        except InvalidInput:
            return []
        try:
            demand = parse_pod(args.get("Pod"), self.names)
        except InvalidInput:
            demand = None
        if demand is None:
            return [{"Host": n, "Score": 0} for n in nodes]
        home = self.pool.home_of(demand.uid)  # (a retried cycle: keep the pod's lease)
        return [
            {"Host": n, "Score": MAX_SCORE if n == home else s}
            for n, s in self.pool.prioritize(demand, nodes)
        ]

    def preempt(self, args: dict[str, Any]) -> dict[str, Any]:
        meta = args.get("NodeNameToMetaVictims")
        full = args.get("NodeNameToVictims")
        given = meta if isinstance(meta, dict) else full if isinstance(full, dict) else {}
        try:
            demand = parse_pod(args.get("Pod"), self.names)
        except InvalidInput:
            return {"NodeNameToMetaVictims": {}}
        if demand is None:
            return {
                "NodeNameToMetaVictims": {n: _meta_of(v) for n, v in given.items() if isinstance(v, dict)}
            }
        plans = self.pool.preempt(demand, [n for n in given if isinstance(n, str)])
        result = {}
        for node, uids in plans.items():
            pdb = given.get(node) or {}
            violations = pdb.get("NumPDBViolations", 0) if isinstance(pdb, dict) else 0
            result[node] = {
                "Pods": [{"UID": u} for u in uids],
                "NumPDBViolations": violations if type(violations) is int else 0,
            }
        return {"NodeNameToMetaVictims": result}

    def bind(self, args: dict[str, Any]) -> dict[str, Any]:
        fields = {}
        for key in ("PodName", "PodNamespace", "PodUID", "Node"):
            value = args.get(key, "")
            if not isinstance(value, str) or (key != "PodUID" and not value):  # (a PodUID may be "")
                why = "must be a string" if key == "PodUID" else "must be a non-empty string"
                return {"Error": str(InvalidInput(key, value, why))}
            if not value.isascii() and not _is_unicode(value):  # (a URL path segment of the API)
                return {"Error": str(InvalidInput(key, value, "holds a lone surrogate: not Unicode text"))}
            fields[key] = value
        name, ns, uid, node = fields["PodName"], fields["PodNamespace"], fields["PodUID"], fields["Node"]
        with self._bind_locks.hold((ns, name)):
            return self._bind_one(ns, name, uid, node)

    def _bind_one(self, ns: str, name: str, uid: str, node: str) -> dict[str, Any]:
        """One bind of one pod; the caller holds the pod's bind lock (no other bind of it runs)."""
        try:
            demand = self._demand_for_bind(ns, name, uid)
        except (InvalidInput, KubeApiError) as exc:
            return {"Error": f"bind {ns}/{name}: {exc}"}
        if demand is None:
            return self._binding_only(ns, name, uid, node)
        held = self.pool.lease_of(demand.uid)
        if held is not None and self.api is not None:
            bound = self._node_of(ns, name)
            if bound == node and held.node == node:
                return {"Error": ""}  # NOTE: a retried bind whose first attempt succeeded
            if bound:
                return {"Error": f"bind {ns}/{name} to {node}: pod is already bound to {bound}"}
        with self._node_locks.hold(node):  # the rival check and the commit, as one per node
            guard = self._guard if held is None or held.node != node else None
            rival = guard.waiting_rival(self.pool, demand, node) if guard is not None else None
            if rival is not None:
                why = f"pod {rival} still waits there for kubelet with {demand.gpu_count} card(s)"
                return {"Error": f"bind {ns}/{name} to {node}: {why}; retry once it is admitted"}
            out = self.pool.reserve(demand, node)
        if not out.granted or out.lease is None:
            return {"Error": f"bind {ns}/{name} to {node}: {out.code.value}: {out.reason}"}
        if self.api is None:
            return {"Error": ""}
        placement = Placement.of_lease(
            out.lease,
            self.pool.slices_of(out.lease),
            namespace=ns,
            name=name,
            container=demand.container,
            bound_at=self.wall_clock(),
        )
        key = self.names.placement
        try:
            self.api.annotate_pod(ns, name, {key: encode_placement(placement)})
            self.api.bind_pod(ns, name, uid, node)
        except KubeApiError as exc:
            if self._bound_to(ns, name, node):
                return {"Error": ""}  # NOTE: a conflict or a lost reply: the Binding exists
            self.pool.release_pod(demand.uid, reason=f"bind failed: {exc}", lease_id=out.lease.id)
            try:
                self.api.annotate_pod(ns, name, {key: None})
            except KubeApiError:
                log.warning("could not remove %s from %s/%s after a failed bind", key, ns, name)
            return {"Error": f"bind {ns}/{name} to {node}: {exc}"}
        return {"Error": ""}

    def _node_of(self, ns: str, name: str) -> str:
        """The node the pod is bound to ("" when unbound or unreadable)."""
        try:
            pod = self.api.read_pod(ns, name) if self.api is not None else {}
        except KubeApiError:
            return ""
        node = (pod.get("spec") or {}).get("nodeName")
        return node if isinstance(node, str) else ""

    def _bound_to(self, ns: str, name: str, node: str) -> bool:
        return self._node_of(ns, name) == node

    def _demand_for_bind(self, ns: str, name: str, uid: str) -> PodDemand | None:
        demand = self.pool.demand_of(uid) if uid else None
        if demand is not None and demand.namespace == ns and demand.name == name:
            return demand
        if self.api is None:
            raise InvalidInput(
                "PodUID", uid, "pod was not seen by filter and no Kubernetes API is configured"
            )
        pod = self.api.read_pod(ns, name)
        demand = parse_pod(pod, self.names)
        if demand is not None and uid and demand.uid != uid:
            raise InvalidInput("PodUID", uid, f"the pod {ns}/{name} now has UID {demand.uid}")
        return demand

    def _binding_only(self, ns: str, name: str, uid: str, node: str) -> dict[str, Any]:
        if self.api is not None:
            try:
                self.api.bind_pod(ns, name, uid, node)
            except KubeApiError as exc:
                return {"Error": f"bind {ns}/{name} to {node}: {exc}"}
        return {"Error": ""}

    def state(self) -> dict[str, Any]:
        pool = self.pool
        slices = pool.slices()
        return {
            "nodes": len(pool.nodes()),
            "slices": len(slices),
            "pods": pool.pod_uids(),
            "generation": pool.generation,
            "binds_in_flight": self._bind_locks.in_flight(),
            **{key: fn() for key, fn in sorted(self.status.items())},
        }


def _is_unicode(text: str) -> bool:
    """False for a string JSON can carry but UTF-8 cannot (a lone surrogate, ``"\\ud800"``)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _meta_of(victims: dict[str, Any]) -> dict[str, Any]:
    """The victims as ``MetaVictims``; entries of the wrong type are skipped (never a 500)."""
    pods = victims.get("Pods")
    uids = []
    for p in pods if isinstance(pods, list) else ():
        if isinstance(p, dict):
            meta = p.get("metadata")
            uid = p.get("UID") or (meta.get("uid") if isinstance(meta, dict) else None)
            if isinstance(uid, str):
                uids.append({"UID": uid})
    violations = victims.get("NumPDBViolations", 0)
    return {"Pods": uids, "NumPDBViolations": violations if type(violations) is int else 0}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # NOTE: one small response must not wait for a delayed ACK
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.idle_timeout_s)  # a read waits this long, then closes

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, obj: object, *, head_only: bool = False) -> None:
        body = json.dumps(obj, separators=(",", ":")).encode()
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.wfile.write(head.encode() + (b"" if head_only else body))  # NOTE: one write: no Nagle stall
        self.log_request(status)

    def _unavailable(self, why: str) -> None:
        body = json.dumps({"Error": why}, separators=(",", ":")).encode()
        head = (
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.wfile.write(head.encode() + body)
        self.log_request(503)

    def _relay(self, ext: Extender | Forwarder, method: str, raw: bytes) -> bool:
        """When this replica stands by (``ext`` is a `Forwarder`), hand the call to the leader's
        extender and send its answer back unchanged; False when this replica serves it."""
        if not isinstance(ext, Forwarder):
            if not self.server.gate():
                self._unavailable("this replica no longer leads; retry")
                return True
            return False
        if self.headers.get(FORWARDED_BY):
            self._unavailable("no leader is serving the extender now (forwarded to a standby); retry")
            return True
        try:
            status, body = ext.forward(method, self.path, raw)
        except Unavailable as exc:
            self._unavailable(str(exc))
            return True
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        self.wfile.write(head.encode() + body)
        self.log_request(status)
        return True

    def do_GET(self) -> None:
        prefix = self.server.prefix
        if self.path in ("/healthz", "/readyz"):
            self._send(200, {"status": "ok"})
        elif self.path == f"{prefix}/state":
            ext = self.server.extender
            if not self._relay(ext, "GET", b"") and isinstance(ext, Extender):
                self._send(200, ext.state())
        else:
            self._send(404, {"Error": f"no route GET {self.path}"})

    def do_HEAD(self) -> None:
        """The probes (``/healthz``, ``/readyz``) as GET, without the body (``curl -I``, monitors)."""
        if self.path in ("/healthz", "/readyz"):
            self._send(200, {"status": "ok"}, head_only=True)
        else:
            self._send(405, {"Error": f"no route HEAD {self.path}"}, head_only=True)

    def do_POST(self) -> None:
        ext = self.server.extender
        prefix = self.server.prefix
        verb = self.path[len(prefix) + 1 :] if self.path.startswith(prefix + "/") else ""
        handler: Callable[[dict[str, Any]], object] | None = None
        if verb in VERBS:
            handler = getattr(ext, verb) if isinstance(ext, Extender) else _relayed
        try:
            text = self.headers.get("Content-Length") or "0"
            length = int(text) if text.isascii() and text.isdigit() else -1
            if not 0 <= length <= MAX_BODY_BYTES:  # NOTE: the body stays unread: close, never parse it
                self.close_connection = True
                raise BadRequestError(f"Content-Length {text!r} is not a length in [0, {MAX_BODY_BYTES}]")
            try:
                raw = self.rfile.read(length)
            except TimeoutError:  # the body stalled: answer 408 and close (the file is unusable now)
                self.close_connection = True
                self._send(HTTPStatus.REQUEST_TIMEOUT, {"Error": "request body incomplete: timed out"})
                return
            if handler is None:
                self._send(404, {"Error": f"no route POST {self.path}"})
                return
            if self._relay(ext, "POST", raw):
                return
            try:
                args = boundedjson.loads(raw)
            except boundedjson.JsonDepthError as exc:
                raise BadRequestError(f"body: {exc}") from None
            except RecursionError:  # NOTE: the bound's safety net (e.g. a UTF-16 body)
                raise BadRequestError("body: JSON nested too deeply") from None
            except (UnicodeDecodeError, ValueError) as exc:
                raise BadRequestError(f"body is not JSON: {exc}") from None
            if not isinstance(args, dict):
                raise BadRequestError(f"body must be a JSON object, got {type(args).__name__}")
            self._send(200, handler(args))
        except BadRequestError as exc:
            self._send(HTTPStatus.BAD_REQUEST, {"Error": str(exc)})
        except Exception as exc:
            log.exception("extender %s failed", verb)
            self._send(HTTPStatus.INTERNAL_SERVER_ERROR, {"Error": f"internal error in {verb}: {exc}"})


VERBS = ("filter", "prioritize", "bind", "preempt")


def _relayed(args: dict[str, Any]) -> object:
    raise AssertionError("a relayed verb is answered by the leader")  # (`_relay` sent it already)


def _always() -> bool:
    return True


IDLE_TIMEOUT_S = 120.0
"""A connection that sends nothing for this long (no request, or a request stalled mid-way) is
closed (a stalled body is answered 408 first): without it each such connection held one of the
server's threads for ever. Longer than the idle timeout of kube-scheduler's HTTP client (Go's
90 s default), so the scheduler closes its idle connections first and never has a request cut by
this close."""


MAX_CONNECTIONS = 256
"""Connections served at once (one thread each); the next one is answered 503 with ``Retry-After``
from the accepting thread and closed. Without it a client opening connections started a thread
for each (2,000 idle ones: 2,000 threads, 100 MB). kube-scheduler keeps a few."""


class _Server(ConnectionBound, ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    idle_timeout_s = IDLE_TIMEOUT_S
    max_connections = MAX_CONNECTIONS
    extender: Extender | Forwarder
    prefix: str
    gate: Callable[[], bool] = staticmethod(_always)

    def busy_answer(self) -> bytes:
        """503 with ``Retry-After`` and kube-scheduler's ``Error`` body (`ConnectionBound`)."""
        body = json.dumps({"Error": f"busy: {self.max_connections} connections open; retry"}).encode()
        head = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
        return f"{head}Connection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


class ExtenderServer:
    """The HTTP server around an `Extender`; ``start`` serves in a thread, ``serve_forever`` blocks."""

    def __init__(
        self,
        extender: Extender | Forwarder,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        prefix: str = "",
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        self._server = _Server((host, port), _Handler)
        self._server.idle_timeout_s = idle_timeout_s
        self._server.max_connections = max_connections
        self._server.extender = extender
        self._server.prefix = prefix
        self._thread: threading.Thread | None = None
        self.prefix = prefix

    def use(self, extender: Extender | Forwarder, *, gate: Callable[[], bool] = _always) -> None:
        """Serve the next calls with ``extender`` (a replica's role changed: the listening socket
        stays, so kube-scheduler's connection attempts meanwhile wait in its backlog); ``gate``:
        an `Extender` answers only while it returns True (else 503: the leader lost its lease)."""
        self._server.gate = gate
        self._server.extender = extender

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = self._server.server_address[0]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://{host}:{self.port}{self.prefix}"

    def start(self) -> ExtenderServer:
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="gpupool-extender", daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
