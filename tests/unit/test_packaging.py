"""The wheel carries every package of nodedra: setup.cfg names them one by one."""

from __future__ import annotations

import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_setup_cfg_names_every_package_of_nodedra() -> None:
    """A package left out installs nothing of it: the image's nodedra then fails to import."""
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    named = set(config["options"]["packages"].split())
    source = ROOT / "operator"
    found = {
        ".".join(init.parent.relative_to(source).parts)
        for init in (source / "nodedra").rglob("__init__.py")
        if "grpc_gen" not in init.parts or init.parent.name == "grpc_gen"
    }
    assert found - named == set()
