"""`EngineScraper`: keeps the newest ``/metrics`` of every vLLM-style engine on this node.

Role: engines reserve their memory up front, so the loop needs ``vllm:kv_cache_usage_perc`` and
``vllm:num_requests_waiting`` to know how full a GPU really is (`gpupool.agent.pressure`). Scraping
runs on its own thread so a slow engine never delays a tick; `views` is a dictionary read.

Invariants:
- `views` returns one `EngineView` per engine configured on that GPU, in endpoint order; an engine
  never scraped successfully has ``kv_usage=None`` (fail closed), and ``age_s`` is measured on the
  agent's clock from the last good scrape.
- `parse_engine_spec` accepts ``gpu=<id>,url=<http url>[,reserved_mib=<int>]`` and names the bad
  field otherwise (a URL that does not parse, with its host and port, is refused here, not at the
  first scrape).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from gpupool.adapters.pause.vllm import EngineMetrics, VllmControl
from gpupool.agent.pressure import EngineView
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
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def scrape_once(self) -> None:
        for e in self.engines:
            m = self.control.scrape(e.endpoint, at_s=self.clock.now())
            if m is not None:
                with self._lock:
                    self._latest[e.endpoint] = m

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
            self.scrape_once()

    def start(self) -> None:
        if self._thread is None and self.engines:
            self.scrape_once()
            self._thread = threading.Thread(target=self._run, name="gpupool-engine-scraper", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.control.close()
