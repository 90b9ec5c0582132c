"""vLLM-style engine control over HTTP (httpx): sleep/wake, pause/resume, and engine metrics.

Role: `VllmSleepPauser` frees VRAM (``POST /sleep?level=1|2&mode=keep``; level 1 keeps the weights in
host memory, level 2 drops them; ``mode=keep`` freezes in-flight requests so they continue after the
wake -- vLLM's default, ``abort``, would fail them), wakes with ``POST /wake_up`` and confirms with
``GET /is_sleeping``.
`VllmPausePauser` uses ``POST /pause?mode=keep`` / ``POST /resume``: requests freeze inside the
scheduler with their KV cache kept, so it frees compute only. `scrape_engine` reads
``vllm:kv_cache_usage_perc`` (or, from engines that only have it, the older
``vllm:gpu_cache_usage_perc``) and ``vllm:num_requests_waiting`` from ``/metrics`` (engines reserve
their memory up front, so NVML alone misleads; gateway.md 6.2). A page with neither KV metric reads
as full (``kv_usage`` 1.0): fail closed, the reservation counts as used.

Invariants:
- ``workload.endpoint`` is the engine's base URL (``http://host:port``); every call has a timeout
  and an HTTP or transport failure becomes ``ok=False`` with the reason, never an exception.
- One call holds its thread at most ``deadline_s`` (connect, send and the whole answer; plus at most
  one read's ``timeout_s``) and reads at most ``max_body_bytes``: an engine that answers slowly or
  trickles its answer fails the call (``ok=False``) instead of holding an agent worker for good.
- httpx is imported lazily; one pooled client per pauser (thread-safe).
- `parse_engine_metrics` sums the gauges over label sets (several model names on one engine) and
  ignores every other family.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpupool.adapters.pause.base import PauserBase, Step
from gpupool.core.clock import Clock
from gpupool.core.pausers import Frees, PauseAction, PauseResult, Workload

if TYPE_CHECKING:
    import httpx

KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"
"""The name before vLLM renamed it (deprecated, no longer emitted by default): read when it is alone."""
SLEEP_MODES = ("abort", "wait", "keep")
WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """One scrape of one engine. ``kv_usage`` is 0..1 (max over models); counts are summed."""

    endpoint: str
    kv_usage: float
    requests_waiting: int
    requests_running: int
    at_s: float


def parse_engine_metrics(text: str, *, endpoint: str, at_s: float) -> EngineMetrics:
    """Parse the Prometheus text exposition of a vLLM ``/metrics`` page (only the gauges we use)."""
    kv: dict[str, float] = {}
    waiting = 0.0
    running = 0.0
    for line in text.splitlines():
        name = next((n for n in (KV_USAGE, KV_USAGE_OLD, WAITING, RUNNING) if line.startswith(n)), None)
        if name is None or line[len(name) : len(name) + 1] not in ("{", " "):
            continue
        rest = line[len(name) :]
        if rest.startswith("{"):
            rest = rest[rest.rfind("}") + 1 :]
        fields = rest.split()
        try:
            value = float(fields[0])
        except (IndexError, ValueError):
            continue
        if name in (KV_USAGE, KV_USAGE_OLD):
            kv[name] = max(kv.get(name, 0.0), value)
        elif name == WAITING:
            waiting += value
        else:
            running += value
    usage = kv.get(KV_USAGE, kv.get(KV_USAGE_OLD, 1.0))  # neither: fail closed, as if full
    return EngineMetrics(endpoint, min(max(usage, 0.0), 1.0), int(waiting), int(running), at_s)


def _plain_headers(resp: httpx.Response) -> list[tuple[str, str]]:
    """The answer's headers without those describing the encoded body (it is decoded already)."""
    drop = ("content-encoding", "content-length", "transfer-encoding")
    return [(k, v) for k, v in resp.headers.multi_items() if k.lower() not in drop]


class VllmControl:
    """A small pooled httpx client for one or many engines."""

    def __init__(
        self, *, timeout_s: float = 5.0, deadline_s: float = 10.0, max_body_bytes: int = 4 * 2**20
    ) -> None:
        if not 0 < timeout_s <= deadline_s:
            raise ValueError(
                f"vllm control: timeout_s={timeout_s!r} must be > 0 and <= deadline_s={deadline_s!r}"
            )
        self._timeout_s = timeout_s
        self.deadline_s = deadline_s
        """Bound of one whole call: connect, send and the answer fully read."""
        self.max_body_bytes = max_body_bytes
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def client(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                import httpx

                self._client = httpx.Client(timeout=self._timeout_s)
            return self._client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def call(self, method: str, url: str, **params: Any) -> tuple[bool, str, Any]:
        """(ok, reason, decoded JSON or text). Never raises for HTTP/transport failures."""
        import httpx

        deadline = time.monotonic() + self.deadline_s
        try:
            with self.client().stream(method, url, params=params or None) as resp:
                raw = bytearray()
                for chunk in resp.iter_bytes():  # each read is bounded by timeout_s only
                    raw += chunk
                    if len(raw) > self.max_body_bytes:
                        return False, f"{method} {url}: answer over {self.max_body_bytes} bytes", None
                    if time.monotonic() > deadline:
                        return False, f"{method} {url}: no complete answer within {self.deadline_s:g} s", None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:  # (InvalidURL: a gateway's bad directive)
            return False, f"{method} {url}: {type(exc).__name__}: {exc}", None
        if time.monotonic() > deadline:  # (headers or an empty body that came too late)
            return False, f"{method} {url}: no complete answer within {self.deadline_s:g} s", None
        resp = httpx.Response(resp.status_code, headers=_plain_headers(resp), content=bytes(raw))
        if resp.status_code >= 400:
            return False, f"{method} {url}: HTTP {resp.status_code} {resp.text[:200]}", None
        ctype = resp.headers.get("content-type", "")
        body: Any = resp.text
        if "json" in ctype:
            try:
                body = resp.json()
            except (ValueError, RecursionError):  # (nested deeper than the decoder goes)
                body = resp.text
        return True, f"{method} {url}: HTTP {resp.status_code}", body

    def is_sleeping(self, endpoint: str) -> bool | None:
        ok, _, body = self.call("GET", f"{endpoint}/is_sleeping")
        if not ok:
            return None
        if isinstance(body, dict):
            return bool(body.get("is_sleeping"))
        return str(body).strip().lower() in ("true", "1")

    def scrape(self, endpoint: str, *, at_s: float) -> EngineMetrics | None:
        ok, _, body = self.call("GET", f"{endpoint}/metrics")
        if not ok:
            return None
        return parse_engine_metrics(str(body), endpoint=endpoint, at_s=at_s)


class _HttpPauser(PauserBase):
    name = "vllm"
    frees = Frees.COMPUTE

    def __init__(self, *, control: VllmControl | None = None, clock: Clock | None = None) -> None:
        super().__init__(clock=clock)
        self.control = control or VllmControl()

    def check(self, workload: Workload) -> str | None:
        if not workload.endpoint.startswith(("http://", "https://")):
            return f"{self.name} needs the engine's http(s) endpoint, got {workload.endpoint!r}"
        return None

    def terminate(self, workload: Workload) -> PauseResult:
        return self._declined(
            workload,
            PauseAction.TERMINATE,
            "an engine is not killed by the agent; the gateway stops routing to the revoked lease",
        )

    def _do(
        self, workload: Workload, action: PauseAction, method: str, path: str, **params: Any
    ) -> PauseResult:
        def work() -> Step:
            ok, reason, _ = self.control.call(method, f"{workload.endpoint.rstrip('/')}{path}", **params)
            freed = workload.vram_mib if ok and action is PauseAction.PAUSE and self.frees.frees_vram else 0
            return Step(ok=ok, reason=reason, vram_freed_mib=freed)

        return self._attempt(workload, action, work)


class VllmSleepPauser(_HttpPauser):
    """Sleep mode: level 1 offloads weights to host RAM and drops the KV cache; level 2 drops both."""

    name = "vllm-sleep"
    frees = Frees.COMPUTE_AND_VRAM

    def __init__(
        self,
        *,
        control: VllmControl | None = None,
        clock: Clock | None = None,
        vram_free_estimate_s: float = 1.0,
        mode: str = "keep",
    ) -> None:
        if mode not in SLEEP_MODES:
            raise ValueError(f"vllm sleep mode {mode!r}: must be one of {list(SLEEP_MODES)}")
        super().__init__(control=control, clock=clock)
        self.vram_free_estimate_s = vram_free_estimate_s
        self.mode = mode
        """``keep``: in-flight requests are frozen and continue after the wake (a pause, not a kill)."""

    def pause(self, workload: Workload) -> PauseResult:
        return self._do(
            workload, PauseAction.PAUSE, "POST", "/sleep", level=workload.sleep_level, mode=self.mode
        )

    def resume(self, workload: Workload) -> PauseResult:
        return self._do(workload, PauseAction.RESUME, "POST", "/wake_up")

    def is_paused(self, workload: Workload) -> bool:
        return self.control.is_sleeping(workload.endpoint.rstrip("/")) is True


class VllmPausePauser(_HttpPauser):
    """``/pause?mode=keep``: in-flight requests freeze with their KV kept; frees compute only."""

    name = "vllm-pause"
    frees = Frees.COMPUTE
    vram_free_estimate_s = float("inf")

    def __init__(self, *, control: VllmControl | None = None, clock: Clock | None = None) -> None:
        super().__init__(control=control, clock=clock)
        self._paused: set[str] = set()
        self._lock = threading.Lock()

    def pause(self, workload: Workload) -> PauseResult:
        r = self._do(workload, PauseAction.PAUSE, "POST", "/pause", mode="keep")
        if r.ok:
            with self._lock:
                self._paused.add(workload.lease_id)
        return r

    def resume(self, workload: Workload) -> PauseResult:
        r = self._do(workload, PauseAction.RESUME, "POST", "/resume")
        if r.ok:
            with self._lock:
                self._paused.discard(workload.lease_id)
        return r

    def is_paused(self, workload: Workload) -> bool:
        ok, _, body = self.control.call("GET", f"{workload.endpoint.rstrip('/')}/is_paused")
        if ok and isinstance(body, dict) and "is_paused" in body:
            return bool(body["is_paused"])
        with self._lock:
            return workload.lease_id in self._paused
