"""Run the test suite on a busy machine, several times: ``tox -e stress``.

CI and development machines are small and shared, so a test that only passes while the
machine is idle will fail somewhere, some day, at random. This runs pytest with every core
kept busy by unrelated processes (as many spinning processes as there are cores), the given
number of times in a row, and reports each run. A race shows up here within a few runs
where it shows up once in dozens on an idle machine.

    python -m tests.stress --runs 3                 # the whole suite, three times
    python -m tests.stress --runs 5 -- tests/integration -k operator
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

_SPIN = "while True: pass"


@contextlib.contextmanager
def busy_cores(count: int) -> Iterator[None]:
    """Keep ``count`` cores busy with spinning processes for the duration."""
    spinners = [subprocess.Popen([sys.executable, "-c", _SPIN]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
        for spinner in spinners:
            spinner.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Run pytest ``--runs`` times under load; the exit status is 1 if any run failed."""
    parser = argparse.ArgumentParser(prog="python -m tests.stress", description=__doc__)
    parser.add_argument("--runs", type=int, default=3, help="how many runs (default 3)")
    parser.add_argument(
        "--spinners",
        type=int,
        default=os.cpu_count() or 2,
        help="busy processes beside the tests (default: one per core)",
    )
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --)")
    args = parser.parse_args(argv)
    outcomes = []
    for run in range(1, args.runs + 1):
        print(f"[stress] run {run}/{args.runs} with {args.spinners} busy cores", flush=True)
        started = time.monotonic()
        with busy_cores(args.spinners):
            status = subprocess.call([sys.executable, "-m", "pytest", *args.pytest_args])
        outcomes.append(status)
        verdict = "passed" if status == 0 else f"FAILED (pytest exit status {status})"
        print(f"[stress] run {run}: {verdict} in {time.monotonic() - started:.0f} s", flush=True)
    failed = sum(1 for status in outcomes if status != 0)
    print(f"[stress] {args.runs - failed} of {args.runs} runs passed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
