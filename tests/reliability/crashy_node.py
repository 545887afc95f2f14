"""nodedra in a process of its own, so that a crash test can kill it at a crash point.

    python -m tests.reliability.crashy_node ROOT POLICY OP...

builds the real ResourceManager, plugin and POLICY (topology-aware or static) on the
two-socket fixture machine with its directories under ROOT (see helpers.LocalNode), against
the real API server of ROOT/kubeconfig, whose claims ROOT/claims.json names (letter ->
namespace, name and UID, as the kubelet would name them); starts it (load the checkpoint,
restore, sweep, register, publish) and runs each OP in turn:

    prepare:X[,Y...]        one NodePrepareResources request for the claims named X, Y...
    together:X[,Y...]       one request per claim, all at once, committed in one batch
    unprepare:X[,Y...]      one NodeUnprepareResources request
    state                   the node's books (helpers.state_of)

Every step prints one JSON line and flushes it, so what the test reads tells how far the
process got: {"event": "started"}, then per OP {"event": "begin", "op": OP} and
{"op": OP, "result": ...}, and {"event": "stopped"} after a clean stop; ``together`` prints
{"op": OP, "answered": UID, "answer": ...} as soon as each request has its answer, so that
after a crash the test knows what the kubelet was told. With
NODEDRA_CRASH_AT set to a crash point the process SIGKILLs itself there (nodedra.lib.faults).
A start that fails prints {"event": "refused", "error": ...} and exits with status 3.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kubernetes.config import new_client_from_config

from nodedra.dra import ClaimRef, KubeClusterAPI
from nodedra.policy import PolicyError
from nodedra.resmgr import CheckpointError, batchlock
from tests.reliability.helpers import LocalNode, encode_answer

CLAIMS_FILE = "claims.json"
KUBECONFIG_FILE = "kubeconfig"

_emitting = threading.Lock()


def emit(line: dict[str, Any]) -> None:
    with _emitting:  # requests answered at once print whole lines
        sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")
        sys.stdout.flush()


def write_claims(root: Path, refs: Mapping[str, ClaimRef]) -> None:
    """Name the claims a crashy node may be asked about (letter -> the kubelet's ref)."""
    (root / CLAIMS_FILE).write_text(json.dumps({k: asdict(r) for k, r in refs.items()}))


def refs(node: LocalNode, letters: str) -> list[ClaimRef]:
    """The kubelet's references to the claims with these letters, as the claims file has them."""
    named = json.loads((node.root / CLAIMS_FILE).read_text())
    return [ClaimRef(**named[letter]) for letter in letters.split(",")]


def together(node: LocalNode, op: str, letters: str) -> dict[str, Any]:
    """Prepare each claim in a request of its own, all at once, in one batch (one commit).

    The requests queue for the owner's lock while this thread holds it (as a runtime event
    would), and a batch waits for every request queued (BATCH_WAIT is made long), so the
    last of them to get the lock commits them all. Each answer is printed when it is had.
    """
    batchlock.BATCH_WAIT = 600.0
    answers: dict[str, Any] = {}

    def prepare(ref: ClaimRef) -> None:
        ((uid, answer),) = node.prepare(ref).items()
        answers[uid] = encode_answer(answer)
        emit({"op": op, "answered": uid, "answer": answers[uid]})

    threads = [threading.Thread(target=prepare, args=(ref,)) for ref in refs(node, letters)]
    with node.manager:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while node.manager._lock.requests_waiting < len(threads):  # all queued for the lock
            if time.monotonic() > deadline:
                raise SystemExit(f"{op}: the requests never all queued for the lock")
            time.sleep(0.005)
    for thread in threads:
        thread.join()
    return answers


def run(node: LocalNode, op: str) -> Any:
    kind, _, uids = op.partition(":")
    if kind == "prepare":
        answers = node.prepare(*refs(node, uids))
        return {uid: encode_answer(answer) for uid, answer in answers.items()}
    if kind == "together":
        return together(node, op, uids)
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
    api = KubeClusterAPI(new_client_from_config(str(root / KUBECONFIG_FILE)))  # type: ignore[no-untyped-call]
    node = LocalNode(root, policy, cluster=api)
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
