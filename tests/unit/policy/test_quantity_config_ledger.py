"""Quantities, the configuration file and the ledger of grants."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodedra.lib import quantity
from nodedra.lib.quantity import MAX_LENGTH, parse_quantity, whole_positive
from nodedra.policy.config import ConfigError, load_config, parse_config
from nodedra.policy.ledger import Grant, Ledger, PolicyError, env_suffix, grant_edits


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("2", 2),
        ("1500m", Fraction(3, 2)),
        ("4Gi", 4 << 30),
        ("1e3", 1000),
        ("1.5Ki", 1536),
        ("0.5", Fraction(1, 2)),
        ("+3", 3),
        ("-1", -1),
        ("2k", 2000),
        ("1.", 1),
        (".5", Fraction(1, 2)),
        (" 2 ", 2),
        ("1" * MAX_LENGTH, int("1" * MAX_LENGTH)),
        (7, 7),
    ],
)
def test_parse_quantity(text: str | int, value: Fraction | int) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "x", "1Qi", "1 Gi", "--1", "1e", True, None, 1.5])
def test_parse_quantity_refuses(text: object) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(text)  # type: ignore[arg-type]


def test_a_quantity_longer_than_any_is_refused_by_its_length() -> None:
    """A long run of digits is refused before the grammar, ``Fraction`` or ``int`` see it,
    and the message does not carry the whole of it."""
    text = "1" * 200_000 + "x"
    with pytest.raises(ValueError, match=r"\(200001 characters; a quantity has at most 64\)"):
        parse_quantity(text)
    with pytest.raises(ValueError, match="not a quantity") as caught:
        parse_quantity("1" * (MAX_LENGTH + 1))
    assert len(str(caught.value)) < 2 * MAX_LENGTH + 60


@pytest.mark.parametrize(
    "text",
    [
        "1" * 200_000 + "x",
        "1" * 200_000 + ".5x",
        "." + "1" * 200_000 + "x",
        "1e" + "1" * 200_000 + "x",
    ],
)
def test_the_grammar_refuses_a_long_digit_run_in_one_pass(text: str) -> None:
    """Whatever the length bound, the grammar takes time linear in its input.

    One that could split a run of digits between two parts in every way tried each split
    before refusing what follows: 200,000 digits then take it some half an hour, far beyond
    the test run's timeout, and a few thousand take seconds.
    """
    assert quantity._QUANTITY.fullmatch(text) is None


@pytest.mark.parametrize("text", ["0", "-2", "1500m", "0.5"])
def test_whole_positive_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="is not a positive whole number"):
        whole_positive(text, "consumed cpu")


@given(st.integers(min_value=1, max_value=10**12))
def test_whole_positive_round_trips(n: int) -> None:
    assert whole_positive(str(n), "x") == n
    assert whole_positive(f"{n}000m", "x") == n


def test_default_config() -> None:
    config = parse_config(None)
    assert (config.policy, config.reserved_cpus, config.reserved_memory) == (
        "topology-aware",
        frozenset(),
        0,
    )


def test_full_config(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "policy: topology-aware\nreservedCPUs: 0-1,8\noptions:\n  reservedMemory: 2Gi\n"
    )
    config = load_config(path)
    assert config.reserved_cpus == {0, 1, 8}
    assert config.reserved_memory == 2 << 30
    assert parse_config({"policy": "static", "reservedCPUs": 3}).reserved_cpus == {3}
    assert not config.full_physical_cores
    assert parse_config({"policy": "static", "fullPhysicalCores": True}).full_physical_cores


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "must be a mapping"),
        ({"polcy": "static"}, r"unknown keys \['polcy'\]"),
        ({"policy": "balloons"}, "'balloons' is not one of"),
        ({"reservedCPUs": "0-x"}, "reservedCPUs: .*0-x"),
        ({"reservedCPUs": ["0"]}, "reservedCPUs: must be a cpu list"),
        ({"options": []}, "options: must be a mapping"),
        (
            {"policy": "static", "options": {"reservedMemory": "1Gi"}},
            "not options of policy static",
        ),
        ({"options": {"reservedMemry": "1Gi"}}, "reservedMemry"),
        ({"options": {"reservedMemory": "lots"}}, "not a quantity"),
        ({"options": {"reservedMemory": "-1Gi"}}, "not a whole, non-negative number of bytes"),
        ({"options": {"reservedMemory": "0.5"}}, "not a whole, non-negative number of bytes"),
        ({"policy": "static", "fullPhysicalCores": "yes"}, "fullPhysicalCores: must be true"),
    ],
)
def test_bad_config(data: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(data, "config.yaml")


def test_unreadable_and_invalid_config_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read configuration"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def grant(cpus: set[int], memory: int = 0, node: int = 0, device: str = "d") -> Grant:
    return Grant("req", device, frozenset(cpus), memory, frozenset({node}))


def test_ledger_refuses_double_grants() -> None:
    ledger = Ledger()
    ledger.add("a", [grant({0, 1})])
    with pytest.raises(PolicyError, match=r"CPU 1 would be granted twice \(held by claim a"):
        ledger.add("b", [grant({1, 2})])
    with pytest.raises(PolicyError, match="CPU 3 would be granted twice"):
        ledger.add("c", [grant({3}), grant({3})])
    with pytest.raises(PolicyError, match="already recorded"):
        ledger.add("a", [grant({9})])
    assert ledger.uids() == {"a"}
    assert ledger.allocated_cpus() == {0, 1}


def test_ledger_round_trip_and_memory() -> None:
    ledger = Ledger()
    ledger.add("a", [grant({0, 1}, 1 << 30, node=0), grant({4}, 5, node=1)])
    ledger.add("b", [grant({2}, 1 << 20, node=0)])
    assert ledger.memory_used(0) == (1 << 30) + (1 << 20)
    assert ledger.memory_used(1) == 5
    again = Ledger.from_json(ledger.to_json())
    assert again.to_json() == ledger.to_json()
    assert again.grants("a") == ledger.grants("a")
    assert ledger.remove("a") == again.grants("a")
    assert ledger.remove("unknown") == ()
    assert ledger.allocated_cpus() == {2}


@pytest.mark.parametrize(
    "data",
    [
        {"a": "x"},
        {"a": {"grants": [{"device": "d"}]}},
        {
            "a": {
                "grants": [{"request": "r", "device": "d", "cpus": "0-x", "memory": 0, "mems": "0"}]
            }
        },
        {
            "a": {
                "grants": [{"request": "r", "device": "d", "cpus": "0", "memory": -1, "mems": "0"}]
            }
        },
        {
            "a": {
                "grants": [{"request": "r", "device": "d", "cpus": "0", "memory": 0, "mems": "0"}]
            },
            "b": {
                "grants": [{"request": "r", "device": "d", "cpus": "0", "memory": 0, "mems": "0"}]
            },
        },
    ],
)
def test_ledger_refuses_bad_checkpoints(data: dict[str, object]) -> None:
    with pytest.raises(PolicyError, match="claim"):
        Ledger.from_json(data)


def test_edits_name_claim_and_result() -> None:
    uid = "8b9c5a6e-1f2d-4c3b-9a8e-7d6c5b4a3f21"
    assert env_suffix(uid, 3) == "8b9c5a6e_1f2d_4c3b_9a8e_7d6c5b4a3f21_3"
    edits = grant_edits(uid, 0, grant({0, 1, 2, 5}, 1 << 30, node=1))
    assert edits == {
        "env": [
            "DRA_CPUSET_8b9c5a6e_1f2d_4c3b_9a8e_7d6c5b4a3f21_0=0-2,5",
            "DRA_MEMSET_8b9c5a6e_1f2d_4c3b_9a8e_7d6c5b4a3f21_0=1",
            f"DRA_MEMORY_8b9c5a6e_1f2d_4c3b_9a8e_7d6c5b4a3f21_0={1 << 30}",
        ]
    }
    for entry in edits["env"]:
        name = entry.split("=", 1)[0]
        assert name.isidentifier()
