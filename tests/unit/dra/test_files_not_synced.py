"""Only the checkpoint is fsynced: CDI specs and device metadata are written again by the
kubelet's prepare after every boot, so a prepare does not wait for the disk for them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodedra.dra import CDIStore, ClaimRef, MetadataStore
from nodedra.dra.claims import AllocationResult
from nodedra.lib import durable
from tests.unit.dra.fakes import DRIVER

REF = ClaimRef("ns", "claim", "uid-1")


def test_specs_and_metadata_are_written_without_fsync_the_checkpoint_with(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    cdi = CDIStore(DRIVER, tmp_path / "cdi")
    cdi.write_spec(cdi.claim_spec(REF.uid, [{"env": ["A=1"]}]))
    metadata = MetadataStore(DRIVER, tmp_path / "plugin")
    result = AllocationResult("cpus", DRIVER, "pool", "cpu0")
    metadata.write(metadata.claim_metadata(REF, {"metadata": {}}, [result], [{}]))
    assert synced == []
    assert cdi.has_claim(REF.uid)
    assert metadata.claim_uids().keys() == {REF.uid}

    durable.replace_file(tmp_path / "checkpoint.json", b"{}")
    assert len(synced) == 2, "the checkpoint's file and its directory"
