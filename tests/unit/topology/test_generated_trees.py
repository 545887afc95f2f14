"""The committed sysfs trees are exactly what tests/fixtures/sysfs/generate.py writes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .sysfs_trees import FIXTURES, GENERATOR, SHAPES


def files_under(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    # Run as a script, the way a developer does, into a scratch directory.
    subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(tmp_path)],
        check=True,
        timeout=120,
    )
    generated = sorted(path.name for path in tmp_path.iterdir())
    assert generated == sorted(SHAPES)
    for shape in SHAPES:
        committed = files_under(FIXTURES / shape)
        fresh = files_under(tmp_path / shape)
        assert committed.keys() == fresh.keys(), f"{shape}: rerun generate.py and commit"
        changed = [name for name in fresh if committed[name] != fresh[name]]
        assert not changed, f"{shape}: {changed[:5]} differ; rerun generate.py and commit"


def test_generating_twice_replaces_old_files(tmp_path: Path) -> None:
    stale = tmp_path / "offline-cpus" / "devices/system/cpu/cpu5/topology/core_id"
    stale.parent.mkdir(parents=True)
    stale.write_text("1\n")
    other = tmp_path / "not-a-shape" / "keep"
    other.parent.mkdir()
    other.write_text("mine\n")
    subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(tmp_path)],
        check=True,
        timeout=120,
    )
    assert not stale.exists()
    assert other.read_text() == "mine\n"


def test_trees_survive_git() -> None:
    # git keeps neither empty directories nor file modes beyond the executable bit, so a
    # tree that needs either would differ after a checkout.
    for shape in SHAPES:
        for path in (FIXTURES / shape).rglob("*"):
            assert not path.is_symlink(), path
            if path.is_dir():
                assert any(path.iterdir()), f"empty directory {path}"
            else:
                assert path.read_bytes().isascii(), path
                assert path.read_bytes().endswith(b"\n"), path
