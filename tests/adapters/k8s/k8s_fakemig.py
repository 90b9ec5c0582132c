"""The fake API server plus what the mig-manager protocol needs: ConfigMaps (get, create, replace),
one node (get, merge-patch of labels and annotations), and a fake mig-manager thread that watches
the node's ``nvidia.com/mig.config`` label and answers with ``nvidia.com/mig.config.state`` the way
NVIDIA's k8s-mig-manager does (``pending`` -> ``success`` | ``failed``).

Not a mock of gpupool code: it stands in for the API server and for NVIDIA's controller.
"""

from __future__ import annotations

import copy
import json
import threading
from typing import Any
from urllib.parse import urlparse

import yaml
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer

CONFIG = "nvidia.com/mig.config"
STATE = "nvidia.com/mig.config.state"


class FakeMigApi(FakeApiServer):
    def __init__(self) -> None:
        super().__init__()
        self.config_maps: dict[tuple[str, str], dict[str, Any]] = {}
        base = self.server.RequestHandlerClass
        api = self

        class Handler(base):  # type: ignore[misc, valid-type]
            def _cm(self) -> tuple[str, str] | None:
                parts = urlparse(self.path).path.strip("/").split("/")
                if len(parts) >= 5 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "configmaps":
                    return parts[3], parts[5] if len(parts) > 5 else ""
                return None

            def _node(self) -> str | None:
                parts = urlparse(self.path).path.strip("/").split("/")
                return parts[3] if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4 else None

            def _read(self) -> Any:
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"{}")

            def do_GET(self) -> None:
                cm, node = self._cm(), self._node()
                if cm and cm[1]:
                    with api.lock:
                        obj = copy.deepcopy(api.config_maps.get(cm))
                    if obj is None:
                        self._status(404, "NotFound", f'configmaps "{cm[1]}" not found')
                    else:
                        self._json(200, obj)
                    return
                if node:
                    with api.lock:
                        obj = copy.deepcopy(api.nodes.get(node))
                    if obj is None:
                        self._status(404, "NotFound", f'nodes "{node}" not found')
                    else:
                        self._json(200, obj)
                    return
                super().do_GET()

            def do_POST(self) -> None:
                cm = self._cm()
                if cm and not cm[1]:
                    body = self._read()
                    key = (cm[0], body["metadata"]["name"])
                    with api.lock:
                        if key in api.config_maps:
                            self._status(409, "AlreadyExists", f'configmaps "{key[1]}" already exists')
                            return
                        body["metadata"]["namespace"] = cm[0]
                        api.config_maps[key] = body
                    self._json(201, body)
                    return
                super().do_POST()

            def do_PUT(self) -> None:
                cm = self._cm()
                if not cm or not cm[1]:
                    self._status(404, "NotFound", self.path)
                    return
                body = self._read()
                with api.lock:
                    if cm not in api.config_maps:
                        self._status(404, "NotFound", f'configmaps "{cm[1]}" not found')
                        return
                    body["metadata"]["namespace"] = cm[0]
                    api.config_maps[cm] = body
                self._json(200, body)

            def do_PATCH(self) -> None:
                node = self._node()
                if not node:
                    super().do_PATCH()
                    return
                body = self._read()
                with api.lock:
                    obj = api.nodes.get(node)
                    if obj is None:
                        self._status(404, "NotFound", f'nodes "{node}" not found')
                        return
                    meta = body.get("metadata") or {}
                    for field in ("labels", "annotations"):
                        have = obj["metadata"].setdefault(field, {})
                        for k, v in (meta.get(field) or {}).items():
                            if v is None:
                                have.pop(k, None)
                            else:
                                have[k] = v
                    api.lock.notify_all()
                    out = copy.deepcopy(obj)
                self._json(200, out)

        self.server.RequestHandlerClass = Handler

    def labels(self, node: str) -> dict[str, str]:
        with self.lock:
            return dict(self.nodes[node]["metadata"].get("labels") or {})


class FakeMigManager:
    """Applies ``nvidia.com/mig.config`` changes on one node: reads the config from the ConfigMap,
    records what it applied, and sets the state label. ``fail_profiles``: a config asking for one of
    these profiles ends ``failed`` (as a real apply does on an illegal layout)."""

    def __init__(
        self,
        api: FakeMigApi,
        node: str,
        *,
        namespace: str,
        config_map: str,
        fail_profiles: frozenset[str] = frozenset(),
    ) -> None:
        self.api, self.node, self.namespace, self.config_map = api, node, namespace, config_map
        self.fail_profiles = fail_profiles
        self.applied: list[tuple[str, list[dict[str, Any]]]] = []
        self.states_seen: list[str] = []
        self.release = threading.Event()
        """Cleared: the manager holds at ``pending`` until set (tests of the wait)."""
        self.release.set()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> FakeMigManager:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self.api.lock:
            self._stop = True
            self.api.lock.notify_all()
        self._thread.join(5)

    def _set_state(self, state: str) -> None:
        with self.api.lock:
            self.api.nodes[self.node]["metadata"].setdefault("labels", {})[STATE] = state
            self.states_seen.append(state)

    def _run(self) -> None:
        done = ""
        while True:
            with self.api.lock:
                while not self._stop:
                    want = (self.api.nodes[self.node]["metadata"].get("labels") or {}).get(CONFIG, "")
                    if want and want != done:
                        break
                    self.api.lock.wait(0.05)
                if self._stop:
                    return
                cm = self.api.config_maps.get((self.namespace, self.config_map)) or {}
            self._set_state("pending")
            self.release.wait()
            doc = yaml.safe_load((cm.get("data") or {}).get("config.yaml", "") or "{}") or {}
            entries = (doc.get("mig-configs") or {}).get(want)
            ok = entries is not None and not any(
                p in self.fail_profiles for e in entries for p in (e.get("mig-devices") or {})
            )
            if entries is not None:
                self.applied.append((want, entries))
            self._set_state("success" if ok else "failed")
            done = want
