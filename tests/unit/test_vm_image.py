"""The VM image's build helpers that need no root, network or QEMU (tests.peers.vm_image)."""

from __future__ import annotations

import lzma
import os
import shutil
from pathlib import Path

import pytest

from tests.peers import vm_image
from tests.peers.build import PeerBinaries
from tests.peers.vm_image import VMImageError, extract_vmlinux, recipe_key


def test_the_elf_kernel_is_taken_out_of_the_xz_payload_of_a_bzimage() -> None:
    elf = b"\x7fELF" + bytes(range(256)) * 64
    # A bzImage: setup code, the decompressor (which may hold the magic by chance), the xz
    # stream, then trailing data.
    bzimage = b"MZ" + b"\0" * 500 + b"\xfd7zXZ\x00junk" + lzma.compress(elf) + b"\0" * 64
    assert extract_vmlinux(bzimage) == elf


def test_a_bzimage_without_an_xz_elf_payload_is_refused() -> None:
    with pytest.raises(VMImageError, match="no xz-compressed ELF kernel"):
        extract_vmlinux(b"MZ" + lzma.compress(b"not an ELF file"))


def _peers(directory: Path) -> PeerBinaries:
    """Stand-ins for the binaries the guest carries, each file holding its name."""
    names = vm_image.guest_peer_names()
    for name in names:
        (directory / name).write_text(name)
    return PeerBinaries({name: directory / name for name in names})


def test_the_cache_key_changes_with_the_recipe(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    peers = _peers(tmp_path)
    kernel = "linux-image-6.1.0-57-amd64"
    key = recipe_key(kernel, peers)
    assert recipe_key(kernel, peers) == key
    assert recipe_key("linux-image-6.1.0-58-amd64", peers) != key
    monkeypatch.setattr(vm_image, "PACKAGES", (*vm_image.PACKAGES, "iptables"))
    assert recipe_key(kernel, peers) != key
    monkeypatch.setattr(vm_image, "INIT_SCRIPT", vm_image.INIT_SCRIPT + "\n")
    monkeypatch.setattr(vm_image, "PACKAGES", vm_image.PACKAGES[:-1])
    assert recipe_key(kernel, peers) != key
    monkeypatch.undo()
    assert recipe_key(kernel, peers) == key


@pytest.mark.parametrize("changed", vm_image.guest_peer_names())
def test_the_cache_key_follows_the_content_of_the_binaries_the_guest_carries(
    tmp_path: Path, changed: str
) -> None:
    peers = _peers(tmp_path)
    key = recipe_key("linux-image-6.1.0-57-amd64", peers)
    (tmp_path / changed).write_text("rebuilt")
    assert recipe_key("linux-image-6.1.0-57-amd64", peers) != key


def test_without_qemu_and_root_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(VMImageError) as failed:
        vm_image.ensure_host_tools()
    message = str(failed.value)
    for package in ("qemu-system-x86", "qemu-utils", "e2fsprogs"):
        assert package in message
    assert "apt-get install --no-install-recommends" in message
