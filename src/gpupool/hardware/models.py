"""Model catalogue: architecture of the LLM, embedding and reranker models gpupool plans for.

Role: the config.json facts of section 7 of the fact sheet, plus reading a local HuggingFace
``config.json`` (never downloads anything).

Public API:
- ``ModelArch``: frozen architecture value (layers, hidden, heads, kv heads, head_dim, intermediate, vocab,
  tied embeddings, max positions, encoder/decoder, MoE experts) with ``param_count`` computed by the
  fact sheet's formula (7.1) and ``embedding_params`` (kept in bf16 by int4 checkpoints).
- ``model_arch(name)``: catalogue lookup (case-insensitive; an ``org/`` prefix and an ``-instruct``
  suffix are ignored); raises ``UnknownModelError`` naming the value and the known names.
- ``arch_from_hf_config(config_dict, name=...)`` and ``load_hf_config(path)``: a ``ModelArch`` from a
  config.json dict or a local file / model directory.
- ``MODEL_CATALOGUE``: name -> ``ModelArch``.

Invariants:
- ``head_dim`` is taken from config.json when present (Qwen3 sets it explicitly); otherwise
  ``hidden / heads``.
- Parameter counts match the published counts to within 1 % (tested).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class ModelArch:
    name: str
    kind: str
    """``decoder`` (has a KV cache) or ``encoder`` (embedding / reranker; no KV cache)."""
    family: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    max_positions: int
    qkv_bias: bool = False
    qk_norm: bool = False
    experts: int = 0
    moe_intermediate: int = 0
    type_vocab: int = 0
    """Encoders: token-type embeddings (2 for BERT, 1 for XLM-R)."""
    head: str = ""
    """Encoders: ``pooler`` (embedding) or ``classifier`` (reranker)."""

    @property
    def is_decoder(self) -> bool:
        return self.kind == "decoder"

    @property
    def embedding_params(self) -> int:
        """Token embedding (+ untied lm_head) parameters: stay bf16 in int4 checkpoints."""
        emb = self.vocab * self.hidden
        return emb if self.tied_embeddings or not self.is_decoder else 2 * emb

    @property
    def param_count(self) -> int:
        h, n = self.hidden, self.layers
        if not self.is_decoder:
            emb = (self.vocab + self.max_positions + self.type_vocab) * h + 2 * h
            attn = 4 * h * h + 4 * h
            ffn = 2 * h * self.intermediate + self.intermediate + h
            layer = attn + ffn + 4 * h
            head = h * h + h if self.head == "pooler" else h * h + h + h + 1
            return emb + n * layer + head
        q = h * self.heads * self.head_dim
        kv = 2 * h * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * h
        bias = (self.heads + 2 * self.kv_heads) * self.head_dim if self.qkv_bias else 0
        norm = 2 * self.head_dim if self.qk_norm else 0
        if self.experts:
            mlp = self.experts * 3 * h * self.moe_intermediate + h * self.experts
        else:
            mlp = 3 * h * self.intermediate
        layer = q + kv + o + bias + norm + mlp + 2 * h
        return self.embedding_params + n * layer + h


def _dec(  # noqa: PLR0917 - positional on purpose: one table row per model
    name: str,
    family: str,
    layers: int,
    hidden: int,
    heads: int,
    kv: int,
    inter: int,
    vocab: int,
    tied: bool,
    max_pos: int,
    *,
    head_dim: int = 128,
    experts: int = 0,
    moe_inter: int = 0,
) -> ModelArch:
    qwen2 = family == "qwen2"
    return ModelArch(
        name,
        "decoder",
        family,
        layers,
        hidden,
        heads,
        kv,
        head_dim,
        inter,
        vocab,
        tied,
        max_pos,
        qkv_bias=qwen2,
        qk_norm=family == "qwen3",
        experts=experts,
        moe_intermediate=moe_inter,
    )


def _enc(  # noqa: PLR0917 - positional on purpose: one table row per model
    name: str,
    layers: int,
    hidden: int,
    heads: int,
    inter: int,
    vocab: int,
    max_pos: int,
    type_vocab: int,
    head: str,
) -> ModelArch:
    family = "bert" if vocab < 100_000 else "xlm-roberta"
    return ModelArch(
        name,
        "encoder",
        family,
        layers,
        hidden,
        heads,
        heads,
        hidden // heads,
        inter,
        vocab,
        False,
        max_pos,
        type_vocab=type_vocab,
        head=head,
    )


MODEL_CATALOGUE: dict[str, ModelArch] = {
    m.name: m
    for m in (
        _dec("qwen2.5-0.5b", "qwen2", 24, 896, 14, 2, 4864, 151936, True, 32768, head_dim=64),
        _dec("qwen2.5-1.5b", "qwen2", 28, 1536, 12, 2, 8960, 151936, True, 32768),
        _dec("qwen2.5-3b", "qwen2", 36, 2048, 16, 2, 11008, 151936, True, 32768),
        _dec("qwen2.5-7b", "qwen2", 28, 3584, 28, 4, 18944, 152064, False, 131072),
        _dec("qwen2.5-14b", "qwen2", 48, 5120, 40, 8, 13824, 152064, False, 131072),
        _dec("qwen2.5-32b", "qwen2", 64, 5120, 40, 8, 27648, 152064, False, 131072),
        _dec("qwen2.5-72b", "qwen2", 80, 8192, 64, 8, 29568, 152064, False, 32768),
        _dec("qwen3-0.6b", "qwen3", 28, 1024, 16, 8, 3072, 151936, True, 40960),
        _dec("qwen3-1.7b", "qwen3", 28, 2048, 16, 8, 6144, 151936, True, 40960),
        _dec("qwen3-4b", "qwen3", 36, 2560, 32, 8, 9728, 151936, True, 40960),
        _dec("qwen3-8b", "qwen3", 36, 4096, 32, 8, 12288, 151936, False, 40960),
        _dec("qwen3-14b", "qwen3", 40, 5120, 40, 8, 17408, 151936, False, 40960),
        _dec("qwen3-32b", "qwen3", 64, 5120, 64, 8, 25600, 151936, False, 40960),
        _dec(
            "qwen3-30b-a3b", "qwen3", 48, 2048, 32, 4, 6144, 151936, False, 40960, experts=128, moe_inter=768
        ),
        _dec("llama-3.1-8b", "llama", 32, 4096, 32, 8, 14336, 128256, False, 131072),
        _dec("llama-3.1-70b", "llama", 80, 8192, 64, 8, 28672, 128256, False, 131072),
        _enc("bge-large-en-v1.5", 24, 1024, 16, 4096, 30522, 512, 2, "pooler"),
        _enc("bge-base-en-v1.5", 12, 768, 12, 3072, 30522, 512, 2, "pooler"),
        _enc("bge-m3", 24, 1024, 16, 4096, 250002, 8194, 1, "pooler"),
        _enc("bge-reranker-v2-m3", 24, 1024, 16, 4096, 250002, 8194, 1, "classifier"),
        _enc("bge-reranker-large", 24, 1024, 16, 4096, 250002, 514, 1, "classifier"),
        _enc("bge-reranker-base", 12, 768, 12, 3072, 250002, 514, 1, "classifier"),
    )
}

ALIASES = {
    "bge-large": "bge-large-en-v1.5",
    "bge-base": "bge-base-en-v1.5",
    "bge-reranker": "bge-reranker-v2-m3",
    "llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama-3.1-8b": "llama-3.1-8b",
    "meta-llama-3.1-70b": "llama-3.1-70b",
}


class UnknownModelError(ValueError):
    def __init__(self, name: object) -> None:
        self.name = name
        super().__init__(f"unknown model {name!r} (known: {', '.join(MODEL_CATALOGUE)}, or give vram_mib)")


def _canon(name: str) -> str:
    key = name.strip().lower().rsplit("/", 1)[-1]
    for suffix in ("-instruct", "-chat"):
        key = key.removesuffix(suffix)
    return ALIASES.get(key, key)


def model_arch(name: str) -> ModelArch:
    """The catalogue architecture of ``name``; raises ``UnknownModelError``."""
    if not isinstance(name, str):
        raise UnknownModelError(name)
    arch = MODEL_CATALOGUE.get(_canon(name))
    if arch is None:
        raise UnknownModelError(name)
    return arch


def known_models() -> tuple[str, ...]:
    return tuple(MODEL_CATALOGUE)


class BadModelConfigError(ValueError):
    """A config.json that is unreadable or lacks a field the estimator needs."""


def _int(cfg: dict[str, Any], key: str, where: str) -> int:
    value = cfg.get(key)
    if type(value) is not int or value <= 0:
        raise BadModelConfigError(f"{where}: {key}={value!r}: expected a positive integer")
    return value


def _opt_int(cfg: dict[str, Any], key: str, where: str, default: int) -> int:
    """An optional count (absent or null: ``default``); a negative one would make the estimate negative."""
    value = cfg.get(key)
    if value is None:
        return default
    if type(value) is not int or value < 0:
        raise BadModelConfigError(f"{where}: {key}={value!r}: expected an integer >= 0")
    return value


def arch_from_hf_config(cfg: dict[str, Any], *, name: str = "", where: str = "config.json") -> ModelArch:
    """Architecture from a HuggingFace config.json dict (decoders and BERT / XLM-R encoders)."""
    if not isinstance(cfg, dict):
        raise BadModelConfigError(f"{where}: expected a JSON object")
    mtype = str(cfg.get("model_type", ""))
    archs_raw = cfg.get("architectures") or []
    if not isinstance(archs_raw, list) or not all(isinstance(a, str) for a in archs_raw):
        raise BadModelConfigError(f"{where}: architectures={archs_raw!r}: expected a list of class names")
    archs: list[str] = archs_raw
    label = name or str(cfg.get("_name_or_path") or mtype or "custom")
    layers = _int(cfg, "num_hidden_layers", where)
    hidden = _int(cfg, "hidden_size", where)
    heads = _int(cfg, "num_attention_heads", where)
    inter = _int(cfg, "intermediate_size", where)
    vocab = _int(cfg, "vocab_size", where)
    max_pos = _int(cfg, "max_position_embeddings", where)
    if mtype in ("bert", "xlm-roberta", "roberta") or any("Bert" in a or "Roberta" in a for a in archs):
        head = "classifier" if any("SequenceClassification" in a for a in archs) else "pooler"
        tv = _opt_int(cfg, "type_vocab_size", where, 2)
        return ModelArch(
            label,
            "encoder",
            "xlm-roberta" if "roberta" in mtype else "bert",
            layers,
            hidden,
            heads,
            heads,
            hidden // heads,
            inter,
            vocab,
            False,
            max_pos,
            type_vocab=tv,
            head=head,
        )
    kv = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or hidden // heads
    if type(kv) is not int or kv <= 0:
        raise BadModelConfigError(f"{where}: num_key_value_heads={kv!r}: expected a positive integer")
    if type(head_dim) is not int or head_dim <= 0:
        raise BadModelConfigError(f"{where}: head_dim={head_dim!r}: expected a positive integer")
    experts = _opt_int(cfg, "num_experts", where, 0) or _opt_int(cfg, "num_local_experts", where, 0)
    moe_inter = _opt_int(cfg, "moe_intermediate_size", where, 0)
    family = "qwen3" if mtype.startswith("qwen3") else "qwen2" if mtype.startswith("qwen2") else mtype
    return ModelArch(
        label,
        "decoder",
        family,
        layers,
        hidden,
        heads,
        kv,
        head_dim,
        inter,
        vocab,
        bool(cfg.get("tie_word_embeddings", False)),
        max_pos,
        qkv_bias=family == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_norm=family == "qwen3",
        experts=experts,
        moe_intermediate=moe_inter,
    )


def load_hf_config(path: str | Path, *, name: str = "") -> ModelArch:
    """Read ``config.json`` (or ``<dir>/config.json``) from the local disk; never downloads."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadModelConfigError(f"{p}: no such file (gpupool never downloads models)") from None
    except (OSError, ValueError) as exc:  # (ValueError: not UTF-8, not JSON)
        raise BadModelConfigError(f"{p}: cannot read config.json: {exc}") from None
    except RecursionError:
        raise BadModelConfigError(f"{p}: cannot read config.json: JSON nested too deeply") from None
    return arch_from_hf_config(cfg, name=name or p.parent.name, where=str(p))
