"""What the kubelet of this node says about itself, read from its files.

Two files, each optional, each read fresh on every call:

- the CPU manager's state file, ``<kubelet root>/cpu_manager_state`` (kubeadm and most
  distributions: ``/var/lib/kubelet``), a checkpoint the kubelet writes whatever its policy
  is, whose ``policyName`` is the policy in effect: a kubelet refuses to start with a policy
  other than the file's, so the file is the truth while it exists;
- the kubelet's configuration file (kubeadm: ``/var/lib/kubelet/config.yaml``), for the
  CPU, memory and topology manager policies and ``reservedSystemCPUs``. Flags given to the
  kubelet win over the file, and nodedra cannot see them: the file is what was meant.

A file that is absent, unreadable or not what it should be is *unknown*, never fine: the
reason is kept for the report. In nodedra's pod each file is a hostPath mount of that one
file (never the kubelet's whole directory, which holds the pods' secrets). The kubelet
replaces its state file (writes a new one and renames it over the old), and a mount of a
file keeps showing the file that was there when the container started: the old file then
has no name left on the host (``st_nlink`` 0), which is how a stale copy is told apart.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Read:
    """What one file said: its data, or why there is none; whether it is a stale copy."""

    path: Path | None
    data: dict[str, Any] | None
    why: str = ""
    """Why ``data`` is None (absent, unreadable, not JSON or YAML): for the report."""
    stale: bool = False
    """The host has replaced the file since it was mounted: ``data`` is what it was then."""

    def get(self, key: str) -> Any:
        """A top-level value of the file; None when absent or when the file is unknown."""
        return None if self.data is None else self.data.get(key)


def _read(path: Path | None, what: str, parse: Any) -> Read:
    if path is None:
        return Read(None, None, f"{what} is not read (no path is set)")
    try:
        with path.open("rb") as file:
            stale = os.fstat(file.fileno()).st_nlink == 0
            text = file.read().decode()
    except FileNotFoundError:
        return Read(path, None, f"{what} {path} does not exist")
    except (OSError, UnicodeDecodeError) as err:
        return Read(path, None, f"cannot read {what} {path}: {err}")
    return _parsed(path, what, text, stale, parse)


def _parsed(path: Path, what: str, text: str, stale: bool, parse: Any) -> Read:
    if not text.strip():
        return Read(path, None, f"{what} {path} is empty", stale)
    try:
        data = parse(text)
    except ValueError as err:  # json.JSONDecodeError and yaml.YAMLError
        return Read(path, None, f"{what} {path} is not what the kubelet writes: {err}", stale)
    if not isinstance(data, dict):
        return Read(path, None, f"{what} {path} is not a mapping", stale)
    return Read(path, data, "", stale)


def _yaml(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(str(err)) from None


def read_state(path: Path | None) -> Read:
    """The CPU manager's state file (JSON)."""
    return _read(path, "the kubelet's CPU manager state file", json.loads)


def read_config(path: Path | None) -> Read:
    """The kubelet's configuration file (YAML or JSON, a KubeletConfiguration)."""
    return _read(path, "the kubelet's configuration file", _yaml)
