"""docs/lifecycle.md's runtime and kubelet settings are the ones nodedra and its tests use.

The runtime snippets are checked key by key against the configuration the test bed's
containerd and CRI-O run with (tests.peers), and their paths against nodedra's defaults; the
kubelet's reserved CPUs against the manifests' ``reservedCPUs``. The kubeadm files themselves
are validated by kubeadm in tests/integration/test_lifecycle.py.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from nodedra.dra.cdi import DEFAULT_CDI_DIR
from nodedra.nri.plugin import DEFAULT_SOCKET
from tests.pages import labelled_blocks
from tests.peers.build import PeerBinaries
from tests.peers.mountns import MountNamespace
from tests.peers.runtime import NodeRuntime, RuntimeSetting
from tests.peers.runtime_containerd import Containerd
from tests.peers.runtime_crio import CRIO

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "lifecycle.md"


def blocks(language: str, label: str) -> list[str]:
    """The page's code blocks in ``language`` whose first line is the comment ``# label``."""
    return labelled_blocks(PAGE, language, label)


def keys(table: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every key path of a TOML document."""
    for key, value in table.items():
        if isinstance(value, Mapping):
            yield from keys(value, (*prefix, key))
        else:
            yield (*prefix, key)


def value(table: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        table = table[key]
    return table


def config_of_the_test_bed(runtime: type[NodeRuntime], tmp_path: Path) -> dict[str, Any]:
    """The configuration the test bed's ``runtime`` is started with (its _config)."""
    setting = RuntimeSetting(
        binaries=PeerBinaries({"pinns": tmp_path / "pinns"}),
        workdir=tmp_path,
        bin_dir=tmp_path / "bin",
        runc_root=tmp_path / "runc",
        cni_dir=tmp_path / "cni",
        cdi_dir=tmp_path / "cdi",
        nri_socket=tmp_path / "nri.sock",
        nri_registration_timeout="5s",
        nri_request_timeout="2s",
        log_level="info",
        required_plugin=None,
        tolerate_annotation="",
        namespace=cast(MountNamespace, None),  # not used to write the configuration
        env={},
    )
    return tomllib.loads(runtime(setting, "any")._config())  # type: ignore[attr-defined]


@pytest.mark.parametrize(("label", "runtime"), [("containerd 2.x", Containerd), ("CRI-O", CRIO)])
def test_the_runtime_settings_are_those_the_test_bed_runs_with(
    label: str, runtime: type[NodeRuntime], tmp_path: Path
) -> None:
    (snippet,) = (tomllib.loads(b) for b in blocks("toml", label))
    tested = config_of_the_test_bed(runtime, tmp_path)
    tested_keys = set(keys(tested))
    for path in keys(snippet):
        assert path in tested_keys, f"{label}: {'.'.join(path)} is not in the tested config"
        page, bed = value(snippet, path), value(tested, path)
        if isinstance(page, bool):
            assert page == bed, f"{label}: {'.'.join(path)} = {page}, tested with {bed}"
        elif path[-1] in ("socket_path", "nri_listen"):
            assert Path(page) == DEFAULT_SOCKET, f"{label}: NRI socket {page}"
        elif path[-1] == "cdi_spec_dirs":
            assert DEFAULT_CDI_DIR in page, f"{label}: {page} lacks nodedra's {DEFAULT_CDI_DIR}"


def test_the_kubelet_reserves_what_nodedra_reserves() -> None:
    manifests = next(
        d
        for d in yaml.safe_load_all((ROOT / "manifests" / "configmap.yaml").read_text())
        if d and d.get("kind") == "ConfigMap"
    )
    reserved = yaml.safe_load(manifests["data"]["config.yaml"])["reservedCPUs"]
    files = blocks("yaml", "kubeadm: Kubernetes 1.34, 1.35") + blocks(
        "yaml", "kubeadm: Kubernetes 1.36, 1.37"
    )
    for file in files:
        kubelet = next(d for d in yaml.safe_load_all(file) if d["kind"] == "KubeletConfiguration")
        assert kubelet["reservedSystemCPUs"] == reserved
        assert kubelet["cpuManagerPolicy"] == "none"
