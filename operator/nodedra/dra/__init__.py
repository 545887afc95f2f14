"""The kubelet-facing DRA plugin: registration, Prepare/Unprepare, slices, CDI, metadata.

The package owns the plumbing between the kubelet and nodedra and knows nothing of what the
devices it publishes mean: which devices exist, what a claim gets and what its CDI edits say
are the policy's decisions, and making them durable is the owner's.
"""

from .cdi import CDIStore
from .claims import AllocationResult, ClaimError, ClaimRef, claim_configs
from .contracts import ClaimPolicy, Owner, PluginHealth, RequestObserver, RequestReport
from .errors import HealthNotSupportedError, NotServingClaimsError, RecoverableError
from .kube import ClusterAPI, KubeAPIError, KubeClusterAPI
from .metadata import MetadataStore
from .names import (
    DRA_DOMAIN,
    CDIClaimDevice,
    claim_of_cdi_device,
    container_claims,
    driver_name,
)
from .plugin import Options, Plugin, PluginSettings
from .results import PreparedDevice, PrepareResult
from .withheld import Withheld

__all__ = [
    "DRA_DOMAIN",
    "AllocationResult",
    "CDIClaimDevice",
    "CDIStore",
    "ClaimError",
    "ClaimPolicy",
    "ClaimRef",
    "ClusterAPI",
    "HealthNotSupportedError",
    "KubeAPIError",
    "KubeClusterAPI",
    "MetadataStore",
    "NotServingClaimsError",
    "Options",
    "Owner",
    "Plugin",
    "PluginHealth",
    "PluginSettings",
    "PrepareResult",
    "PreparedDevice",
    "RecoverableError",
    "RequestObserver",
    "RequestReport",
    "Withheld",
    "claim_configs",
    "claim_of_cdi_device",
    "container_claims",
    "driver_name",
]
