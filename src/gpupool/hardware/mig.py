"""MIG profiles per GPU model, legal placements, the layout validator and placement search.

Role: the rules of section 1.3-1.4 of the fact sheet, as data plus three operations.

Public API:
- ``MigProfile``: one GPU-instance profile of one MIG family (``name`` like ``3g.40gb``, ``shape`` like
  ``3g`` / ``1g2`` (double-memory 1g) / ``1g+me``, ``sm_slices``, ``memory_slices``, ``memory_mib``,
  ``sm_count``, ``max_instances``, ``starts``, ``profile_id`` as ``nvidia-smi mig -lgip`` shows it).
- ``MigInstance(profile, start)``: one GPU instance in a layout.
- ``mig_profiles(model)`` / ``mig_profile(model, name)``: a model's profiles; ``model`` is a
  ``GpuModel`` or a catalogue name. ``mig_profile`` raises ``IllegalLayoutError`` for a foreign profile.
- ``layout_problems(model, instances)``: the reasons a layout is illegal (empty tuple = legal);
  ``validate_layout`` raises ``IllegalLayoutError`` with the first reason; ``is_legal_layout`` is the bool.
- ``find_placement(model, profile_names)``: start slots for a multiset of profiles, or None.
- ``best_layout(model, profile_names)``: the placement of those profiles that leaves the largest pool,
  plus the pool instances that fill the free slots (``MigLayout``).
- ``maximal_layouts(model)``: every legal layout (standard shapes, no +me) to which nothing can be added.

Invariants (the driver is always the final judge on real hardware):
- A layout is legal iff every instance uses a profile of this model, starts at one of its profile's
  allowed starts, memory-slice ranges ``[start, start + memory_slices)`` do not overlap, per-profile
  instance limits hold and the SM slices sum to at most the family's SM-slice budget (7, or 4 on A30).
- Every function here is deterministic; placement search orders candidates by a documented total
  order (larger instances first, then lower start slots).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from gpupool.hardware.catalogue import GPU_MODELS, GpuModel, gpu_model


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str
    shape: str
    profile_id: int
    sm_slices: int
    memory_slices: int
    memory_mib: int
    sm_count: int
    max_instances: int
    starts: tuple[int, ...]

    @property
    def media(self) -> bool:
        return "+me" in self.shape


@dataclass(frozen=True, slots=True)
class MigFamily:
    name: str
    memory_slots: int
    sm_slices: int
    profiles: tuple[MigProfile, ...]

    def profile(self, name: str) -> MigProfile | None:
        for p in self.profiles:
            if p.name == name:
                return p
        return None


@dataclass(frozen=True, slots=True, order=True)
class MigInstance:
    """One GPU instance: a profile name at a start memory slot."""

    profile: str
    start: int

    def __str__(self) -> str:
        return f"{self.profile}@{self.start}"


class IllegalLayoutError(ValueError):
    """A MIG layout the hardware would refuse; the message says why (overlap, illegal start, ...)."""


# shape -> (profile id, sm slices, memory slices, max instances, starts)
_SHAPES_8: dict[str, tuple[int, int, int, int, tuple[int, ...]]] = {
    "1g": (19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    "1g+me": (20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g2": (15, 1, 2, 4, (0, 2, 4, 6)),
    "2g": (14, 2, 2, 3, (0, 2, 4)),
    "3g": (9, 3, 4, 2, (0, 4)),
    "4g": (5, 4, 4, 1, (0,)),
    "7g": (0, 7, 8, 1, (0,)),
}
_SHAPES_A30: dict[str, tuple[int, int, int, int, tuple[int, ...]]] = {
    "1g": (14, 1, 1, 4, (0, 1, 2, 3)),
    "1g+me": (21, 1, 1, 1, (0, 1, 2, 3)),
    "2g": (5, 2, 2, 2, (0, 2)),
    "2g+me": (6, 2, 2, 1, (0, 2)),
    "4g": (0, 4, 4, 1, (0,)),
}

# family -> shape -> (GB label, memory MiB, SM count). Sources: gpu-facts.md 1.3.x (lgip columns); the
# unverified entries (1g2 on A100-80GB, H200, H20, B200 except 1g.23gb) are planning estimates.
_TABLES: dict[str, dict[str, tuple[str, int, int]]] = {
    "a100-40gb": {
        "1g": ("5gb", 4864, 14),
        "1g2": ("10gb", 9856, 14),
        "2g": ("10gb", 9856, 28),
        "3g": ("20gb", 19968, 42),
        "4g": ("20gb", 19968, 56),
        "7g": ("40gb", 40192, 98),
    },
    "a100-80gb": {
        "1g": ("10gb", 9728, 14),
        "1g2": ("20gb", 19968, 14),
        "2g": ("20gb", 19968, 28),
        "3g": ("40gb", 40192, 42),
        "4g": ("40gb", 40192, 56),
        "7g": ("80gb", 80896, 98),
    },
    "h100-80gb-sxm": {
        "1g": ("10gb", 9984, 16),
        "1g2": ("20gb", 20096, 26),
        "2g": ("20gb", 20096, 32),
        "3g": ("40gb", 40448, 60),
        "4g": ("40gb", 40448, 64),
        "7g": ("80gb", 81152, 132),
    },
    "h100-80gb-pcie": {
        "1g": ("10gb", 9984, 14),
        "1g2": ("20gb", 20096, 14),
        "2g": ("20gb", 20096, 30),
        "3g": ("40gb", 40448, 46),
        "4g": ("40gb", 40448, 62),
        "7g": ("80gb", 81152, 114),
    },
    "h100-94gb": {
        "1g": ("12gb", 10880, 16),
        "1g2": ("24gb", 22016, 26),
        "2g": ("24gb", 22016, 32),
        "3g": ("47gb", 47226, 60),
        "4g": ("47gb", 47226, 64),
        "7g": ("94gb", 94843, 132),
    },
    "h20": {
        "1g": ("12gb", 11264, 10),
        "1g2": ("24gb", 23552, 10),
        "2g": ("24gb", 23552, 20),
        "3g": ("48gb", 47616, 32),
        "4g": ("48gb", 47616, 42),
        "7g": ("96gb", 95232, 78),
    },
    "h200": {
        "1g": ("18gb", 16384, 16),
        "1g2": ("35gb", 33280, 26),
        "2g": ("35gb", 33280, 32),
        "3g": ("71gb", 71424, 60),
        "4g": ("71gb", 71424, 64),
        "7g": ("141gb", 143360, 132),
    },
    "b200": {
        "1g": ("23gb", 20992, 18),
        "1g2": ("45gb", 45312, 30),
        "2g": ("45gb", 45312, 36),
        "3g": ("90gb", 91136, 70),
        "4g": ("90gb", 91136, 72),
        "7g": ("180gb", 182784, 148),
    },
    "a30": {
        "1g": ("6gb", 5952, 14),
        "2g": ("12gb", 11968, 28),
        "4g": ("24gb", 24000, 56),
    },
}


def _family(name: str) -> MigFamily:
    table = _TABLES[name]
    shapes = _SHAPES_A30 if name == "a30" else _SHAPES_8
    profiles: list[MigProfile] = []
    for shape, (pid, sm, mem, max_n, starts) in shapes.items():
        base = shape.removesuffix("+me")
        gb, mib, sms = table[base]
        g = base.removesuffix("2")
        suffix = "+me" if shape.endswith("+me") else ""
        profiles.append(MigProfile(f"{g}.{gb}{suffix}", shape, pid, sm, mem, mib, sms, max_n, starts))
    if name == "a30":
        return MigFamily(name, 4, 4, tuple(profiles))
    return MigFamily(name, 8, 7, tuple(profiles))


MIG_FAMILIES: dict[str, MigFamily] = {name: _family(name) for name in _TABLES}


def family_of(model: GpuModel | str) -> MigFamily:
    """The MIG family of a model; raises ``IllegalLayoutError`` when the model has no MIG."""
    m = model if isinstance(model, GpuModel) else gpu_model(model)
    if not m.mig_family:
        raise IllegalLayoutError(f"{m.name} does not support MIG")
    return MIG_FAMILIES[m.mig_family]


@functools.lru_cache(maxsize=64)
def family_model(family: str) -> GpuModel:
    """The first catalogue model of a MIG family (placement rules are per family, not per model)."""
    for m in GPU_MODELS:
        if m.mig_family == family:
            return m
    raise IllegalLayoutError(f"unknown MIG family {family!r}")


def mig_profiles(model: GpuModel | str) -> tuple[MigProfile, ...]:
    """All profiles of the model, in shape order (1g, 1g+me, 1g2, 2g, 3g, 4g, 7g)."""
    return family_of(model).profiles


def mig_profile(model: GpuModel | str, name: str) -> MigProfile:
    fam = family_of(model)
    p = fam.profile(name)
    if p is None:
        m = model if isinstance(model, GpuModel) else gpu_model(model)
        known = ", ".join(q.name for q in fam.profiles)
        raise IllegalLayoutError(f"profile {name!r} is not on {m.name} (profiles: {known})")
    return p


def layout_problems(model: GpuModel | str, instances: Iterable[MigInstance]) -> tuple[str, ...]:
    """Every reason the layout is illegal, in a fixed order; an empty tuple means legal."""
    try:
        fam = family_of(model)
    except IllegalLayoutError as exc:
        return (str(exc),)
    m = model if isinstance(model, GpuModel) else gpu_model(model)
    problems: list[str] = []
    used: dict[int, MigInstance] = {}
    counts: Counter[str] = Counter()
    sm_total = 0
    for inst in sorted(instances, key=lambda i: (i.start, i.profile)):
        p = fam.profile(inst.profile)
        if p is None:
            problems.append(f"profile {inst.profile!r} is not on {m.name}")
            continue
        counts[p.name] += 1
        sm_total += p.sm_slices
        if inst.start not in p.starts:
            problems.append(f"illegal start: {inst} ({p.name} may start at {list(p.starts)})")
            continue
        for slot in range(inst.start, inst.start + p.memory_slices):
            other = used.get(slot)
            if other is not None:
                problems.append(f"overlap: {inst} and {other} both use memory slice {slot}")
                break
        else:
            for slot in range(inst.start, inst.start + p.memory_slices):
                used[slot] = inst
    for name, n in sorted(counts.items()):
        p = fam.profile(name)
        if p is not None and n > p.max_instances:
            problems.append(f"too many instances: {n} x {name} (at most {p.max_instances})")
    if sm_total > fam.sm_slices:
        problems.append(f"too many compute slices: {sm_total} > {fam.sm_slices}")
    return tuple(problems)


def is_legal_layout(model: GpuModel | str, instances: Iterable[MigInstance]) -> bool:
    return not layout_problems(model, instances)


def validate_layout(model: GpuModel | str, instances: Iterable[MigInstance]) -> None:
    """Raise ``IllegalLayoutError`` with the first problem when the layout is illegal."""
    problems = layout_problems(model, instances)
    if problems:
        raise IllegalLayoutError(problems[0])


def _placement_order(p: MigProfile) -> tuple[int, int, str]:
    return (-p.memory_slices, -p.sm_slices, p.name)


def _iter_placements(fam: MigFamily, profiles: Sequence[MigProfile]) -> Iterator[tuple[MigInstance, ...]]:
    """Every legal placement of exactly ``profiles`` (identical profiles get increasing starts)."""
    order = sorted(profiles, key=_placement_order)
    n = len(order)
    if sum(p.sm_slices for p in order) > fam.sm_slices:
        return
    for name, k in Counter(p.name for p in order).items():
        prof = fam.profile(name)
        if prof is not None and k > prof.max_instances:
            return
    occupied = [False] * fam.memory_slots
    chosen: list[MigInstance] = []

    def rec(i: int) -> Iterator[tuple[MigInstance, ...]]:
        if i == n:
            yield tuple(chosen)
            return
        p = order[i]
        floor = chosen[-1].start + 1 if i > 0 and order[i - 1].name == p.name else 0
        for start in p.starts:
            if start < floor:
                continue
            span = range(start, start + p.memory_slices)
            if any(occupied[s] for s in span):
                continue
            for s in span:
                occupied[s] = True
            chosen.append(MigInstance(p.name, start))
            yield from rec(i + 1)
            chosen.pop()
            for s in span:
                occupied[s] = False

    yield from rec(0)


def _profiles_of(fam: MigFamily, names: Iterable[str]) -> list[MigProfile]:
    out: list[MigProfile] = []
    for name in names:
        p = fam.profile(name)
        if p is None:
            raise IllegalLayoutError(f"profile {name!r} is not in MIG family {fam.name}")
        out.append(p)
    return out


def find_placement(model: GpuModel | str, profile_names: Iterable[str]) -> tuple[MigInstance, ...] | None:
    """The first legal placement (largest profiles first, lowest starts first), or None."""
    fam = family_of(model)
    return next(_iter_placements(fam, _profiles_of(fam, profile_names)), None)


@dataclass(frozen=True, slots=True)
class MigLayout:
    """A placed layout: the requested instances plus the pool instances filling the free slots."""

    instances: tuple[MigInstance, ...]
    pool: tuple[MigInstance, ...]

    @property
    def all(self) -> tuple[MigInstance, ...]:
        return tuple(sorted((*self.instances, *self.pool), key=lambda i: (i.start, i.profile)))


def _pool_shapes(fam: MigFamily) -> list[MigProfile]:
    return sorted((p for p in fam.profiles if not p.media), key=_placement_order)


def _best_fill(
    fam: MigFamily, placed: tuple[MigInstance, ...]
) -> tuple[tuple[int, ...], tuple[MigInstance, ...]]:
    """Pool instances for the free slots maximising (memory MiB, SM slices, largest instance, -count)."""
    occupied = [False] * fam.memory_slots
    counts: Counter[str] = Counter()
    sm = 0
    for inst in placed:
        p = fam.profile(inst.profile)
        assert p is not None
        counts[p.name] += 1
        sm += p.sm_slices
        for s in range(inst.start, inst.start + p.memory_slices):
            occupied[s] = True
    shapes = _pool_shapes(fam)
    best_key: tuple[int, ...] = (0, 0, 0, 0)
    best: tuple[MigInstance, ...] = ()
    added: list[tuple[MigProfile, int]] = []

    def rec(min_start: int, sm_used: int) -> None:
        nonlocal best_key, best
        mem = sum(p.memory_mib for p, _ in added)
        key = (
            mem,
            sum(p.sm_slices for p, _ in added),
            max((p.memory_mib for p, _ in added), default=0),
            -len(added),
        )
        if key > best_key:
            best_key, best = key, tuple(MigInstance(p.name, s) for p, s in added)
        for start in range(min_start, fam.memory_slots):
            if occupied[start]:
                continue
            for p in shapes:
                if start not in p.starts or sm_used + p.sm_slices > fam.sm_slices:
                    continue
                if counts[p.name] >= p.max_instances:
                    continue
                span = range(start, start + p.memory_slices)
                if any(occupied[s] for s in span):
                    continue
                for s in span:
                    occupied[s] = True
                counts[p.name] += 1
                added.append((p, start))
                rec(start + p.memory_slices, sm_used + p.sm_slices)
                added.pop()
                counts[p.name] -= 1
                for s in span:
                    occupied[s] = False

    rec(0, sm)
    return best_key, best


@functools.lru_cache(maxsize=4096)
def _best_layout_cached(family: str, names: tuple[str, ...], fill_pool: bool) -> MigLayout | None:
    fam = MIG_FAMILIES[family]
    best: MigLayout | None = None
    best_key: tuple[int, ...] | None = None
    for placed in _iter_placements(fam, _profiles_of(fam, names)):
        if not fill_pool:
            return MigLayout(placed, ())
        key, pool = _best_fill(fam, placed)
        if best_key is None or key > best_key:
            best_key, best = key, MigLayout(placed, pool)
    return best


def best_layout(
    model: GpuModel | str, profile_names: Iterable[str], *, fill_pool: bool = True
) -> MigLayout | None:
    """Place ``profile_names`` so that the pool filling the rest is largest; None if they cannot fit.

    Among placements, the pool is compared by (total pool MiB, pool SM slices, largest pool instance
    MiB, fewer instances); ties keep the first placement in search order (largest first, low starts).
    """
    fam = family_of(model)
    return _best_layout_cached(fam.name, tuple(sorted(profile_names)), fill_pool)


def can_place(model: GpuModel | str, profile_names: Iterable[str]) -> bool:
    return best_layout(model, profile_names, fill_pool=False) is not None


def maximal_layouts(model: GpuModel | str) -> tuple[tuple[MigInstance, ...], ...]:
    """Every legal layout of standard shapes (no +me) to which no further instance can be added."""
    fam = family_of(model)
    shapes = _pool_shapes(fam)
    out: list[tuple[MigInstance, ...]] = []
    occupied = [False] * fam.memory_slots
    counts: Counter[str] = Counter()
    chosen: list[tuple[MigProfile, int]] = []

    def addable(p: MigProfile, start: int, sm_used: int) -> bool:
        return (
            start in p.starts
            and sm_used + p.sm_slices <= fam.sm_slices
            and counts[p.name] < p.max_instances
            and not any(occupied[s] for s in range(start, start + p.memory_slices))
        )

    def rec(min_start: int, sm_used: int) -> None:
        extended = False
        for start in range(fam.memory_slots):
            for p in shapes:
                if not addable(p, start, sm_used):
                    continue
                extended = True
                if start < min_start:
                    continue
                for s in range(start, start + p.memory_slices):
                    occupied[s] = True
                counts[p.name] += 1
                chosen.append((p, start))
                rec(start + p.memory_slices, sm_used + p.sm_slices)
                chosen.pop()
                counts[p.name] -= 1
                for s in range(start, start + p.memory_slices):
                    occupied[s] = False
        if not extended:
            out.append(tuple(MigInstance(p.name, s) for p, s in chosen))

    rec(0, 0)
    return tuple(out)
