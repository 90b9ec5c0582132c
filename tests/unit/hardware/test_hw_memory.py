"""Model memory estimator against the fact sheet's worked numbers (gpu-facts.md 7.2-7.3)."""

import json

import pytest

from gpupool.hardware.memory import (
    estimate,
    kv_bytes_per_token,
    kv_bytes_per_token_of,
    kv_tokens_that_fit,
    weights_bytes,
)
from gpupool.hardware.models import (
    MODEL_CATALOGUE,
    BadModelConfigError,
    UnknownModelError,
    arch_from_hf_config,
    load_hf_config,
    model_arch,
)

GIB = 1024**3

# model: (params in billions, bf16 GiB, int4 real GiB or None, KV bytes/token bf16)
FACTS = {
    "qwen2.5-0.5b": (0.49, 0.92, None, 12288),
    "qwen2.5-1.5b": (1.54, 2.88, None, 28672),
    "qwen2.5-7b": (7.62, 14.19, 5.2, 57344),
    "qwen2.5-14b": (14.77, 27.51, 9.3, 196608),
    "qwen2.5-32b": (32.76, 61.03, 18.0, 262144),
    "qwen2.5-72b": (72.71, 135.43, 38.6, 327680),
    "qwen3-0.6b": (0.60, 1.11, None, 114688),
    "qwen3-8b": (8.19, 15.26, 5.7, 147456),
    "qwen3-14b": (14.77, 27.51, 9.3, 163840),
    "qwen3-32b": (32.76, 61.02, 18.0, 262144),
    "qwen3-30b-a3b": (30.53, 56.87, None, 98304),
    "llama-3.1-8b": (8.03, 14.96, 5.3, 131072),
    "llama-3.1-70b": (70.55, 131.42, 37.0, 327680),
    "bge-large-en-v1.5": (0.3351, 0.62, None, 0),
    "bge-m3": (0.5678, 1.06, None, 0),
    "bge-reranker-v2-m3": (0.5678, 1.06, None, 0),
    "bge-reranker-large": (0.5599, 1.04, None, 0),
}


@pytest.mark.parametrize("name", sorted(FACTS))
def test_catalogue_matches_fact_sheet(name):
    params_b, bf16_gib, int4_gib, kv = FACTS[name]
    arch = model_arch(name)
    assert arch.param_count / 1e9 == pytest.approx(params_b, rel=0.01)
    assert weights_bytes(arch, "bf16") / GIB == pytest.approx(bf16_gib, rel=0.01)
    if int4_gib is not None:
        assert weights_bytes(arch, "awq") / GIB == pytest.approx(int4_gib, abs=0.15)
    assert kv_bytes_per_token_of(arch) == kv


def test_kv_formula():
    assert kv_bytes_per_token(64, 8, 128, dtype_bytes=2) == 262144
    assert kv_bytes_per_token(64, 8, 128, dtype_bytes=1) == 131072


def test_estimate_parts_and_monotone():
    e = estimate("qwen2.5-32b", quant="awq", max_context=16384, concurrency=4)
    assert e.kv_cache_mib == 16 * 1024
    assert e.total_mib == e.weights_mib + e.kv_cache_mib + e.overhead_mib
    assert 35_000 < e.total_mib < 40_192  # fits a 3g.40gb on A100-80GB
    assert estimate("qwen2.5-32b", quant="awq", max_context=16384, concurrency=5).total_mib > e.total_mib
    assert estimate("qwen2.5-32b", quant="fp8", max_context=16384, concurrency=4).weights_mib > e.weights_mib


def test_encoder_has_no_kv():
    e = estimate("bge-m3", max_context=512, concurrency=32)
    assert e.kv_cache_mib == 0 and e.activation_mib > 0
    assert e.total_mib < 9728  # fits a 1g.10gb


def test_guardrail_small():
    assert estimate("qwen2.5-0.5b", max_context=4096, concurrency=16).total_mib < 4096


def test_kv_tokens_that_fit():
    # Qwen2.5-7B int4 in a 1g.10gb: weights ~5.2 GiB leave room for KV
    n = kv_tokens_that_fit("qwen2.5-7b", 9728, quant="int4")
    assert 40_000 < n < 80_000
    assert kv_tokens_that_fit("qwen2.5-7b", 9728, quant="bf16") == 0


def test_lookup_normalisation_and_unknown():
    assert model_arch("Qwen/Qwen2.5-7B-Instruct").name == "qwen2.5-7b"
    assert model_arch("bge-reranker").name == "bge-reranker-v2-m3"
    with pytest.raises(UnknownModelError, match="unknown model 'gpt-5'"):
        model_arch("gpt-5")


def test_hf_config_roundtrip(tmp_path):
    cfg = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "num_hidden_layers": 36,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 12288,
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    arch = load_hf_config(tmp_path)
    assert arch.param_count == MODEL_CATALOGUE["qwen3-8b"].param_count
    assert kv_bytes_per_token_of(arch) == 147456
    e = estimate(str(tmp_path / "config.json"), max_context=8192)
    assert e.kv_cache_mib == 1152


def test_hf_config_encoder():
    cfg = {
        "architectures": ["XLMRobertaModel"],
        "model_type": "xlm-roberta",
        "num_hidden_layers": 24,
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "intermediate_size": 4096,
        "vocab_size": 250002,
        "max_position_embeddings": 8194,
        "type_vocab_size": 1,
    }
    arch = arch_from_hf_config(cfg)
    assert arch.param_count == MODEL_CATALOGUE["bge-m3"].param_count


def test_hf_config_errors(tmp_path):
    with pytest.raises(BadModelConfigError, match="no such file"):
        load_hf_config(tmp_path / "missing")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(BadModelConfigError, match="cannot read"):
        load_hf_config(tmp_path)
    with pytest.raises(BadModelConfigError, match="num_hidden_layers"):
        arch_from_hf_config({"hidden_size": 8})


_TINY = {
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 100,
    "max_position_embeddings": 1024,
}


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ({"architectures": 5}, "architectures=5: expected a list"),
        ({"architectures": [["BertModel"]]}, "architectures=[['BertModel']]"),
        ({"num_experts": -5000, "moe_intermediate_size": 10}, "num_experts=-5000: expected an integer >= 0"),
        ({"num_experts": 8, "moe_intermediate_size": -1}, "moe_intermediate_size=-1"),
        ({"model_type": "bert", "type_vocab_size": -100_000_000}, "type_vocab_size=-100000000"),
    ],
)
def test_hf_config_bad_optional_fields(extra, fragment):
    """Each was a traceback or a negative parameter count (a plan placing a -700 GiB model)."""
    with pytest.raises(BadModelConfigError) as exc:
        arch_from_hf_config({**_TINY, **extra}, where="m/config.json")
    assert str(exc.value).startswith("m/config.json: ") and fragment in str(exc.value)


@pytest.mark.parametrize(
    "raw",
    [b'{"a": "\xff"}', b"[" * 100_000 + b"]" * 100_000],
    ids=["not-utf8", "nested-deeply"],
)
def test_hf_config_unreadable_names_the_file(tmp_path, raw):
    (tmp_path / "config.json").write_bytes(raw)
    with pytest.raises(BadModelConfigError, match=r"config\.json: cannot read config\.json"):
        load_hf_config(tmp_path)
