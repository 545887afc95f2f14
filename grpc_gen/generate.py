"""Regenerate the Python modules of the .proto files in this package.

Run as ``python -m grpc_gen.generate`` from the repository root (``tox -e gen`` does). The
generated modules are committed so that installing nodedra needs no code generator; a test
regenerates them into a scratch directory and fails when they differ from what is committed.
"""

from __future__ import annotations

import sys
from pathlib import Path

PACKAGE = "grpc_gen"


def proto_files(root: Path) -> list[Path]:
    """The .proto files of the package under ``root``, relative to ``root``."""
    return sorted(p.relative_to(root) for p in (root / PACKAGE).glob("*.proto"))


def generate(root: Path, out: Path) -> None:
    """Generate messages, gRPC stubs and their type stubs for ``root``'s protos into ``out``.

    ``out`` receives ``grpc_gen/<name>_pb2*.py[i]``, laid out like the package itself.
    """
    from grpc_tools import protoc  # noqa: PLC0415 (a development dependency only)

    args = [
        "grpc_tools.protoc",
        f"--proto_path={root}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        f"--mypy_out={out}",
        f"--mypy_grpc_out={out}",
        *(str(root / p) for p in proto_files(root)),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


if __name__ == "__main__":
    repo = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd()
    generate(repo, repo)
