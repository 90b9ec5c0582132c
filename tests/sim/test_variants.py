"""The workload-variant generator (`gpupool.sim.variants`) and ``gpupool sim variants``.

Proves, on the golden 40-pod trace and 6-node cluster: a variant is a pure function of (base, name,
seed) and a different seed draws differently; each knob changes what its name says and nothing
else (share: the sharing pods' share of the GPU request, task count kept; multi: the multi-GPU
share, by appending renamed copies; cpu: the CPU of GPU pods only, capped at the largest node that
could host the pod; spec: the share of pinned GPU pods, each to a model that can host it); knobs draw
from their own streams, so a combination equals the knobs applied one after another; a written
variant loads back unchanged; bad names exit 2 naming the variant and token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli.main import app
from gpupool.core.errors import InvalidInput
from gpupool.sim.trace import load_nodes, load_pods
from gpupool.sim.variants import (
    make_variant,
    parse_variant,
    stats,
    with_cpu,
    with_multi,
    write_pods,
)

GOLDEN = Path(__file__).with_name("golden")
NODES = load_nodes(GOLDEN / "nodes.csv")
PODS = load_pods(GOLDEN / "pods.csv")


def _without(p: object, *fields: str) -> tuple[object, ...]:
    keep = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec")
    return tuple(getattr(p, f) for f in keep if f not in fields)


def test_same_seed_same_variant_other_seed_other_draws() -> None:
    for name in ("share60", "multi40", "spec33", "share20-multi30-cpu150-spec10"):
        assert make_variant(PODS, NODES, name, seed=7) == make_variant(PODS, NODES, name, seed=7)
    for name in ("share60", "spec33", "share20"):
        assert make_variant(PODS, NODES, name, seed=7) != make_variant(PODS, NODES, name, seed=8), name


def test_base_is_the_input() -> None:
    assert make_variant(PODS, NODES, "base", seed=1) == PODS


@pytest.mark.parametrize("pct", [20, 60, 100])
def test_share_knob_sets_the_sharing_share_of_the_gpu_request(pct: int) -> None:
    before = stats(PODS)
    v = make_variant(PODS, NODES, f"share{pct}", seed=3)
    after = stats(v)
    assert len(v) == len(PODS) and [p.name for p in v] == [p.name for p in PODS]
    assert before.sharing_pct != pytest.approx(pct, abs=5)  # the knob had something to do
    # one converted pod moves the share by at most 1000 milli of the request
    step = 100.0 * 1000 / after.gpu_request_milli
    if pct > before.sharing_pct:
        assert pct <= after.sharing_pct < pct + step
    else:
        assert pct - step < after.sharing_pct <= pct
    assert [p.num_gpu == 0 for p in v] == [p.num_gpu == 0 for p in PODS]  # CPU-only pods untouched


def test_multi_knob_appends_renamed_copies_until_the_share_is_reached() -> None:
    v = make_variant(PODS, NODES, "multi40", seed=3)
    assert v[: len(PODS)] == PODS
    extra = v[len(PODS) :]
    assert extra and all(p.num_gpu > 1 for p in extra)
    assert len({p.name for p in v}) == len(v)
    assert stats(v).multi_pct >= 40 > stats(v[:-1]).multi_pct
    assert stats(PODS).multi_pct < 40


def test_cpu_knob_scales_gpu_pods_only_and_caps_at_the_largest_host() -> None:
    v = make_variant(PODS, NODES, "cpu300", seed=3)
    for old, new in zip(PODS, v, strict=True):
        assert _without(old, "cpu_milli") == _without(new, "cpu_milli")
        if old.num_gpu == 0:
            assert new.cpu_milli == old.cpu_milli
        else:
            cap = max(nd.cpu_milli for nd in NODES if nd.gpu_count >= old.num_gpu)
            assert new.cpu_milli == min(3 * old.cpu_milli, max(cap, old.cpu_milli))
    assert any(n.cpu_milli == 3 * o.cpu_milli > 0 for o, n in zip(PODS, v, strict=True))
    assert any(n.cpu_milli < 3 * o.cpu_milli for o, n in zip(PODS, v, strict=True))  # the cap bit
    assert all(p.cpu_milli == 0 for p in make_variant(PODS, NODES, "cpu0", seed=3) if p.num_gpu)


def test_spec_knob_pins_that_share_of_gpu_pods_to_a_model_that_fits() -> None:
    v = make_variant(PODS, NODES, "spec50", seed=3)
    gpu = [p for p in v if p.num_gpu]
    assert sum(1 for p in gpu if p.gpu_spec) == len(gpu) * 50 // 100
    for old, new in zip(PODS, v, strict=True):
        assert _without(old, "gpu_spec") == _without(new, "gpu_spec")
        if new.gpu_spec != old.gpu_spec:
            assert not old.gpu_spec and len(new.gpu_spec) == 1
            (model,) = new.gpu_spec
            assert any(
                nd.gpu_model == model and nd.gpu_count >= new.num_gpu and nd.cpu_milli >= new.cpu_milli
                for nd in NODES
            )


def test_knobs_draw_from_their_own_streams() -> None:
    combo = make_variant(PODS, NODES, "multi40-cpu200", seed=5)
    assert combo == tuple(with_cpu(with_multi(PODS, 40, 5), 200, NODES))
    # the multi-GPU copies do not depend on whether the cpu knob is turned too
    multi = make_variant(PODS, NODES, "multi40", seed=5)
    assert [p.name for p in combo] == [p.name for p in multi]


def test_written_variant_loads_back_unchanged(tmp_path: Path) -> None:
    v = make_variant(PODS, NODES, "share60-multi30-spec33", seed=2)
    write_pods(v, tmp_path / "v.csv")
    assert load_pods(tmp_path / "v.csv") == v


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("cpu400", "cpu must be in [0, 300] %, got 400"),
        ("cpu9999", "cpu must be in [0, 300] %, got 9999"),
        ("share0", "share must be in [1, 100] %"),
        ("gpu20", "token 'gpu20'"),
        ("cpu100-cpu200", "knob cpu given twice"),
        ("", "token ''"),
    ],
)
def test_bad_names_name_the_variant_and_token(name: str, message: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_variant(name)
    assert f"invalid variant={json.dumps(name)}" in str(err.value) and message in str(err.value)


def test_cli_writes_reproducible_files_and_rejects_bad_names(tmp_path: Path) -> None:
    base = ["sim", "variants", "--pods", str(GOLDEN / "pods.csv"), "--nodes", str(GOLDEN / "nodes.csv")]
    for out in ("a", "b"):
        r = CliRunner().invoke(
            app, [*base, "--out", str(tmp_path / out), "--variants", "base,share60,multi40"]
        )
        assert r.exit_code == 0, r.output
        assert "share60\t40\t" in r.output
    for name in ("base", "share60", "multi40"):
        f = f"openb_pod_list_{name}.csv"
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    assert load_pods(tmp_path / "a" / "openb_pod_list_share60.csv") == make_variant(
        PODS, NODES, "share60", seed=1
    )
    for args, msg in (
        (["--variants", "share60,bogus"], 'invalid variant="bogus"'),
        (["--variants", "share60,share60"], "'share60' is the same variant as 'share60'"),
        (["--variants", "cpu050,cpu50"], "'cpu50' is the same variant as 'cpu050'"),
        (["--variants", "cpu0-share20,share20-cpu0"], "is the same variant as"),
        (["--seed", "-1"], "invalid --seed=-1: must be in [0, 4294967295]"),
    ):
        r = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "c"), *args])
        assert r.exit_code == 2, (args, r.output)
        assert msg in r.output and len(r.output.strip().splitlines()) == 1
    assert not (tmp_path / "c").exists()  # bad input writes nothing
    (tmp_path / "a-file").write_text("")
    data = tmp_path / "data" / "alibaba-gpu-v2023"  # a data root of the golden lists (works in a clone)
    data.mkdir(parents=True)
    (data / "openb_node_list_gpu_node.csv").write_bytes((GOLDEN / "nodes.csv").read_bytes())
    (data / "openb_pod_list_default.csv").write_bytes((GOLDEN / "pods.csv").read_bytes())
    report = ["sim", "report", "--variants", "base", "--bound", "none", "--data", str(data.parent)]
    for out, msg in (
        (tmp_path / "a-file", "not a directory"),
        (tmp_path / "a-file" / "sub", "cannot create it"),
    ):
        r = CliRunner().invoke(app, [*base, "--out", str(out), "--variants", "base"])
        assert r.exit_code == 2 and f"invalid --out={str(out)!r}: {msg}" in r.output, r.output
        r = CliRunner().invoke(app, [*report, "--out", str(out)])
        assert r.exit_code == 2 and f"invalid --out={str(out)!r}: {msg}" in r.output, r.output


def test_a_knob_that_finds_nothing_to_copy_names_the_whole_variant_and_why() -> None:
    """share100 turns the base's multi-GPU pod into a sharing one: multi<P> after it has nothing to
    copy, and the error says so (not "the base has none", which is false) under the variant's name."""
    assert any(p.num_gpu > 1 for p in PODS)
    with pytest.raises(InvalidInput) as err:
        make_variant(PODS, NODES, "share100-multi40", seed=1)
    assert 'invalid variant="share100-multi40": share100 turns every multi-GPU pod' in str(err.value)
    sharing_only = [p for p in PODS if p.is_sharing]
    with pytest.raises(InvalidInput, match='invalid variant="cpu50-share60": the base has no whole 1-GPU'):
        make_variant(sharing_only, NODES, "cpu50-share60", seed=1)


def test_knob_values_are_ascii_digits() -> None:
    with pytest.raises(InvalidInput, match="token 'cpu\u0665\u0660'"):
        parse_variant("cpu\u0665\u0660")  # Arabic-Indic 50: int() reads it, a file name should not


def test_cli_bad_variant_or_node_list_writes_nothing(tmp_path: Path) -> None:
    """The first variant is valid, the second is not: no file of the first is left behind (all are
    made before any is written); a node list without a GPU node is refused (nothing sizes cpu/spec)."""
    base = ["sim", "variants", "--pods", str(GOLDEN / "pods.csv")]
    out = tmp_path / "out"
    r = CliRunner().invoke(
        app,
        [
            *base,
            "--nodes",
            str(GOLDEN / "nodes.csv"),
            "--out",
            str(out),
            "--variants",
            "cpu50,share100-multi40",
        ],
    )
    assert r.exit_code == 2 and 'invalid variant="share100-multi40"' in r.output, r.output
    assert not out.exists()
    no_gpu = tmp_path / "cpu_nodes.csv"
    no_gpu.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,64000,1024,0,\n")
    r = CliRunner().invoke(app, [*base, "--nodes", str(no_gpu), "--out", str(out), "--variants", "cpu300"])
    assert r.exit_code == 2 and f"{no_gpu}: no node has a GPU" in r.output, r.output
    assert not out.exists()
    data = tmp_path / "data" / "alibaba-gpu-v2023"
    data.mkdir(parents=True)
    (data / "openb_node_list_gpu_node.csv").write_bytes((GOLDEN / "nodes.csv").read_bytes())
    (data / "openb_pod_list_default.csv").write_bytes((GOLDEN / "pods.csv").read_bytes())
    report = [
        "sim",
        "report",
        "--data",
        str(data.parent),
        "--out",
        str(out),
        "--cache",
        str(tmp_path / "cache"),
    ]
    r = CliRunner().invoke(app, [*report, "--variants", "cpu50,share100-multi40"])
    assert r.exit_code == 2 and 'invalid variant="share100-multi40"' in r.output, r.output
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_cli_refuses_a_base_without_gpu_pods(tmp_path: Path) -> None:
    """A variant with no GPU pod gives the experiment nothing to run (`sim fgd` refuses it): said
    when the variants are made, with nothing written."""
    cpu_only = tmp_path / "cpu_only.csv"
    cpu_only.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1,0,0\n")
    out = tmp_path / "out"
    args = [
        "sim",
        "variants",
        "--pods",
        str(cpu_only),
        "--nodes",
        str(GOLDEN / "nodes.csv"),
        "--out",
        str(out),
    ]
    r = CliRunner().invoke(app, [*args, "--variants", "cpu200"])
    assert r.exit_code == 2 and f"{cpu_only}: no pod asks for a GPU" in r.output, r.output
    assert not out.exists()
