"""Tidal (day/night) time-sharing in the core, stdlib only:

- `modes` — the DAY / TRANSITION / NIGHT mode machine (`TidalController`) on online demand, with the
  seed's schedule as configurable defaults, per time zone, and `CompressedClock` for demos;
- `partition` — MIG re-partition plans for the night (merge a drained GPU's slices into one large
  batch instance and back), legal placements from the hardware catalogue;
- `jobs` — batch job specs, their states and legal transitions, and the P2 lease request of a job.

The package re-exports the mode machine's names (``from gpupool.core.tidal import TidalController``).
"""

from gpupool.core.tidal.modes import CompressedClock, Mode, TidalConfig, TidalController

__all__ = ["CompressedClock", "Mode", "TidalConfig", "TidalController"]
