"""MIG re-partition through the GPU Operator's mig-manager protocol, against the fake API server
(real HTTP, the official kubernetes client) and a fake mig-manager thread: the ConfigMap gets the
node's mig-parted config next to the existing ones, the node label asks for it, and the outcome is
what ``nvidia.com/mig.config.state`` says."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from tests.adapters.k8s.k8s_fakeapi import make_node
from tests.adapters.k8s.k8s_fakemig import FakeMigApi, FakeMigManager

from gpupool.adapters.k8s.kubeapi import KubeApi
from gpupool.adapters.k8s.migmanager import CONFIG_LABEL, STATE_LABEL, MigManagerActuator
from gpupool.hardware.mig import MigInstance
from gpupool.hardware.migparted import parse_mig_parted

NS, CM = "gpu-operator", "custom-mig-config"
OTHER = {"version": "v1", "mig-configs": {"all-disabled": [{"devices": "all", "mig-enabled": False}]}}


@pytest.fixture
def cluster() -> Iterator[tuple[FakeMigApi, FakeMigManager, KubeApi]]:
    api = FakeMigApi().start()
    api.add_node(make_node("gpu-a"))
    api.config_maps[(NS, CM)] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": CM, "namespace": NS},
        "data": {"config.yaml": yaml.safe_dump(OTHER)},
    }
    mgr = FakeMigManager(
        api, "gpu-a", namespace=NS, config_map=CM, fail_profiles=frozenset({"1g.10gb"})
    ).start()
    try:
        yield api, mgr, KubeApi.for_host(api.url)
    finally:
        mgr.stop()
        api.stop()


LAYOUT = {0: [MigInstance("3g.40gb", 0), MigInstance("3g.40gb", 4)], 1: [MigInstance("7g.80gb", 0)]}


def test_apply_writes_the_config_labels_the_node_and_waits_for_success(cluster) -> None:
    api, mgr, kube = cluster
    out = MigManagerActuator(kube, namespace=NS, config_map=CM, poll_s=0.02, timeout_s=30).apply(
        "gpu-a", LAYOUT
    )
    assert out.ok, out.detail
    labels = api.labels("gpu-a")
    name = labels[CONFIG_LABEL]
    assert name.startswith("gpupool-gpu-a-") and labels[STATE_LABEL] == "success"
    doc = yaml.safe_load(api.config_maps[(NS, CM)]["data"]["config.yaml"])
    configs = parse_mig_parted(doc)
    assert "all-disabled" in configs  # the operator's own configs are kept
    assert mgr.applied == [
        (
            name,
            [
                {"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
                {"devices": [1], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}},
            ],
        )
    ]
    # the same layout again: already applied, nothing rewritten
    again = MigManagerActuator(kube, namespace=NS, config_map=CM, poll_s=0.02).apply("gpu-a", LAYOUT)
    assert again.ok and "already applied" in again.detail and len(mgr.applied) == 1


def test_failed_state_is_a_failed_outcome_and_the_stale_success_is_not_trusted(cluster) -> None:
    api, mgr, kube = cluster
    act = MigManagerActuator(kube, namespace=NS, config_map=CM, poll_s=0.02, timeout_s=30)
    assert act.apply("gpu-a", LAYOUT).ok  # leaves state=success behind
    out = act.apply("gpu-a", {0: [MigInstance("1g.10gb", 0)]})
    assert not out.ok and f"{STATE_LABEL}=failed" in out.detail
    assert mgr.states_seen == ["pending", "success", "pending", "failed"]
    only = list(parse_mig_parted(yaml.safe_load(api.config_maps[(NS, CM)]["data"]["config.yaml"])))
    assert sum(1 for c in only if c.startswith("gpupool-gpu-a-")) == 1  # the node's old config replaced


def test_a_manager_that_never_finishes_times_out(cluster) -> None:
    _api, mgr, kube = cluster
    mgr.release.clear()
    try:
        out = MigManagerActuator(kube, namespace=NS, config_map=CM, poll_s=0.02, timeout_s=0.3).apply(
            "gpu-a", LAYOUT
        )
    finally:
        mgr.release.set()
    assert not out.ok and "did not finish" in out.detail and "pending" in out.detail


def test_drain_first_leases_block_the_write(cluster) -> None:
    api, mgr, kube = cluster
    act = MigManagerActuator(
        kube, namespace=NS, config_map=CM, busy=lambda node, i, doomed: ["l-1"] if i == 1 else []
    )
    out = act.apply("gpu-a", LAYOUT)
    assert not out.ok and out.busy == ("l-1",)
    assert CONFIG_LABEL not in api.labels("gpu-a") and mgr.applied == []
    assert yaml.safe_load(api.config_maps[(NS, CM)]["data"]["config.yaml"]) == OTHER
