"""The chart's HA control plane (deploy/helm/gpupool/templates/ha/, ``ha.enabled``), rendered and checked
against the Kubernetes wire formats (the official client's models) and the gpupool CLI itself.

Off (the default): one replica on SQLite, its store on a PersistentVolumeClaim, nothing of ha/.
On: the single-replica Deployment and its claim are gone; ``ha.replicas`` replicas of
``gpupool serve --kubernetes --store etcds://...`` (arguments the real CLI accepts) with the etcd TLS
and password Secrets and the shared tokens Secret; a readiness probe on /healthz (answered 200 by the
leader and by a standby alike); one Service for the API and one for the extender port, both selecting
every replica, on ports the container has; each replica advertises the address the others forward
to; kube-scheduler leader-elected in its own Deployment, its extender ``urlPrefix`` the extender
Service, with RBAC for its election Lease.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from gpupool.cli.ha import default_extender_url
from gpupool.cli.main import app
from tests.adapters.k8s.k8s_helm import render_chart
from tests.adapters.k8s.test_k8s_deploy import EXTENDER_FIELDS, _prune

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "gpupool"
POD = {"app.kubernetes.io/name": "gpupool-control"}


def _docs(ha: bool, **values: Any) -> list[dict[str, Any]]:
    with_ha = {"ha": {**yaml.safe_load((CHART / "values.yaml").read_text())["ha"], "enabled": ha, **values}}
    out: list[dict[str, Any]] = []
    for pattern in ("*.yaml", "ha/*.yaml"):
        for text in render_chart(CHART, with_ha, pattern=pattern).values():
            out += [d for d in yaml.safe_load_all(text) if d]
    return out


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (d,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return d


def test_by_default_one_replica_keeps_its_sqlite_store_on_a_claim() -> None:
    docs = _docs(False)
    assert render_chart(CHART, pattern="ha/*.yaml") == {"ha/control-plane-ha.yaml": ""}
    assert not [d for d in docs if (d["kind"], d["metadata"]["name"]) == ("Service", "gpupool-extender")]
    deploy = _one(docs, "Deployment", "gpupool-control")
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"]["type"] == "Recreate"
    claim = _one(docs, "PersistentVolumeClaim", "gpupool-data")
    volumes = {v["name"]: v for v in deploy["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    (gp,) = [c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "gpupool"]
    assert "--store" not in gp["args"]  # (SQLite under --data-dir, the claim's mount)
    assert {m["mountPath"] for m in gp["volumeMounts"] if m["name"] == "data"} == {
        gp["args"][gp["args"].index("--data-dir") + 1]
    }


@pytest.mark.parametrize("doc", _docs(True), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_ha_document_matches_the_kubernetes_schema(doc: dict[str, Any]) -> None:
    from kubernetes import client

    api = client.ApiClient()
    model = getattr(client, f"V1{doc['kind']}")
    obj = api.deserialize(json.dumps(doc), model.__name__, "application/json")
    assert _prune(api.sanitize_for_serialization(obj)) == _prune(doc), "unknown or mistyped fields"


def test_ha_replicas_serve_both_ports_behind_one_service_each() -> None:
    docs = _docs(True, replicas=5)
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    (deploy,) = [d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gpupool-control"]
    spec = deploy["spec"]
    assert spec["replicas"] == 5 and spec["template"]["metadata"]["labels"] == POD
    (gp,) = spec["template"]["spec"]["containers"]
    sub, *args = gp["args"]
    group = typer.main.get_command(app)
    cmd = group.get_command(None, sub)  # type: ignore[attr-defined]
    params = cmd.make_context(sub, list(args)).params  # (the real CLI's parser: valid arguments)
    assert params["kubernetes"] and params["store"].startswith("etcds://")
    assert params["store"] == "etcds://etcd-0.etcd:2379,etcd-1.etcd:2379,etcd-2.etcd:2379/gpupool/"
    assert params["extender_host"] == "0.0.0.0"  # (other replicas relay to it)
    ports = {p["name"]: p["containerPort"] for p in gp["ports"]}
    assert ports == {"http": params["port"], "extender": params["extender_port"]}
    # ready on leader and standby alike: both answer /healthz 200 on the API port
    probe = gp["readinessProbe"]["httpGet"]
    assert probe["path"] == "/healthz" and probe["port"] in ports
    # the address other replicas forward to: this pod's IP, on the ports it serves
    env = {e["name"]: e for e in gp["env"]}
    assert list(env).index("POD_IP") < list(env).index("GPUPOOL_ADVERTISE_URL")  # ($(VAR) needs it first)
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    advertise = env["GPUPOOL_ADVERTISE_URL"]["value"].replace("$(POD_IP)", "10.0.0.7")
    assert advertise == f"http://10.0.0.7:{ports['http']}"
    assert default_extender_url(advertise, params["extender_port"], params["extender_prefix"]) == (
        f"http://10.0.0.7:{ports['extender']}"
    )
    # etcd TLS files and the password from Secrets, the tokens shared by every replica
    mounts = {m["name"]: m["mountPath"] for m in gp["volumeMounts"]}
    secrets = {
        v["name"]: v["secret"]["secretName"] for v in spec["template"]["spec"]["volumes"] if "secret" in v
    }
    assert secrets == {"tokens": "gpupool-tokens", "etcd-tls": "gpupool-etcd-tls"}
    for opt, name in (("etcd_cacert", "ca.crt"), ("etcd_cert", "tls.crt"), ("etcd_key", "tls.key")):
        assert str(params[opt]) == f"{mounts['etcd-tls']}/{name}"
    assert str(params["auth_file"]).startswith(mounts["tokens"] + "/")
    ref = env["GPUPOOL_ETCD_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == ("gpupool-etcd-password", "password")
    # one Service per port, each selecting every replica, each on a port the container has
    for name, port_name in (("gpupool-gateway", "http"), ("gpupool-extender", "extender")):
        svc = _one(docs, "Service", name)
        assert svc["spec"]["selector"] == POD
        (p,) = svc["spec"]["ports"]
        assert p["targetPort"] == port_name and p["port"] == ports[port_name]


def test_ha_kube_scheduler_is_leader_elected_and_calls_the_extender_service() -> None:
    docs = _docs(True)
    ns = _one(docs, "Service", "gpupool-extender")["metadata"]["namespace"]
    sched = _one(docs, "Deployment", "gpupool-scheduler")
    pod = sched["spec"]["template"]["spec"]
    (ks,) = pod["containers"]
    assert "--config=/etc/gpupool/scheduler-config.yaml" in ks["command"]
    (vol,) = pod["volumes"]
    cm = _one(docs, "ConfigMap", vol["configMap"]["name"])
    cfg = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    assert (
        cfg["kind"] == "KubeSchedulerConfiguration" and cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    )
    assert cfg["leaderElection"]["leaderElect"] is True and cfg["leaderElection"]["resourceNamespace"] == ns
    (ext,) = cfg["extenders"]
    assert set(ext) <= EXTENDER_FIELDS
    svc_port = _one(docs, "Service", "gpupool-extender")["spec"]["ports"][0]["port"]
    assert ext["urlPrefix"] == f"http://gpupool-extender.{ns}.svc:{svc_port}"
    assert ext["bindVerb"] == "bind" and ext["ignorable"] is False and ext["nodeCacheCapable"] is True
    assert re.fullmatch(r"\d+(ms|s|m)", ext["httpTimeout"])
    # its election Lease: a Role on leases bound to its service account
    role = _one(docs, "Role", "gpupool-scheduler-election")
    grants = {(res, v) for r in role["rules"] for res in r["resources"] for v in r["verbs"]}
    assert {("leases", "get"), ("leases", "create"), ("leases", "update")} <= grants
    binding = _one(docs, "RoleBinding", "gpupool-scheduler-election")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert [s["name"] for s in binding["subjects"]] == [pod["serviceAccountName"]]
