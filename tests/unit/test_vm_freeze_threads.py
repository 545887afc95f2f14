"""vm_freeze's thread report (tests/peers/vm_freeze.py) on a real process whose thread
starts while the report samples it: such a thread is named, as new, not left out (a CI run
described a QEMU whose CPU threads started during the sample, and they were missing)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from tests.peers import vm_freeze

# Reads a line, starts a thread that sleeps, says so, and waits for its stdin to close.
CHILD = """
import sys, threading, time
sys.stdin.readline()
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print("started", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def test_a_thread_started_while_sampled_is_named_as_new(
    child: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert child.stdin is not None
    assert child.stdout is not None
    stdin, stdout = child.stdin, child.stdout

    def start_a_thread(seconds: float) -> None:
        """In place of the sample's wait: the child's thread starts between the samples."""
        assert seconds == vm_freeze.SAMPLE_SECONDS
        stdin.write("go\n")
        stdin.flush()
        assert stdout.readline() == "started\n"

    monkeypatch.setattr(vm_freeze, "time", SimpleNamespace(sleep=start_a_thread))
    report = vm_freeze.threads_report(child.pid).splitlines()
    assert len(report) == 2, report
    main, new = sorted(report, key=lambda line: f"[{child.pid}]:" not in line)
    # Either thread may be caught before it blocks (R) or after (S): only the naming counts.
    assert re.fullmatch(rf".+ \[{child.pid}\]: [RS], \d+% of a CPU", main), report
    assert re.fullmatch(r".+ \[\d+\]: [RS], new in the last 2 s", new), report
