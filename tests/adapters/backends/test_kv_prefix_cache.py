"""The emulated engine's prefix cache: 512-token chunk hits on the GPU and the host tier, LRU eviction,
recompute and PCIe transfer costs, and the vLLM prefix-cache metrics over real HTTP."""

from __future__ import annotations

import httpx
import pytest

from gpupool.adapters.backends import EmulatedEngine, Roofline
from gpupool.adapters.backends.app import create_backend_app, render_metrics
from gpupool.adapters.backends.kvcache import PrefixCache, chunk_keys, chunk_keys_of_ids
from gpupool.adapters.backends.tokenizer import EmulatedTokenizer
from tests.adapters.http.servers import running

MIB = 1024 * 1024


def _roof() -> Roofline:
    # 1 KiB of KV per token: a 512-token chunk is 0.5 MiB, a 16-token block 16 KiB
    return Roofline(
        params=10**9, bytes_per_param=2, kv_bytes_per_token=1024, mem_bw_bytes_s=1e12, peak_flops=1e14
    )


def _engine(gpu_blocks: int, host_mib: int = 0) -> EmulatedEngine:
    eng = EmulatedEngine(
        _roof(),
        kv_budget_mib=1,
        block_size=16,
        host_tier_mib=host_mib,
        pcie_bytes_s=1e9,
    )
    eng.num_blocks = gpu_blocks  # 1 MiB budget = 64 blocks; tests pick their own pool size
    return eng


def _finish_all(eng: EmulatedEngine) -> None:
    for s in list(eng.running):
        eng.abort(s)
    eng.check()


def test_keys_chain_so_only_a_shared_prefix_matches() -> None:
    a = list(range(1024)) + [7] * 100
    b = list(range(512)) + [9] * 512
    ka, kb = chunk_keys(a, 512), chunk_keys(b, 512)
    assert len(ka) == 2 and len(kb) == 2  # the partial trailing chunk has no key
    assert ka[0] == kb[0] and ka[1] != kb[1]
    # same second chunk after a different first one: still a different key (chained)
    c = [9] * 512 + list(range(512, 1024))
    assert chunk_keys(c, 512)[1] != ka[1]
    assert chunk_keys_of_ids([0, 5, 6], 2) == chunk_keys_of_ids([0, 5, 8], 2)
    assert chunk_keys_of_ids([0, 5, 6], 3) != chunk_keys_of_ids([0, 5, 8], 3)


def test_cache_counts_leading_chunks_and_evicts_lru_to_the_host_tier() -> None:
    c = PrefixCache(host_chunks=2)
    for k in (1, 2, 3):
        c.acquire(k)
    for k in (3, 1, 2):  # released in this order: idle LRU order 3, 1, 2
        c.release(k)
    assert c.lookup((1, 2, 3)) == (3, 0)
    assert c.lookup((9, 1)) == (0, 0)  # a miss first: nothing after it counts
    assert c.evict_idle() and c.evict_idle()  # 3 then 1 go to the host tier
    assert list(c.host) == [3, 1] and list(c.idle) == [2]
    assert c.lookup((2, 3, 1)) == (1, 2)  # GPU first, then the host tier
    assert c.evict_idle() and not c.evict_idle()
    assert list(c.host) == [1, 2]  # capacity 2: the oldest (3) dropped
    assert c.offloaded_chunks == 3
    c.check()


def test_engine_reuses_a_cached_prefix_and_charges_only_the_recompute() -> None:
    eng = _engine(gpu_blocks=1000)
    keys = chunk_keys_of_ids([0, 1, 2, 3], 4)
    first = eng.submit(2100, 4, keys=keys)  # 4 full chunks + 52 tokens
    t1 = eng._admit()
    assert t1 == pytest.approx(eng.roofline.prefill_s(2100))
    assert first.cached_tokens == 0 and eng.prefix_hits_tokens == 0
    _finish_all(eng)
    assert eng.used_blocks == 0 and eng.idle_blocks == 4 * 32  # the chunks stay, idle
    second = eng.submit(2100, 4, keys=chunk_keys_of_ids([0, 1, 2, 9], 4))  # shares 3 chunks
    t2 = eng._admit()
    assert second.cached_tokens == 3 * 512
    assert t2 == pytest.approx(eng.roofline.prefill_s(2100 - 3 * 512))
    assert eng.prefix_queries_tokens == 4200 and eng.prefix_hits_tokens == 1536
    assert eng.recomputed_tokens == 2100 + 2100 - 1536
    eng.check()


def test_a_full_hit_still_recomputes_one_token() -> None:
    eng = _engine(gpu_blocks=1000)
    keys = chunk_keys_of_ids([4, 5], 2)
    eng.submit(1024, 1, keys=keys)
    eng._admit()
    _finish_all(eng)
    s = eng.submit(1024, 1, keys=keys)
    eng._admit()
    assert s.cached_tokens == 1023 and eng.recomputed_tokens == 1024 + 1


def test_pool_pressure_moves_idle_chunks_to_the_host_tier_and_a_host_hit_costs_pcie() -> None:
    # 80 blocks = two 32-block chunks + room; the host tier holds 4 chunks (2 MiB / 0.5 MiB)
    eng = _engine(gpu_blocks=80, host_mib=2)
    assert eng.host_tier_chunks == 4
    a = chunk_keys_of_ids([1, 2], 2)
    eng.submit(1024 + 10, 1, keys=a)
    eng._admit()
    _finish_all(eng)
    b = chunk_keys_of_ids([7, 8], 2)
    eng.submit(1024 + 10, 1, keys=b)  # needs 64 + 2 blocks: A's idle chunks are evicted (to host)
    eng._admit()
    assert len(eng.running) == 1 and eng.cache.offloaded_chunks == 2
    assert eng.preemptions == 0
    _finish_all(eng)
    s = eng.submit(1024 + 10, 1, keys=a)
    t = eng._admit()
    assert s.cached_tokens == 1024 and eng.host_hits_tokens == 1024
    transfer = 1024 * 1024 / 1e9  # 1024 tokens x 1 KiB over 1 GB/s
    assert t == pytest.approx(eng.roofline.prefill_s(10) + transfer)
    assert eng.host_loaded_bytes == 1024 * 1024 and eng.host_stored_bytes >= 2 * 512 * 1024
    text = render_metrics(eng, "m")
    assert 'vllm:external_prefix_cache_hits_total{model_name="m"} 1024' in text
    assert 'gpupool:kv_host_tier_usage_perc{model_name="m"}' in text
    eng.check()


def test_without_a_host_tier_evicted_chunks_are_recomputed() -> None:
    eng = _engine(gpu_blocks=80)
    a = chunk_keys_of_ids([1, 2], 2)
    for keys in (a, chunk_keys_of_ids([7, 8], 2), a):
        s = eng.submit(1024 + 10, 1, keys=keys)
        eng._admit()
        _finish_all(eng)
    assert s.cached_tokens == 0 and eng.host_hits_tokens == 0 and eng.cache.offloaded_chunks == 0


def test_a_full_pool_waits_instead_of_evicting_running_chunks() -> None:
    eng = _engine(gpu_blocks=80)
    eng.submit(1024 + 10, 1, keys=chunk_keys_of_ids([1, 2], 2))
    eng.submit(1024 + 10, 1, keys=chunk_keys_of_ids([3, 4], 2))
    eng._admit()
    assert len(eng.running) == 1 and len(eng.waiting) == 1  # the second does not fit beside it
    assert eng.cache.lookup(eng.running[0].keys) == (2, 0)
    eng.check()


def _text_of_chunks(ids: list[int], tail: int) -> str:
    """Text whose emulated tokens (after the BOS) are 512 per id, then ``tail`` more."""
    words = [f" {_word(h, i)}" for h in ids for i in range(512)]
    words += [f" {_word(-1, i)}" for i in range(tail)]
    return "".join(words)


def _word(h: int, i: int) -> str:
    n, out = (h * 7919 + i) % (26**5), []
    for _ in range(5):
        n, r = divmod(n, 26)
        out.append(chr(97 + r))
    return "".join(out)


def test_text_with_a_shared_prefix_hits_over_http() -> None:
    tok = EmulatedTokenizer()
    p1 = _text_of_chunks([1, 2, 3], 20)
    p2 = _text_of_chunks([1, 2, 4], 20)
    assert tok.count(p1) == 1 + 3 * 512 + 20
    eng = EmulatedEngine(_roof(), kv_budget_mib=64, speed=1000.0)
    app = create_backend_app(eng, model="m")
    with running(app) as url, httpx.Client(base_url=url, timeout=20) as cl:
        for p in (p1, p2):
            r = cl.post("/v1/completions", json={"model": "m", "prompt": p, "max_tokens": 2})
            assert r.status_code == 200, r.text
        text = cl.get("/metrics").text
        # the BOS shifts the chunks by one token, the same for both: chunks 0 and 1 agree
        assert 'vllm:prefix_cache_hits_total{model_name="m"} 1024' in text
        assert f'vllm:prefix_cache_queries_total{{model_name="m"}} {2 * (1 + 1536 + 20)}' in text
        # explicit hash ids replace the text's hashing
        r = cl.post(
            "/v1/completions",
            json={"model": "m", "prompt": p1, "max_tokens": 2, "kv_hash_ids": [50, 51, 52]},
        )
        assert r.status_code == 200
        bad = cl.post("/v1/completions", json={"model": "m", "prompt": "x", "kv_hash_ids": ["a"]})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "kv_hash_ids"
        assert '["a"]' in bad.json()["error"]["message"]
    assert eng.prefix_hits_tokens == 1024


def test_a_request_the_pool_can_never_hold_is_400_not_a_hang() -> None:
    eng = EmulatedEngine(_roof(), kv_budget_mib=1, speed=1000.0)  # 64 blocks of 16: 1008 tokens
    assert eng.capacity_tokens == 63 * 16
    app = create_backend_app(eng, model="m")
    with running(app) as url, httpx.Client(base_url=url, timeout=20) as cl:
        r = cl.post("/v1/completions", json={"model": "m", "prompt": [5] * 1000, "max_tokens": 9})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
        assert "1009" in r.json()["error"]["message"] and r.json()["error"]["param"] == "prompt"
        ok = cl.post("/v1/completions", json={"model": "m", "prompt": [5] * 1000, "max_tokens": 8})
        assert ok.status_code == 200
    assert eng.requests_total == 1


def test_a_request_that_cannot_fit_waits_without_evicting_idle_chunks() -> None:
    """As vLLM's allocator: evictable cached blocks count as free, and an allocation that cannot be
    made fails before any of them is evicted (a waiting request would otherwise flush the cache to
    the host tier, and the host tier's oldest chunks out, on every scheduler step)."""
    eng = _engine(gpu_blocks=100, host_mib=2)
    a = chunk_keys_of_ids([1, 2], 2)
    eng.submit(1024 + 10, 1, keys=a)
    eng._admit()
    _finish_all(eng)  # A's two chunks idle on the GPU: 64 blocks
    eng.submit(470, 1)  # 31 blocks: fits in the 36 free, nothing evicted
    eng._admit()
    big = eng.submit(1270, 1)  # 81 blocks > 5 free + 64 idle: it waits
    eng._admit()
    assert big in eng.waiting and len(eng.running) == 1
    assert eng.cache.offloaded_chunks == 0 and eng.cache.lookup(a) == (2, 0)
    eng.check()
