"""docs/lifecycle.md's kubeadm files, as kubeadm and each release's API server take them.

kubeadm (v1.37.2, built with the other peers) validates each file strictly; the feature gates
a file names are checked against the API server of the release this run is at (the
compatibility runs check the others), with the stage and default the page states.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.pages import DOCS, labelled_blocks
from tests.peers.build import PeerBinaries
from tests.peers.profile import chosen_version, settable_gates

#: The page's kubeadm files by the releases each is for, and the gates each release has as
#: the page says: stage and default.
FILES: Mapping[str, tuple[tuple[int, ...], Mapping[str, tuple[str, bool]]]] = {
    "kubeadm: Kubernetes 1.34, 1.35": ((34, 35), {"DRAConsumableCapacity": ("ALPHA", False)}),
    "kubeadm: Kubernetes 1.36, 1.37": (
        (36, 37),
        {"DRAConsumableCapacity": ("BETA", True), "DRANodeAllocatableResources": ("ALPHA", False)},
    ),
}


def validate(kubeadm: Path, text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "kubeadm.yaml"
    config.write_text(text)
    return subprocess.run(
        [str(kubeadm), "config", "validate", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def gates_named(text: str) -> dict[str, bool]:
    """Every feature gate a kubeadm file sets, for any component."""
    named: dict[str, bool] = {}
    for document in yaml.safe_load_all(text):
        if document["kind"] == "KubeletConfiguration":
            named.update(document.get("featureGates", {}))
            continue
        for component in ("apiServer", "controllerManager", "scheduler"):
            args: list[dict[str, Any]] = document.get(component, {}).get("extraArgs", [])
            for arg in args:
                if arg["name"] == "feature-gates":
                    for pair in arg["value"].split(","):
                        gate, _, on = pair.partition("=")
                        named[gate] = on == "true"
    return named


@pytest.mark.parametrize("label", FILES)
def test_kubeadm_takes_the_file(label: str, node_binaries: PeerBinaries, tmp_path: Path) -> None:
    (text,) = labelled_blocks(DOCS / "lifecycle.md", "yaml", label)
    done = validate(node_binaries["kubeadm"], text, tmp_path)
    assert done.returncode == 0, f"{label}: {done.stderr}"
    # The check is strict: the same file with a misspelt field is refused.
    misspelt = text.replace("cpuManagerPolicy:", "cpuManagerPolicies:")
    assert misspelt != text
    refused = validate(node_binaries["kubeadm"], misspelt, tmp_path)
    assert refused.returncode != 0
    assert 'unknown field "cpuManagerPolicies"' in refused.stderr


def test_the_gates_are_those_of_this_release(peer_binaries: PeerBinaries) -> None:
    minor = int(chosen_version().split(".")[1])
    ((label, (_, stages)),) = [(k, v) for k, v in FILES.items() if minor in v[0]]
    (text,) = labelled_blocks(DOCS / "lifecycle.md", "yaml", label)
    settable = settable_gates(peer_binaries.kube_apiserver)
    for gate, on in gates_named(text).items():
        assert on, f"{label}: {gate} is turned off"
        assert gate in settable, f"{label}: {gate} cannot be set at {chosen_version()}"
    for gate, stage in stages.items():
        assert settable[gate] == stage, f"{label}: {gate} at {chosen_version()}"
        if stage[1]:
            assert gate not in gates_named(text), f"{label}: {gate} is on by default"
        else:
            assert gate in gates_named(text), f"{label}: {gate} is off by default"
