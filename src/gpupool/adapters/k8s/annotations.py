"""Versioned annotation codecs: the pod placement record and the node slice list (standard library).

Pod annotation ``<domain>/placement`` (written by the extender at bind, before the Binding, so the
device plugin can never see a bound pod without it), JSON with ``"version": 1``:
``{"version", "lease", "pod": {"uid", "namespace", "name", "container"}, "node", "priority",
"preemptible", "request": {"vram_mib", "compute_milli", "gpu_count", "kinds"}, "grants": [{"slice",
"gpu", "uuid", "kind", "index", "profile", "vram_mib", "compute_milli", "shared"}], "bound_at"}``.
``grants`` are in the lease's order; ``index`` is the card's index on the node; ``shared`` says the
grant is less than the whole slice (so the container must be capped through MPS).

Node annotation ``<domain>/slices`` (written by the node agent), JSON with ``"version": 1``:
``{"version", "slices": [{"id", "gpu", "kind", "vram_mib", "compute_milli", "index", "model",
"profile", "uuid", "healthy", "mps_pipe_dir"?}]}``; ``uuid`` is the MIG device UUID on MIG slices,
``mps_pipe_dir`` (only on MPS slices whose daemon's pipe directory is known) is optional, so older
readers and writers stay compatible (`decode_pipe_dirs` reads it).

Invariants: ``decode(encode(x)) == x`` for both records (tested); an unknown version or a missing /
mistyped field raises `InvalidInput` naming the field; encoding is canonical (sorted keys, no spaces).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpupool.core.errors import InvalidInput
from gpupool.core.model import Grant, Lease, Request
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources

PLACEMENT_VERSION = 1
SLICES_VERSION = 1


@dataclass(frozen=True, slots=True)
class PlacedGrant:
    slice_id: str
    gpu_id: str
    uuid: str
    kind: SliceKind
    index: int
    profile: str
    vram_mib: int
    compute_milli: int
    shared: bool


@dataclass(frozen=True, slots=True)
class Placement:
    lease_id: str
    pod_uid: str
    namespace: str
    name: str
    container: str
    node: str
    priority: int
    preemptible: bool
    vram_mib: int
    compute_milli: int
    gpu_count: int
    kinds: tuple[SliceKind, ...]
    grants: tuple[PlacedGrant, ...]
    bound_at: float

    @property
    def gpu_ids(self) -> frozenset[str]:
        return frozenset(g.gpu_id for g in self.grants)

    @classmethod
    def of_lease(
        cls,
        lease: Lease,
        slices: dict[str, Slice],
        *,
        namespace: str,
        name: str,
        container: str,
        bound_at: float,
    ) -> Placement:
        grants = []
        for g in lease.grants:
            s = slices[g.slice_id]
            grants.append(
                PlacedGrant(
                    slice_id=s.id,
                    gpu_id=s.gpu_id,
                    uuid=s.uuid,
                    kind=s.kind,
                    index=s.gpu_index,
                    profile=s.profile,
                    vram_mib=g.resources.vram_mib,
                    compute_milli=g.resources.compute_milli,
                    shared=g.resources != s.capacity,
                )
            )
        r = lease.request
        return cls(
            lease_id=lease.id,
            pod_uid=r.id,
            namespace=namespace,
            name=name,
            container=container,
            node=lease.node,
            priority=r.priority,
            preemptible=r.is_preemptible,
            vram_mib=r.demand.vram_mib,
            compute_milli=r.demand.compute_milli,
            gpu_count=r.gpu_count,
            kinds=tuple(sorted(r.kinds)),
            grants=tuple(grants),
            bound_at=bound_at,
        )

    def to_lease(self, *, granted_at: float, ttl_s: float) -> Lease:
        """The ACTIVE lease this record describes, for `Allocator.restore` after a restart."""
        request = Request(
            id=self.pod_uid,
            tenant=self.namespace,
            priority=self.priority,
            demand=Resources(self.vram_mib, self.compute_milli),
            ttl_s=ttl_s,
            kinds=frozenset(self.kinds),
            preemptible=self.preemptible,
            gpu_count=self.gpu_count,
            labels=(("pod", f"{self.namespace}/{self.name}"),),
        )
        grants = tuple(
            Grant(slice_id=g.slice_id, gpu_id=g.gpu_id, resources=Resources(g.vram_mib, g.compute_milli))
            for g in self.grants
        )
        return Lease(
            id=self.lease_id,
            request=request,
            node=self.node,
            grants=grants,
            granted_at=granted_at,
            expires_at=granted_at + ttl_s,
        )


def _dump(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def encode_placement(p: Placement) -> str:
    return _dump(
        {
            "version": PLACEMENT_VERSION,
            "lease": p.lease_id,
            "pod": {"uid": p.pod_uid, "namespace": p.namespace, "name": p.name, "container": p.container},
            "node": p.node,
            "priority": p.priority,
            "preemptible": p.preemptible,
            "request": {
                "vram_mib": p.vram_mib,
                "compute_milli": p.compute_milli,
                "gpu_count": p.gpu_count,
                "kinds": [k.value for k in p.kinds],
            },
            "grants": [
                {
                    "slice": g.slice_id,
                    "gpu": g.gpu_id,
                    "uuid": g.uuid,
                    "kind": g.kind.value,
                    "index": g.index,
                    "profile": g.profile,
                    "vram_mib": g.vram_mib,
                    "compute_milli": g.compute_milli,
                    "shared": g.shared,
                }
                for g in p.grants
            ],
            "bound_at": p.bound_at,
        }
    )


def _get(d: dict[str, Any], key: str, typ: type | tuple[type, ...], field: str) -> Any:
    if key not in d:
        raise InvalidInput(f"{field}.{key}", None, "is missing")
    v = d[key]
    if isinstance(v, bool) and typ is not bool and bool not in (typ if isinstance(typ, tuple) else (typ,)):
        raise InvalidInput(f"{field}.{key}", v, f"must be {typ}")
    if not isinstance(v, typ):
        raise InvalidInput(f"{field}.{key}", v, f"must be {getattr(typ, '__name__', typ)}")
    return v


def _kind(value: object, field: str) -> SliceKind:
    try:
        return SliceKind(str(value))
    except ValueError:
        raise InvalidInput(field, value, f"must be one of {[k.value for k in SliceKind]}") from None


def _load(text: str, field: str, version: int) -> dict[str, Any]:
    try:
        d = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(field, str(text)[:80], f"is not JSON ({exc})") from None
    if not isinstance(d, dict):
        raise InvalidInput(field, type(d).__name__, "must be a JSON object")
    if d.get("version") != version:
        raise InvalidInput(f"{field}.version", d.get("version"), f"this gpupool reads version {version}")
    return d


def decode_placement(text: str, field: str = "placement") -> Placement:
    d = _load(text, field, PLACEMENT_VERSION)
    pod = _get(d, "pod", dict, field)
    req = _get(d, "request", dict, field)
    grants = []
    for i, g in enumerate(_get(d, "grants", list, field)):
        gf = f"{field}.grants[{i}]"
        if not isinstance(g, dict):
            raise InvalidInput(gf, g, "must be an object")
        grants.append(
            PlacedGrant(
                slice_id=_get(g, "slice", str, gf),
                gpu_id=_get(g, "gpu", str, gf),
                uuid=_get(g, "uuid", str, gf),
                kind=_kind(_get(g, "kind", str, gf), f"{gf}.kind"),
                index=_get(g, "index", int, gf),
                profile=_get(g, "profile", str, gf),
                vram_mib=_get(g, "vram_mib", int, gf),
                compute_milli=_get(g, "compute_milli", int, gf),
                shared=_get(g, "shared", bool, gf),
            )
        )
    if not grants:
        raise InvalidInput(f"{field}.grants", [], "must hold at least one grant")
    return Placement(
        lease_id=_get(d, "lease", str, field),
        pod_uid=_get(pod, "uid", str, f"{field}.pod"),
        namespace=_get(pod, "namespace", str, f"{field}.pod"),
        name=_get(pod, "name", str, f"{field}.pod"),
        container=_get(pod, "container", str, f"{field}.pod"),
        node=_get(d, "node", str, field),
        priority=_get(d, "priority", int, field),
        preemptible=_get(d, "preemptible", bool, field),
        vram_mib=_get(req, "vram_mib", int, f"{field}.request"),
        compute_milli=_get(req, "compute_milli", int, f"{field}.request"),
        gpu_count=_get(req, "gpu_count", int, f"{field}.request"),
        kinds=tuple(_kind(k, f"{field}.request.kinds") for k in _get(req, "kinds", list, f"{field}.request")),
        grants=tuple(grants),
        bound_at=float(_get(d, "bound_at", (int, float), field)),
    )


def encode_slices(slices: list[Slice], *, pipe_dirs: dict[str, str] | None = None) -> str:
    """The node annotation; ``pipe_dirs`` maps MPS slice ids to their daemon's pipe directory."""
    pipes = pipe_dirs or {}
    return _dump(
        {
            "version": SLICES_VERSION,
            "slices": [
                {
                    **({"mps_pipe_dir": pipes[s.id]} if pipes.get(s.id) else {}),
                    "id": s.id,
                    "gpu": s.gpu_id,
                    "kind": s.kind.value,
                    "vram_mib": s.capacity.vram_mib,
                    "compute_milli": s.capacity.compute_milli,
                    "index": s.gpu_index,
                    "model": s.gpu_model,
                    "profile": s.profile,
                    "uuid": s.uuid,
                    "healthy": s.healthy,
                }
                for s in slices
            ],
        }
    )


def decode_slices(text: str, *, node: str, field: str = "slices") -> list[Slice]:
    d = _load(text, field, SLICES_VERSION)
    out = []
    for i, s in enumerate(_get(d, "slices", list, field)):
        sf = f"{field}.slices[{i}]"
        if not isinstance(s, dict):
            raise InvalidInput(sf, s, "must be an object")
        try:
            out.append(
                Slice(
                    id=_get(s, "id", str, sf),
                    node=node,
                    gpu_id=_get(s, "gpu", str, sf),
                    kind=_kind(_get(s, "kind", str, sf), f"{sf}.kind"),
                    capacity=Resources(_get(s, "vram_mib", int, sf), _get(s, "compute_milli", int, sf)),
                    healthy=_get(s, "healthy", bool, sf),
                    gpu_index=_get(s, "index", int, sf),
                    gpu_model=_get(s, "model", str, sf),
                    profile=_get(s, "profile", str, sf),
                    uuid=_get(s, "uuid", str, sf),
                )
            )
        except ValueError as exc:
            if isinstance(exc, InvalidInput):
                raise
            raise InvalidInput(sf, s.get("id"), str(exc)) from None
    return out


def decode_pipe_dirs(text: str, field: str = "slices") -> dict[str, str]:
    """Slice id -> MPS pipe directory, for the slices of a node annotation that name one."""
    d = _load(text, field, SLICES_VERSION)
    out: dict[str, str] = {}
    for s in _get(d, "slices", list, field):
        if isinstance(s, dict) and isinstance(s.get("id"), str) and isinstance(s.get("mps_pipe_dir"), str):
            out[s["id"]] = s["mps_pipe_dir"]
    return out
