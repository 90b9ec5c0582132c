"""deploy/: every manifest validates against the Kubernetes schemas (the official client's models),
the Helm chart renders exactly deploy/kubernetes, and the pieces agree with the code."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from tests.adapters.k8s.k8s_helm import render_chart
from tests.adapters.k8s.k8s_helpers import pool_of

from gpupool.adapters.k8s.extender import Extender
from gpupool.adapters.k8s.resources import PRIORITY_CLASSES, ResourceNames, parse_pod
from gpupool.cli.main import app
from gpupool.cli.specfiles import load_cluster_file, load_workload_file
from gpupool.core.clock import ManualClock
from gpupool.hardware.planner import inventory_from_plan, plan

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "gpupool"
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
EXAMPLES = sorted((DEPLOY / "examples").glob("*.yaml"))

EXTENDER_FIELDS = {
    "urlPrefix",
    "filterVerb",
    "preemptVerb",
    "prioritizeVerb",
    "weight",
    "bindVerb",
    "enableHTTPS",
    "tlsConfig",
    "httpTimeout",
    "nodeCacheCapable",
    "managedResources",
    "ignorable",
}


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_docs() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{p.parent.name}/{p.name}#{i}", d) for p in MANIFESTS + EXAMPLES for i, d in enumerate(docs(p))]


def _prune(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _prune(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_prune(v) for v in obj]
    return obj


@pytest.mark.parametrize(("where", "doc"), all_docs(), ids=[w for w, _ in all_docs()])
def test_manifest_matches_the_kubernetes_schema(where: str, doc: dict[str, Any]) -> None:
    from kubernetes import client

    api = client.ApiClient()
    model = getattr(client, f"V1{doc['kind']}")
    obj = api.deserialize(json.dumps(doc), model.__name__, "application/json")
    back = _prune(api.sanitize_for_serialization(obj))
    assert back == _prune(json.loads(json.dumps(doc))), f"{where}: unknown or mistyped fields were dropped"
    assert doc["apiVersion"] == back["apiVersion"]


def test_chart_renders_exactly_the_plain_manifests() -> None:
    rendered = render_chart(CHART)
    assert sorted(rendered) == [p.name for p in MANIFESTS]
    for p in MANIFESTS:
        assert list(yaml.safe_load_all(rendered[p.name])) == list(yaml.safe_load_all(p.read_text())), p.name


def test_chart_values_flow_through() -> None:
    rendered = render_chart(CHART, {"domain": "example.com", "namespace": "gp"})
    cfg = yaml.safe_load(yaml.safe_load(rendered["scheduler-config.yaml"])["data"]["scheduler-config.yaml"])
    assert [r["name"] for r in cfg["extenders"][0]["managedResources"]] == list(
        ResourceNames("example.com").all()
    )
    assert all(
        d["metadata"].get("namespace") in (None, "gp", "kube-system")
        for d in yaml.safe_load_all(rendered["rbac.yaml"])
    )


def _by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in all_docs() if d["kind"] == kind]


def test_scheduler_configuration_wires_the_extender() -> None:
    (cm,) = [d for d in _by_kind("ConfigMap") if d["metadata"]["name"] == "gpupool-scheduler-config"]
    cfg = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    assert (
        cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1" and cfg["kind"] == "KubeSchedulerConfiguration"
    )
    (profile,) = cfg["profiles"]
    (ext,) = cfg["extenders"]
    assert set(ext) <= EXTENDER_FIELDS
    assert (ext["filterVerb"], ext["prioritizeVerb"], ext["bindVerb"], ext["preemptVerb"]) == (
        "filter",
        "prioritize",
        "bind",
        "preempt",
    )
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is False and ext["weight"] > 0
    assert re.fullmatch(r"\d+(ms|s|m)", ext["httpTimeout"])
    names = ResourceNames()
    managed = {r["name"]: r["ignoredByScheduler"] for r in ext["managedResources"]}
    assert managed == {names.vram: True, names.compute: True, names.gpu: False}
    (deploy,) = _by_kind("Deployment")
    containers = {c["name"]: c for c in deploy["spec"]["template"]["spec"]["containers"]}
    args = containers["gpupool"]["args"]  # one control plane: the extender verbs are `serve --kubernetes`
    assert args[0] == "serve" and "--kubernetes" in args
    port = args[args.index("--extender-port") + 1]
    assert ext["urlPrefix"] == f"http://127.0.0.1:{port}"
    assert "--config=/etc/gpupool/scheduler-config.yaml" in containers["kube-scheduler"]["command"]
    for _, d in all_docs():
        if d["kind"] == "Pod":
            assert d["spec"]["schedulerName"] == profile["schedulerName"]


def test_priority_classes_match_the_core_bands() -> None:
    classes = {d["metadata"]["name"]: d for d in _by_kind("PriorityClass")}
    assert {n: c["value"] for n, c in classes.items()} == PRIORITY_CLASSES
    assert classes["gpupool-p2"]["preemptionPolicy"] == "Never"
    assert (
        classes["gpupool-p2"]["value"] < 0 <= classes["gpupool-p1"]["value"] < classes["gpupool-p0"]["value"]
    )


def test_container_args_are_valid_gpupool_commands() -> None:
    group = typer.main.get_command(app)
    seen = set()
    for kind in ("Deployment", "DaemonSet"):
        for d in _by_kind(kind):
            for c in d["spec"]["template"]["spec"]["containers"]:
                if c["image"].startswith("gpupool/"):
                    sub, *args = c["args"]
                    cmd = group.get_command(None, sub)  # type: ignore[attr-defined]
                    assert cmd is not None, sub
                    cmd.make_context(sub, list(args))
                    seen.add(sub)
    assert seen == {"serve", "agent", "device-plugin"}


def test_rbac_allows_what_the_adapter_calls() -> None:
    roles = {d["metadata"]["name"]: d for d in _by_kind("ClusterRole")}

    def grants(role: str) -> set[tuple[str, str]]:
        return {(res, v) for r in roles[role]["rules"] for res in r["resources"] for v in r["verbs"]}

    ext = grants("gpupool-extender")
    for need in ("pods:patch", "pods:watch", "pods/binding:create", "pods/eviction:create", "nodes:list"):
        assert tuple(need.split(":")) in ext, need
    node = grants("gpupool-node")
    assert ("pods", "watch") in node and ("nodes", "patch") in node


def test_example_pods_schedule_on_the_example_platform() -> None:
    cluster = load_cluster_file(ROOT / "examples" / "cluster-a100-l40s.yaml")
    workloads = load_workload_file(ROOT / "examples" / "workloads-agent-platform.yaml")
    pool = pool_of(list(inventory_from_plan(plan(cluster, workloads))), clock=ManualClock(0.0))
    ext = Extender(pool)
    kinds = set()
    for pod in _by_kind("Pod"):
        pod["metadata"]["uid"] = pod["metadata"]["name"]
        demand = parse_pod(pod)
        assert demand is not None and demand.priority == PRIORITY_CLASSES[pod["spec"]["priorityClassName"]]
        out = ext.filter({"Pod": pod, "Nodes": None, "NodeNames": pool.nodes()})
        assert out["Error"] == "" and out["NodeNames"], (pod["metadata"]["name"], out)
        kinds.add(pod["spec"]["priorityClassName"])
    assert kinds == set(PRIORITY_CLASSES) and len(_by_kind("Pod")) == 4


def test_gateway_specs_configmap_is_a_valid_cluster_and_workload_spec() -> None:
    from gpupool.hardware.spec import load_cluster_spec, load_workload_spec

    (cm,) = [d for d in _by_kind("ConfigMap") if d["metadata"]["name"] == "gpupool-specs"]
    cluster = load_cluster_spec(yaml.safe_load(cm["data"]["cluster.yaml"]), source="gpupool-specs")
    workloads = load_workload_spec(yaml.safe_load(cm["data"]["workloads.yaml"]), source="gpupool-specs")
    assert len(cluster.gpus()) == 6 and len(list(inventory_from_plan(plan(cluster, workloads)))) > 6
