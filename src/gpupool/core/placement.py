"""Where a request may go, for admission: could it ever fit, where does it fit now outside the units
held by queued requests, and which units should it hold while it waits.

Role: the capacity side of the admission rule written in `gpupool.core.admission`. Read-only over an
`Allocator`'s ledger except `place`, which commits its answer through the allocator. A *scope* restricts
the slices: ``gpu_id`` (one GPU), ``request.nodes``, and for request leases ``kv_models`` (KV slice
id -> model, the request's model must match).

Invariants:
- a request *could use* a slice when the slice is in its scope, healthy, of a kind it accepts and
  large enough (capacity) for its demand; an N-GPU request could use N whole cards of one node;
- `hold_target` only names units the request could use, so a hold never blocks unrelated capacity;
- `fit_now` never answers a unit in ``avoid`` nor, for sheddable work, one on a paused GPU;
- every answer is deterministic (ties by slice id / node name).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from gpupool.core.allocator import Allocator
from gpupool.core.ledger import SliceState
from gpupool.core.model import Request
from gpupool.core.outcome import Outcome, OutcomeCode

NO_UNITS: frozenset[str] = frozenset()


def _scoped(
    alloc: Allocator, request: Request, gpu_id: str, kv_models: Mapping[str, str] | None
) -> Iterator[SliceState]:
    ledger = alloc.ledger
    ids = ledger.on_gpu(gpu_id) if gpu_id and kv_models is None else ledger.slice_ids()
    for sid in ids:
        if kv_models is not None and kv_models.get(sid) != request.model:
            continue
        st = ledger.state(sid)
        if gpu_id and st.slice.gpu_id != gpu_id:
            continue
        if request.nodes and st.slice.node not in request.nodes:
            continue
        yield st


def _could_use(st: SliceState, request: Request) -> bool:
    return st.healthy and request.accepts(st.slice.kind) and request.demand.fits_in(st.slice.capacity)


def _plain(request: Request, gpu_id: str, kv_models: Mapping[str, str] | None) -> bool:
    """No scope beyond kinds: the ledger's shape groups answer without a scan."""
    return kv_models is None and not gpu_id and not request.nodes and request.gpu_count == 1


def _card_nodes(alloc: Allocator, request: Request) -> Iterator[tuple[str, list[str]]]:
    """(node, its healthy WHOLE cards large enough for the demand) for each allowed node."""
    ledger = alloc.ledger
    for node, ids in sorted(ledger.whole_nodes().items()):
        if request.nodes and node not in request.nodes:
            continue
        cards = [
            sid
            for sid in ids
            if ledger.is_healthy(sid) and request.demand.fits_in(ledger.slice(sid).capacity)
        ]
        yield node, cards


SHOW_NODES = 4
SHOW_NODE_CHARS = 64


def _nodes_text(nodes: frozenset[str]) -> str:
    """``nodes a, b`` for a short list; past `SHOW_NODES` names (or a name past `SHOW_NODE_CHARS`)
    the first ones, cut, and how many: a request's node list may be long, its error stays short."""
    names = sorted(nodes)
    shown = [n if len(n) <= SHOW_NODE_CHARS else n[: SHOW_NODE_CHARS - 3] + "..." for n in names[:SHOW_NODES]]
    if len(names) <= SHOW_NODES:
        return f"nodes {', '.join(shown)}"
    return f"nodes {', '.join(shown)}, ... ({len(names)} nodes)"


def unresolvable(
    alloc: Allocator, request: Request, *, gpu_id: str = "", kv_models: Mapping[str, str] | None = None
) -> str | None:
    """Why no healthy slice in scope could ever hold ``request`` (None: some could)."""
    if request.gpu_count > 1:
        if any(len(cards) >= request.gpu_count for _, cards in _card_nodes(alloc, request)):
            return None
        where = _nodes_text(request.nodes) if request.nodes else "any node"
        return (
            f"no node ({where}) has {request.gpu_count} healthy whole GPUs that could hold "
            f"{request.demand} each"
        )
    if _plain(request, gpu_id, kv_models):
        for g in alloc.ledger.groups():
            if g.num_healthy and request.accepts(g.key[0]) and request.demand.fits_in(g.capacity):
                return None
    elif any(_could_use(st, request) for st in _scoped(alloc, request, gpu_id, kv_models)):
        return None
    if kv_models is not None:
        where = f"model {request.model}"
    elif gpu_id:
        where = f"GPU {gpu_id}"
    elif request.nodes:
        where = _nodes_text(request.nodes)
    else:
        where = "the pool"
    kinds = ", ".join(sorted(k.value for k in request.kinds)) if request.kinds else "any"
    return f"no healthy slice of {where} of kind {kinds} could ever hold {request.demand}"


def fit_now(
    alloc: Allocator,
    request: Request,
    *,
    gpu_id: str = "",
    kv_models: Mapping[str, str] | None = None,
    paused: frozenset[str] | set[str] = frozenset(),
    avoid: frozenset[str] = NO_UNITS,
) -> tuple[tuple[str, ...] | None, bool]:
    """(slice ids to place on now, or None; whether paused GPUs alone had room).

    One GPU: slices best fit (least VRAM left), request leases most free first (spread load)."""
    if request.gpu_count > 1:
        return _cards_now(alloc, request, paused, avoid)
    best: tuple[int, int, str] | None = None
    held_back = False
    need = request.demand
    for st in _scoped(alloc, request, gpu_id, kv_models):
        s = st.slice
        if s.id in avoid or not st.healthy or not request.accepts(s.kind) or not need.fits_in(st.free):
            continue
        if s.gpu_id in paused:
            held_back = True
            continue
        left = -st.free.vram_mib if kv_models is not None else st.free.vram_mib - need.vram_mib
        key = (left, st.free.compute_milli - need.compute_milli, s.id)
        if best is None or key < best:
            best = key
    return (None, held_back) if best is None else ((best[2],), False)


def place(
    alloc: Allocator,
    request: Request,
    *,
    gpu_id: str = "",
    kv_models: Mapping[str, str] | None = None,
    paused: frozenset[str] | set[str] = frozenset(),
    avoid: frozenset[str] = NO_UNITS,
    preempt: bool = False,
    retry_after_s: float = 1.0,
) -> Outcome:
    """Grant ``request`` now outside ``avoid`` (and, for sheddable work, off ``paused`` GPUs): the
    allocator's own search when nothing is excluded, else `fit_now`; preemption (``preempt``) only
    when nothing is held. BACKPRESSURE when paused GPUs alone had room, else NO_CAPACITY."""
    plain = kv_models is None and not gpu_id
    if plain and not paused and not avoid:
        return alloc.allocate(request, preempt=preempt)
    slice_ids, held_back = fit_now(
        alloc, request, gpu_id=gpu_id, kv_models=kv_models, paused=paused, avoid=avoid
    )
    if slice_ids is not None:
        return alloc.place(request, slice_ids)
    if held_back:
        return Outcome(
            OutcomeCode.BACKPRESSURE,
            reason="only GPUs above the VRAM/temperature watermark have room for sheddable work",
            retry_after_s=retry_after_s,
        )
    if preempt and plain and not avoid:
        return alloc.allocate(request, preempt=True)
    return Outcome(OutcomeCode.NO_CAPACITY, reason="no slice has room now")


def _cards_now(
    alloc: Allocator, request: Request, paused: frozenset[str] | set[str], avoid: frozenset[str]
) -> tuple[tuple[str, ...] | None, bool]:
    ledger = alloc.ledger
    n = request.gpu_count
    best: tuple[int, str, tuple[str, ...]] | None = None
    held_back = False
    for node, cards in _card_nodes(alloc, request):
        free = ledger.free_whole(node)
        open_ = [sid for sid in cards if sid in free and sid not in avoid]
        usable = sorted(
            (ledger.slice(sid).capacity.vram_mib, sid)
            for sid in open_
            if ledger.slice(sid).gpu_id not in paused
        )
        if len(usable) < n:
            held_back = held_back or len(open_) >= n
            continue
        key = (len(usable), node, tuple(sorted(sid for _, sid in usable[:n])))
        if best is None or key < best:
            best = key
    return (None, held_back) if best is None else (best[2], False)


def hold_target(
    alloc: Allocator,
    request: Request,
    *,
    gpu_id: str = "",
    kv_models: Mapping[str, str] | None = None,
    held: frozenset[str] = NO_UNITS,
) -> frozenset[str]:
    """The units a waiting ``request`` holds: the slice it could use that is closest to having room
    (most free VRAM, then compute; one not yet ``held`` by an earlier item first), or for N GPUs the
    N cards of the node with the most free of them. Empty when nothing in scope could take it."""
    ledger = alloc.ledger
    if request.gpu_count > 1:
        return _cards_hold(alloc, request)
    if _plain(request, gpu_id, kv_models):
        top: tuple[int, int, str] | None = None
        for g in ledger.groups():
            if g.num_healthy and request.accepts(g.key[0]) and request.demand.fits_in(g.capacity):
                lf = ledger.largest_free(g.key)
                if lf is not None and (top is None or lf[:2] > top[:2]):
                    top = lf
        return NO_UNITS if top is None else frozenset({top[2]})
    pick: tuple[bool, int, int, str] | None = None
    for st in _scoped(alloc, request, gpu_id, kv_models):
        if not _could_use(st, request):
            continue
        key = (st.slice.id not in held, st.free.vram_mib, st.free.compute_milli, st.slice.id)
        if pick is None or key > pick:
            pick = key
    return NO_UNITS if pick is None else frozenset({pick[3]})


def _cards_hold(alloc: Allocator, request: Request) -> frozenset[str]:
    ledger = alloc.ledger
    n = request.gpu_count
    best: tuple[int, int, str] | None = None
    best_cards: list[str] = []
    for node, cards in _card_nodes(alloc, request):
        if len(cards) < n:
            continue
        by_room = sorted(cards, key=lambda sid: (-ledger.free(sid).vram_mib, sid))[:n]
        free_count = sum(1 for sid in by_room if sid in ledger.free_whole(node))
        room = sum(ledger.free(sid).vram_mib for sid in by_room)
        key = (free_count, room, node)
        if best is None or key[:2] > best[:2]:
            best, best_cards = key, by_room
    return frozenset(best_cards)


__all__ = ["NO_UNITS", "fit_now", "hold_target", "place", "unresolvable"]
