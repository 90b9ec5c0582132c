"""`FakeNvml` is shaped after the installed ``nvidia-ml-py`` (module ``pynvml``), not after memory.

The NVML fixtures are hand-written from reference facts, so the fake that replays them is the only
thing standing between the tests and the real library: every ``nvml*`` function it implements must
exist in pynvml with the same arity (positional parameters, and how many of them are required), and
the constants and types it mirrors must have pynvml's names and values. Drift fails here.
"""

from __future__ import annotations

import inspect

import pytest

from gpupool.adapters.nvml.replay import FakeNvml

pynvml = pytest.importorskip("pynvml")

FUNCTIONS = sorted(n for n, v in vars(FakeNvml).items() if n.startswith("nvml") and callable(v))


def _arity(fn: object, *, drop_self: bool) -> tuple[int, int]:
    params = [
        p
        for p in inspect.signature(fn).parameters.values()  # type: ignore[arg-type]
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if drop_self:
        params = params[1:]
    return len(params), sum(1 for p in params if p.default is p.empty)


def test_the_fake_implements_the_functions_the_source_calls() -> None:
    assert len(FUNCTIONS) >= 25, FUNCTIONS


@pytest.mark.parametrize("name", FUNCTIONS)
def test_each_fake_function_exists_in_pynvml_with_the_same_arity(name: str) -> None:
    real = getattr(pynvml, name, None)
    assert callable(real), f"pynvml has no function {name}"
    assert _arity(getattr(FakeNvml, name), drop_self=True) == _arity(real, drop_self=False), name


@pytest.mark.parametrize(
    "name", ["NVML_TEMPERATURE_GPU", "NVML_DEVICE_MIG_ENABLE", "nvmlEventTypeXidCriticalError"]
)
def test_mirrored_constants_have_pynvml_values(name: str) -> None:
    assert getattr(FakeNvml, name) == getattr(pynvml, name)


def test_mirrored_types_exist_in_pynvml() -> None:
    assert issubclass(pynvml.NVMLError, Exception)
    assert hasattr(pynvml, "c_nvmlGpmMetricsGet_t")
    for field in ("version", "numMetrics", "sample1", "sample2", "metrics"):
        assert field in dict(pynvml.c_nvmlGpmMetricsGet_t._fields_), field
