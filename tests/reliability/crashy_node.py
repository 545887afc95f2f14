"""nodedra in a process of its own, so that a crash test can kill it at a crash point.

    python -m tests.reliability.crashy_node ROOT POLICY OP...

builds the real ResourceManager, plugin and POLICY (topology-aware or static) on the
two-socket fixture machine with its directories under ROOT (see helpers.LocalNode), serving
the claims listed in ROOT/claims.json through a fake of our ClusterAPI protocol; starts it
(load the checkpoint, restore, sweep, register, publish) and runs each OP in turn:

    prepare:UID[,UID...]    one NodePrepareResources request for those claims
    unprepare:UID[,UID...]  one NodeUnprepareResources request
    state                   the node's books (helpers.state_of)

Every step prints one JSON line and flushes it, so what the test reads tells how far the
process got: {"event": "started"}, then per OP {"event": "begin", "op": OP} and
{"op": OP, "result": ...}, and {"event": "stopped"} after a clean stop. With
NODEDRA_CRASH_AT set to a crash point the process SIGKILLs itself there (nodedra.lib.faults).
A start that fails prints {"event": "refused", "error": ...} and exits with status 3.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from nodedra.dra import ClaimRef
from nodedra.policy import PolicyError
from nodedra.resmgr import CheckpointError
from tests.reliability.helpers import FileClaims, LocalNode, encode_answer

CLAIMS_FILE = "claims.json"


def emit(line: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")
    sys.stdout.flush()


def refs(node: LocalNode, uids: str) -> list[ClaimRef]:
    """The kubelet's references to the claims with these UIDs, as the claims file has them."""
    path = node.root / CLAIMS_FILE
    claims = {c["metadata"]["uid"]: c for c in json.loads(path.read_text())}
    found = []
    for uid in uids.split(","):
        meta = claims[uid]["metadata"]
        found.append(ClaimRef(meta["namespace"], meta["name"], uid))
    return found


def run(node: LocalNode, op: str) -> Any:
    kind, _, uids = op.partition(":")
    if kind == "prepare":
        answers = node.prepare(*refs(node, uids))
        return {uid: encode_answer(answer) for uid, answer in answers.items()}
    if kind == "unprepare":
        errors = node.unprepare(*refs(node, uids))
        return {uid: None if err is None else str(err) for uid, err in errors.items()}
    if kind == "state":
        return node.state()
    raise SystemExit(f"unknown op {op!r}")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    root, policy, ops = Path(argv[0]), argv[1], argv[2:]
    node = LocalNode(root, policy, cluster=FileClaims(root / CLAIMS_FILE))
    try:
        node.manager.start()
    except (CheckpointError, PolicyError) as err:
        emit({"event": "refused", "error": str(err)})
        return 3
    emit({"event": "started"})
    try:
        for op in ops:
            emit({"event": "begin", "op": op})
            emit({"op": op, "result": run(node, op)})
    finally:
        node.manager.stop()
    emit({"event": "stopped"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
