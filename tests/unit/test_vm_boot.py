"""How the VM node tells a hung boot (tests.peers.vm.VMNode.start), without QEMU."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.peers.vm import SOFT_LOCKUP, VMError, VMNode
from tests.peers.vm_image import VMImage

LOCKUP_LINE = SOFT_LOCKUP + b" - CPU#3 stuck for 45s! [kworker/3:1:50]\n"


def test_only_a_soft_lockup_of_the_boot_under_way_counts_as_a_hung_boot(tmp_path: Path) -> None:
    image = VMImage(tmp_path, tmp_path / "k", tmp_path / "i", tmp_path / "d", "v", "p")
    node = VMNode(image, tmp_path)
    node._check_boot_stalled()  # no console yet: nothing to say

    # An earlier boot's lockup, then this boot's console so far (the log is appended to).
    node.console_path.write_bytes(b"[ 12.0] " + LOCKUP_LINE + b"[ 30.1] reboot: Restarting\n")
    node._console_at = node.console_path.stat().st_size
    with node.console_path.open("ab") as console:
        console.write(b"[ 0.02] RETBleed: WARNING: Spectre v2 mitigation\n")
    node._check_boot_stalled()

    with node.console_path.open("ab") as console:
        console.write(b"[ 48.6] " + LOCKUP_LINE)
    with pytest.raises(VMError, match="soft lockup while booting"):
        node._check_boot_stalled()
