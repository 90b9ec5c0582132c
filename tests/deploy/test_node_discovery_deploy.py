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
    assert ("pods/eviction", "create") in grants  # the agent evicts the pod of an ended lease
    binding = next(
        d for d in docs if d["kind"] == "ClusterRoleBinding" and d["metadata"]["name"] == "gpupool-node"
    )
    assert binding["roleRef"]["name"] == "gpupool-node"
    assert {s["name"] for s in binding["subjects"]} == {_node_pod()["serviceAccountName"]}


def _volume_host_path(name: str) -> str:
    return str(next(v for v in _node_pod()["volumes"] if v["name"] == name)["hostPath"]["path"])


def test_the_agent_runs_mps_daemons_that_mps_containers_reach(monkeypatch: Any) -> None:
    """MPS as shipped: the agent starts its daemons (GPUPOOL_MPS_DAEMONS, no per-GPU flags), with
    NVML and the control binary from the NVIDIA runtime; its /dev/shm and pipe root are host
    directories, and the device plugin mounts exactly those into MPS containers."""
    agent, plugin = _container("agent"), _container("device-plugin")
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "compute" in env["NVIDIA_DRIVER_CAPABILITIES"]
    monkeypatch.setenv("GPUPOOL_MPS_DAEMONS", env["GPUPOOL_MPS_DAEMONS"])
    a = _params("agent", agent["args"][1:])
    assert a["mps_daemons"] and a["mps"] == []  # one daemon per GPU discovered as MPS
    monkeypatch.setenv("GPUPOOL_MPS_DAEMONS", "false")
    assert not _params("agent", agent["args"][1:])["mps_daemons"]
    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    assert mounts["mps-shm"] == "/dev/shm"
    assert mounts["mps-pipe"] == a["mps_pipe_dir"] == _volume_host_path("mps-pipe")
    p = _params("device-plugin", plugin["args"][1:])
    assert p["mps_shm_dir"] == _volume_host_path("mps-shm")
    assert p["mps_pipe_dir"] == a["mps_pipe_dir"]


def test_the_chart_value_turns_mps_daemons_off() -> None:
    from tests.adapters.k8s.k8s_helm import render_chart

    values = yaml.safe_load((ROOT / "deploy" / "helm" / "gpupool" / "values.yaml").read_text())
    assert values["agent"]["mpsDaemons"] is True
    rendered = render_chart(
        ROOT / "deploy" / "helm" / "gpupool", {"agent": {**values["agent"], "mpsDaemons": False}}
    )
    (ds,) = [d for d in yaml.safe_load_all(rendered["node-daemonset.yaml"]) if d and d["kind"] == "DaemonSet"]
    agent = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")
    assert {e["name"]: e.get("value") for e in agent["env"]}["GPUPOOL_MPS_DAEMONS"] == "false"
