"""Cluster / workload spec parsing: values and one-line errors naming source, key and value."""

import pytest

from gpupool.hardware.capability import GpuMode
from gpupool.hardware.spec import Isolation, Role, SpecError, load_cluster_spec, load_workload_spec

CLUSTER = {
    "nodes": [
        {"name": "gpu-a", "gpus": [{"model": "A100-SXM4-80GB", "count": 4}]},
        {"name": "gpu-b", "gpus": [{"model": "L40S-48GB", "count": 2}, "L4-24GB"]},
    ]
}


def test_cluster_expands_cards():
    c = load_cluster_spec(CLUSTER, source="c.yaml")
    ids = [g.gpu_id for g in c.gpus()]
    assert ids == ["gpu-a/0", "gpu-a/1", "gpu-a/2", "gpu-a/3", "gpu-b/0", "gpu-b/1", "gpu-b/2"]
    assert c.gpus()[-1].model.name == "L4-24GB"


def test_workload_defaults_and_estimate():
    ws = load_workload_spec(
        {
            "workloads": [
                {
                    "name": "guardrail",
                    "model": "qwen2.5-0.5b",
                    "priority": "P0",
                    "replicas": 2,
                    "max_context": 4096,
                    "concurrency": 16,
                    "isolation": "any",
                },
                {"name": "emb", "model": "bge-m3", "max_context": 512},
                {"name": "raw", "vram_mib": 12000, "priority": "p2"},
            ]
        },
        source="w.yaml",
    )
    g, e, r = ws.workloads
    assert g.role is Role.GUARDRAIL and g.isolation is Isolation.ANY and g.need_mib < 4096
    assert e.role is Role.EMBEDDING and e.priority == "P1"
    assert r.need_mib == 12000 and r.priority == "P2" and r.role is Role.BATCH


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (
            {"nodes": [{"name": "n", "gpus": [{"model": "A100-FOO"}]}]},
            "c.yaml: nodes[0].gpus[0].model='A100-FOO': unknown GPU model (known:",
        ),
        ({"nodes": [{"name": "n", "gpus": [{"model": "L40S", "count": 0}]}]}, "nodes[0].gpus[0].count=0"),
        ({"nodes": [{"name": "n", "gpus": [{"model": "L40S", "mode": "mig"}]}]}, "does not support MIG"),
        (
            {"nodes": [{"name": "n", "gpus": ["L4"]}, {"name": "n", "gpus": ["L4"]}]},
            "nodes[1].name='n': duplicate",
        ),
        ({"nodes": [{"name": "n", "gpu": ["L4"]}]}, "nodes[0].gpu=['L4']: unknown key"),
        ({"nodes": []}, "nodes=[]"),
        ([1, 2], "c.yaml: top level: expected a mapping, got list"),
        ({"nodes": [{"name": "a/b", "gpus": ["L4"]}]}, "nodes[0].name='a/b'"),
        ({"nodes": [{"name": "gpu-a\n", "gpus": ["L4"]}]}, "nodes[0].name='gpu-a\\n'"),
    ],
)
def test_cluster_errors_name_file_key_value(data, fragment):
    with pytest.raises(SpecError) as exc:
        load_cluster_spec(data, source="c.yaml")
    msg = str(exc.value)
    assert fragment in msg and "\n" not in msg and msg.startswith("c.yaml")


@pytest.mark.parametrize(
    ("w", "fragment"),
    [
        ({"name": "x", "model": "gpt-5"}, "workloads[0].model='gpt-5': unknown model (known:"),
        ({"name": "x"}, "give a catalogue model name or vram_mib"),
        ({"name": "x", "vram_mib": 10, "priority": "P7"}, "workloads[0].priority='P7'"),
        ({"name": "x", "vram_mib": 10, "isolation": "vgpu"}, "workloads[0].isolation='vgpu'"),
        ({"name": "x", "vram_mib": 10, "replicas": -1}, "workloads[0].replicas=-1"),
        ({"name": "x", "vram_mib": "lots"}, "workloads[0].vram_mib='lots'"),
        ({"name": "x", "model": "qwen3-8b", "max_context": 1_000_000}, "supports at most 40960"),
        ({"name": "x", "model": "qwen3-8b", "quant": "int3"}, "workloads[0].quant='int3'"),
        ({"name": "x", "vram_mib": 10, "replica": 2}, "workloads[0].replica=2: unknown key"),
        ({"name": "x\n", "vram_mib": 10}, "workloads[0].name='x\\n': expected a name"),
    ],
)
def test_workload_errors(w, fragment):
    with pytest.raises(SpecError) as exc:
        load_workload_spec({"workloads": [w]}, source="w.yaml")
    assert fragment in str(exc.value) and str(exc.value).startswith("w.yaml: ")


def test_duplicate_workload_name():
    with pytest.raises(SpecError, match=r"workloads\[1\].name='a': duplicate"):
        load_workload_spec({"workloads": [{"name": "a", "vram_mib": 1}, {"name": "a", "vram_mib": 1}]})


def test_forced_mode_and_uuids():
    c = load_cluster_spec(
        {
            "nodes": [
                {
                    "name": "n",
                    "gpus": [
                        {"model": "H100-SXM5-80GB", "count": 2, "mode": "mps", "uuids": ["GPU-1", "GPU-2"]}
                    ],
                }
            ]
        }
    )
    assert [g.mode for g in c.gpus()] == [GpuMode.MPS, GpuMode.MPS]
    assert [g.uuid for g in c.gpus()] == ["GPU-1", "GPU-2"]


def test_model_from_local_config(tmp_path):
    import json

    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_hidden_layers": 32,
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "intermediate_size": 14336,
                "vocab_size": 128256,
                "max_position_embeddings": 131072,
            }
        )
    )
    ws = load_workload_spec(
        {"workloads": [{"name": "l", "model": "./m", "max_context": 8192}]}, base_dir=tmp_path
    )
    assert ws.workloads[0].arch is not None and ws.workloads[0].arch.param_count == 8_030_261_248
