"""The cluster's ResourceClaims as the node agent follows them, one job per module.

- ``watch``: the ResourceClaim watch (``ClaimFeed``), a thread of its own: every claim of
  the cluster streams past it, only those that can concern us are parsed.
- ``index``: the claims allocated to our driver on our node (``ClaimIndex``), which the
  watch feeds, and whether it follows the cluster now.
- ``status``: our entries of the claims' ``status.devices`` (``StatusWriter``, a thread),
  queued by kubelet requests and watch events.
- ``orphans``: claims held here whose ResourceClaim is gone (``OrphanTracker``).

``nodedra.runtime`` wires them together. Parsing a claim is ``nodedra.dra.claims``'s.
"""

from .index import ClaimIndex
from .orphans import OrphanTracker
from .status import StatusWriter
from .watch import ClaimFeed

__all__ = ["ClaimFeed", "ClaimIndex", "OrphanTracker", "StatusWriter"]
