"""Regenerate the Python modules of the .proto files in this package.

Run as ``python -m grpc_gen.generate`` from the repository root (``tox -e gen`` does). The
generated modules are committed so that installing nodedra needs no code generator; a test
regenerates them into a scratch directory and fails when they differ from what is committed.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

FOLDER = "grpc_gen"
"""Where the .proto files and the generated modules are kept in the repository."""
PACKAGE = "nodedra.grpc_gen"
"""What they are installed as (the folder is linked into nodedra's package tree)."""


def proto_files(root: Path) -> list[Path]:
    """The .proto files of the folder under ``root``, relative to ``root``."""
    return sorted(p.relative_to(root) for p in (root / FOLDER).glob("*.proto"))


def generate(root: Path, out: Path) -> None:
    """Generate messages, gRPC stubs and their type stubs for ``root``'s protos into ``out``.

    ``out`` receives ``grpc_gen/<name>_pb2*.py[i]``, laid out like the folder itself. The
    protos are compiled as files of the installed package (``nodedra/grpc_gen/...``), so
    that the generated modules import each other as ``nodedra.grpc_gen``.
    """
    from grpc_tools import protoc  # noqa: PLC0415 (a development dependency only)

    with tempfile.TemporaryDirectory() as scratch:
        staged = Path(scratch) / "in"
        package = staged / PACKAGE.replace(".", "/")
        package.mkdir(parents=True)
        for proto in proto_files(root):
            shutil.copy(root / proto, package / proto.name)
        generated = Path(scratch) / "out"
        generated.mkdir()
        protos = sorted(package.glob("*.proto"))
        # gRPC stubs only for the files that declare a service: the NRI and ttrpc messages
        # travel over ttrpc (nodedra.nri), which calls methods by name.
        services = [p for p in protos if re.search(r"^service ", p.read_text(), re.MULTILINE)]
        for files, outputs in (
            (protos, ("python_out", "mypy_out")),
            (services, ("grpc_python_out", "mypy_grpc_out")),
        ):
            args = [
                "grpc_tools.protoc",
                f"--proto_path={staged}",
                *(f"--{output}={generated}" for output in outputs),
                *(str(p) for p in files),
            ]
            if protoc.main(args) != 0:
                raise RuntimeError(f"protoc failed: {' '.join(args)}")
        (out / FOLDER).mkdir(parents=True, exist_ok=True)
        for module in (generated / PACKAGE.replace(".", "/")).iterdir():
            shutil.copy(module, out / FOLDER / module.name)


if __name__ == "__main__":
    repo = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()
    generate(repo, repo)
