"""Runs every YAML scenario table in tests/scenarios/allocator/: cluster + requests -> outcomes.

Step forms (each may carry ``expect``):
- ``allocate: {id, priority, vram_mib, compute_milli, kinds, gpu_count, ttl_s, preemptible, tenant}``
  expect ``{code, slices, victims, early_warning}``;
- ``release: <request id>`` expect ``{code}``;  ``renew: {id, ttl_s}`` expect ``{code}``;
- ``advance_s: N`` then optionally ``expire: true`` expect ``{expired: [request ids]}``;
- ``unhealthy: {slice, revoke}`` expect ``{leases: [request ids]}``;
- ``free: {slice id: [vram_mib, compute_milli]}`` checks the ledger.
The ledger's invariants are checked after every step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from gpupool.core import Allocator, ManualClock, Request, Resources, Slice, SliceKind, parse_priority
from gpupool.core.ids import seeded_lease_ids

HERE = Path(__file__).parent / "allocator"
FILES = sorted(HERE.glob("*.yaml"))


def _slice(d: dict[str, Any]) -> Slice:
    return Slice(
        id=d["id"],
        node=d.get("node", "n0"),
        gpu_id=d.get("gpu", d["id"]),
        kind=SliceKind(d.get("kind", "whole")),
        capacity=Resources(d["vram_mib"], d.get("compute_milli", 1000)),
        healthy=d.get("healthy", True),
    )


def _request(d: dict[str, Any]) -> Request:
    return Request(
        id=d["id"],
        tenant=d.get("tenant", "t"),
        priority=parse_priority(d.get("priority", "P2")),
        demand=Resources(d["vram_mib"], d.get("compute_milli", 0)),
        ttl_s=d.get("ttl_s", 60),
        kinds=frozenset(SliceKind(k) for k in d.get("kinds", [])),
        gpu_count=d.get("gpu_count", 1),
        preemptible=d.get("preemptible"),
    )


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_scenario(path: Path) -> None:
    spec = yaml.safe_load(path.read_text())
    clock = ManualClock()
    alloc = Allocator(
        [_slice(s) for s in spec["slices"]], clock=clock, policy=spec.get("policy", "bestfit"),
        lease_ids=seeded_lease_ids(0),
    )  # fmt: skip
    lease_of: dict[str, str] = {}
    for n, step in enumerate(spec["steps"]):
        where = f"{path.name} step {n + 1}: {step}"
        exp = step.get("expect", {})
        if "allocate" in step:
            out = alloc.allocate(_request(step["allocate"]), preempt=step["allocate"].get("preempt", True))
            if out.lease is not None:
                lease_of[out.lease.request.id] = out.lease.id
            assert out.code.value == exp.get("code", out.code.value), f"{where}: {out.code} {out.reason}"
            if "slices" in exp:
                assert out.lease is not None and list(out.lease.slice_ids) == exp["slices"], where
            if "victims" in exp:
                assert sorted(v.request.id for v in out.victims) == sorted(exp["victims"]), where
            if "early_warning" in exp:
                assert out.early_warning == exp["early_warning"], where
        elif "release" in step:
            out = alloc.release(lease_of[step["release"]])
            assert out.code.value == exp.get("code", out.code.value), where
        elif "renew" in step:
            out = alloc.renew(lease_of[step["renew"]["id"]], step["renew"].get("ttl_s"))
            assert out.code.value == exp.get("code", out.code.value), where
        elif "advance_s" in step:
            clock.advance(step["advance_s"])
            if step.get("expire"):
                expired = alloc.expire_due()
                if "expired" in exp:
                    assert sorted(x.request.id for x in expired) == sorted(exp["expired"]), where
        elif "unhealthy" in step:
            on = alloc.mark_unhealthy(
                step["unhealthy"]["slice"], revoke=step["unhealthy"].get("revoke", False)
            )
            if "leases" in exp:
                assert sorted(x.request.id for x in on) == sorted(exp["leases"]), where
        elif "free" in step:
            for sid, (vram, compute) in step["free"].items():
                assert alloc.slice_state(sid).free == Resources(vram, compute), (
                    f"{where}: {alloc.slice_state(sid)}"
                )
        else:
            raise AssertionError(f"{where}: unknown step")
        alloc.check_invariants()
