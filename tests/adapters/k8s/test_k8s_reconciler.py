"""Pod reconciliation against a fake API server: release on delete / finish, adoption, drift, relist."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from tests.adapters.k8s.k8s_fakeapi import FakeApiServer, make_pod
from tests.adapters.k8s.k8s_helpers import Client, make_pool, wait_until

from gpupool.adapters.k8s.kubeapi import KubeApi, KubeApiError
from gpupool.adapters.k8s.reconciler import PodReconciler


def bind(client: Client, api: FakeApiServer, pod: dict[str, Any], node: str) -> None:
    api.add_pod(pod)
    out = client.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": [node]})
    assert out["NodeNames"] == [node], out
    m = pod["metadata"]
    assert client.post(
        "bind", {"PodName": m["name"], "PodNamespace": m["namespace"], "PodUID": m["uid"], "Node": node}
    ) == {"Error": ""}


def free_map(pool: Any) -> dict[str, Any]:
    return {st.slice.id: (st.free, st.num_leases) for st in pool.allocator.states()}


def test_restart_adopts_bound_pods_and_releases_the_gone(extender: Any, fake_api: FakeApiServer) -> None:
    fake_api.admit_on_binding = True  # a live kubelet admits each bound pod: none waits
    ext, _, client = extender
    bind(client, fake_api, make_pod("a", vram_mib=30000, compute_pct=20), "gpu-a")
    bind(client, fake_api, make_pod("b", vram_mib=10000, compute_pct=50, priority=-1), "gpu-a")
    bind(client, fake_api, make_pod("c", vram_mib=5000, gpus=1), "gpu-c")
    before = free_map(ext.pool)

    fresh = make_pool()
    rec = PodReconciler(fresh)
    pods, _ = KubeApi.for_host(fake_api.url).list_pods()
    summary = rec.resync(pods, listed_at=fresh.allocator.clock.now())
    assert rec.counts["adopted"] == 3 and summary["released"] == 0
    assert free_map(fresh) == before
    fresh.check()
    for name in ("a", "b", "c"):
        uid = fake_api.pod("default", name)["metadata"]["uid"]
        assert fresh.lease_of(uid).id == ext.pool.lease_of(uid).id

    fake_api.delete_pod("default", "b")
    pods, _ = KubeApi.for_host(fake_api.url).list_pods()
    fresh.allocator.clock.advance(1.0)  # type: ignore[attr-defined]
    assert rec.resync(pods, listed_at=fresh.allocator.clock.now())["released"] == 1
    assert len(fresh.pod_uids()) == 2


def test_watch_releases_deleted_and_finished_pods(extender: Any, fake_api: FakeApiServer) -> None:
    fake_api.admit_on_binding = True  # a live kubelet admits each bound pod: none waits
    ext, _, client = extender
    rec = PodReconciler(ext.pool)
    stop = threading.Event()
    t = threading.Thread(
        target=rec.run, args=(KubeApi.for_host(fake_api.url), stop), kwargs={"watch_timeout_s": 1}
    )
    t.start()
    try:
        bind(client, fake_api, make_pod("job", vram_mib=2000, priority=-1), "gpu-b")
        bind(client, fake_api, make_pod("svc", vram_mib=2000), "gpu-b")
        uids = {n: fake_api.pod("default", n)["metadata"]["uid"] for n in ("job", "svc")}
        wait_until(lambda: rec.counts.get("ok", 0) >= 2, what="bound pods seen")
        fake_api.update_pod("default", "job", phase="Succeeded")
        wait_until(lambda: ext.pool.lease_of(uids["job"]) is None, what="finished pod released")
        fake_api.delete_pod("default", "svc")
        wait_until(lambda: ext.pool.lease_of(uids["svc"]) is None, what="deleted pod released")
        assert ext.pool.pod_uids() == []
        ext.pool.check()
    finally:
        stop.set()
        t.join(timeout=10)
    assert not t.is_alive()


def test_expired_watch_relists(extender: Any, fake_api: FakeApiServer) -> None:
    ext, _, client = extender
    rec = PodReconciler(ext.pool)
    fake_api.expire_watch_before = 10**9
    stop = threading.Event()
    # An expired watch (410) is no error: the reconciler lists again at once. With an hour of
    # back-off for errors, several relists can only happen if a 410 is not backed off like one.
    t = threading.Thread(
        target=rec.run,
        args=(KubeApi.for_host(fake_api.url), stop),
        kwargs={"watch_timeout_s": 1, "backoff_s": 3600.0},
    )
    bind(client, fake_api, make_pod("x", vram_mib=100), "gpu-a")
    t.start()
    try:
        wait_until(lambda: rec.counts.get("ok", 0) >= 3, what="several relists")
    finally:
        stop.set()
        t.join(timeout=10)


def test_drift_is_reported_not_fixed(fake_api: FakeApiServer) -> None:
    pool = make_pool()
    rec = PodReconciler(pool)
    good = {
        "version": 1,
        "lease": "l-1",
        "node": "gpu-a",
        "priority": 0,
        "preemptible": False,
        "bound_at": 1.0,
        "pod": {"uid": "u1", "namespace": "default", "name": "ghost", "container": "main"},
        "request": {"vram_mib": 100, "compute_milli": 0, "gpu_count": 1, "kinds": []},
        "grants": [
            {
                "slice": "gpu-a/9/whole",
                "gpu": "gpu-a/9",
                "uuid": "",
                "kind": "whole",
                "index": 9,
                "profile": "",
                "vram_mib": 100,
                "compute_milli": 0,
                "shared": True,
            }
        ],
    }
    ghost = make_pod("ghost", uid="u1", node="gpu-a", annotations={"gpupool.io/placement": json.dumps(good)})
    assert rec.apply("ADDED", ghost) == "drift"
    assert rec.drifts[-1].kind == "adopt-failed" and "gpu-a/9/whole" in rec.drifts[-1].detail
    bad = make_pod("bad", node="gpu-a", annotations={"gpupool.io/placement": "{not json"})
    assert rec.apply("MODIFIED", bad) == "drift" and rec.drifts[-1].kind == "bad-annotation"
    old = make_pod(
        "old", node="gpu-a", annotations={"gpupool.io/placement": json.dumps({**good, "version": 0})}
    )
    assert rec.apply("MODIFIED", old) == "drift" and "version" in rec.drifts[-1].detail
    rogue = make_pod("rogue", vram_mib=1000, node="gpu-b")
    assert rec.apply("ADDED", rogue) == "drift" and rec.drifts[-1].kind == "unmanaged"
    moved = make_pod("moved", uid="u1", node="gpu-b", annotations={"gpupool.io/placement": json.dumps(good)})
    assert rec.apply("MODIFIED", moved) == "drift" and rec.drifts[-1].kind == "node-mismatch"
    in_flight = make_pod("inflight", uid="u1", annotations={"gpupool.io/placement": json.dumps(good)})
    assert rec.apply("MODIFIED", in_flight) == "ignored"
    assert pool.pod_uids() == []
    pool.check()


def test_inventory_sync_follows_node_annotations() -> None:
    from tests.adapters.k8s.k8s_fakeapi import make_node
    from tests.adapters.k8s.k8s_helpers import pool_of

    from gpupool.adapters.k8s.annotations import encode_slices
    from gpupool.adapters.k8s.inventory import sync_from_nodes
    from gpupool.adapters.k8s.resources import PodDemand
    from gpupool.core import Resources, Slice, SliceKind
    from gpupool.core.clock import ManualClock

    def mps(node: str, i: int, vram: int = 12288, healthy: bool = True) -> Slice:
        return Slice(
            f"{node}/0/mps{i}", node, f"{node}/0", SliceKind.MPS, Resources(vram, 250), healthy=healthy
        )

    def nodes(**per_node: list[Slice] | str) -> list[dict[str, Any]]:
        out = []
        for name, value in per_node.items():
            text = value if isinstance(value, str) else encode_slices(value)
            out.append(make_node(name, {"gpupool.io/slices": text}))
        return out

    pool = pool_of(clock=ManualClock(0.0))
    report = sync_from_nodes(pool, nodes(n1=[mps("n1", 0), mps("n1", 1)], n2=[mps("n2", 0)]))
    assert sorted(report["added"]) == ["n1/0/mps0", "n1/0/mps1", "n2/0/mps0"]
    demand = PodDemand("u1", "default", "p", 0, 4096, 100)
    assert pool.reserve(demand, "n1").granted
    held = pool.lease_of("u1").grants[0].slice_id  # type: ignore[union-attr]
    free = "n1/0/mps1" if held == "n1/0/mps0" else "n1/0/mps0"
    # n1: the held slice vanishes (kept, unhealthy), the free one shrinks (replaced); n2: annotation broken
    report = sync_from_nodes(
        pool,
        nodes(n1=[mps("n1", 2), Slice(free, "n1", "n1/0", SliceKind.MPS, Resources(6144, 250))], n2="{bad"),
    )
    assert report["blocked"] == [held] and report["removed"] == [free]
    assert sorted(report["added"]) == sorted([free, "n1/0/mps2"]) and report["skipped"] == ["n2"]
    assert not pool.allocator.ledger.is_healthy(held)
    assert pool.allocator.ledger.slice(free).capacity == Resources(6144, 250)
    assert "n2" in pool.nodes()
    # n2 deleted from the cluster: its free slice goes; health flips follow the annotation
    report = sync_from_nodes(
        pool,
        nodes(
            n1=[mps("n1", 2, healthy=False), Slice(free, "n1", "n1/0", SliceKind.MPS, Resources(6144, 250))]
        ),
    )
    assert report["removed"] == ["n2/0/mps0"] and "n2" not in pool.nodes()
    assert report["health"] == ["n1/0/mps2"]
    pool.release_pod("u1", reason="done")
    report = sync_from_nodes(
        pool,
        nodes(
            n1=[mps("n1", 2, healthy=False), Slice(free, "n1", "n1/0", SliceKind.MPS, Resources(6144, 250))]
        ),
    )
    assert report["removed"] == [held]
    pool.check()


def test_a_pod_deleted_between_watches_is_released_by_the_next_list(
    extender: Any, fake_api: FakeApiServer
) -> None:
    """The DELETED event can fall between one watch's end and the next list; that list's resync
    must release the lease, even when the pool's clock has not moved since the grant (the frozen
    clock here), while a lease granted after the list started is kept."""
    ext, _, client = extender
    rec = PodReconciler(ext.pool)
    bind(client, fake_api, make_pod("gone", vram_mib=2000, priority=-1), "gpu-b")
    gone = fake_api.pod("default", "gone")["metadata"]["uid"]
    before = rec.held()
    fake_api.delete_pod("default", "gone")  # no watch runs: only the list can tell
    pods, _ = KubeApi.for_host(fake_api.url).list_pods()
    bind(client, fake_api, make_pod("late", vram_mib=2000), "gpu-b")  # raced the list
    late = fake_api.pod("default", "late")["metadata"]["uid"]
    summary = rec.resync(pods, held_before=before)
    assert summary["released"] == 1
    assert ext.pool.lease_of(gone) is None and ext.pool.lease_of(late) is not None
    ext.pool.check()


def test_resync_needs_exactly_one_age_rule() -> None:
    rec = PodReconciler(make_pool())
    for kw in ({}, {"held_before": frozenset[str](), "listed_at": 1.0}):
        with pytest.raises(TypeError, match="exactly one"):
            rec.resync([], **kw)  # type: ignore[arg-type]


class _BrokenWatch(BaseHTTPRequestHandler):
    """Answers a watch with one good event, then a chunk cut off mid-way (``/cut``) or a line
    that is no JSON (``/junk``), as a dying API server or a proxy in the way can."""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        good = json.dumps({"type": "ADDED", "object": make_pod("p")}).encode() + b"\n"
        self.wfile.write(b"%x\r\n%s\r\n" % (len(good), good))
        if self.server.mode == "junk":  # type: ignore[attr-defined]
            self.wfile.write(b"6\r\n{oops\n\r\n0\r\n\r\n")
        else:
            self.wfile.write(b'400\r\n{"type": "MOD')
        self.wfile.flush()
        self.close_connection = True


@pytest.mark.parametrize("mode", ["cut", "junk"])
def test_a_broken_watch_stream_is_one_api_error(mode: str) -> None:
    """A watch stream that breaks off or carries junk ends in `KubeApiError` after the events that
    arrived whole, so the reconciler's and the device plugin's loops back off and list again
    instead of their threads dying on a raw transport or JSON error."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BrokenWatch)
    server.mode = mode  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        api = KubeApi.for_host(f"http://127.0.0.1:{server.server_address[1]}")
        seen: list[str] = []
        with pytest.raises(KubeApiError) as err:
            for kind, obj in api.watch_pods("5", timeout_s=1):
                seen.append(f"{kind} {obj['metadata']['name']}")
        assert seen == ["ADDED p"]
        assert ("not an event" if mode == "junk" else "watch broken") in str(err.value)
    finally:
        server.shutdown()
        server.server_close()


def test_the_loop_outlives_a_failing_event(
    extender: Any, fake_api: FakeApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug or a bad event that raises inside the loop is logged; the loop lists again and the
    lease is still released (before, the thread died and no pod was ever reconciled again)."""
    ext, _, client = extender
    rec = PodReconciler(ext.pool)
    bind(client, fake_api, make_pod("svc", vram_mib=2000), "gpu-b")
    uid = fake_api.pod("default", "svc")["metadata"]["uid"]
    real, calls = ext.pool.release_pod, []

    def flaky(*a: Any, **kw: Any) -> Any:
        calls.append(a)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return real(*a, **kw)

    monkeypatch.setattr(ext.pool, "release_pod", flaky)
    stop = threading.Event()
    t = threading.Thread(
        target=rec.run,
        args=(KubeApi.for_host(fake_api.url), stop),
        kwargs={"watch_timeout_s": 1, "backoff_s": 0.05},
    )
    t.start()
    try:
        wait_until(lambda: rec.counts.get("ok", 0) >= 1, what="the bound pod seen")
        fake_api.delete_pod("default", "svc")
        wait_until(lambda: ext.pool.lease_of(uid) is None, what="the lease released after the failure")
        assert len(calls) >= 2 and t.is_alive()
    finally:
        stop.set()
        t.join(timeout=10)
