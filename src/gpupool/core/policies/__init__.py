"""Built-in placement policies, one small module each, selected by name through `get_policy`.

A policy is a pure function of an immutable `SliceState` and the demand; it returns an integer cost
(lower is better) and, to let the allocator stop scanning the free index early, a lower bound on the
cost of any slice that would leave at least a given amount of VRAM (``None`` = no bound: full scan).
"""

from __future__ import annotations

from gpupool.core.policies.base import Policy
from gpupool.core.policies.bestfit import BestFit2D
from gpupool.core.policies.fraggradient import FragGradient
from gpupool.core.policies.seed_bestfit import SeedBestFit
from gpupool.core.policies.spread import Spread

POLICIES: dict[str, type[Policy]] = {
    BestFit2D.name: BestFit2D,
    FragGradient.name: FragGradient,
    SeedBestFit.name: SeedBestFit,
    Spread.name: Spread,
}

DEFAULT_POLICY = BestFit2D.name


def get_policy(name: str) -> Policy:
    from gpupool.core.errors import InvalidInput

    try:
        return POLICIES[name]()
    except KeyError:
        raise InvalidInput("policy", name, f"known policies: {', '.join(sorted(POLICIES))}") from None


__all__ = [
    "DEFAULT_POLICY",
    "POLICIES",
    "BestFit2D",
    "FragGradient",
    "Policy",
    "SeedBestFit",
    "Spread",
    "get_policy",
]
