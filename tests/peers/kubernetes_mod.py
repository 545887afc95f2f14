"""Write the module file that builds the Kubernetes peers against another release.

    python -m tests.peers.kubernetes_mod v1.34.4

writes ``tests/peers/go.k8s-v1.34.4.mod`` (and, through ``go mod tidy``, its ``.sum``): the
requirements of ``go.mod`` with k8s.io/kubernetes at that release, its staging modules
replaced by their published ``v0.<minor>.<patch>``, and every other direct requirement at
the version that release pins, so that the peers are built from what the release was built
from. ``go build -modfile`` then builds the same sources against it (see peer_groups.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.peers.peer_groups import PEERS_DIR, kubernetes_modfile

_LINE = re.compile(r"^\s*(\S+)\s+(v\S+)", re.MULTILINE)


def _block(text: str, keyword: str) -> str:
    start = text.index(f"{keyword} (")
    return text[start : text.index(")", start) + 1]


def _kubernetes_go_mod(version: str) -> str:
    answer = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
        cwd=PEERS_DIR,
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(json.loads(answer.stdout)["GoMod"]).read_text()


def module_file(version: str) -> str:
    """The text of the module file for Kubernetes ``version``."""
    ours = (PEERS_DIR / "go.mod").read_text()
    theirs = _kubernetes_go_mod(version)
    staging = sorted(set(re.findall(r"^\s*(\S+) => \./staging/", theirs, re.MULTILINE)))
    pins = dict(_LINE.findall(theirs[: theirs.index("replace (")]))
    published = "v0." + version.removeprefix("v1.")
    direct = []
    for module, ours_pinned in _LINE.findall(_block(ours, "require")):
        if module == "k8s.io/kubernetes":
            pinned = version
        elif module in staging:
            pinned = published
        else:
            pinned = pins.get(module, ours_pinned)
        direct.append(f"\t{module} {pinned}")
    header = ours[: ours.index("require (")]
    replace = [f"\t{module} => {module} {published}" for module in staging]
    return (
        f"{header}require (\n"
        + "\n".join(direct)
        + "\n)\n\nreplace (\n"
        + "\n".join(replace)
        + "\n)\n"
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not re.fullmatch(r"v1\.\d+\.\d+", argv[0]):
        print("usage: python -m tests.peers.kubernetes_mod v1.<minor>.<patch>", file=sys.stderr)
        return 2
    version = argv[0]
    path = PEERS_DIR / kubernetes_modfile(version)
    path.write_text(module_file(version))
    subprocess.run(["go", "mod", "tidy", f"-modfile={path.name}"], cwd=PEERS_DIR, check=True)
    print(f"wrote {path} and {path.with_suffix('.sum')}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
