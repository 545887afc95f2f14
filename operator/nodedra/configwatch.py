"""Live reconfiguration from the configuration file (mounted from a ConfigMap).

The kubelet swaps a ConfigMap's mounted files in place when the ConfigMap changes, so the
file is checked now and then; a changed file is parsed and handed to the policy under the
owner's lock. A file that does not parse, or that the policy refuses (say, reserving CPUs a
claim holds), is reported once and the configuration in force stays.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

from nodedra.policy import ConfigError, PolicyConfig, PolicyError, load_config

log = logging.getLogger(__name__)


class ConfigWatcher:
    """Applies the configuration file whenever its content changes."""

    def __init__(
        self,
        path: Path,
        apply: Callable[[PolicyConfig], None],
        counted: Callable[[str], None] = lambda result: None,
    ) -> None:
        self._path = path
        self._apply = apply
        self._counted = counted
        self._seen = self._digest()

    def _digest(self) -> str | None:
        try:
            return hashlib.sha256(self._path.read_bytes()).hexdigest()
        except FileNotFoundError:
            return None

    def check(self) -> str | None:
        """Apply the file if it changed: "applied", "refused", or None (no change)."""
        digest = self._digest()
        if digest == self._seen:
            return None
        self._seen = digest
        if digest is None:
            log.warning("configuration %s is gone; the one in force stays", self._path)
            return None
        try:
            self._apply(load_config(self._path))
        except (ConfigError, PolicyError) as err:
            log.error("configuration %s refused, the one in force stays: %s", self._path, err)
            self._counted("refused")
            return "refused"
        log.info("configuration %s applied", self._path)
        self._counted("applied")
        return "applied"
