"""The node-local queue that matches kubelet's Allocate calls to bound leases."""

from __future__ import annotations

from tests.adapters.k8s.k8s_fakeapi import make_pod

from gpupool.adapters.k8s.annotations import PlacedGrant, Placement, encode_placement
from gpupool.adapters.k8s.pending import PendingQueue, feed
from gpupool.hardware.slices import SliceKind


def placement(uid: str, gpus: list[str], bound_at: float) -> Placement:
    grants = tuple(
        PlacedGrant(f"{g}/whole", g, "", SliceKind.WHOLE, i, "", 1000, 100, True) for i, g in enumerate(gpus)
    )
    return Placement(
        "L-" + uid, uid, "ns", "pod-" + uid, "c", "n1", 0, False, 1000, 100, len(gpus), (), grants, bound_at
    )


def test_take_prefers_exact_cards_then_oldest() -> None:
    q = PendingQueue()
    q.offer(placement("a", ["g0"], 2.0))
    q.offer(placement("b", ["g1"], 1.0))
    q.offer(placement("c", ["g0", "g1"], 0.5))
    assert [p.pod_uid for p in q.waiting()] == ["c", "b", "a"]
    assert q.prefer(1, {"g0": ["g0-1"], "g1": ["g1-0", "g1-1"]}) == ["g1-0"]  # oldest 1-card lease: b
    assert q.take(frozenset({"g0"}), 1).pod_uid == "a"  # exact cards win over age
    assert q.take(frozenset({"g0"}), 1).pod_uid == "b"  # fallback: oldest of that size
    assert q.take(frozenset({"g0"}), 1) is None
    two = q.take(frozenset({"g0", "g1"}), 2)
    assert two is not None and two.pod_uid == "c"
    q.untake(two)
    assert [p.pod_uid for p in q.waiting()] == ["c"]


def test_verify_reports_swaps_and_confirms_the_rest() -> None:
    q = PendingQueue()
    q.offer(placement("a", ["g0"], 1.0))
    q.offer(placement("b", ["g1"], 2.0))
    q.take(frozenset({"g0"}), 1)
    q.take(frozenset({"g1"}), 1)
    drift = q.verify({("ns", "pod-a"): frozenset({"g0"}), ("ns", "pod-b"): frozenset({"g0"})})
    assert len(drift) == 1 and "ns/pod-b" in drift[0]
    assert q.taken() == []
    assert not q.offer(placement("a", ["g0"], 1.0))  # confirmed pods are never queued again


def test_feed_queues_bound_pending_pods_and_drops_started_ones() -> None:
    q = PendingQueue()
    errors: list[str] = []
    p = placement("u1", ["g0"], 1.0)
    pod = make_pod(
        "pod-u1",
        namespace="ns",
        uid="u1",
        node="n1",
        annotations={"gpupool.io/placement": encode_placement(p)},
    )
    feed(q, "ADDED", pod, node="n1", on_error=errors.append)
    assert [x.pod_uid for x in q.waiting()] == ["u1"]
    other = make_pod("x", uid="u2", node="n2", annotations={"gpupool.io/placement": encode_placement(p)})
    feed(q, "ADDED", other, node="n1", on_error=errors.append)
    assert len(q.waiting()) == 1
    liar = make_pod("y", uid="u3", node="n1", annotations={"gpupool.io/placement": encode_placement(p)})
    feed(q, "ADDED", liar, node="n1", on_error=errors.append)
    assert len(q.waiting()) == 1 and "placement is for" in errors[-1]
    feed(
        q,
        "ADDED",
        make_pod("z", node="n1", annotations={"gpupool.io/placement": "{"}),
        node="n1",
        on_error=errors.append,
    )
    assert "not JSON" in errors[-1]
    pod["status"] = {"phase": "Running"}
    feed(q, "MODIFIED", pod, node="n1")
    assert q.waiting() == []
    pod["status"] = {"phase": "Pending"}
    feed(q, "MODIFIED", pod, node="n1")  # a late event must not queue a started pod again
    assert q.waiting() == []
