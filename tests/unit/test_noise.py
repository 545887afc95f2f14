"""The noise probe's readings (tests.peers.noise): /proc/interrupts and the scheduler's trace,
in the formats the guest's kernel writes them."""

from __future__ import annotations

from tests.peers.noise import interrupt_deltas, is_cpu_kernel_thread, ran_on_cpu

BEFORE = """\
           CPU0       CPU1       CPU2       CPU3
  0:         40          0          0          0   IO-APIC   2-edge      timer
 24:          0          0        100          0   PCI-MSI 49152-edge      virtio1-req.0
 25:         10         20          0          5   PCI-MSI 32768-edge      virtio0-input.0
NMI:          0          0          0          0   Non-maskable interrupts
LOC:       1000       1000       1000       1000   Local timer interrupts
ERR:          0
"""
AFTER = """\
           CPU0       CPU1       CPU2       CPU3
  0:         40          0          0          0   IO-APIC   2-edge      timer
 24:          0          0        130          0   PCI-MSI 49152-edge      virtio1-req.0
 25:         15         20          0          9   PCI-MSI 32768-edge      virtio0-input.0
NMI:          0          0          0          0   Non-maskable interrupts
LOC:       1100       1200       1250       1010   Local timer interrupts
ERR:          0
"""


def test_interrupts_on_the_cpu_by_line_and_the_loads_everywhere() -> None:
    devices, own, everywhere = interrupt_deltas(BEFORE, AFTER, 2)
    assert devices == {"24 virtio1-req.0": 30}
    assert own == {"LOC": 250}
    assert everywhere == {"24 virtio1-req.0": 30, "25 virtio0-input.0": 9}


def switch(at: str, prev: str, prev_pid: int, next_: str, next_pid: int) -> str:
    """One sched_switch line as the kernel's trace has it."""
    return (
        f" {prev}-{prev_pid}  [002] d..2.  {at}: sched_switch: prev_comm={prev} "
        f"prev_pid={prev_pid} prev_prio=120 prev_state=R ==> next_comm={next_} "
        f"next_pid={next_pid} next_prio=120\n"
    )


TRACE = (
    switch("10.000000100", "workload", 900, "sh", 51)
    + switch("10.000500100", "sh", 51, "ksoftirqd/2", 22)
    + switch("10.000600100", "ksoftirqd/2", 22, "workload", 900)
    + switch("10.002000000", "workload", 900, "swapper/2", 0)
    + switch("10.003000000", "swapper/2", 0, "kworker/2:1", 30)
)


def test_what_ran_on_the_cpu_in_the_window_but_the_claims_own_and_idle() -> None:
    start, end = 10_000_000_000, 10_003_500_000
    ran = ran_on_cpu(TRACE, start, end)
    assert ran == {("sh", 51): 0.5, ("ksoftirqd/2", 22): 0.1, ("kworker/2:1", 30): 0.5}
    # A window that ends before the shell ran sees nothing of it.
    assert ran_on_cpu(TRACE, start, 10_000_000_050) == {}


def test_the_cpus_own_kernel_threads_by_name() -> None:
    for name in ("ksoftirqd/2", "kworker/2:1", "kworker/2:0H", "migration/2", "cpuhp/2"):
        assert is_cpu_kernel_thread(name, 2), name
    for name in ("kworker/u8:3", "ksoftirqd/12", "kworker/12:1", "sh", "rcu_preempt"):
        assert not is_cpu_kernel_thread(name, 2), name
