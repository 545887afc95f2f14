"""Live reconfiguration from the configuration file (mounted from a ConfigMap).

The kubelet swaps a ConfigMap's mounted files in place when the ConfigMap changes, so the
file is checked now and then; a changed file is parsed and handed to the policy under the
owner's lock. A file that does not parse, or that the policy refuses (say, reserving CPUs a
claim holds), is reported once and the configuration in force stays.

A file is done with only once it is applied. One that does not parse never will, so it is
not parsed again until it changes; but one the policy refused may be taken later (the
claim holding those CPUs goes), so every check offers it again, and reports a refusal only
when its reason is new.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

import yaml

from nodedra.policy import ConfigError, PolicyConfig, PolicyError, parse_config

log = logging.getLogger(__name__)


class ConfigWatcher:
    """Applies the configuration file whenever its content changes, until it is applied."""

    def __init__(
        self,
        path: Path,
        apply: Callable[[PolicyConfig], None],
        counted: Callable[[str], None] = lambda result: None,
    ) -> None:
        self._path = path
        self._apply = apply
        self._counted = counted
        try:
            content = self._read()
        except ConfigError:  # the start-up read it, or it is reported at the first check
            content = None
        self._applied = _digest(content) if content is not None else None
        """The digest of the file in force (at start: as it was read to start with)."""
        self._refused: tuple[str, str] | None = None
        """The digest of the file refused last and why: reported once."""
        self._unparsable: str | None = None
        """The digest of a file that does not parse: not parsed again."""
        self._gone = content is None

    def _read(self) -> bytes | None:
        try:
            return self._path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:  # unreadable now, perhaps not at the next check
            raise ConfigError(
                f"cannot read configuration {self._path}: {err.strerror or err}"
            ) from None

    def check(self) -> str | None:
        """Apply the file if it is not in force.

        "applied", "refused" (reported once for a file and a reason), or None (nothing new).
        """
        try:
            content = self._read()
        except ConfigError as err:
            return self._refuse("", err)
        if content is None:
            if not self._gone:
                log.warning("configuration %s is gone; the one in force stays", self._path)
            self._gone = True
            return None
        self._gone = False
        digest = _digest(content)
        if digest == self._applied:  # a refused file coming back is news again
            self._refused = self._unparsable = None
            return None
        if digest == self._unparsable:
            return None
        return self._offer(digest, content)

    def _offer(self, digest: str, content: bytes) -> str | None:
        """Parse the file and hand it to the policy: "applied", "refused" or None."""
        try:
            config = self._parse(content)
        except ConfigError as err:
            self._unparsable = digest
            return self._refuse(digest, err)
        try:
            self._apply(config)
        except PolicyError as err:
            return self._refuse(digest, err)
        self._applied, self._refused, self._unparsable = digest, None, None
        log.info("configuration %s applied", self._path)
        self._counted("applied")
        return "applied"

    def _parse(self, content: bytes) -> PolicyConfig:
        """The configuration in ``content``: the bytes digested, not the file read again."""
        try:
            data = yaml.safe_load(content)
        except yaml.YAMLError as err:
            raise ConfigError(f"{self._path}: not valid YAML: {err}") from None
        return parse_config(data, str(self._path))

    def _refuse(self, digest: str, err: Exception) -> str | None:
        """Report a refusal, unless it is the one reported last."""
        if self._refused == (digest, str(err)):
            return None
        self._refused = (digest, str(err))
        log.error("configuration %s refused, the one in force stays: %s", self._path, err)
        self._counted("refused")
        return "refused"


def _digest(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()
