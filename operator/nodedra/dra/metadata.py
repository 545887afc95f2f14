"""Device metadata (KEP-5304): a prepared claim's containers told what its devices are.

Kubernetes' standard way for a driver to tell a workload about the devices it got is a file
per claim request, ``<plugin data dir>/dra-device-metadata/<namespace>_<claim>/<request>/
metadata.json``, mounted read-only into the claim's containers at
``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claim>/<request>/<driver>-
metadata.json`` (``resourceclaimtemplates/<pod claim name>/...`` for a claim made from a
template, whose generated name the pod's author cannot know). The file is a stream of
``DeviceMetadata`` objects, one per API version, newest first: a reader takes the first it
understands. Each names the claim and lists the request's devices with their attributes,
in the ResourceSlice's form.

The layout, names and versions are those of ``k8s.io/dynamic-resource-allocation``'s
``kubeletplugin`` (v0.37: ``metadata.go``, ``api/metadata``), so that a program reading the
files of any driver reads ours. The mount differs: the Go helper writes a CDI spec of its own
per request, while ours travels in the claim's spec, on the first device of each request,
so a prepare writes one spec however many requests a claim has. Nothing in the kubelet
takes part and no feature gate is involved: any release's runtime mounts what CDI says.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodedra.lib.durable import remove_leftovers, replace_file

from .claims import AllocationResult, ClaimError, ClaimRef, is_dns_label

log = logging.getLogger(__name__)

METADATA_DIR = "dra-device-metadata"
"""The directory of the files in the plugin's data directory."""
FILE_NAME = "metadata.json"
API_VERSIONS = ("metadata.resource.k8s.io/v1beta1", "metadata.resource.k8s.io/v1alpha1")
"""Newest first: v1beta1 is read from Kubernetes 1.37 on, v1alpha1 by 1.36's readers."""
CONTAINER_DIR = "/var/run/kubernetes.io/dra-device-attributes"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
"""Set on claims made from a pod's template: the name the pod gives the claim."""
MAX_ATTRIBUTES = 32
"""The API's limit on one device's attributes."""
ATTRIBUTE_TYPES = frozenset({"int", "bool", "string", "version"})

_FILE_MODE = 0o644  # the containers may run as any user
_DIR_MODE = 0o755
SWEEP_DELAY = 1.0
"""Seconds after an unprepare before the directories it emptied are removed: off the
kubelet's time (their two removals cost an unprepare about 0.2 ms on a disk), and long
enough for a burst of unprepares to be swept at once."""

Attributes = Mapping[str, Mapping[str, object]]
"""One device's attributes as in a ResourceSlice: name -> {"int": 1} (or bool, string...)."""


@dataclass(frozen=True)
class RequestFile:
    """The metadata file of one request of a claim."""

    path: Path
    container_path: str
    content: bytes
    first_result: int
    """The index of the request's first result: its CDI device carries the mount."""

    def mount(self) -> dict[str, Any]:
        """The CDI mount that puts the file into a container, read-only."""
        return {
            "hostPath": str(self.path),
            "containerPath": self.container_path,
            "options": ["ro", "bind"],
        }


@dataclass(frozen=True)
class ClaimMetadata:
    """A claim's metadata files, made but not written."""

    files: tuple[RequestFile, ...]

    def with_mounts(self, edits: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``edits`` (one per result) with each file mounted by its request's first result."""
        mounted = [dict(e) for e in edits]
        for file in self.files:
            device = mounted[file.first_result]
            device["mounts"] = [*device.get("mounts", ()), file.mount()]
        return mounted


class MetadataStore:
    """The device metadata files of one driver's prepared claims.

    Written after the claim's allocation is committed and before its CDI spec, removed after
    the spec, so a claim with a spec always has its files, and what a crash leaves is a
    file of a claim nobody holds, which the start-up sweep removes (``remove_unheld``). Like
    the specs they are rewritten by every prepare (after a boot too) and are not fsynced.
    The directories a removal empties go a little later (``start_sweeping``), under the
    same locks as the writes, so that a prepare never writes into one being removed.
    """

    def __init__(self, driver: str, plugin_data_dir: Path) -> None:
        self._driver = driver
        self._directory = plugin_data_dir / METADATA_DIR
        self._emptied: set[Path] = set()
        """Claim directories whose files were removed (the owner's lock guards it)."""
        self._sweep = threading.Condition()
        self._sweeper: threading.Thread | None = None
        self._stopping = False

    @property
    def directory(self) -> Path:
        """Where the claims' directories are."""
        return self._directory

    def claim_dir(self, namespace: str, name: str) -> Path:
        """The directory of claim ``namespace/name``'s files (one subdirectory per request)."""
        return self._directory / f"{namespace}_{name}"

    def claim_metadata(
        self,
        ref: ClaimRef,
        claim: Mapping[str, Any],
        results: Sequence[AllocationResult],
        attributes: Sequence[Attributes],
    ) -> ClaimMetadata:
        """The files of claim ``ref``: one per request of ``results``, with their devices.

        ``attributes`` are each result's, in order. A ClaimError names the claim and what
        cannot be written (a request or pod claim name that is no DNS label, too many or
        malformed attributes).
        """
        if len(attributes) != len(results):
            raise ClaimError(
                f"claim {ref}: the policy described {len(attributes)} devices "
                f"for {len(results)} allocation results"
            )
        by_request: dict[str, list[int]] = {}
        for index, result in enumerate(results):
            by_request.setdefault(result.base_request, []).append(index)
        pod_claim_name = _pod_claim_name(ref, claim)
        files = []
        for request, indexes in by_request.items():
            if not is_dns_label(request):
                raise ClaimError(f"claim {ref}: request name {request!r} is not a DNS label")
            devices = [
                {
                    "driver": self._driver,
                    "pool": results[i].pool,
                    "name": results[i].device,
                    "attributes": _checked(ref, results[i].device, attributes[i]),
                }
                for i in indexes
            ]
            document = {
                "metadata": {
                    "name": ref.name,
                    "namespace": ref.namespace,
                    "uid": ref.uid,
                    "generation": 1,
                },
                **({"podClaimName": pod_claim_name} if pod_claim_name else {}),
                # The request as the results name it: "<request>/<subrequest>" if chosen so.
                "requests": [{"name": results[indexes[0]].request, "devices": devices}],
            }
            kind = "resourceclaimtemplates" if pod_claim_name else "resourceclaims"
            files.append(
                RequestFile(
                    path=self.claim_dir(ref.namespace, ref.name) / request / FILE_NAME,
                    container_path=(
                        f"{CONTAINER_DIR}/{kind}/{pod_claim_name or ref.name}/{request}/"
                        f"{self._driver}-metadata.json"
                    ),
                    content=_stream(document),
                    first_result=indexes[0],
                )
            )
        return ClaimMetadata(tuple(files))

    def write(self, metadata: ClaimMetadata) -> None:
        """Write a claim's files, each replaced atomically (a reader never sees half of one)."""
        for file in metadata.files:
            replace_file(
                file.path,
                file.content,
                mode=_FILE_MODE,
                dir_mode=_DIR_MODE,
                survive_power_cut=False,
            )

    def remove_claim(self, ref: ClaimRef) -> None:
        """Remove claim ``ref``'s files; those of another claim of the same name stay.

        A claim deleted and made again under its name may be prepared before the old one is
        unprepared: the files name their claim's UID, and only the old one's go. Their
        directories stay until the next sweep (``remove_emptied``).

        A claim known by its UID alone (an orphan released whose checkpoint kept no name)
        is looked for in every claim's directory, since the files name their UID: else
        they would stay until the next start's sweep. That costs a read per claim held,
        which only such a release pays. A ref without a UID names no file: "" is what an
        unreadable file's UID reads as.
        """
        if not ref.uid:
            return
        named = bool(ref.namespace and ref.name)
        claim_dirs = [self.claim_dir(ref.namespace, ref.name)] if named else self._claim_dirs()
        emptied = False
        for claim_dir in claim_dirs:
            try:
                requests = list(os.scandir(claim_dir))
            except FileNotFoundError:
                continue
            found = False
            for entry in requests:
                path = Path(entry.path) / FILE_NAME
                if entry.is_dir() and _uid_of(path) == ref.uid:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()
                    found = True
            if named or found:
                self._emptied.add(claim_dir)
                emptied = True
        if emptied:
            with self._sweep:
                self._sweep.notify()

    def _claim_dirs(self) -> list[Path]:
        """The directories of every claim with files here."""
        try:
            return [Path(entry.path) for entry in os.scandir(self._directory) if entry.is_dir()]
        except FileNotFoundError:
            return []

    def remove_emptied(self) -> None:
        """Remove the directories removals left empty (holding what a write holds)."""
        emptied, self._emptied = self._emptied, set()
        for claim_dir in emptied:
            with contextlib.suppress(FileNotFoundError):
                for entry in os.scandir(claim_dir):
                    with contextlib.suppress(OSError):  # not empty: another claim's file
                        os.rmdir(entry.path)
            with contextlib.suppress(OSError):
                claim_dir.rmdir()

    def start_sweeping(self, hold: Callable[[], AbstractContextManager[object]]) -> None:
        """Remove emptied directories ``SWEEP_DELAY`` after each removal, inside ``hold()``.

        ``hold`` takes the locks a kubelet request takes, so no write is under way meanwhile.
        """
        with self._sweep:
            self._stopping = False
            self._sweeper = threading.Thread(
                target=self._sweep_loop, args=(hold,), name="metadata-sweeper", daemon=True
            )
        self._sweeper.start()

    def stop_sweeping(self, hold: Callable[[], AbstractContextManager[object]]) -> None:
        """Stop the sweeper, then sweep what is left (inside ``hold()``)."""
        with self._sweep:
            self._stopping = True
            self._sweep.notify()
            sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.join()
        self._sweep_now(hold)

    def _sweep_loop(self, hold: Callable[[], AbstractContextManager[object]]) -> None:
        while True:
            with self._sweep:
                self._sweep.wait_for(lambda: self._stopping or bool(self._emptied))
                if self._stopping or self._sweep.wait_for(lambda: self._stopping, SWEEP_DELAY):
                    return
            self._sweep_now(hold)

    def _sweep_now(self, hold: Callable[[], AbstractContextManager[object]]) -> None:
        try:
            with hold():
                self.remove_emptied()
        except Exception:  # a directory left behind costs nothing: the next start sweeps it
            log.exception("removing emptied device metadata directories failed")

    def remove_unheld(self, held: frozenset[str]) -> list[str]:
        """Remove the files of claims not in ``held`` (a crash left them); their claims."""
        removed: list[str] = []
        for claim_dir in self._claim_dirs():
            removed += self._remove_files(claim_dir, lambda uid: uid not in held)
        return removed

    def remove_leftovers(self) -> list[str]:
        """Remove the temporary files a crash left in the claims' directories; their names."""
        if not self._directory.is_dir():
            return []
        return [
            name
            for request_dir in self._directory.glob("*/*/")
            for name in remove_leftovers(request_dir, FILE_NAME)
        ]

    def claim_uids(self) -> dict[str, list[Path]]:
        """The files on disk by claim UID (a file nobody can read: UID ``""``)."""
        found: dict[str, list[Path]] = {}
        for path in sorted(self._directory.glob(f"*/*/{FILE_NAME}")):
            found.setdefault(_uid_of(path), []).append(path)
        return found

    def _remove_files(self, claim_dir: Path, remove: Callable[[str], bool]) -> list[str]:
        """Remove the requests under ``claim_dir`` whose file's UID ``remove`` accepts.

        Then ``claim_dir`` too if that leaves it empty. Returns the UIDs removed.
        """
        removed = []
        try:
            requests = list(os.scandir(claim_dir))
        except FileNotFoundError:
            return []
        for entry in requests:
            path = Path(entry.path) / FILE_NAME
            uid = _uid_of(path)
            if entry.is_dir() and remove(uid):
                if path.exists():  # else an emptied directory, or a crash's before the file
                    removed.append(uid)
                _remove_request_dir(Path(entry.path))
        with contextlib.suppress(OSError):  # not empty (another claim's request), or gone
            claim_dir.rmdir()
        return removed


def _remove_request_dir(path: Path) -> None:
    """Remove a request's directory: its file, then it (a crash's leftovers too, if any).

    Not ``shutil.rmtree`` first: on every unprepare its walk costs more than the removal.
    """
    with contextlib.suppress(FileNotFoundError):
        (path / FILE_NAME).unlink()
    try:
        path.rmdir()
    except FileNotFoundError:
        pass
    except OSError:  # not empty: a temporary file a crash left beside it
        shutil.rmtree(path)


def _pod_claim_name(ref: ClaimRef, claim: Mapping[str, Any]) -> str | None:
    annotations = claim.get("metadata", {}).get("annotations") or {}
    name = annotations.get(POD_CLAIM_NAME_ANNOTATION) if isinstance(annotations, Mapping) else None
    if name is None or name == "":
        return None
    if not isinstance(name, str) or not is_dns_label(name):
        raise ClaimError(
            f"claim {ref}: annotation {POD_CLAIM_NAME_ANNOTATION} is {name!r}, not the DNS "
            "label a pod's claim name is"
        )
    return name


def _checked(ref: ClaimRef, device: str, attributes: Attributes) -> dict[str, dict[str, object]]:
    """A device's attributes as the API would take them, or a ClaimError naming them."""
    if len(attributes) > MAX_ATTRIBUTES:
        raise ClaimError(
            f"claim {ref}: device {device} has {len(attributes)} attributes, "
            f"more than the {MAX_ATTRIBUTES} device metadata may carry"
        )
    checked = {}
    for name, value in attributes.items():
        if not (isinstance(value, Mapping) and len(value) == 1 and set(value) <= ATTRIBUTE_TYPES):
            raise ClaimError(
                f"claim {ref}: device {device}'s attribute {name!r} is {value!r}, not one "
                f"value of a type in {sorted(ATTRIBUTE_TYPES)}"
            )
        checked[name] = dict(value)
    return checked


def _stream(document: Mapping[str, Any]) -> bytes:
    """The document once per API version, newest first, each a compact JSON object on a line.

    As the Go helper writes it; compact, because json's C encoder writes no indentation
    (with indentation the pure-Python one runs, several times slower, on every prepare).
    """
    return b"".join(
        json.dumps(
            {"kind": "DeviceMetadata", "apiVersion": version, **document}, separators=(",", ":")
        ).encode()
        + b"\n"
        for version in API_VERSIONS
    )


def _uid_of(path: Path) -> str:
    """The claim UID the file at ``path`` names; "" if it cannot be read."""
    try:
        first, _ = json.JSONDecoder().raw_decode(path.read_text())
        uid = first["metadata"]["uid"]
    except (OSError, ValueError, TypeError, KeyError):
        return ""
    return uid if isinstance(uid, str) else ""
