"""`KubeApi`: the few Kubernetes API calls gpupool makes, through the official ``kubernetes`` client.

Every object crosses this boundary as a plain JSON dict (camelCase keys, exactly as the API server
sends them), so the extender, the device plugin and the reconciler parse one shape. Lists and
watches are read with ``_preload_content=False`` and decoded here (no model round trip).

Calls: read / annotate (JSON merge patch of metadata.annotations; ``None`` deletes a key) / bind a
pod (``POST .../pods/{name}/binding`` with the pod UID, as kube-scheduler's DefaultBinder does) /
evict a pod (policy/v1 Eviction),
list pods and nodes, read one node, and a pod watch that yields ``(type, object)`` and raises
`WatchExpiredError` on HTTP 410 so the caller relists. Errors surface as `KubeApiError` with the HTTP status.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

POOL_CONNECTIONS = 32
"""Kept-alive connections to the API server (parallel binds each hold one while they run)."""


class KubeApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(f"kubernetes API {status}: {message}")


class KubeConfigError(Exception):
    """No usable Kubernetes configuration: not in a cluster, and no (readable) kubeconfig."""


def _check_kubeconfig_file(path: str) -> None:
    """`KubeConfigError` saying what is wrong when ``path`` is not a kubeconfig at all (missing, a
    directory, not YAML, not a mapping with ``clusters``): the client library's own answers to
    these are its internals (``'str' object does not support item assignment``)."""
    from pathlib import Path

    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise KubeConfigError(f"cannot read it: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
        raise KubeConfigError(f"not YAML: {getattr(exc, 'problem', None) or exc}{where}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("clusters"), list):
        raise KubeConfigError("not a kubeconfig: expected a YAML mapping with clusters, contexts and users")


class WatchExpiredError(KubeApiError):
    """The watch's resourceVersion is too old (HTTP 410 Gone): list again."""


def _decode(resp: Any) -> Any:
    data = resp.data
    return json.loads(data) if data else {}


class KubeApi:
    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._client = api_client
        self._core = client.CoreV1Api(api_client)

    @classmethod
    def for_host(cls, host: str, *, token: str = "") -> KubeApi:
        """A client for an explicit API server URL (tests, ``--kube-api``)."""
        from kubernetes import client

        conf = client.Configuration()
        conf.host = host.rstrip("/")
        conf.connection_pool_maxsize = POOL_CONNECTIONS
        if token:
            conf.api_key = {"authorization": token}
            conf.api_key_prefix = {"authorization": "Bearer"}
        return cls(client.ApiClient(conf))

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None) -> KubeApi:
        """In-cluster service account when present, else ``kubeconfig`` / ``$KUBECONFIG`` / ~/.kube/config.

        Raises `KubeConfigError` when none of them gives a configuration."""
        from kubernetes import client
        from kubernetes import config as _config

        config: Any = _config
        if kubeconfig:
            _check_kubeconfig_file(kubeconfig)
        try:
            if kubeconfig:
                raise config.ConfigException("explicit kubeconfig")
            config.load_incluster_config()
        except config.ConfigException:
            try:
                config.load_kube_config(config_file=kubeconfig)
            except Exception as exc:  # NOTE: missing file, bad YAML, incomplete kubeconfig: all one answer
                raise KubeConfigError(" ".join(str(exc).split()) or type(exc).__name__) from None
        conf = client.Configuration.get_default_copy()
        conf.connection_pool_maxsize = POOL_CONNECTIONS
        return cls(client.ApiClient(conf))

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, _preload_content=False, **kwargs)
        except ApiException as exc:
            body = exc.body.decode() if isinstance(exc.body, bytes) else str(exc.body or exc.reason)
            raise KubeApiError(int(exc.status or 0), body[:300]) from None
        except (OSError, HTTPError) as exc:  # NOTE: connection refused / reset, protocol errors
            raise KubeApiError(0, str(exc)) from None

    def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        out: dict[str, Any] = _decode(self._call(self._core.read_namespaced_pod, name, namespace))
        return out

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str | None]) -> dict[str, Any]:
        body = {"metadata": {"annotations": annotations}}
        out: dict[str, Any] = _decode(self._call(self._core.patch_namespaced_pod, name, namespace, body))
        return out

    def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        from kubernetes import client

        binding = client.V1Binding(
            metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
            target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
        )
        self._call(self._core.create_namespaced_pod_binding, name, namespace, binding)

    def evict_pod(self, namespace: str, name: str) -> None:
        """``POST .../pods/{name}/eviction`` (policy/v1): honours PodDisruptionBudgets (HTTP 429)."""
        from kubernetes import client

        body = client.V1Eviction(
            api_version="policy/v1",
            kind="Eviction",
            metadata=client.V1ObjectMeta(name=name, namespace=namespace),
        )
        self._call(self._core.create_namespaced_pod_eviction, name, namespace, body)

    def list_pods(self, *, field_selector: str = "") -> tuple[list[dict[str, Any]], str]:
        kw = {"field_selector": field_selector} if field_selector else {}
        data = _decode(self._call(self._core.list_pod_for_all_namespaces, **kw))
        return list(data.get("items") or []), str((data.get("metadata") or {}).get("resourceVersion", ""))

    def annotate_node(self, name: str, annotations: dict[str, str | None]) -> dict[str, Any]:
        """Merge-patch a node's annotations (the node agent publishes ``<domain>/slices`` with this)."""
        body = {"metadata": {"annotations": annotations}}
        out: dict[str, Any] = _decode(self._call(self._core.patch_node, name, body))
        return out

    def read_node(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = _decode(self._call(self._core.read_node, name))
        return out

    def list_nodes(self) -> list[dict[str, Any]]:
        return list(_decode(self._call(self._core.list_node)).get("items") or [])

    def watch_pods(
        self, resource_version: str, *, field_selector: str = "", timeout_s: int = 300
    ) -> Iterator[tuple[str, dict[str, Any]]]:
        """``(ADDED|MODIFIED|DELETED, pod)`` events after ``resource_version``; ends at the timeout."""
        from kubernetes.watch import watch as _watch
        from urllib3.exceptions import HTTPError

        iter_resp_lines: Any = _watch.iter_resp_lines

        kw: dict[str, Any] = {"watch": True, "timeout_seconds": timeout_s, "allow_watch_bookmarks": True}
        if resource_version:
            kw["resource_version"] = resource_version
        if field_selector:
            kw["field_selector"] = field_selector
        resp = self._call(self._core.list_pod_for_all_namespaces, **kw)
        lines = iter(iter_resp_lines(resp))
        try:
            while True:
                try:
                    line = next(lines)
                except StopIteration:
                    return
                except (OSError, HTTPError) as exc:  # the stream broke off: one error for the callers' retry
                    raise KubeApiError(0, f"pod watch broken: {exc}") from None
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                    kind, obj = str(event.get("type", "")), dict(event.get("object") or {})
                except (ValueError, TypeError, AttributeError):
                    raise KubeApiError(
                        0, f"pod watch sent a line that is not an event: {line[:120]!r}"
                    ) from None
                if kind == "ERROR":
                    code = int(obj.get("code") or 0)
                    if code == 410:
                        raise WatchExpiredError(410, str(obj.get("message", "")))
                    raise KubeApiError(code, str(obj.get("message", "")))
                yield kind, obj
        finally:
            resp.close()
            resp.release_conn()

    # -- MIG re-partition through the GPU Operator's mig-manager (gpupool.adapters.k8s.migmanager) --
    def label_node(self, name: str, labels: dict[str, str | None]) -> dict[str, Any]:
        """Merge-patch a node's labels (``None`` deletes a key)."""
        body = {"metadata": {"labels": labels}}
        out: dict[str, Any] = _decode(self._call(self._core.patch_node, name, body))
        return out

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap, or None when it does not exist."""
        try:
            out: dict[str, Any] = _decode(self._call(self._core.read_namespaced_config_map, name, namespace))
        except KubeApiError as exc:
            if exc.status == 404:
                return None
            raise
        return out

    def write_config_map(self, namespace: str, name: str, data: dict[str, str]) -> None:
        """Create the ConfigMap, or replace its data when it exists."""
        body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}
        if self.read_config_map(namespace, name) is None:
            self._call(self._core.create_namespaced_config_map, namespace, body)
        else:
            self._call(self._core.replace_namespaced_config_map, name, namespace, body)
