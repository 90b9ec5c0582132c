"""A fake Kubernetes API server on loopback: pods (get, merge-patch, binding, list, chunked watch)
and nodes (list, get, merge-patch of annotations). Enough of the real wire protocol for the official
``kubernetes`` client.

Not a mock of gpupool code: it stands in for the API server, the way kind stands in for a cluster.
"""

from __future__ import annotations

import copy
import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # many parallel clients; the default listen backlog is 5


ADMITTED_AT = "2025-01-01T00:00:00Z"


def make_pod(
    name: str,
    *,
    namespace: str = "default",
    vram_mib: int | None = None,
    compute_pct: int | None = None,
    gpus: int | None = None,
    priority: int | None = None,
    priority_class: str = "",
    uid: str = "",
    annotations: dict[str, str] | None = None,
    node: str = "",
    phase: str = "Pending",
    domain: str = "gpupool.io",
) -> dict[str, Any]:
    limits: dict[str, str] = {"cpu": "1", "memory": "1Gi"}
    if vram_mib is not None:
        limits[f"{domain}/vram-mib"] = str(vram_mib)
    if compute_pct is not None:
        limits[f"{domain}/compute-pct"] = str(compute_pct)
    if gpus is not None:
        limits[f"{domain}/gpu"] = str(gpus)
    spec: dict[str, Any] = {
        "containers": [
            {"name": "sidecar", "image": "busybox", "resources": {"requests": {"cpu": "10m"}}},
            {
                "name": "main",
                "image": "vllm/vllm-openai",
                "resources": {"limits": limits, "requests": limits},
            },
        ],
        "schedulerName": "gpupool-scheduler",
        "restartPolicy": "Always",
    }
    if priority is not None:
        spec["priority"] = priority
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuid.uuid4()),
            "annotations": dict(annotations or {}),
            "labels": {"app": name},
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def make_node(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "annotations": dict(annotations or {}), "labels": {}},
        "status": {"allocatable": {"cpu": "64"}},
    }


class FakeApiServer:
    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[int, str, dict[str, Any]]] = []
        self.rv = 100
        self.fail_bindings: set[str] = set()
        self.binding_gate = threading.Event()
        """Binding requests wait here until it is set (it is set unless a test clears it)."""
        self.binding_gate.set()
        self.binding_arrivals = 0
        self.binding_outcomes: list[str] = []
        """Scripted outcomes of the next binding requests, in arrival order: ``ok`` (as usual),
        ``fail`` (HTTP 500, nothing bound) or ``lost`` (bound, but the reply is an HTTP 500)."""
        self.bindings: list[dict[str, Any]] = []
        self.admit_on_binding = False
        """Set ``status.startTime`` right after each Binding, as a live kubelet does once it admitted
        the pod (its device plugin Allocate done): the extender then no longer counts the pod as
        waiting on its node. Off: pods stay waiting until a test admits them (`admit`)."""
        self.evictions: list[tuple[str, str]] = []
        self.requests: list[tuple[str, str]] = []
        self.expire_watch_before = 0
        self._stopping = False
        server = _Server(("127.0.0.1", 0), _make_handler(self))
        server.daemon_threads = True
        self.server = server
        self.thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeApiServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.lock:
            self._stopping = True
            self.lock.notify_all()
        self.server.shutdown()
        self.server.server_close()

    # ---------------------------------------------------------------- state changes (emit events)
    def _emit(self, kind: str, pod: dict[str, Any]) -> None:
        self.rv += 1
        pod["metadata"]["resourceVersion"] = str(self.rv)
        self.events.append((self.rv, kind, copy.deepcopy(pod)))
        self.lock.notify_all()

    def add_pod(self, pod: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            self.pods[key] = copy.deepcopy(pod)
            self._emit("ADDED", self.pods[key])
            return copy.deepcopy(self.pods[key])

    def update_pod(self, namespace: str, name: str, **status: Any) -> None:
        with self.lock:
            pod = self.pods[(namespace, name)]
            pod["status"].update(status)
            self._emit("MODIFIED", pod)

    def admit(self, namespace: str, name: str) -> None:
        """Kubelet admitted the pod (and called Allocate for it): it writes ``status.startTime``."""
        self.update_pod(namespace, name, startTime=ADMITTED_AT)

    def delete_pod(self, namespace: str, name: str) -> None:
        with self.lock:
            pod = self.pods.pop((namespace, name))
            self._emit("DELETED", pod)

    def add_node(self, node: dict[str, Any]) -> None:
        with self.lock:
            self.nodes[node["metadata"]["name"]] = copy.deepcopy(node)

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.pods[(namespace, name)])


def _selector_match(pod: dict[str, Any], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, want = term.partition("=")
        if key == "spec.nodeName" and pod["spec"].get("nodeName", "") != want:
            return False
    return True


def _make_handler(api: FakeApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, status: int, obj: Any) -> None:
            body = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _status(self, code: int, reason: str, message: str) -> None:
            self._json(
                code,
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "reason": reason,
                    "message": message,
                    "code": code,
                },
            )

        def _body(self) -> Any:
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n) or b"{}")

        def _pod_path(self) -> tuple[str, str, str] | None:
            parts = urlparse(self.path).path.strip("/").split("/")
            if len(parts) >= 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "pods":
                return parts[3], parts[5], "/".join(parts[6:])
            return None

        def do_GET(self) -> None:
            url = urlparse(self.path)
            api.requests.append(("GET", url.path))
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            if url.path == "/api/v1/nodes":
                with api.lock:
                    items = [copy.deepcopy(n) for n in api.nodes.values()]
                self._json(
                    200,
                    {
                        "kind": "NodeList",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(api.rv)},
                        "items": items,
                    },
                )
                return
            if url.path.startswith("/api/v1/nodes/"):
                name = url.path.rsplit("/", 1)[-1]
                with api.lock:
                    node = copy.deepcopy(api.nodes.get(name))
                if node is None:
                    self._status(404, "NotFound", f'nodes "{name}" not found')
                else:
                    self._json(200, node)
                return
            if url.path == "/api/v1/pods":
                if q.get("watch") in ("true", "True", "1"):
                    self._watch(q)
                    return
                sel = q.get("fieldSelector", "")
                with api.lock:
                    items = [copy.deepcopy(p) for p in api.pods.values() if _selector_match(p, sel)]
                    rv = str(api.rv)
                self._json(
                    200,
                    {
                        "kind": "PodList",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": rv},
                        "items": items,
                    },
                )
                return
            pp = self._pod_path()
            if pp and not pp[2]:
                with api.lock:
                    pod = api.pods.get((pp[0], pp[1]))
                    pod = copy.deepcopy(pod) if pod else None
                if pod is None:
                    self._status(404, "NotFound", f'pods "{pp[1]}" not found')
                else:
                    self._json(200, pod)
                return
            self._status(404, "NotFound", self.path)

        def _watch(self, q: dict[str, str]) -> None:
            start = int(q.get("resourceVersion") or 0)
            timeout = float(q.get("timeoutSeconds") or 30)
            sel = q.get("fieldSelector", "")
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def chunk(data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            import time

            deadline = time.monotonic() + timeout
            sent = start
            try:
                if start and start < api.expire_watch_before:
                    err = {
                        "type": "ERROR",
                        "object": {
                            "kind": "Status",
                            "code": 410,
                            "reason": "Expired",
                            "message": "too old resource version",
                        },
                    }
                    chunk((json.dumps(err) + "\n").encode())
                else:
                    while True:
                        with api.lock:
                            pending = [e for e in api.events if e[0] > sent]
                            if not pending:
                                left = deadline - time.monotonic()
                                if left <= 0 or api._stopping:
                                    break
                                api.lock.wait(min(left, 0.2))
                                continue
                        for rv, kind, obj in pending:
                            sent = rv
                            if _selector_match(obj, sel):
                                chunk((json.dumps({"type": kind, "object": obj}) + "\n").encode())
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass
            self.close_connection = True

        def do_PATCH(self) -> None:
            pp = self._pod_path()
            api.requests.append(("PATCH", self.path))
            body = self._body()
            parts = urlparse(self.path).path.strip("/").split("/")
            if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
                with api.lock:
                    node = api.nodes.get(parts[3])
                    if node is None:
                        self._status(404, "NotFound", f'nodes "{parts[3]}" not found')
                        return
                    ann = node["metadata"].setdefault("annotations", {})
                    for k, v in ((body.get("metadata") or {}).get("annotations") or {}).items():
                        if v is None:
                            ann.pop(k, None)
                        else:
                            ann[k] = v
                    out = copy.deepcopy(node)
                self._json(200, out)
                return
            if not pp or pp[2]:
                self._status(404, "NotFound", self.path)
                return
            with api.lock:
                pod = api.pods.get((pp[0], pp[1]))
                if pod is None:
                    self._status(404, "NotFound", f'pods "{pp[1]}" not found')
                    return
                ann = pod["metadata"].setdefault("annotations", {})
                for k, v in ((body.get("metadata") or {}).get("annotations") or {}).items():
                    if v is None:
                        ann.pop(k, None)
                    else:
                        ann[k] = v
                api._emit("MODIFIED", pod)
                out = copy.deepcopy(pod)
            self._json(200, out)

        def do_POST(self) -> None:
            pp = self._pod_path()
            api.requests.append(("POST", self.path))
            body = self._body()
            if pp and pp[2] == "eviction":
                with api.lock:
                    if (pp[0], pp[1]) not in api.pods:
                        self._status(404, "NotFound", f'pods "{pp[1]}" not found')
                        return
                    api.evictions.append((pp[0], pp[1]))
                    pod = api.pods.pop((pp[0], pp[1]))
                    api._emit("DELETED", pod)
                self._json(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})
                return
            if not pp or pp[2] != "binding":
                self._status(404, "NotFound", self.path)
                return
            ns, name, _ = pp
            with api.lock:
                api.binding_arrivals += 1
                outcome = api.binding_outcomes.pop(0) if api.binding_outcomes else "ok"
                api.lock.notify_all()
            api.binding_gate.wait()
            with api.lock:
                pod = api.pods.get((ns, name))
                if pod is None:
                    self._status(404, "NotFound", f'pods "{name}" not found')
                    return
                uid = (body.get("metadata") or {}).get("uid")
                if uid and uid != pod["metadata"]["uid"]:
                    self._status(409, "Conflict", f"Precondition failed: UID in precondition: {uid}")
                    return
                if name in api.fail_bindings or outcome == "fail":
                    self._status(500, "InternalError", "injected binding failure")
                    return
                if pod["spec"].get("nodeName"):
                    self._status(
                        409, "Conflict", f"pod {name} is already assigned to node {pod['spec']['nodeName']}"
                    )
                    return
                target = body.get("target") or {}
                pod["spec"]["nodeName"] = target.get("name")
                if api.admit_on_binding:
                    pod.setdefault("status", {})["startTime"] = ADMITTED_AT
                api.bindings.append(body)
                api._emit("MODIFIED", pod)
            if outcome == "lost":
                self._status(500, "InternalError", "injected: bound, reply lost")
                return
            self._json(201, {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201})

    return Handler
