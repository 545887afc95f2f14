"""OCI image archives of single static binaries, made by hand: the test node needs no registry.

containerd imports an OCI image layout from a tar archive (``ctr images import``) and names the
image after the ``io.containerd.image.name`` annotation of the index, so the node's images are
written here from the binaries of the peer build: one uncompressed layer holding the binary, a
config naming it as the entrypoint, a manifest and an index. The archive is deterministic (fixed
timestamps and owners), so an unchanged binary gives an image with the same digest.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MEDIA_INDEX = "application/vnd.oci.image.index.v1+json"
MEDIA_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MEDIA_CONFIG = "application/vnd.oci.image.config.v1+json"
MEDIA_LAYER = "application/vnd.oci.image.layer.v1.tar"

#: Go's names of the machines, which OCI platforms use.
_GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}


def host_architecture() -> str:
    """This machine's architecture as an OCI platform names it."""
    machine = platform.machine()
    return _GOARCH.get(machine, machine)


@dataclass(frozen=True)
class ImageSpec:
    """One single-binary image: ``binary`` lands at ``/<path_in_image>`` and is the entrypoint."""

    name: str
    """The full reference the node knows it by, e.g. ``nodedra.test/workload:v1``."""
    binary: Path
    path_in_image: str
    env: Mapping[str, str] = field(default_factory=dict)
    cmd: Sequence[str] = ()

    @property
    def entrypoint(self) -> list[str]:
        return ["/" + self.path_in_image]


def _blob(data: bytes) -> tuple[str, bytes]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def _descriptor(media_type: str, digest: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest, "size": len(data), **extra}


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def _layer(spec: ImageSpec) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_member(tar, spec.path_in_image, spec.binary.read_bytes(), 0o755)
    return buffer.getvalue()


def _json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def write_image_archive(spec: ImageSpec, path: Path) -> str:
    """Write ``spec`` as an OCI image layout archive at ``path``; returns the manifest digest."""
    arch = host_architecture()
    layer_digest, layer = _blob(_layer(spec))
    config_digest, config = _blob(
        _json(
            {
                "architecture": arch,
                "os": "linux",
                "config": {
                    "Entrypoint": spec.entrypoint,
                    "Cmd": list(spec.cmd) or None,
                    "Env": [f"{k}={v}" for k, v in sorted(spec.env.items())],
                },
                # Uncompressed: the layer's digest is its diff ID.
                "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            }
        )
    )
    manifest_digest, manifest = _blob(
        _json(
            {
                "schemaVersion": 2,
                "mediaType": MEDIA_MANIFEST,
                "config": _descriptor(MEDIA_CONFIG, config_digest, config),
                "layers": [_descriptor(MEDIA_LAYER, layer_digest, layer)],
            }
        )
    )
    tag = spec.name.rsplit(":", 1)[1] if ":" in spec.name.rsplit("/", 1)[-1] else "latest"
    index = _json(
        {
            "schemaVersion": 2,
            "mediaType": MEDIA_INDEX,
            "manifests": [
                _descriptor(
                    MEDIA_MANIFEST,
                    manifest_digest,
                    manifest,
                    platform={"architecture": arch, "os": "linux"},
                    annotations={
                        "io.containerd.image.name": spec.name,
                        "org.opencontainers.image.ref.name": tag,
                    },
                )
            ],
        }
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _tar_member(tar, "oci-layout", _json({"imageLayoutVersion": "1.0.0"}), 0o644)
        _tar_member(tar, "index.json", index, 0o644)
        for digest, data in (
            (layer_digest, layer),
            (config_digest, config),
            (manifest_digest, manifest),
        ):
            _tar_member(tar, f"blobs/sha256/{digest.removeprefix('sha256:')}", data, 0o644)
    return manifest_digest
