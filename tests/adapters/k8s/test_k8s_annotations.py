"""Versioned annotation codecs: round trips, canonical encoding, bad input naming the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.adapters.k8s.annotations import (
    PlacedGrant,
    Placement,
    decode_placement,
    decode_slices,
    encode_placement,
    encode_slices,
)
from gpupool.adapters.k8s.resources import ResourceNames, parse_pod
from gpupool.core.errors import InvalidInput
from gpupool.core.model import Grant, Lease, Request
from gpupool.hardware.slices import Slice, SliceKind
from gpupool.hardware.units import Resources

kinds = st.sampled_from(list(SliceKind))
text = st.text(min_size=0, max_size=12)

grants = st.builds(
    PlacedGrant,
    slice_id=text,
    gpu_id=text,
    uuid=text,
    kind=kinds,
    index=st.integers(0, 64),
    profile=text,
    vram_mib=st.integers(1, 2**24),
    compute_milli=st.integers(0, 1000),
    shared=st.booleans(),
)
placements = st.builds(
    Placement,
    lease_id=text,
    pod_uid=text,
    namespace=text,
    name=text,
    container=text,
    node=text,
    priority=st.integers(-(10**9), 10**9),
    preemptible=st.booleans(),
    vram_mib=st.integers(1, 2**24),
    compute_milli=st.integers(0, 1000),
    gpu_count=st.integers(1, 8),
    kinds=st.lists(kinds, max_size=3, unique=True).map(lambda ks: tuple(sorted(ks))),
    grants=st.lists(grants, min_size=1, max_size=4).map(tuple),
    bound_at=st.floats(0, 2e9, allow_nan=False),
)


@given(placements)
def test_placement_round_trip(p: Placement) -> None:
    text = encode_placement(p)
    assert decode_placement(text) == p
    assert encode_placement(decode_placement(text)) == text
    assert json.loads(text)["version"] == 1


@given(
    st.lists(
        st.builds(
            Slice,
            id=st.text(min_size=1, max_size=8),
            node=st.just("n1"),
            gpu_id=st.text(min_size=1, max_size=8),
            kind=kinds,
            capacity=st.builds(Resources, st.integers(1, 2**20), st.integers(0, 1000)),
            healthy=st.booleans(),
            gpu_index=st.integers(0, 16),
            gpu_model=text,
            profile=text,
            uuid=text,
        ),
        max_size=6,
    )
)
def test_slices_round_trip(slices: list[Slice]) -> None:
    assert decode_slices(encode_slices(slices), node="n1") == slices


def test_placement_to_lease_and_back() -> None:
    s = Slice("n/0/whole", "n", "n/0", SliceKind.WHOLE, Resources(81920, 1000), gpu_index=0, uuid="GPU-1")
    req = Request(
        id="uid-1",
        tenant="ns",
        priority=-1,
        demand=Resources(4096, 250),
        ttl_s=60.0,
        labels=(("pod", "ns/p"),),
    )
    lease = Lease(
        id="L1",
        request=req,
        node="n",
        grants=(Grant("n/0/whole", "n/0", Resources(4096, 250)),),
        granted_at=5.0,
        expires_at=65.0,
    )
    p = Placement.of_lease(lease, {s.id: s}, namespace="ns", name="p", container="c", bound_at=1.5)
    assert p.preemptible and p.grants[0].shared and p.grants[0].uuid == "GPU-1"
    back = p.to_lease(granted_at=5.0, ttl_s=60.0)
    assert back.id == lease.id and back.grants == lease.grants and back.request.demand == req.demand
    assert back.request.is_preemptible and back.node == "n"


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(version=2), "placement.version"),
        (lambda d: d.pop("lease"), "placement.lease"),
        (lambda d: d.update(priority="high"), "placement.priority"),
        (lambda d: d["grants"][0].update(kind="fpga"), "placement.grants[0].kind"),
        (lambda d: d["grants"][0].update(vram_mib=True), "placement.grants[0].vram_mib"),
        (lambda d: d.update(grants=[]), "placement.grants"),
        (lambda d: d["pod"].pop("uid"), "placement.pod.uid"),
    ],
)
def test_bad_placements_name_the_field(mutate: object, field: str) -> None:
    p = Placement(
        "L",
        "U",
        "ns",
        "p",
        "c",
        "n",
        0,
        False,
        1,
        0,
        1,
        (),
        (PlacedGrant("s", "g", "", SliceKind.WHOLE, 0, "", 1, 0, True),),
        1.0,
    )
    d = json.loads(encode_placement(p))
    mutate(d)  # type: ignore[operator]
    with pytest.raises(InvalidInput) as err:
        decode_placement(json.dumps(d))
    assert err.value.field == field
    with pytest.raises(InvalidInput, match="not JSON"):
        decode_placement("{nope")


def test_custom_domain_and_priority_classes() -> None:
    names = ResourceNames("example.com")
    pod = {
        "metadata": {"name": "x", "uid": "u"},
        "spec": {
            "priorityClassName": "gpupool-p2",
            "containers": [
                {
                    "name": "c",
                    "resources": {"requests": {"example.com/vram-mib": 512, "example.com/compute-pct": "7"}},
                }
            ],
        },
    }
    d = parse_pod(pod, names)
    assert d is not None and (d.vram_mib, d.compute_milli, d.priority, d.gpu_count) == (512, 70, -1, 1)
    assert parse_pod(pod) is None
    whole = {
        "metadata": {"name": "w"},
        "spec": {
            "priority": 5_000_000_000,
            "containers": [{"name": "c", "resources": {"limits": {"gpupool.io/gpu": "2"}}}],
        },
    }
    d = parse_pod(whole)
    assert d is not None and (d.vram_mib, d.compute_milli, d.gpu_count, d.priority) == (1, 1000, 2, 10**9)
    assert d.uid == "default/w"


@pytest.mark.parametrize("quantity", ["\u00b2", "1\u00b2", "\u2460"])
def test_a_quantity_of_non_ascii_digits_is_invalid_input_naming_it(quantity: str) -> None:
    """``str.isdigit`` accepts superscripts and circled digits that ``int()`` refuses (a ValueError,
    a 500 from the extender); such a quantity is invalid input naming the resource."""
    pod = {
        "metadata": {"name": "q"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"gpupool.io/gpu": quantity}}}]},
    }
    with pytest.raises(InvalidInput, match=r"gpupool\.io/gpu"):
        parse_pod(pod)


def _asking(quantities: dict[str, object]) -> dict[str, object]:
    return {
        "metadata": {"name": "q"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": quantities}}]},
    }


@pytest.mark.parametrize(
    ("vram", "gpu", "want"),
    [
        ("8k", "1", (8000, 1)),
        ("40k", "2", (40000, 2)),
        ("1Ki", "1", (1024, 1)),
        ("36Ki", "1", (36864, 1)),
        ("1e3", "1", (1000, 1)),
        ("1E3", "+1", (1000, 1)),
        ("2000m", "2000m", (2, 2)),
        ("8000.0", "1.", (8000, 1)),
    ],
)
def test_quantities_in_kubernetes_canonical_form_parse_to_their_value(
    vram: str, gpu: str, want: tuple[int, int]
) -> None:
    """The API server re-emits every quantity in canonical form ("8000" becomes "8k"), and that is
    what kube-scheduler sends the extender: such a pod was refused as having a unit suffix."""
    d = parse_pod(_asking({"gpupool.io/vram-mib": vram, "gpupool.io/gpu": gpu}))
    assert d is not None and (d.vram_mib, d.gpu_count) == want


@pytest.mark.parametrize(
    ("quantity", "why"),
    [
        ("0.5", "whole number"),
        ("1500m", "whole number"),
        ("-8k", r"\[1, "),
        ("1e999999999", r"\[1, "),
        ("-1e999999999", r"\[1, "),
        ("1e-999999999", "whole number"),
        ("1" * 200, r"\[1, "),
        ("8kb", "quantity"),
        ("1 k", "quantity"),
        ("", "quantity"),
        ("k", "quantity"),
        ("0x10", "quantity"),
    ],
)
def test_a_quantity_that_is_not_a_whole_number_in_range_names_the_field(quantity: str, why: str) -> None:
    with pytest.raises(InvalidInput, match=rf"gpupool\.io/vram-mib.*{why}"):
        parse_pod(_asking({"gpupool.io/vram-mib": quantity}))
