"""`EmulatedEngine`: a vLLM-like continuous-batching scheduler over a fixed pool of KV blocks, timed by
the `Roofline` model. No GPU: it only keeps time and books, so tests and demos see realistic queueing.

Books: ``num_blocks`` blocks of ``block_size`` tokens; a running sequence holds
``ceil((prompt + generated) / block_size)`` blocks. A waiting sequence is admitted (highest urgency =
lowest vLLM ``priority`` first, then arrival) when its prompt blocks + 1 fit and fewer than
``max_num_seqs`` run. When a running sequence needs a block and none is free, the least urgent, most
recently arrived running sequence is preempted (recompute: its blocks are freed, it waits again).
Paused (``/pause``) or sleeping (``/sleep``) engines admit and step nothing; requests wait.

Invariant: used blocks == sum of running sequences' blocks <= num_blocks (checked in `check`).
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import time
from dataclasses import dataclass, field

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
    blocks: int = 0
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
    ) -> None:
        self.roofline = roofline
        self.block_size = block_size
        per_block = max(1, roofline.kv_bytes_per_token * block_size)
        self.num_blocks = max(1, kv_budget_mib * 1024 * 1024 // per_block)
        self.max_num_seqs = max_num_seqs
        self.speed = speed
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.used_blocks = 0
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
        self._wake.set()

    def wake_up(self) -> None:
        self.sleep_level = 0
        self._wake.set()

    def halted(self) -> bool:
        """Paused or asleep: nothing is admitted or stepped."""
        return self.paused or self.sleep_level > 0

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.num_blocks

    def submit(self, prompt_tokens: int, max_tokens: int, priority: int = 0) -> Sequence:
        s = Sequence(next(self._ids), max(1, prompt_tokens), max(0, max_tokens), priority, time.monotonic())
        bisect.insort(self.waiting, s, key=Sequence.key)
        self.requests_total += 1
        self.prompt_tokens_total += s.prompt_tokens
        self._wake.set()
        return s

    def abort(self, s: Sequence) -> None:
        if s in self.running:
            self.running.remove(s)
            self.used_blocks -= s.blocks
            s.blocks = 0
        elif s in self.waiting:
            self.waiting.remove(s)
        self._wake.set()

    def check(self) -> None:
        assert self.used_blocks == sum(s.blocks for s in self.running) <= self.num_blocks

    # ------------------------------------------------------------------ internals
    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def _preempt(self, s: Sequence) -> None:
        self.running.remove(s)
        self.used_blocks -= s.blocks
        s.blocks, s.prefilled = 0, False
        bisect.insort(self.waiting, s, key=Sequence.key)
        self.preemptions += 1

    def _admit(self) -> float:
        """Move waiting sequences into the batch; return the prefill time they cost."""
        t = 0.0
        while self.waiting and len(self.running) < self.max_num_seqs:
            s = self.waiting[0]
            need = self._blocks_for(s.prompt_tokens + s.generated) + 1
            if need > self.num_blocks - self.used_blocks:
                break
            self.waiting.pop(0)
            s.blocks = need
            self.used_blocks += need
            self.running.append(s)
            t += self.roofline.prefill_s(s.prompt_tokens + s.generated)
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
                while need > s.blocks:
                    if self.used_blocks < self.num_blocks:
                        s.blocks += 1
                        self.used_blocks += 1
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
                    s.out.put_nowait(s.generated)
                if s.generated >= s.max_tokens:
                    self.running.remove(s)
                    self.used_blocks -= s.blocks
                    s.blocks = 0
                    s.out.put_nowait(None)
