"""`EmulatedEngine`: a vLLM-like continuous-batching scheduler over a fixed pool of KV blocks, timed by
the `Roofline` model. No GPU: it only keeps time and books, so tests and demos see realistic queueing.

Books: ``num_blocks`` blocks of ``block_size`` tokens; a running sequence holds
``ceil((prompt + generated) / block_size) + 1`` blocks, of which its full ``prefix_block_tokens`` prompt
chunks live in the `PrefixCache` (shared between sequences with the same prefix, kept after they end as
idle evictable blocks, LRU, copied to the host tier of ``host_tier_mib`` when evicted) and the rest are
its own. A waiting sequence is admitted (highest urgency = lowest vLLM ``priority`` first, then arrival)
when fewer than ``max_num_seqs`` run and the blocks it lacks fit after evicting idle chunks. Its prefill
costs the roofline time of the tokens it must recompute (everything after its leading cached chunks,
at least one token) plus the PCIe transfer of its host-tier chunks (``pcie_bytes_s``). When a running
sequence needs a block and none is free or evictable, the least urgent, most recently arrived running
sequence is preempted (recompute: its blocks are freed, it waits again). Paused (``/pause``) or
sleeping (``/sleep``) engines admit and step nothing; requests wait.

Invariant: used blocks (own blocks of running sequences + active chunks) + idle chunks <= num_blocks
(checked in `check`).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import time
from dataclasses import dataclass, field

from gpupool.adapters.backends.kvcache import PrefixCache
from gpupool.adapters.backends.roofline import Roofline

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


@dataclass(eq=False)
class Sequence:
    id: int
    prompt_tokens: int
    max_tokens: int
    priority: int
    arrival: float
    generated: int = 0
    keys: tuple[int, ...] = ()
    """Chained keys of the prompt's full prefix chunks (`kvcache.chunk_keys`)."""
    blocks: int = 0
    """Own blocks (not counting the prefix chunks it holds)."""
    held: int = 0
    """How many of ``keys`` it holds in the prefix cache while running."""
    cached_tokens: int = 0
    """Prompt tokens its last admission found cached (GPU or host tier)."""
    prefilled: bool = False
    first_token_at: float | None = None
    out: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)

    def key(self) -> tuple[int, float, int]:
        return (self.priority, self.arrival, self.id)


class EmulatedEngine:
    def __init__(
        self,
        roofline: Roofline,
        *,
        kv_budget_mib: int,
        block_size: int = 16,
        max_num_seqs: int = 256,
        speed: float = 1.0,
        prefix_block_tokens: int = 512,
        host_tier_mib: int = 0,
        pcie_bytes_s: float = 32e9,
        stream_interval: int = 1,
    ) -> None:
        if prefix_block_tokens < block_size or prefix_block_tokens % block_size:
            raise ValueError(
                f"prefix_block_tokens={prefix_block_tokens}: must be a multiple of block_size={block_size}"
            )
        if host_tier_mib < 0 or pcie_bytes_s <= 0:
            raise ValueError(f"host_tier_mib={host_tier_mib} pcie_bytes_s={pcie_bytes_s}: invalid")
        if stream_interval < 1:
            raise ValueError(f"stream_interval={stream_interval}: must be >= 1")
        self.stream_interval = stream_interval
        """Tokens per streamed chunk after the first (fewer wake-ups and chunks; timing unchanged)."""
        self.roofline = roofline
        self.block_size = block_size
        per_block = max(1, roofline.kv_bytes_per_token * block_size)
        self.num_blocks = max(1, kv_budget_mib * 1024 * 1024 // per_block)
        self.prefix_block_tokens = prefix_block_tokens
        self.chunk_blocks = prefix_block_tokens // block_size
        chunk_bytes = max(1, roofline.kv_bytes_per_token * prefix_block_tokens)
        self.host_tier_chunks = host_tier_mib * 1024 * 1024 // chunk_bytes
        self.pcie_bytes_s = pcie_bytes_s
        self.cache = PrefixCache(host_chunks=self.host_tier_chunks)
        self.own_blocks = 0
        self.prefix_queries_tokens = 0
        self.prefix_hits_tokens = 0
        self.host_queries_tokens = 0
        self.host_hits_tokens = 0
        self.recomputed_tokens = 0
        self.max_num_seqs = max_num_seqs
        self.speed = speed
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.paused = False
        self.sleep_level = 0
        self.preemptions = 0
        self.ttft_counts = [0] * (len(TTFT_BUCKETS) + 1)
        self.ttft_sum = 0.0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self._ids = itertools.count(1)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ control
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        self._wake.set()

    def sleep(self, level: int) -> None:
        """Level 1: weights offloaded, KV dropped; level 2: both dropped. Running work is recomputed."""
        self.sleep_level = level
        for s in list(self.running):
            self._preempt(s)
        self.cache.idle.clear()
        self._wake.set()

    def wake_up(self) -> None:
        self.sleep_level = 0
        self._wake.set()

    def halted(self) -> bool:
        """Paused or asleep: nothing is admitted or stepped."""
        return self.paused or self.sleep_level > 0

    @property
    def used_blocks(self) -> int:
        """Blocks held by running sequences: their own plus the prefix chunks they reference."""
        return self.own_blocks + len(self.cache.refs) * self.chunk_blocks

    @property
    def idle_blocks(self) -> int:
        """Blocks of cached prefix chunks no running sequence holds (evictable)."""
        return len(self.cache.idle) * self.chunk_blocks

    @property
    def free_blocks(self) -> int:
        return self.num_blocks - self.used_blocks - self.idle_blocks

    @property
    def kv_usage(self) -> float:
        """vLLM's ``kv_cache_usage_perc``: idle cached blocks count as free."""
        return self.used_blocks / self.num_blocks

    @property
    def capacity_tokens(self) -> int:
        """The longest sequence (prompt + output) the block pool can ever hold (one block spare)."""
        return (self.num_blocks - 1) * self.block_size

    @property
    def host_tier_usage(self) -> float:
        return len(self.cache.host) / self.host_tier_chunks if self.host_tier_chunks else 0.0

    @property
    def host_loaded_bytes(self) -> int:
        return self.host_hits_tokens * self.roofline.kv_bytes_per_token

    @property
    def host_stored_bytes(self) -> int:
        return self.cache.offloaded_chunks * self.prefix_block_tokens * self.roofline.kv_bytes_per_token

    def submit(
        self, prompt_tokens: int, max_tokens: int, priority: int = 0, *, keys: tuple[int, ...] = ()
    ) -> Sequence:
        """Queue a sequence; ``keys`` are its prompt's prefix-chunk keys (`kvcache.chunk_keys`)."""
        prompt_tokens = max(1, prompt_tokens)
        keys = keys[: prompt_tokens // self.prefix_block_tokens]
        s = Sequence(
            next(self._ids), prompt_tokens, max(0, max_tokens), priority, time.monotonic(), keys=keys
        )
        bisect.insort(self.waiting, s, key=Sequence.key)
        self.requests_total += 1
        self.prompt_tokens_total += s.prompt_tokens
        self._wake.set()
        return s

    def abort(self, s: Sequence) -> None:
        if s in self.running:
            self.running.remove(s)
            self._free(s)
        elif s in self.waiting:
            self.waiting.remove(s)
        self._wake.set()

    def check(self) -> None:
        assert self.own_blocks == sum(s.blocks for s in self.running)
        assert self.used_blocks + self.idle_blocks <= self.num_blocks
        self.cache.check()

    # ------------------------------------------------------------------ internals
    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def _free(self, s: Sequence) -> None:
        """Give back a leaving sequence's own blocks and its hold on its prefix chunks."""
        self.own_blocks -= s.blocks
        s.blocks = 0
        for k in s.keys[: s.held]:
            self.cache.release(k)
        s.held = 0

    def _room(self, blocks: int) -> bool:
        """Evict idle prefix chunks (LRU, to the host tier) until ``blocks`` are free; False, evicting
        nothing, when free + idle blocks cannot make it (vLLM's allocator counts evictable cached
        blocks as free and fails an allocation before touching them: a request that waits for room
        does not flush the prefix cache on every step)."""
        if self.free_blocks + self.idle_blocks < blocks:
            return False
        while self.free_blocks < blocks:
            if not self.cache.evict_idle():
                return False
        return True

    def _preempt(self, s: Sequence) -> None:
        self.running.remove(s)
        self._free(s)
        s.prefilled = False
        bisect.insort(self.waiting, s, key=Sequence.key)
        self.preemptions += 1

    def _admit(self) -> float:
        """Move waiting sequences into the batch; return the prefill time they cost."""
        t = 0.0
        while self.waiting and len(self.running) < self.max_num_seqs:
            s = self.waiting[0]
            tokens = s.prompt_tokens + s.generated
            gpu, host = self.cache.lookup(s.keys)
            for k in s.keys[:gpu]:  # pin the resident prefix before evicting anything
                self.cache.acquire(k)
            s.held = gpu
            own = max(1, self._blocks_for(tokens) + 1 - len(s.keys) * self.chunk_blocks)
            if not self._room(own + (len(s.keys) - gpu) * self.chunk_blocks):
                self._free(s)
                break
            for k in s.keys[gpu:]:
                self.cache.acquire(k)
            s.held = len(s.keys)
            self.waiting.pop(0)
            s.blocks = own
            self.own_blocks += own
            self.running.append(s)
            cached = min(tokens - 1, (gpu + host) * self.prefix_block_tokens)
            on_gpu = min(cached, gpu * self.prefix_block_tokens)
            s.cached_tokens = cached
            self.prefix_queries_tokens += tokens
            self.prefix_hits_tokens += on_gpu
            self.host_queries_tokens += tokens - on_gpu
            self.host_hits_tokens += cached - on_gpu
            self.recomputed_tokens += tokens - cached
            t += self.roofline.prefill_s(tokens - cached)
            t += (cached - on_gpu) * self.roofline.kv_bytes_per_token / self.pcie_bytes_s
            s.prefilled = True
        return t

    async def _loop(self) -> None:
        while True:
            if self.halted() or not (self.running or self.waiting):
                self._wake.clear()
                await self._wake.wait()
                continue
            dt = self._admit()
            if not self.running:
                self._wake.clear()
                await self._wake.wait()
                continue
            kv_tokens = sum(s.prompt_tokens + s.generated for s in self.running)
            dt += self.roofline.decode_step_s(len(self.running), kv_tokens)
            await asyncio.sleep(dt / self.speed)
            if self.halted():
                continue
            now = time.monotonic()
            for s in sorted(self.running, key=Sequence.key):
                if s not in self.running:
                    continue
                need = self._blocks_for(s.prompt_tokens + s.generated + 1)
                while need > s.blocks + s.held * self.chunk_blocks:
                    if self._room(1):
                        s.blocks += 1
                        self.own_blocks += 1
                        continue
                    victim = max(self.running, key=Sequence.key)
                    self._preempt(victim)
                    if victim is s:
                        break
                if s not in self.running:
                    continue
                if s.first_token_at is None:
                    s.first_token_at = now
                    ttft = now - s.arrival
                    self.ttft_sum += ttft
                    self.ttft_counts[bisect.bisect_left(TTFT_BUCKETS, ttft)] += 1
                if s.generated < s.max_tokens:
                    s.generated += 1
                    self.generation_tokens_total += 1
                    g = s.generated
                    if g == 1 or g % self.stream_interval == 0 or g >= s.max_tokens:
                        s.out.put_nowait(g)
                if s.generated >= s.max_tokens:
                    self.running.remove(s)
                    self._free(s)
                    s.out.put_nowait(None)
