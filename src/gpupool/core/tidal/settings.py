"""Settings of the tidal control plane: `PlaneConfig` (the mode machine's `TidalConfig`, the lending
guard's `GuardConfig` and the plane's own knobs) and `plane_config`, which reads them from one flat
mapping (``gpupool serve --tidal-config``'s ``tidal:`` section) and names a bad key as ``tidal.<key>``.

Invariants: a `PlaneConfig` is valid once built (`InvalidInput` otherwise, naming the setting);
unknown keys are refused, never ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.core.errors import InvalidInput
from gpupool.core.tidal.lending import GuardConfig
from gpupool.core.tidal.modes import TidalConfig
from gpupool.core.tidal.numbers import finite_number
from gpupool.core.tidal.standby import StandbyConfig

DAY_POLICIES = ("strict", "lending")
LENDING_SCOPES = ("requests", "kv-budget")


def _finite(name: str, value: float, *, lo: float = 0.0) -> None:
    if not finite_number(value):
        raise InvalidInput(f"tidal.{name}", value, "must be a finite number")
    if value < lo:
        raise InvalidInput(f"tidal.{name}", value, f"must be >= {lo:g}")


@dataclass(frozen=True, slots=True)
class PlaneConfig:
    """The control plane's tidal settings (YAML ``tidal:`` in ``gpupool serve --tidal-config``)."""

    tidal: TidalConfig = field(default_factory=TidalConfig)
    enabled: bool = True
    """The per-cluster off switch: False counts demand and shows the mode but never refuses P2."""
    holdback_s: float = 30.0
    demand_window_s: float = 60.0
    day_batch_concurrency: int = 1
    """Batch jobs the queue runs at once by DAY (in the P2 share); NIGHT: no limit but capacity."""
    repartition_gpus: tuple[str, ...] = ()
    """MIG GPUs merged into large batch instances at NIGHT (drained, re-partitioned, restored)."""
    restore_lead_min_s: float = 600.0
    """Restore starts at least this long before the day window (more: twice the measured time)."""
    day_policy: str = "strict"
    """``strict`` (the seed): by DAY no P2 request enters an online engine; ``lending``: a fraction
    of them does, set by the SLO guard (`gpupool.core.tidal.lending`)."""
    lending: GuardConfig = field(default_factory=GuardConfig)
    lending_scope: str = "requests"
    """What ``lending`` lends by DAY: ``requests`` (a fraction ``level`` of P2 requests enters the
    online engines) or ``kv-budget`` (P2 requests may hold up to ``level`` x the spare KV budget of the
    model's instances: what each keeps free above ``lending_kv_reserve`` of its budget after its
    online requests; a busy instance lends nothing)."""
    lending_kv_reserve: float = 0.5
    """``kv-budget``: the share of every instance's KV budget kept for online work, never lent."""
    standby: StandbyConfig = field(default_factory=StandbyConfig)
    """Standby backends slept at NIGHT through the node agents (`gpupool.core.tidal.standby`)."""

    def __post_init__(self) -> None:
        if type(self.enabled) is not bool:
            raise InvalidInput("tidal.enabled", self.enabled, "must be true or false")
        _finite("holdback_s", self.holdback_s)
        _finite("demand_window_s", self.demand_window_s, lo=1.0)
        _finite("restore_lead_min_s", self.restore_lead_min_s)
        if type(self.day_batch_concurrency) is not int or self.day_batch_concurrency < 0:
            raise InvalidInput(
                "tidal.day_batch_concurrency", self.day_batch_concurrency, "must be an integer >= 0"
            )
        if self.day_policy not in DAY_POLICIES:
            raise InvalidInput(
                "tidal.day_policy", self.day_policy, f"must be one of {', '.join(DAY_POLICIES)}"
            )
        if self.lending_scope not in LENDING_SCOPES:
            raise InvalidInput(
                "tidal.lending_scope", self.lending_scope, f"must be one of {', '.join(LENDING_SCOPES)}"
            )
        r = self.lending_kv_reserve
        if isinstance(r, bool) or not isinstance(r, int | float) or not 0 <= r < 1:
            raise InvalidInput("tidal.lending_kv_reserve", r, "must be a number in [0, 1)")
        for i, g in enumerate(self.repartition_gpus):
            if not isinstance(g, str) or not g:
                raise InvalidInput(f"tidal.repartition_gpus[{i}]", g, "must be a GPU id such as gpu-a/1")


PLANE_KEYS = frozenset(PlaneConfig.__dataclass_fields__) - {"tidal", "lending", "standby"}
TIDAL_KEYS = frozenset(TidalConfig.__dataclass_fields__)
LENDING_KEYS = {f"lending_{k}": k for k in GuardConfig.__dataclass_fields__}
STANDBY_KEYS = {
    ("standby_backends" if k == "backends" else "standby_sleep_level" if k == "level" else f"standby_{k}"): k
    for k in StandbyConfig.__dataclass_fields__
}


def plane_config(doc: object) -> PlaneConfig:
    """A mapping of `PlaneConfig` and `TidalConfig` keys (one flat level) -> `PlaneConfig`.

    Unknown keys and bad values raise `InvalidInput` naming ``tidal.<key>``."""
    if doc is None:
        return PlaneConfig()
    if not isinstance(doc, dict):
        raise InvalidInput("tidal", type(doc).__name__, "must be a mapping of settings")
    for k in doc:
        if k not in PLANE_KEYS and k not in TIDAL_KEYS and k not in LENDING_KEYS and k not in STANDBY_KEYS:
            raise InvalidInput(f"tidal.{k}", doc[k], "unknown setting")
    tidal = {k: v for k, v in doc.items() if k in TIDAL_KEYS}
    plane: dict[str, object] = {k: v for k, v in doc.items() if k in PLANE_KEYS}
    guard = {LENDING_KEYS[k]: v for k, v in doc.items() if k in LENDING_KEYS}
    standby = {STANDBY_KEYS[k]: v for k, v in doc.items() if k in STANDBY_KEYS}
    if "backends" in standby:
        ids = standby["backends"]
        if not isinstance(ids, list | tuple):
            raise InvalidInput("tidal.standby_backends", ids, "must be a list of backend ids")
        standby["backends"] = tuple(ids)
    if "repartition_gpus" in plane:
        gpus = plane["repartition_gpus"]
        if not isinstance(gpus, list | tuple):
            raise InvalidInput("tidal.repartition_gpus", gpus, "must be a list of GPU ids")
        plane["repartition_gpus"] = tuple(gpus)
    try:
        return PlaneConfig(
            tidal=TidalConfig(**tidal),
            lending=GuardConfig(**guard),
            standby=StandbyConfig(**standby),
            **plane,  # type: ignore[arg-type]
        )
    except TypeError as exc:  # a wrong type the dataclass itself rejects
        raise InvalidInput("tidal", doc, str(exc)) from None


__all__ = ["DAY_POLICIES", "LENDING_SCOPES", "PlaneConfig", "plane_config"]
