"""nodedra's image recipe: the Dockerfile and tests.peers.image build from image/ alone.

The Dockerfile is built only in ``tox -e dockerfile`` (buildah, minutes when cold:
tests/integration/test_dockerfile.py compares its image with tests.peers.image's). What keeps
it honest in every run is that it installs exactly image/packages.txt and runs
image/install.sh, with nothing inlined beside them, and that its ENTRYPOINT, CMD and ENV are
those of the image built here (tests.peers.image, which the integration tests run). This
module checks that by parsing the Dockerfile's instructions, in milliseconds and without
buildah, and checks that the checks catch each kind of drift. It also checks the pieces of
the other builds that need neither root's network nor a node: the OCI archive writer for
prepared layers, the layer packer, the stripping of the base tree, and what the Dockerfile
build's cache key reads of setup.cfg.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import stat
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nodedra import __version__
from tests.peers import debian, dockerfile_image, image, image_base, image_build, layers
from tests.peers.oci import (
    MEDIA_CONFIG,
    MEDIA_LAYER,
    MEDIA_MANIFEST,
    ImageConfig,
    ImageSpec,
    Layer,
    write_image_archive,
    write_layers_archive,
)

# -- the Dockerfile, as Docker reads it ------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str
    line: int


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[Instruction]

    def runs(self) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == "RUN"]


def parse_dockerfile(text: str) -> list[Stage]:
    """The stages of a Dockerfile: lines joined where they end in ``\\``, comment lines (also
    inside a continued instruction, as Docker drops them) and blank lines left out."""
    instructions: list[Instruction] = []
    current, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if not current:
            start = number
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        keyword, _, args = (current + line).partition(" ")
        instructions.append(Instruction(keyword.upper(), args.strip(), start))
        current = ""
    assert not current, "the Dockerfile ends inside a continued instruction"
    stages: list[Stage] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            words = instruction.args.split()
            name = words[2] if len(words) == 3 and words[1].lower() == "as" else ""
            stages.append(Stage(words[0], name, []))
        else:
            assert stages, f"line {instruction.line}: {instruction.keyword} before any FROM"
            stages[-1].instructions.append(instruction)
    return stages


def run_parts(args: str) -> tuple[list[str], str]:
    """A RUN's flags (``--mount=...``) and its shell command."""
    flags = []
    rest = args
    while match := re.match(r"(--\S+)\s+", rest):
        flags.append(match.group(1))
        rest = rest[match.end() :]
    return flags, rest


def commands(shell: str) -> list[str]:
    """The simple commands of a shell command line (split at ``&&``, ``||``, ``;``, ``|``)."""
    return [c.strip() for c in re.split(r"&&|\|\||;|\|", shell) if c.strip()]


def env_of(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in stage.instructions:
        if instruction.keyword == "ENV":
            words = shlex.split(instruction.args)
            if "=" not in words[0]:  # the old form: ENV KEY value with spaces
                env[words[0]] = " ".join(words[1:])
            else:
                for word in words:
                    key, _, value = word.partition("=")
                    env[key] = value
    return env


#: What the Dockerfile's base stage runs to read image/packages.txt (bound at /image).
PACKAGES_ASSIGNMENT = "packages=$(sed -e 's/#.*//' /image/packages.txt)"
IMAGE_MOUNT = "--mount=type=bind,source=image,target=/image"
WHEELS_MOUNT = "--mount=type=bind,from=wheels,source=/wheels,target=/wheels"
INSTALL_COMMAND = "sh /image/install.sh /wheels"
#: Ways of installing software that only image/ may hold.
_INSTALLERS = {
    "pip install": re.compile(r"\b(?:pip[0-9.]*|-m\s+pip)\b[^&;|]*\binstall\b"),
    "apt-get/apt install": re.compile(r"\bapt(?:-get)?\b[^&;|]*\binstall\b"),
    "dpkg -i": re.compile(r"\bdpkg\b[^&;|]*\s(?:-i|--install)\b"),
    "setup.py install": re.compile(r"\bsetup\.py\b[^&;|]*\binstall\b"),
}


def _config_problems(stages: list[Stage]) -> list[str]:
    """Where the image's ENTRYPOINT, CMD, ENV, WORKDIR and USER differ from the other build's."""
    by_name = {s.name: s for s in stages if s.name}
    chain = [stages[-1]]
    while chain[-1].base in by_name:
        chain.append(by_name[chain[-1].base])
    merged: dict[str, str] = {}
    last: dict[str, str] = {}
    for stage in reversed(chain):
        merged.update(env_of(stage))
        for instruction in stage.instructions:
            last[instruction.keyword] = instruction.args
    expected = image.IMAGE_CONFIG
    exec_forms: dict[str, Any] = {}
    for key in ("ENTRYPOINT", "CMD"):
        try:
            exec_forms[key] = json.loads(last.get(key, "null"))
        except ValueError:
            exec_forms[key] = f"{last[key]} (not the JSON exec form)"
    found = {
        **exec_forms,
        "ENV": merged,
        "WORKDIR": last.get("WORKDIR", ""),
        "USER": last.get("USER", ""),
    }
    wanted: dict[str, Any] = {
        "ENTRYPOINT": list(expected.entrypoint),
        "CMD": list(expected.cmd),
        "ENV": dict(expected.env),
        "WORKDIR": expected.working_dir,
        "USER": expected.user,
    }
    return [
        f"the image's {key} is {found[key]!r} in the Dockerfile but {wanted[key]!r} in "
        "tests.peers.image (IMAGE_CONFIG): change both"
        for key in wanted
        if found[key] != wanted[key]
    ]


def _base_problems(stage: Stage) -> list[str]:
    """The base stage: debian:<SUITE>-slim with image/packages.txt installed, and nothing more."""
    problems = []
    if stage.base != f"debian:{debian.SUITE}-slim":
        problems.append(
            f"the image's system is {stage.base}, but tests.peers.image builds Debian "
            f"{debian.SUITE} (debian:{debian.SUITE}-slim)"
        )
    runs = stage.runs()
    if len(runs) != 1:
        problems.append(
            f"the base stage has {len(runs)} RUN instructions; it installs image/packages.txt "
            "in one and does nothing else (put what the image needs in image/)"
        )
        return problems
    flags, shell = run_parts(runs[0].args)
    if IMAGE_MOUNT not in flags:
        problems.append(f"the base stage's RUN does not bind image/ at /image ({IMAGE_MOUNT})")
    parts = commands(shell)
    if PACKAGES_ASSIGNMENT not in parts:
        problems.append(
            f"the base stage does not read its packages from image/packages.txt "
            f"({PACKAGES_ASSIGNMENT})"
        )
    installs = [c for c in parts if re.match(r"apt-get\s+install\b", c)]
    if len(installs) != 1:
        problems.append(f"the base stage runs {len(installs)} apt-get installs, not one")
        return problems
    words = installs[0].split()[2:]
    if "--no-install-recommends" not in words:
        problems.append("apt-get install without --no-install-recommends (debootstrap has none)")
    named = [w for w in words if not w.startswith("-")]
    if named != ["$packages"]:
        problems.append(
            f"apt-get install names packages itself ({' '.join(named)}): list them in "
            "image/packages.txt, which both builds install"
        )
    return problems


def _installer_problems(stages: list[Stage], base: Stage | None) -> list[str]:
    """Software installed by the Dockerfile itself, not by image/ (the base stage's one
    apt-get install of image/packages.txt aside, which _base_problems checks)."""
    problems = []
    for stage in stages:
        for run in stage.runs():
            for command in commands(run_parts(run.args)[1]):
                if stage is base and re.match(r"apt-get\s+install\b", command):
                    continue
                problems += [
                    f"line {run.line}: {what} in the Dockerfile ({command}); only image/ says "
                    "what the image holds (image/packages.txt, image/install.sh)"
                    for what, pattern in _INSTALLERS.items()
                    if pattern.search(command)
                ]
    return problems


def _image_stage_problems(final: Stage) -> list[str]:
    """The image's own stage runs image/install.sh on the wheels, and nothing else."""
    problems = []
    runs = final.runs()
    install = [r for r in runs if INSTALL_COMMAND in commands(run_parts(r.args)[1])]
    if not install:
        problems.append(f"the image's stage does not run image/install.sh ({INSTALL_COMMAND})")
    elif not {IMAGE_MOUNT, WHEELS_MOUNT} <= set(run_parts(install[0].args)[0]):
        problems.append(f"install.sh's RUN lacks the mounts {IMAGE_MOUNT} and {WHEELS_MOUNT}")
    if len(runs) != 1 or commands(run_parts(runs[0].args)[1]) != [INSTALL_COMMAND]:
        problems.append(
            "the image's stage runs more than image/install.sh: "
            + "; ".join(run_parts(r.args)[1] for r in runs)
        )
    problems += [
        f"line {i.line}: {i.keyword} into the image; install.sh alone puts files there"
        for i in final.instructions
        if i.keyword in ("COPY", "ADD")
    ]
    return problems


def _wheel_stage_problems(wheels: Stage | None) -> list[str]:
    """The wheels are built from what tests.peers.image builds them from."""
    if wheels is None:
        return ["no stage `wheels` makes the wheels install.sh installs"]
    copied = [
        word.rstrip("/")
        for i in wheels.instructions
        if i.keyword == "COPY"
        for word in i.args.split()[:-1]
    ]
    if sorted(copied) == sorted(image.SOURCES):
        return []
    return [
        f"the wheel stage builds from {copied}, tests.peers.image from {list(image.SOURCES)} "
        "(SOURCES)"
    ]


def recipe_problems(text: str) -> list[str]:
    """Everything that lets the Dockerfile's image drift from tests.peers.image's."""
    stages = parse_dockerfile(text)
    by_name = {s.name: s for s in stages if s.name}
    base = by_name.get("base")
    if base is None or stages[-1].base != "base":
        problems = ["the image is not built FROM the stage `base` that installs the packages"]
    else:
        problems = _base_problems(base)
    return (
        problems
        + _installer_problems(stages, base)
        + _image_stage_problems(stages[-1])
        + _wheel_stage_problems(by_name.get("wheels"))
        + _config_problems(stages)
    )


DOCKERFILE_TEXT = image.DOCKERFILE.read_text()


def test_dockerfile_builds_from_image_dir_only() -> None:
    problems = recipe_problems(DOCKERFILE_TEXT)
    assert problems == [], "the Dockerfile drifts from image/:\n" + "\n".join(problems)


def _replace(old: str, new: str) -> str:
    assert old in DOCKERFILE_TEXT, f"the mutation's anchor {old!r} is not in the Dockerfile"
    return DOCKERFILE_TEXT.replace(old, new, 1)


@pytest.mark.parametrize(
    ("mutated", "problem"),
    [
        pytest.param(
            _replace("--no-install-recommends $packages", "--no-install-recommends $packages curl"),
            "apt-get install names packages itself ($packages curl)",
            id="package-added-inline",
        ),
        pytest.param(
            _replace("--no-install-recommends $packages", "--no-install-recommends python3.11"),
            "apt-get install names packages itself (python3.11)",
            id="package-list-inlined",
        ),
        pytest.param(
            _replace("--no-install-recommends $packages", "$packages"),
            "without --no-install-recommends",
            id="recommends",
        ),
        pytest.param(
            _replace(PACKAGES_ASSIGNMENT, "packages=python3.11"),
            "does not read its packages from image/packages.txt",
            id="packages-not-read",
        ),
        pytest.param(
            _replace(INSTALL_COMMAND, "/opt/venv/bin/pip install /wheels/*.whl"),
            "pip install in the Dockerfile",
            id="pip-install-instead-of-install-sh",
        ),
        pytest.param(
            _replace("WORKDIR /\n", "WORKDIR /\nRUN python3.11 -m pip install kopf\n"),
            "pip install in the Dockerfile",
            id="pip-install-added",
        ),
        pytest.param(
            _replace("WORKDIR /\n", "WORKDIR /\nRUN apt-get update && apt-get -y install jq\n"),
            "apt-get/apt install in the Dockerfile",
            id="apt-in-image-stage",
        ),
        pytest.param(
            _replace("WORKDIR /\n", "WORKDIR /\nCOPY operator/ /opt/src/\n"),
            "COPY into the image",
            id="copy-into-image",
        ),
        pytest.param(
            _replace('CMD ["run"]', 'CMD ["run", "--verbose"]'),
            "the image's CMD",
            id="cmd",
        ),
        pytest.param(
            _replace("PYTHONUNBUFFERED=1", "PYTHONUNBUFFERED=1 \\\n    NODEDRA_X=1"),
            "the image's ENV",
            id="env",
        ),
        pytest.param(
            _replace("FROM debian:bookworm-slim AS base", "FROM debian:trixie-slim AS base"),
            "debian:trixie-slim",
            id="suite",
        ),
        pytest.param(
            _replace("COPY grpc_gen/ grpc_gen/\n", ""),
            "the wheel stage builds from",
            id="wheel-sources",
        ),
    ],
)
def test_drift_is_caught(mutated: str, problem: str) -> None:
    problems = recipe_problems(mutated)
    assert any(problem in p for p in problems), f"{problem!r} not among {problems}"


def test_the_dockerfile_reads_packages_txt_as_the_build_does() -> None:
    """The base stage's own shell command (sed, then word splitting), run on
    image/packages.txt, gives the list that debootstrap gets."""
    assert PACKAGES_ASSIGNMENT in DOCKERFILE_TEXT
    command = PACKAGES_ASSIGNMENT.replace("/image/", f"{image_build.IMAGE_DIR}/")
    done = subprocess.run(
        ["sh", "-c", f'{command} && printf "%s\\n" $packages'],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.split() == image_base.read_packages()
    assert "python3.11" in image_base.read_packages()


def test_install_sh_is_posix_sh() -> None:
    script = image.INSTALL_SCRIPT
    assert script.read_text().startswith("#!/bin/sh\n")
    done = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"sh -n {script}: {done.stderr}"
    text = script.read_text()
    assert "--no-index" in text
    assert "--find-links" in text


def test_read_packages(tmp_path: Path) -> None:
    listing = tmp_path / "packages.txt"
    listing.write_text("# comment\npython3.11  # the interpreter\n\nlibfoo1 libc++1\n")
    assert image_base.read_packages(listing) == ["python3.11", "libfoo1", "libc++1"]
    listing.write_text("python3.11\nNot_A_Package\n")
    with pytest.raises(image_build.ImageBuildError, match="Not_A_Package"):
        image_base.read_packages(listing)
    listing.write_text("# nothing\n")
    with pytest.raises(image_build.ImageBuildError, match="names no package"):
        image_base.read_packages(listing)


def test_base_key_changes_with_the_packages_only() -> None:
    assert image_base.base_key(["python3.11"]) == image_base.base_key(["python3.11"])
    assert image_base.base_key(["python3.11"]) != image_base.base_key(["python3.11", "tzdata"])


def test_default_name_is_the_daemonsets_image() -> None:
    daemonset = (image_build.REPO_ROOT / "manifests" / "daemonset.yaml").read_text()
    version = __version__
    assert f"image: nodedra:{version}" in daemonset
    assert f"docker.io/library/nodedra:{version}" == image.DEFAULT_NAME


def test_debian_mirror_is_apts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(debian.MIRROR_ENV, raising=False)
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    assert debian.debian_mirror(apt) == debian.DEFAULT_MIRROR
    (apt / "sources.list").write_text(
        "deb https://packages.example.com/apt example-bookworm main\n"
    )
    (apt / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://security.example.org/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n\n"
        "Types: deb\n# a comment\nURIs: http://mirror.example.org/debian/\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert debian.debian_mirror(apt) == "http://mirror.example.org/debian"
    (apt / "sources.list").write_text(
        "deb [arch=amd64] http://one.example.org/debian bookworm main\n"
    )
    assert debian.debian_mirror(apt) == "http://one.example.org/debian"
    monkeypatch.setenv(debian.MIRROR_ENV, "http://other.example.org/debian/")
    assert debian.debian_mirror(apt) == "http://other.example.org/debian"


# -- layers -------------------------------------------------------------------------------------


def _members(layer: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(layer) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_pack_layer_keeps_files_links_and_modes_and_drops_devices(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "dev").mkdir()
    tool = root / "usr" / "bin" / "tool"
    tool.write_bytes(b"#!/bin/sh\necho tool\n")
    tool.chmod(0o755)
    os.link(tool, root / "usr" / "bin" / "tool-again")
    (root / "usr" / "bin" / "alias").symlink_to("tool")
    secret = root / "secret"
    secret.write_text("x")
    secret.chmod(0o600)
    os.chown(secret, 1234, 5678)
    os.mkfifo(root / "fifo")
    os.mknod(root / "dev" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    layer = tmp_path / "layer.tar"

    unpacked = layers.pack_layer(root, layer, mtime=7)

    members = _members(layer)
    names = list(members)
    assert names == sorted(names, key=lambda n: n.split("/"))
    assert "dev" in members
    assert "dev/null" not in members
    assert not any(m.ischr() or m.isblk() for m in members.values())
    assert members["usr/bin/tool"].isreg()
    assert members["usr/bin/tool"].mode == 0o755
    assert members["usr/bin/tool-again"].islnk()
    assert members["usr/bin/tool-again"].linkname == "usr/bin/tool"
    assert members["usr/bin/alias"].issym()
    assert members["usr/bin/alias"].linkname == "tool"
    assert members["fifo"].isfifo()
    assert (members["secret"].uid, members["secret"].gid, members["secret"].mode) == (
        1234,
        5678,
        0o600,
    )
    assert {m.uname for m in members.values()} == {""}
    assert {m.mtime for m in members.values()} == {7}
    assert unpacked == len(b"#!/bin/sh\necho tool\n") + 1
    with tarfile.open(layer) as tar:
        content = tar.extractfile("usr/bin/tool")
        assert content is not None
        assert content.read() == b"#!/bin/sh\necho tool\n"


def test_pack_layer_turns_overlay_whiteouts_into_oci_ones(tmp_path: Path) -> None:
    upper = tmp_path / "upper"
    (upper / "etc").mkdir(parents=True)
    (upper / "etc" / "new.conf").write_text("new\n")
    os.mknod(upper / "etc" / "gone.conf", stat.S_IFCHR, os.makedev(0, 0))
    (upper / "opt").mkdir()
    os.setxattr(upper / "opt", "trusted.overlay.opaque", b"y")
    (upper / "opt" / "fresh").write_text("f")
    layer = tmp_path / "layer.tar"

    layers.pack_layer(upper, layer, overlay_upper=True)

    members = _members(layer)
    assert members["etc/.wh.gone.conf"].isreg()
    assert members["etc/.wh.gone.conf"].size == 0
    assert "etc/gone.conf" not in members
    assert "opt/.wh..wh..opq" in members
    assert members["etc/new.conf"].isreg()
    assert not any(m.ischr() for m in members.values())

    # The same tree read as a plain root filesystem: a 0/0 device is just a device, left out.
    layers.pack_layer(upper, layer)
    plain = _members(layer)
    assert not any(".wh." in name for name in plain)
    assert "etc/gone.conf" not in plain


def test_strip_rootfs_keeps_licenses_and_directories(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    files = {
        "usr/share/doc/libc6/copyright": "kept",
        "usr/share/doc/libc6/changelog.Debian.gz": "gone",
        "usr/share/doc/empty/README": "gone",
        "usr/share/man/man1/ls.1.gz": "gone",
        "usr/share/locale/de/LC_MESSAGES/x.mo": "gone",
        "var/lib/apt/lists/deb.debian.org_Packages": "gone",
        "var/cache/apt/archives/python3.11_3.11.2_amd64.deb": "gone",
        "var/cache/apt/pkgcache.bin": "gone",
        "var/log/apt/history.log": "gone",
        "var/log/dpkg.log": "gone",
        "etc/resolv.conf": "gone",
        "etc/passwd": "kept",
        "dev/null": "gone",
        "usr/bin/python3.11": "kept",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / "var/cache/apt/archives/partial").mkdir()
    (root / "usr/share/doc/python3.11-minimal").symlink_to("libc6")

    image_base.strip_rootfs(root)

    left = sorted(str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir())
    assert left == sorted(n for n, text in files.items() if text == "kept")
    for directory in ("var/log/apt", "var/cache/apt/archives/partial", "dev", "usr/share/man"):
        assert (root / directory).is_dir(), f"{directory} should stay, empty"


# -- the OCI archive of prepared layers ------------------------------------------------------------


def _tiny_layer(path: Path, name: str, content: bytes) -> Layer:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = len(content)
        info.mode = 0o755
        tar.addfile(info, io.BytesIO(content))
    return Layer.of(path)


@dataclass(frozen=True)
class Archive:
    """An OCI layout archive, read whole (the tests' archives are tiny)."""

    names: list[str]
    files: dict[str, bytes]

    @classmethod
    def read(cls, path: Path) -> Archive:
        with tarfile.open(path) as tar:
            members = tar.getmembers()
            files = {}
            for member in members:
                content = tar.extractfile(member)
                assert content is not None, f"{member.name} is not a file"
                files[member.name] = content.read()
        return cls([m.name for m in members], files)

    def json(self, name: str) -> Any:
        return json.loads(self.files[name])

    def blob(self, digest: str) -> bytes:
        data = self.files[f"blobs/sha256/{digest.removeprefix('sha256:')}"]
        assert "sha256:" + hashlib.sha256(data).hexdigest() == digest, f"blob {digest} is corrupt"
        return data


def test_layers_archive_structure(tmp_path: Path) -> None:
    layers = [
        _tiny_layer(tmp_path / "base.tar", "bin/base", b"base"),
        _tiny_layer(tmp_path / "top.tar", "opt/top", b"top layer"),
    ]
    assert layers[0].size == (tmp_path / "base.tar").stat().st_size
    config = ImageConfig(
        entrypoint=("nodedra",),
        cmd=("run",),
        env={"PATH": "/opt/nodedra/bin:/usr/bin", "A": "1"},
        working_dir="/",
        user="root",
    )
    name = f"docker.io/library/nodedra:{__version__}"
    archive_path = tmp_path / "image.tar"

    digest = write_layers_archive(name, layers, config, archive_path)

    archive = Archive.read(archive_path)
    assert archive.names[:2] == ["oci-layout", "index.json"]
    assert archive.json("oci-layout") == {"imageLayoutVersion": "1.0.0"}
    (entry,) = archive.json("index.json")["manifests"]
    assert entry["digest"] == digest
    assert entry["mediaType"] == MEDIA_MANIFEST
    assert entry["annotations"] == {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": __version__,
    }
    assert len(archive.blob(digest)) == entry["size"]
    manifest = json.loads(archive.blob(digest))
    assert manifest["config"]["mediaType"] == MEDIA_CONFIG
    assert [(d["mediaType"], d["digest"], d["size"]) for d in manifest["layers"]] == [
        (MEDIA_LAYER, layer.digest, layer.size) for layer in layers
    ]
    for layer in layers:
        assert archive.blob(layer.digest) == layer.path.read_bytes()
    image_config = json.loads(archive.blob(manifest["config"]["digest"]))
    # Uncompressed layers: each diff ID is the layer's digest, lowest layer first.
    assert image_config["rootfs"] == {
        "type": "layers",
        "diff_ids": [layer.digest for layer in layers],
    }
    assert image_config["config"] == {
        "Entrypoint": ["nodedra"],
        "Cmd": ["run"],
        "Env": ["A=1", "PATH=/opt/nodedra/bin:/usr/bin"],
        "WorkingDir": "/",
        "User": "root",
    }
    assert image_config["os"] == "linux"
    assert len(archive.names) == 2 + len(layers) + 2
    assert not list(tmp_path.glob(".image.tar.*")), "a partial archive was left behind"
    # Deterministic: the same layers and config give the same bytes.
    again = tmp_path / "again.tar"
    assert write_layers_archive(name, layers, config, again) == digest
    assert again.read_bytes() == archive_path.read_bytes()


def test_layers_archive_history(tmp_path: Path) -> None:
    """A history entry per layer when asked (buildah builds only on such an image), none
    otherwise (the images of the other tests keep their digests)."""
    layer = _tiny_layer(tmp_path / "base.tar", "bin/base", b"base")
    config = ImageConfig(entrypoint=(), cmd=("bash",))
    plain = write_layers_archive("x:1", [layer], config, tmp_path / "plain.tar")
    write_layers_archive("x:1", [layer], config, tmp_path / "history.tar", history=["made"])
    for name, history in (("plain.tar", None), ("history.tar", [{"created_by": "made"}])):
        archive = Archive.read(tmp_path / name)
        digest = archive.json("index.json")["manifests"][0]["digest"]
        manifest = json.loads(archive.blob(digest))
        assert json.loads(archive.blob(manifest["config"]["digest"])).get("history") == history
    assert plain == write_layers_archive("x:1", [layer], config, tmp_path / "again.tar")
    with pytest.raises(ValueError, match="2 history entries for 1 layers"):
        write_layers_archive("x:1", [layer], config, tmp_path / "x.tar", history=["a", "b"])


def test_dockerfile_build_reads_the_requirements_of_setup_cfg() -> None:
    """The Dockerfile build's cache key resolves nodedra's requirements: every one of them,
    comments left out."""
    found = dockerfile_image.requirements()
    assert found, "no requirement read from setup.cfg"
    names = {re.split(r"[<>=!~ ;\[]", line, maxsplit=1)[0] for line in found}
    assert {"kopf", "kubernetes", "grpcio", "protobuf", "pyyaml"} <= names
    assert not [line for line in found if "#" in line]


def test_layers_archive_needs_a_layer(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one layer"):
        write_layers_archive("x:1", [], ImageConfig(entrypoint=("x",)), tmp_path / "x.tar")


def test_single_binary_images_are_unchanged(tmp_path: Path) -> None:
    """The node's pause and workload images keep their shape (and so their digests): one
    layer, a config of Entrypoint, Cmd and Env only."""
    binary = tmp_path / "pause"
    binary.write_bytes(b"\x7fELF not really")
    spec = ImageSpec("nodedra.test/pause:v1", binary, "pause", env={"B": "2", "A": "1"})
    digest = write_image_archive(spec, tmp_path / "one.tar")
    assert write_image_archive(spec, tmp_path / "two.tar") == digest
    assert (tmp_path / "one.tar").read_bytes() == (tmp_path / "two.tar").read_bytes()
    archive = Archive.read(tmp_path / "one.tar")
    manifest = json.loads(archive.blob(archive.json("index.json")["manifests"][0]["digest"]))
    config = json.loads(archive.blob(manifest["config"]["digest"]))
    (layer,) = manifest["layers"]
    with tarfile.open(fileobj=io.BytesIO(archive.blob(layer["digest"]))) as tar:
        (member,) = tar.getmembers()
    assert config["config"] == {"Entrypoint": ["/pause"], "Cmd": None, "Env": ["A=1", "B=2"]}
    assert config["rootfs"]["diff_ids"] == [layer["digest"]]
    assert (member.name, member.mode, member.mtime, member.uname) == ("pause", 0o755, 0, "root")
