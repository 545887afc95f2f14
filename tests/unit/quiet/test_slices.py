"""The host's processes kept off claimed CPUs: which units, what is set, what is given back.

systemd itself is met on the VM node (tests/integration/vm_cluster/test_quiet_cpus.py); here
a fake of nodedra's own wrapper (:class:`nodedra.quiet.systemd.Systemd`) holds units and
their ``AllowedCPUs``, so that the choices made over them can be checked one by one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nodedra.policy import parse_config
from nodedra.quiet import RECORD, AllWork, QuietKeeper, QuietKinds
from nodedra.quiet.keeper import read_record
from nodedra.quiet.slices import HostProcesses
from nodedra.quiet.systemd import (
    NoSuchUnitError,
    SystemdError,
    SystemdReplyError,
    Unit,
    from_bitmask,
    to_bitmask,
)

ONLINE = frozenset(range(8))
BOOT = "boot-1"
ON = QuietKinds(host_processes=True)


@pytest.mark.parametrize(
    ("cpus", "mask"),
    [(set(), b""), ({0}, b"\x01"), ({0, 9}, b"\x01\x02"), (set(range(8)), b"\xff")],
)
def test_cpu_sets_travel_as_systemds_bitmask(cpus: set[int], mask: bytes) -> None:
    assert to_bitmask(cpus) == mask
    assert from_bitmask(mask) == cpus


class FakeSystemd:
    """Units and their AllowedCPUs; ``down`` makes every call fail as a lost bus would."""

    def __init__(self) -> None:
        self.allowed: dict[str, frozenset[int]] = {
            "-.slice": frozenset(),
            "system.slice": frozenset(),
            "user.slice": frozenset({0, 1, 2, 3}),  # the admin's
            "user-0.slice": frozenset(),
            "kubepods.slice": frozenset(),
            "kubepods-burstable.slice": frozenset(),
            "init.scope": frozenset(),
            "session-1.scope": frozenset(),
        }
        self.parents = {"init.scope": "-.slice", "session-1.scope": "user-0.slice"}
        self.inactive = {"machine.slice"}
        self.down = False
        self.writes: list[tuple[str, frozenset[int]]] = []
        self.failing: dict[str, SystemdError] = {}
        """Units whose setting fails, with systemd's answer."""
        self.reads = 0
        self.closed = 0

    def __call__(self, bus: Path) -> FakeSystemd:
        self._check()
        return self

    def __exit__(self, *args: object) -> None:
        self.closed += 1

    def _check(self) -> None:
        if self.down:
            raise SystemdError("cannot reach the system bus at /run/dbus/system_bus_socket")

    def units(self) -> list[Unit]:
        self._check()
        names = [*self.allowed, *self.inactive]
        return [
            Unit(n, f"/unit/{n}", "inactive" if n in self.inactive else "active") for n in names
        ]

    def parent(self, unit: Unit) -> str:
        self._check()
        if unit.name not in self.parents:  # listed, then gone
            raise SystemdReplyError(f"reading {unit.name}: systemd answered UnknownObject")
        return self.parents[unit.name]

    def allowed_cpus(self, unit: Unit) -> frozenset[int]:
        self._check()
        self.reads += 1
        return self.allowed[unit.name]

    def set_allowed_cpus(self, name: str, cpus: frozenset[int]) -> None:
        self._check()
        if name in self.failing:
            raise self.failing[name]
        self.writes.append((name, cpus))
        self.allowed[name] = cpus


class Claims:
    def __init__(self) -> None:
        self.cpus: frozenset[int] = frozenset()
        self.kinds = ON


def keeper(root: Path, systemd: FakeSystemd, claims: Claims, unified: bool = True) -> QuietKeeper:
    controllers = root / "cgroup.controllers"
    if unified:
        controllers.write_text("cpuset cpu memory\n")
    work = HostProcesses(ONLINE, unified=controllers, connect=systemd)  # type: ignore[arg-type]
    return QuietKeeper(
        AllWork([work]),
        root / RECORD,
        BOOT,
        online=ONLINE,
        claimed=lambda: claims.cpus,
        kinds=lambda: claims.kinds,
    )


def test_the_top_level_units_but_the_pods_follow_the_claims(tmp_path: Path) -> None:
    systemd, claims = FakeSystemd(), Claims()
    quiet = keeper(tmp_path, systemd, claims)
    quiet.update()
    assert systemd.writes == [], "no claim: nothing to narrow, nothing written"
    claims.cpus = frozenset({2, 6})
    quiet.update()
    assert dict(systemd.writes) == {
        "init.scope": ONLINE - {2, 6},
        "system.slice": ONLINE - {2, 6},
        "user.slice": frozenset({0, 1, 3}),  # within what the admin set
    }
    for untouched in ("kubepods.slice", "kubepods-burstable.slice", "user-0.slice", "-.slice"):
        assert systemd.allowed[untouched] == frozenset(), untouched
    assert quiet.status()["left"] == []
    # Released: each unit as it was, the unrestricted ones unset again (not set to all CPUs),
    # after every CPU was set: systemd leaves the kernel's cpuset as it was once unset.
    claims.cpus = frozenset()
    systemd.writes.clear()
    quiet.update()
    assert systemd.allowed["system.slice"] == frozenset()
    assert systemd.allowed["init.scope"] == frozenset()
    assert systemd.allowed["user.slice"] == frozenset({0, 1, 2, 3})
    assert systemd.writes == [
        ("init.scope", ONLINE),
        ("init.scope", frozenset()),
        ("system.slice", ONLINE),
        ("system.slice", frozenset()),
        ("user.slice", frozenset({0, 1, 2, 3})),
    ]


def test_a_unit_the_admin_kept_on_claimed_cpus_only_is_left_there_and_named(
    tmp_path: Path,
) -> None:
    systemd, claims = FakeSystemd(), Claims()
    quiet = keeper(tmp_path, systemd, claims)
    claims.cpus = frozenset({0, 1, 2, 3})
    quiet.update()
    assert systemd.allowed["user.slice"] == frozenset({0, 1, 2, 3})
    assert quiet.status()["left"] == [
        {
            "source": "user.slice (host processes)",
            "cpus": "0-3",
            "why": "allowed no CPU outside the claims before",
        }
    ]


def test_the_originals_are_on_record_before_the_first_write(tmp_path: Path) -> None:
    systemd, claims = FakeSystemd(), Claims()
    claims.cpus = frozenset({5})
    keeper(tmp_path, systemd, claims).update()
    record = read_record(tmp_path / RECORD, BOOT)
    assert record["unit/user.slice"] == frozenset({0, 1, 2, 3})
    assert record["unit/system.slice"] == frozenset()
    # Killed with the claim held: a new keeper of the same boot goes on from the record, and
    # stopped, gives back the originals.
    again = keeper(tmp_path, systemd, claims)
    again.start()
    again.update()
    assert systemd.allowed["system.slice"] == ONLINE - {5}
    again.stop()
    assert systemd.allowed["user.slice"] == frozenset({0, 1, 2, 3})
    assert systemd.allowed["system.slice"] == frozenset()
    assert not (tmp_path / RECORD).exists()


def test_a_lost_bus_keeps_the_originals_until_they_are_given_back(tmp_path: Path) -> None:
    systemd, claims = FakeSystemd(), Claims()
    quiet = keeper(tmp_path, systemd, claims)
    claims.cpus = frozenset({7})
    quiet.update()
    systemd.down = True
    claims.cpus = frozenset()
    quiet.update()
    status = quiet.status()
    assert "system bus" in status["unavailable"]["hostProcesses"], status
    assert "unit/system.slice" in read_record(tmp_path / RECORD, BOOT), "still narrowed"
    systemd.down = False
    quiet.update()
    assert systemd.allowed["system.slice"] == frozenset()
    assert quiet.status()["unavailable"] == {}
    claims.kinds = QuietKinds()
    quiet.update()
    assert not (tmp_path / RECORD).exists()


def test_a_unit_systemd_refuses_is_named_with_its_answer_and_the_others_go_on(
    tmp_path: Path,
) -> None:
    systemd, claims = FakeSystemd(), Claims()
    quiet = keeper(tmp_path, systemd, claims)
    systemd.failing["init.scope"] = SystemdError("setting init.scope's AllowedCPUs: denied")
    claims.cpus = frozenset({3})
    quiet.update()
    assert systemd.allowed["system.slice"] == ONLINE - {3}
    status = quiet.status()
    assert status["unavailable"] == {}, "one unit's failure is not the kind's"
    assert status["left"] == [
        {
            "source": "init.scope (host processes)",
            "cpus": "3",
            "why": "setting init.scope's AllowedCPUs: denied",
        }
    ]


def test_a_unit_gone_is_neither_refused_nor_kept_on_record(tmp_path: Path) -> None:
    systemd, claims = FakeSystemd(), Claims()
    quiet = keeper(tmp_path, systemd, claims)
    claims.cpus = frozenset({3})
    quiet.update()
    systemd.failing["init.scope"] = NoSuchUnitError("Unit init.scope not found.")
    claims.kinds = QuietKinds()
    quiet.update()
    assert systemd.allowed["system.slice"] == frozenset()
    assert not (tmp_path / RECORD).exists()


def test_a_scope_gone_between_listing_and_reading_is_not_a_failure(tmp_path: Path) -> None:
    """The kubelet mounts volumes in short-lived scopes: one that ends while a pass reads
    it leaves the other units steered, and the kind available."""
    systemd, claims = FakeSystemd(), Claims()
    quiet = keeper(tmp_path, systemd, claims)
    claims.cpus = frozenset({3})
    quiet.update()
    systemd.allowed["run-r1.scope"] = frozenset()  # listed, gone before its slice is read
    quiet.update()
    assert systemd.allowed["system.slice"] == ONLINE - {3}
    assert quiet.status()["unavailable"] == {}
    assert "unit/system.slice" in read_record(tmp_path / RECORD, BOOT)


def test_one_read_of_each_unit_per_pass(tmp_path: Path) -> None:
    systemd, claims = FakeSystemd(), Claims()
    quiet = keeper(tmp_path, systemd, claims)
    claims.cpus = frozenset({3})
    quiet.update()  # the first: each unit's original read too
    systemd.reads = 0
    quiet.update()
    assert systemd.reads == 3, "init.scope, system.slice, user.slice: read once each"


def test_stopped_the_keeper_closes_its_connection(tmp_path: Path) -> None:
    systemd, claims = FakeSystemd(), Claims()
    quiet = keeper(tmp_path, systemd, claims)
    quiet.start()
    claims.cpus = frozenset({3})
    quiet.update()
    quiet.stop()
    assert systemd.closed == 1
    assert systemd.allowed["system.slice"] == frozenset()


def test_turned_off_every_unit_is_given_back_and_the_record_goes(tmp_path: Path) -> None:
    systemd, claims = FakeSystemd(), Claims()
    quiet = keeper(tmp_path, systemd, claims)
    claims.cpus = frozenset({4})
    quiet.update()
    claims.kinds = QuietKinds()
    quiet.update()
    assert systemd.allowed["system.slice"] == frozenset()
    assert systemd.allowed["user.slice"] == frozenset({0, 1, 2, 3})
    assert not (tmp_path / RECORD).exists()


def test_cgroup_v1_is_refused_with_why(tmp_path: Path) -> None:
    systemd, claims = FakeSystemd(), Claims()
    quiet = keeper(tmp_path, systemd, claims, unified=False)
    claims.cpus = frozenset({4})
    quiet.update()
    assert systemd.writes == []
    assert "cgroup v2" in quiet.status()["unavailable"]["hostProcesses"]


def test_without_a_system_bus_the_kind_says_so_and_the_others_go_on(tmp_path: Path) -> None:
    missing = tmp_path / "no-bus"
    work = HostProcesses(ONLINE, missing, unified=Path("/"))
    assert work.sources(ON) == []
    assert str(missing) in work.unavailable(ON)["hostProcesses"]
    assert work.unavailable(QuietKinds()) == {}


def test_the_configuration_turns_host_processes_on() -> None:
    config = parse_config({"quietCPUs": {"hostProcesses": True}})
    assert config.quiet == QuietKinds(host_processes=True)
