"""deploy/ as shipped sees a node's GPUs: the agent reads NVML, publishes the node's slices to the
gateway and writes its own node's ``<domain>/slices`` annotation (RBAC + downward-API node name); the
device plugin reads that annotation through the API (no static inventory), so it follows the agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from gpupool.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((K8S / name).read_text()) if d]


def _node_pod() -> dict[str, Any]:
    (ds,) = [d for d in _docs("node-daemonset.yaml") if d["kind"] == "DaemonSet"]
    return dict(ds["spec"]["template"]["spec"])


def _container(name: str) -> dict[str, Any]:
    return next(c for c in _node_pod()["containers"] if c["name"] == name)


def _params(sub: str, args: list[str]) -> dict[str, Any]:
    cmd = typer.main.get_command(app).get_command(None, sub)  # type: ignore[attr-defined]
    assert cmd is not None
    return dict(cmd.make_context(sub, list(args)).params)


def test_the_agent_reads_nvml_and_publishes_to_gateway_and_node() -> None:
    c = _container("agent")
    p = _params(c["args"][0], c["args"][1:])
    assert p["devices"] == "nvml" and p["publish"] and p["kube"]
    assert p["gateway"].startswith("http://gpupool-gateway.") and p["node"] == "$(NODE_NAME)"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert (
        p["mps_pipe_dir"] == _params("device-plugin", _container("device-plugin")["args"][1:])["mps_pipe_dir"]
    )


def test_the_device_plugin_takes_its_cards_from_the_annotation() -> None:
    c = _container("device-plugin")
    p = _params(c["args"][0], c["args"][1:])
    assert p["cluster"] is None and not p["no_kube"]  # cards and health from the agent's annotation
    assert any(e["name"] == "NODE_NAME" for e in c["env"])


def test_the_node_service_account_may_read_and_annotate_nodes() -> None:
    docs = _docs("rbac.yaml")
    role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "gpupool-node")
    grants = {(res, v) for r in role["rules"] for res in r["resources"] for v in r["verbs"]}
    assert {("nodes", "get"), ("nodes", "patch")} <= grants
    binding = next(
        d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == "gpupool-node"
    )
    assert binding["roleRef"]["name"] == "gpupool-node"
    assert {s["name"] for s in binding["subjects"]} == {_node_pod()["serviceAccountName"]}
