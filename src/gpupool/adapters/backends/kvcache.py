"""`PrefixCache`: the emulated engine's automatic prefix cache over 512-token chunks, with a host tier.

A prompt's full ``chunk_tokens`` chunks are keyed by a chained hash (chunk ``i``'s key covers every token
up to the end of chunk ``i``), so two prompts share chunk ``i`` exactly when their first ``(i + 1) *
chunk_tokens`` tokens agree (vLLM's block hashing, at the trace's 512-token grain). `chunk_keys` hashes
token ids; `chunk_keys_of_ids` chains explicit per-chunk ids (a Mooncake trace's ``hash_ids``) instead.

Where a chunk lives:
- GPU, *active*: referenced by running sequences (``refs`` > 0); its blocks count as used.
- GPU, *idle*: no running sequence holds it; it keeps its blocks but they are evictable, oldest first.
- host tier: a copy written when an idle chunk is evicted from the GPU (capacity ``host_chunks``, LRU);
  a hit there costs a PCIe transfer instead of a recompute. Evicted from the host tier, it is gone.

Invariants: a key is active or idle on the GPU, never both; ``len(host) <= host_chunks``; a lookup
counts only the *leading* chunks found (a prefix: after the first miss nothing else is reused).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

ROOT = 0x9E3779B9


def chunk_keys(tokens: Sequence[int], chunk_tokens: int) -> tuple[int, ...]:
    """Chained keys of the full ``chunk_tokens`` chunks of ``tokens`` (a trailing partial chunk has none)."""
    out: list[int] = []
    prev = ROOT
    for i in range(len(tokens) // chunk_tokens):
        prev = hash((prev, tuple(tokens[i * chunk_tokens : (i + 1) * chunk_tokens])))
        out.append(prev)
    return tuple(out)


def chunk_keys_of_ids(ids: Sequence[int], full_chunks: int) -> tuple[int, ...]:
    """Chained keys of explicit chunk ids, the first ``full_chunks`` of them."""
    out: list[int] = []
    prev = ROOT
    for h in ids[: max(0, full_chunks)]:
        prev = hash((prev, -1, h))
        out.append(prev)
    return tuple(out)


class PrefixCache:
    def __init__(self, *, host_chunks: int = 0) -> None:
        self.host_chunks = max(0, host_chunks)
        self.refs: dict[int, int] = {}
        self.idle: OrderedDict[int, None] = OrderedDict()
        self.host: OrderedDict[int, None] = OrderedDict()
        self.offloaded_chunks = 0
        """Chunks written to the host tier (GPU -> host traffic), cumulative."""

    def lookup(self, keys: Sequence[int]) -> tuple[int, int]:
        """(leading chunks on the GPU, then leading chunks after those on the host tier)."""
        gpu = 0
        while gpu < len(keys) and (keys[gpu] in self.refs or keys[gpu] in self.idle):
            gpu += 1
        host = 0
        while gpu + host < len(keys) and keys[gpu + host] in self.host:
            host += 1
        return gpu, host

    def resident(self, key: int) -> bool:
        return key in self.refs or key in self.idle

    def acquire(self, key: int) -> bool:
        """A running sequence holds ``key``; True when it had to be placed on the GPU (new blocks)."""
        n = self.refs.get(key)
        if n is not None:
            self.refs[key] = n + 1
            return False
        was_idle = self.idle.pop(key, 0) is None
        self.refs[key] = 1
        if key in self.host:
            self.host.move_to_end(key)
        return not was_idle

    def release(self, key: int) -> None:
        """A running sequence lets go of ``key``; at zero references it becomes idle (most recent)."""
        n = self.refs[key] - 1
        if n:
            self.refs[key] = n
        else:
            del self.refs[key]
            self.idle[key] = None

    def evict_idle(self) -> bool:
        """Drop the least recently used idle GPU chunk, copying it to the host tier; False if none."""
        if not self.idle:
            return False
        key, _ = self.idle.popitem(last=False)
        if self.host_chunks:
            if key in self.host:
                self.host.move_to_end(key)
            else:
                self.host[key] = None
                self.offloaded_chunks += 1
                while len(self.host) > self.host_chunks:
                    self.host.popitem(last=False)
        return True

    def check(self) -> None:
        assert not (self.refs.keys() & self.idle.keys())
        assert len(self.host) <= self.host_chunks
        assert all(n > 0 for n in self.refs.values())
