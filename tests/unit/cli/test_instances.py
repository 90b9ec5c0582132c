"""`InstanceKeeper` on a real controller and SQLite store (`gpupool serve`'s composition, in process):
a backend whose placement lease ended takes no request until a new one is granted on its slice; a
sleeping backend (the tidal plane's) is not placed by the keeper; a lease past half its TTL is renewed."""

from __future__ import annotations

from pathlib import Path

from gpupool.cli.instances import SYSTEM_TENANT, UNPLACED
from gpupool.cli.serve import Bundle, build, register_backends
from gpupool.core.kvbackends import KV_PREFIX
from gpupool.core.model import Lease

MODEL = "qwen2.5-0.5b"


def _setup(tmp_path: Path) -> tuple[Bundle, str, str]:
    bundle = build(data_dir=tmp_path, simulate=False)
    pl = next(p for p in bundle.plan.placements if bundle.workloads.by_name(p.workload).model == MODEL)
    register_backends(bundle, [("g", MODEL, "http://127.0.0.1:9", pl.slice)])
    gpu = bundle.controller.allocator.slice_state(pl.slice).slice.gpu_id
    return bundle, pl.slice, gpu


def _instance(bundle: Bundle) -> list[Lease]:
    c = bundle.controller
    return [x for x in c.leases(tenant=SYSTEM_TENANT) if dict(x.request.labels).get("instance") == "g"]


def _open(bundle: Bundle) -> bool:
    return bundle.controller.kv.slice_state(KV_PREFIX + "g").healthy


def test_an_unplaced_backend_is_closed_until_placed_again(tmp_path: Path) -> None:
    bundle, sid, gpu = _setup(tmp_path)
    c, keeper = bundle.controller, bundle.keeper
    assert keeper is not None
    (first,) = _instance(bundle)
    assert first.slice_ids == (sid,) and _open(bundle)
    c.drain_gpu(gpu, revoke=True)
    keeper.tick()  # (on a running gateway: on the lease's end event and every RECHECK_S)
    assert UNPLACED in c.unroutable_reasons("g") and _instance(bundle) == []
    c.undrain_gpu(gpu)
    assert not _open(bundle)  # the GPU is open again, but the instance holds no placement lease yet
    keeper.tick()
    (again,) = _instance(bundle)
    assert again.id != first.id and again.slice_ids == (sid,)
    assert _open(bundle) and c.unroutable_reasons("g") == frozenset()
    c.flush()


def test_a_sleeping_backend_is_left_to_the_tidal_plane(tmp_path: Path) -> None:
    bundle, sid, _ = _setup(tmp_path)
    c, keeper = bundle.controller, bundle.keeper
    assert keeper is not None
    c.set_backend_routable("g", False)  # the standby sleeper: asleep, its slice lent to P2 work
    (lease,) = _instance(bundle)
    c.release(lease.id, reason="lent")
    keeper.tick()
    assert _instance(bundle) == [] and c.unroutable_reasons("g") == {"asleep", UNPLACED}
    c.set_backend_routable("g", True)  # woken: still out until it holds a placement lease
    assert not _open(bundle)
    keeper.tick()
    assert [x.slice_ids for x in _instance(bundle)] == [(sid,)] and _open(bundle)


def test_a_lease_past_half_its_ttl_is_renewed(tmp_path: Path) -> None:
    bundle, _, _ = _setup(tmp_path)
    c, keeper = bundle.controller, bundle.keeper
    assert keeper is not None
    (lease,) = _instance(bundle)
    c.renew(lease.id, ttl_s=60.0)  # far less than half of the instance TTL left
    keeper.tick()
    (renewed,) = _instance(bundle)
    assert renewed.id == lease.id and renewed.expires_at - c.clock.now() > 3600
