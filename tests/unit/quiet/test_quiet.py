"""The host's work kept off claimed CPUs: the kernel's files as a tree of our own.

The tree has the files the kernel has and their formats (a CPU list per interrupt, hex masks
for the default affinity and the workqueues); the kernel's own behaviour (refusals, managed
interrupts) is tested on the VM node. An interrupt whose file cannot be written stands for
one the kernel refuses.
"""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from nodedra.policy import ConfigError, parse_config
from nodedra.quiet import RECORD, KernelWork, QuietKeeper, QuietKinds
from nodedra.quiet.cpumask import format_mask, parse_mask
from nodedra.quiet.keeper import read_record
from nodedra.topology import format_cpu_list, parse_cpu_list

ONLINE = frozenset(range(8))
BOOT = "boot-1"


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("ff\n", set(range(8))),
        ("00000000,0000000f", {0, 1, 2, 3}),
        ("00000001,00000000", {32}),
        ("0", set()),
    ],
)
def test_masks_read_and_written_as_the_kernel_does(text: str, cpus: set[int]) -> None:
    assert parse_mask(text) == cpus
    assert parse_mask(format_mask(cpus)) == cpus
    assert all(len(word) == 8 for word in format_mask(cpus).split(","))


def make_host(root: Path) -> tuple[Path, Path]:
    """/proc/irq with interrupts 0 (timer), 24 (a NIC queue: admin set 2-3), 25 (a disk),
    and the workqueues' mask."""
    irq = root / "irq"
    for number, affinity, device in (
        ("0", "0-7", "timer"),
        ("24", "2-3", "eth0"),
        ("25", "0-7", "vda"),
    ):
        (irq / number / device).mkdir(parents=True)
        (irq / number / "smp_affinity_list").write_text(affinity + "\n")
    (irq / "default_smp_affinity").write_text("ff\n")
    workqueue = root / "workqueue"
    workqueue.mkdir()
    (workqueue / "cpumask").write_text("ff\n")
    return irq, workqueue


def affinity(irq: Path, number: str) -> str:
    return (irq / number / "smp_affinity_list").read_text().strip()


class Claims:
    """What claims hold, changed by the test."""

    def __init__(self) -> None:
        self.cpus: frozenset[int] = frozenset()
        self.kinds = QuietKinds(interrupts=True, unbound_work=True)


def keeper(root: Path, claims: Claims, boot: str = BOOT) -> QuietKeeper:
    irq, workqueue = root / "irq", root / "workqueue"
    return QuietKeeper(
        KernelWork(irq, workqueue),
        root / "state" / RECORD,
        boot,
        online=ONLINE,
        claimed=lambda: claims.cpus,
        kinds=lambda: claims.kinds,
    )


def test_sources_follow_the_claims_within_what_the_admin_set(tmp_path: Path) -> None:
    irq, workqueue = make_host(tmp_path)
    claims = Claims()
    quiet = keeper(tmp_path, claims)
    claims.cpus = frozenset({2, 5})
    steered = quiet.update()
    assert [affinity(irq, n) for n in ("0", "24", "25")] == ["0-1,3-4,6-7", "3", "0-1,3-4,6-7"]
    assert parse_mask((irq / "default_smp_affinity").read_text()) == ONLINE - {2, 5}
    assert parse_mask((workqueue / "cpumask").read_text()) == ONLINE - {2, 5}
    assert len(steered.narrowed) == 5
    # The claim on CPU 3 too: IRQ 24 has nowhere left in what the admin allowed.
    claims.cpus = frozenset({2, 3, 5})
    steered = quiet.update()
    assert affinity(irq, "24") == "2-3"
    assert quiet.status()["left"] == [
        {
            "source": "IRQ 24 (eth0)",
            "cpus": "2-3",
            "why": "allowed no CPU outside the claims before",
        }
    ]
    # Released: everything as it was.
    claims.cpus = frozenset()
    quiet.update()
    assert [affinity(irq, n) for n in ("0", "24", "25")] == ["0-7", "2-3", "0-7"]
    assert parse_mask((workqueue / "cpumask").read_text()) == ONLINE


def test_the_originals_are_recorded_before_the_first_write(tmp_path: Path) -> None:
    irq, _ = make_host(tmp_path)
    claims = Claims()
    claims.cpus = frozenset({0})
    keeper(tmp_path, claims).update()
    record = read_record(tmp_path / "state" / RECORD, BOOT)
    assert format_cpu_list(record["irq/24"]) == "2-3"
    assert record["irq/0"] == ONLINE
    assert affinity(irq, "0") == "1-7"


def test_a_restart_goes_on_from_the_record_and_a_stop_gives_everything_back(
    tmp_path: Path,
) -> None:
    """nodedra killed with claims held: the sources stay narrowed; the next instance takes
    the originals from the record, not the narrowed values it finds."""
    irq, workqueue = make_host(tmp_path)
    claims = Claims()
    claims.cpus = frozenset({6, 7})
    keeper(tmp_path, claims).update()  # and killed: no stop
    assert affinity(irq, "25") == "0-5"
    again = keeper(tmp_path, claims)
    again.start()
    claims.cpus = frozenset({7})
    again.update()
    assert affinity(irq, "25") == "0-6", "widened from the original, not from what it found"
    again.stop()
    assert [affinity(irq, n) for n in ("0", "24", "25")] == ["0-7", "2-3", "0-7"]
    assert parse_mask((workqueue / "cpumask").read_text()) == ONLINE
    assert not (tmp_path / "state" / RECORD).exists()


def test_a_record_of_another_boot_is_dropped(tmp_path: Path) -> None:
    """After a reboot the kernel's values are the originals again."""
    irq, _ = make_host(tmp_path)
    claims = Claims()
    claims.cpus = frozenset({6, 7})
    keeper(tmp_path, claims).update()
    (irq / "25" / "smp_affinity_list").write_text("0-7\n")  # the reboot's default
    (irq / "24" / "smp_affinity_list").write_text("4-7\n")  # and the admin's new one
    rebooted = keeper(tmp_path, claims, boot="boot-2")
    rebooted.start()
    rebooted.update()
    assert affinity(irq, "24") == "4-5"
    rebooted.stop()
    assert affinity(irq, "24") == "4-7"


def test_a_kind_turned_off_gets_its_sources_back_at_once(tmp_path: Path) -> None:
    irq, workqueue = make_host(tmp_path)
    claims = Claims()
    claims.cpus = frozenset({1})
    quiet = keeper(tmp_path, claims)
    quiet.update()
    claims.kinds = QuietKinds(interrupts=False, unbound_work=True)
    quiet.update()
    assert affinity(irq, "25") == "0-7"
    assert parse_cpu_list(affinity(irq, "24")) == {2, 3}
    assert parse_mask((workqueue / "cpumask").read_text()) == ONLINE - {1}
    assert set(read_record(tmp_path / "state" / RECORD, BOOT)) == {"workqueue"}
    claims.kinds = QuietKinds()
    quiet.update()
    assert not (tmp_path / "state" / RECORD).exists()


def test_off_by_default_nothing_is_read_or_written(tmp_path: Path) -> None:
    irq, _ = make_host(tmp_path)
    claims = Claims()
    claims.kinds = QuietKinds()
    claims.cpus = frozenset({1})
    assert keeper(tmp_path, claims).update().narrowed == []
    assert affinity(irq, "25") == "0-7"
    assert parse_config({}).quiet == QuietKinds()


class RefusingIRQ26(KernelWork):
    """The kernel's answer for a managed interrupt (a multi-queue device's): EIO."""

    def _put(self, path: Path, text: str) -> None:
        if path.parent.name == "26":
            raise OSError(errno.EIO, "Input/output error")
        super()._put(path, text)


def test_an_interrupt_the_kernel_refuses_is_reported_with_its_device(tmp_path: Path) -> None:
    irq, _ = make_host(tmp_path)
    (irq / "26" / "nvme0q1").mkdir(parents=True)
    (irq / "26" / "smp_affinity_list").write_text("0-7\n")
    claims = Claims()
    claims.cpus = frozenset({1})
    quiet = QuietKeeper(
        RefusingIRQ26(irq, tmp_path / "workqueue"),
        tmp_path / "state" / RECORD,
        BOOT,
        online=ONLINE,
        claimed=lambda: claims.cpus,
        kinds=lambda: claims.kinds,
    )
    steered = quiet.update()
    assert quiet.status()["left"] == [
        {
            "source": "IRQ 26 (nvme0q1)",
            "cpus": "1",
            "why": "Input/output error (the kernel keeps it where it is)",
        }
    ]
    assert "irq/26" not in steered.narrowed
    assert affinity(irq, "25") == "0,2-7", "the others are steered all the same"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"interrupt": True}, "unknown keys ['interrupt']"),
        ({"interrupts": "yes"}, "quietCPUs.interrupts: must be true or false"),
        (True, "must be a mapping"),
    ],
)
def test_bad_settings_are_refused(setting: object, message: str) -> None:
    with pytest.raises(ConfigError, match="quietCPUs") as raised:
        parse_config({"quietCPUs": setting})
    assert message in str(raised.value)


def test_a_rolling_update_s_old_instance_stopping_does_not_leave_the_new_one_unrecorded(
    tmp_path: Path,
) -> None:
    """Both instances run for a while; the old one gives everything back as it stops and
    removes the record. The new one's next pass narrows again and records the originals."""
    irq, _ = make_host(tmp_path)
    claims = Claims()
    claims.cpus = frozenset({4})
    old, new = keeper(tmp_path, claims), keeper(tmp_path, claims)
    old.start()
    old.update()
    new.start()
    new.update()
    old.stop()  # gives everything back and removes the record (new's thread may pass meanwhile)
    new.update()
    assert affinity(irq, "25") == "0-3,5-7"
    assert read_record(tmp_path / "state" / RECORD, BOOT)["irq/25"] == ONLINE
    new.stop()


def test_a_record_that_cannot_be_read_stops_the_steering_and_is_kept(tmp_path: Path) -> None:
    irq, _ = make_host(tmp_path)
    record = tmp_path / "state" / RECORD
    record.parent.mkdir()
    record.write_text('{"bootId": "boot-1", "originals": {"irq/25": "0-')
    claims = Claims()
    claims.cpus = frozenset({1})
    quiet = keeper(tmp_path, claims)
    quiet.start()
    assert quiet.update().narrowed == []
    assert affinity(irq, "25") == "0-7"
    assert quiet.status()["error"].startswith(f"cannot read {record}: ")
    quiet.stop()
    assert record.read_text().endswith('"0-'), "kept, as it was"


def test_an_instance_that_never_started_leaves_the_record_alone(tmp_path: Path) -> None:
    make_host(tmp_path)
    claims = Claims()
    claims.cpus = frozenset({1})
    keeper(tmp_path, claims).update()  # a killed instance's narrowing and record
    keeper(tmp_path, claims).stop()  # a start that failed before the keeper's
    assert read_record(tmp_path / "state" / RECORD, BOOT)
