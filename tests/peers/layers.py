"""A directory tree packed into an image layer: the tar an OCI image's layer is.

The images built here (nodedra's, tests.peers.image; the Dockerfile's base image,
tests.peers.dockerfile_image) are made of root filesystems on disk: a debootstrap tree, or the
upper directory of an overlay that holds what an installation changed. `pack_layer` writes
such a tree as an uncompressed layer tar, deterministic where it must be, with overlayfs's
whiteouts translated to OCI's; tests.peers.oci writes the image archive around the layers.
"""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path


def _is_whiteout(st: os.stat_result) -> bool:
    """overlayfs marks a deleted lower file by a character device 0/0 in the upper directory."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _is_opaque(path: Path) -> bool:
    """overlayfs marks a directory that hides the lower one's entries (made anew where one
    was deleted) with this xattr."""
    try:
        return os.getxattr(path, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False


def _walk(root: Path, relative: str = "") -> Iterator[tuple[str, Path]]:
    """Every entry below ``root`` as (path in the layer, path here), sorted, parents first."""
    with os.scandir(root / relative if relative else root) as entries:
        names = sorted(entry.name for entry in entries)
    for name in names:
        rel = f"{relative}/{name}" if relative else name
        path = root / rel
        yield rel, path
        if path.is_dir() and not path.is_symlink():
            yield from _walk(root, rel)


def pack_layer(
    root: Path, out: Path, *, overlay_upper: bool = False, mtime: int | None = None
) -> int:
    """Write the tree at ``root`` as an uncompressed layer tar at ``out``; returns the bytes
    of its regular files (what the layer takes unpacked).

    Entries are sorted; owners are numeric only (a name would be looked up on this machine,
    not in the image); permissions, symlinks and hard links (within the layer) are kept, and
    the modification times too unless ``mtime`` fixes them. Device nodes and sockets are left
    out (runtimes give containers their own /dev). With ``overlay_upper``, ``root`` is the
    upper directory of an overlay, and its whiteouts and opaque directories become the OCI
    ``.wh.<name>`` and ``.wh..wh..opq`` entries.
    """
    content = 0
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for rel, path in _walk(root):
            st = os.lstat(path)
            if overlay_upper and _is_whiteout(st):
                parent, _, name = rel.rpartition("/")
                _add_marker(tar, f"{parent}/.wh.{name}" if parent else f".wh.{name}")
                continue
            if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) or stat.S_ISSOCK(st.st_mode):
                continue
            info = tar.gettarinfo(str(path), arcname=rel)
            info.uname = info.gname = ""
            if mtime is not None:
                info.mtime = mtime
            if info.isreg():
                content += info.size
                with open(path, "rb") as stream:
                    tar.addfile(info, stream)
            else:
                tar.addfile(info)
            if overlay_upper and info.isdir() and _is_opaque(path):
                _add_marker(tar, f"{rel}/.wh..wh..opq")
    return content


def _add_marker(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.mode = 0o644
    tar.addfile(info)
