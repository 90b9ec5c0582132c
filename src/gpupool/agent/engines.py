"""`EngineScraper`: keeps the newest ``/metrics`` of every vLLM-style engine on this node.

Role: engines reserve their memory up front, so the loop needs ``vllm:kv_cache_usage_perc`` and
``vllm:num_requests_waiting`` to know how full a GPU really is (`gpupool.agent.pressure`). Scraping
runs off the loop's thread so a slow engine never delays a tick; `views` is a dictionary read.

Invariants:
- engines are scraped concurrently, on a `KeyedPool` with one worker per engine address: each call
  has its own deadline (`VllmControl.deadline_s`), and an engine whose scrape is still in flight is
  skipped by the next rounds (never queued behind itself), so a slow engine delays only its own
  metrics, never the other engines' on the node;
- `scrape_once` returns once every engine it started a scrape of has answered or failed (an engine
  whose scrape was already in flight is not waited for); `start` begins the periodic rounds and
  then waits for the first one, so the first tick reads the engines that answer;
- `views` returns one `EngineView` per engine configured on that GPU, in endpoint order; an engine
  never scraped successfully has ``kv_usage=None`` (fail closed), and ``age_s`` is measured on the
  agent's clock from the last good scrape.
- `parse_engine_spec` accepts ``gpu=<id>,url=<http url>[,reserved_mib=<int>]`` and names the bad
  field otherwise (a URL that does not parse, with its host and port, is refused here, not at the
  first scrape).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpupool.adapters.pause.vllm import EngineMetrics, VllmControl
from gpupool.agent.pressure import EngineView
from gpupool.agent.workers import KeyedPool, engine_key
from gpupool.core.clock import Clock
from gpupool.core.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class Engine:
    gpu_id: str
    endpoint: str
    reserved_mib: int = 0
    """Device memory the engine reserved (weights + KV pool); 0 = unknown (no slack is credited)."""


def parse_engine_spec(spec: str) -> Engine:
    fields: dict[str, str] = {}
    for part in spec.split(","):
        key, sep, value = part.partition("=")
        if not sep:
            raise InvalidInput("engine", spec, "expected gpu=<id>,url=<http url>[,reserved_mib=<int>]")
        fields[key.strip()] = value.strip()
    gpu, url = fields.get("gpu", ""), fields.get("url", "")
    if not gpu:
        raise InvalidInput("engine.gpu", gpu, "must name the GPU the engine runs on")
    if not url.startswith(("http://", "https://")):
        raise InvalidInput("engine.url", url, "must be an http(s) URL")
    try:
        host, _port = urlsplit(url).hostname, urlsplit(url).port  # (.port raises for a bad one)
    except ValueError as exc:
        raise InvalidInput("engine.url", url, f"not a valid URL: {exc}") from None
    if not host or any(c.isspace() or not c.isprintable() for c in url):
        raise InvalidInput("engine.url", url, "not a valid URL: needs a host and no spaces")
    raw = fields.get("reserved_mib", "0")
    if not (raw.isascii() and raw.isdigit()):  # isdigit alone takes '²', which int() refuses
        raise InvalidInput("engine.reserved_mib", raw, "must be an integer >= 0")
    return Engine(gpu, url.rstrip("/"), int(raw))


class EngineScraper:
    def __init__(
        self,
        engines: Sequence[Engine],
        *,
        clock: Clock,
        control: VllmControl | None = None,
        period_s: float = 0.1,
    ) -> None:
        self.engines = sorted(engines, key=lambda e: (e.gpu_id, e.endpoint))
        self.clock = clock
        self.control = control or VllmControl(timeout_s=1.0, deadline_s=2.0)
        self.period_s = period_s
        self._latest: dict[str, EngineMetrics] = {}
        self._in_flight: set[str] = set()
        """Endpoints whose scrape was started and has not answered or failed yet."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        addresses = {self._key(e) for e in self.engines}
        self._pool = KeyedPool(max(1, len(addresses)), name="gpupool-engine-scraper")

    @staticmethod
    def _key(e: Engine) -> str:
        return engine_key(e.endpoint) or e.endpoint

    def _scrape(self, e: Engine) -> None:
        try:
            m = self.control.scrape(e.endpoint, at_s=self.clock.now())
            if m is not None:
                with self._lock:
                    self._latest[e.endpoint] = m
        finally:
            with self._lock:
                self._in_flight.discard(e.endpoint)

    def _round(self) -> list[Future[None]]:
        """Start a scrape of every engine that has none in flight; their futures."""
        started = []
        for e in list(self.engines):
            with self._lock:
                if e.endpoint in self._in_flight:
                    continue
                self._in_flight.add(e.endpoint)
            try:
                started.append(self._pool.submit(functools.partial(self._scrape, e), key=self._key(e)))
            except RuntimeError:  # (the pool is shut down: stopping)
                with self._lock:
                    self._in_flight.discard(e.endpoint)
        return started

    def scrape_once(self) -> None:
        wait(self._round())

    def views(self, gpu_id: str, now_s: float) -> Sequence[EngineView]:
        out = []
        with self._lock:
            for e in self.engines:
                if e.gpu_id != gpu_id:
                    continue
                m = self._latest.get(e.endpoint)
                if m is None:
                    out.append(EngineView(e.endpoint, e.reserved_mib, None))
                else:
                    out.append(
                        EngineView(e.endpoint, e.reserved_mib, m.kv_usage, m.requests_waiting, now_s - m.at_s)
                    )
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self._round()

    def start(self) -> None:
        if self._thread is None and self.engines:
            first = self._round()
            self._thread = threading.Thread(target=self._run, name="gpupool-engine-scraper", daemon=True)
            self._thread.start()
            wait(first)  # (the other engines' rounds go on meanwhile)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._pool.shutdown()  # (each scrape in flight ends within its deadline)
        self.control.close()
