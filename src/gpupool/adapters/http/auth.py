"""Bearer-token auth: a table of sha256(token) -> (tenant, role), looked up in constant time.

Invariants: raw tokens are never kept after construction (only their digests); a lookup hashes the
presented token and compares digests with ``hmac.compare_digest``; roles are ``tenant`` or ``admin``.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass

from gpupool.core.errors import InvalidInput

ROLES = ("tenant", "admin")


@dataclass(frozen=True, slots=True)
class Principal:
    tenant: str
    role: str

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


class TokenTable:
    def __init__(self, entries: Iterable[tuple[str, str, str]]) -> None:
        """``entries``: (token, tenant, role)."""
        self._by_digest: dict[bytes, tuple[bytes, Principal]] = {}
        for i, (token, tenant, role) in enumerate(entries):
            if not isinstance(token, str) or len(token) < 8:
                raise InvalidInput(f"tokens[{i}].token", "***", "must be a string of at least 8 characters")
            if not isinstance(tenant, str) or not tenant:
                raise InvalidInput(f"tokens[{i}].tenant", tenant, "must be a non-empty string")
            if role not in ROLES:
                raise InvalidInput(f"tokens[{i}].role", role, "must be tenant or admin")
            d = _digest(token)
            if d in self._by_digest:
                raise InvalidInput(f"tokens[{i}].token", "***", "duplicate token")
            self._by_digest[d] = (d, Principal(tenant, role))
        if not self._by_digest:
            raise InvalidInput("tokens", [], "at least one token is needed")

    def lookup(self, token: str) -> Principal | None:
        d = _digest(token)
        hit = self._by_digest.get(d)
        if hit is None or not hmac.compare_digest(hit[0], d):
            return None
        return hit[1]

    def __len__(self) -> int:
        return len(self._by_digest)


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
