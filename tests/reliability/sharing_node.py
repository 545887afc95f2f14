"""One of two nodedra instances sharing a node's state, as during a rolling update.

    python -m tests.reliability.sharing_node ROOT POD_UID ROUNDS SEED [--reader]

builds the real ResourceManager, plugin and topology-aware policy (as helpers.LocalNode
does, with POD_UID: the instance lock and the catch-up) on directories under ROOT that
another such process shares, and runs ROUNDS kubelet requests: a prepare of a new claim of
one CPU on a random NUMA node while it holds fewer than ``HELD`` claims, else an unprepare
of a random one it holds. With ``--reader`` it also goes, between requests, through every
path that reads the books without the instance lock: the committed view (the claim status
writer and the orphan check), the CPU map, a runtime event's lock, the metrics' usage.

Every acknowledged request prints a JSON line with the time (CLOCK_MONOTONIC, the same in
both processes) at which the claim surely held its CPUs (after the prepare's answer) or
surely no longer did (before the unprepare was sent), so that the test can tell whether
two claims ever held one CPU at once. The claims are the process's own (a fake of
nodedra's ClusterAPI that serves them): the two instances never prepare each other's.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path
from typing import Any

from nodedra.dra import ClaimRef
from nodedra.topology import format_cpu_list
from tests.reliability.helpers import LocalNode, ta_result
from tests.unit.dra.fakes import FakeCluster, make_claim

HELD = 24
"""The most claims each instance holds: enough that the checkpoint spans several pages."""
NUMA_NODES = 4


def emit(**line: Any) -> None:
    sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")
    sys.stdout.flush()


def read_without_the_instance_lock(node: LocalNode) -> None:
    """Each path that reads the books holding only the in-process lock, or none."""
    manager = node.manager
    manager.committed_claims()
    manager.holdings()
    with manager:  # as a runtime event takes it
        pass
    if manager.acquire(timeout=1.0):  # as the metrics' usage takes it
        manager.release()


def main(argv: list[str]) -> int:
    root, pod_uid, rounds, seed = Path(argv[0]), argv[1], int(argv[2]), int(argv[3])
    reader = "--reader" in argv
    cluster = FakeCluster()
    node = LocalNode(root, "topology-aware", cluster=cluster, pod_uid=pod_uid)
    node.manager.start()
    rng = random.Random(seed)
    held: dict[str, ClaimRef] = {}
    try:
        for n in range(rounds):
            if reader:
                read_without_the_instance_lock(node)
            if len(held) < HELD and (not held or rng.random() < 0.6):
                uid = f"{pod_uid}-{n}"
                claim = make_claim(uid, [ta_result(rng.randrange(NUMA_NODES), 1)])
                ref = node.serve(claim)
                answer = node.prepare(ref)[uid]
                if answer.error is None:
                    cpus = {c for g in node.manager.committed_grants(uid) for c in g.cpus}
                    emit(prepared=uid, cpus=format_cpu_list(cpus), at=time.monotonic())
                    held[uid] = ref
                else:
                    emit(refused=uid, error=str(answer.error))
            else:
                uid = rng.choice(sorted(held))
                emit(unpreparing=uid, at=time.monotonic())
                error = node.unprepare(held[uid])[uid]
                if error is None:
                    emit(unprepared=uid)
                    del held[uid]
                else:
                    emit(unprepare_failed=uid, error=str(error))
    finally:
        node.manager.stop()
    emit(event="stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
