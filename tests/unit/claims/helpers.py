"""What the tests of nodedra.claims share: our driver, and claims allocated to it here."""

from __future__ import annotations

from typing import Any

from tests.unit.dra.fakes import NODE, make_claim, result

TA = "topology-aware.nri.io"


def ours(uid: str, **extra: object) -> dict[str, Any]:
    return make_claim(uid, [result("req", "cpudevnuma000", driver=TA, pool=NODE, **extra)])
