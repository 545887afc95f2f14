"""A way to get a copy of a generated sysfs tree that a test may break."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .sysfs_trees import FIXTURES, CopyTree


@pytest.fixture
def sysfs_copy(tmp_path: Path) -> CopyTree:
    """A function copying the named shape's tree into tmp_path, returning the copy's root."""

    def copy(shape: str) -> Path:
        return Path(shutil.copytree(FIXTURES / shape, tmp_path / shape))

    return copy
