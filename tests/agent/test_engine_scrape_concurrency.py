"""One slow engine delays only its own ``/metrics`` scrape (`gpupool.agent.engines.EngineScraper`).

The scraper went through the engines one after the other on one thread: an engine whose
``/metrics`` took seconds to answer held back every other engine's fresh metrics on the node, so
the loop read them stale (and, past their age limit, as full). Real HTTP servers on 127.0.0.1:
one answers at once, one holds each ``/metrics`` request until the test lets it go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest

from gpupool.adapters.pause import VllmControl
from gpupool.agent.engines import Engine, EngineScraper
from gpupool.core.clock import ManualClock
from tests.agent.standin_vllm import HeldEngine, StandinEngine

GPU = "n1/0"
WAIT_S = 30.0
"""How long a test waits for what it expects before it fails (not a timing it asserts)."""


@pytest.fixture
def fast() -> Iterator[StandinEngine]:
    e = StandinEngine()
    yield e
    e.close()


@pytest.fixture
def slow() -> Iterator[HeldEngine]:
    e = HeldEngine(kv_usage=0.5)
    yield e
    e.close()


def kv(scraper: EngineScraper, url: str) -> float | None:
    return next(v.kv_usage for v in scraper.views(GPU, 0.0) if v.endpoint == url)


def eventually(pred: Callable[[], bool]) -> bool:
    """Whether ``pred`` holds within `WAIT_S` (looked at every 10 ms)."""
    pause = threading.Event()
    for _ in range(int(WAIT_S / 0.01)):
        if pred():
            return True
        pause.wait(0.01)
    return pred()


@pytest.mark.timeout(120)
def test_a_held_engine_does_not_hold_back_the_others(fast: StandinEngine, slow: HeldEngine) -> None:
    fast.kv_usage = 0.1
    # a call may wait far longer than this test does: scraped one engine after the other, the fast
    # engine would not be scraped again while the held one's call is in flight
    control = VllmControl(timeout_s=300, deadline_s=300)
    engines = [Engine(GPU, slow.url), Engine(GPU, fast.url)]
    scraper = EngineScraper(engines, clock=ManualClock(), control=control, period_s=0.01)
    starting = threading.Thread(target=scraper.start, daemon=True)  # (waits for the first round)
    starting.start()
    try:
        assert slow.entered.wait(WAIT_S), "the held engine was never scraped"
        fast.kv_usage = 0.9  # a fresh value, set while the held engine's scrape is in flight
        assert eventually(lambda: kv(scraper, fast.url) == 0.9), kv(scraper, fast.url)
        assert slow.held >= 1 and not slow.released.is_set()  # the held engine is still answering
        assert kv(scraper, slow.url) is None  # never scraped successfully yet: fail closed
        slow.released.set()
        assert eventually(lambda: kv(scraper, slow.url) == 0.5)  # its own scrape lands once it answers
        starting.join(WAIT_S)
        assert not starting.is_alive()
    finally:
        slow.released.set()
        scraper.stop()
