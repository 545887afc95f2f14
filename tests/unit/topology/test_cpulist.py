"""Parsing and formatting Linux cpu lists, as sysfs and the kernel command line write them."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodedra.topology import format_cpu_list, parse_cpu_list
from nodedra.topology.cpulist import MAX_CPUS


@pytest.mark.parametrize(
    ("text", "cpus"),
    [
        ("", set()),
        ("\n", set()),
        ("   \n", set()),
        ("0", {0}),
        ("7\n", {7}),
        ("0-3", {0, 1, 2, 3}),
        ("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}),
        ("0-3,8,10-11\n", {0, 1, 2, 3, 8, 10, 11}),
        ("  0-1 , 4\n", {0, 1, 4}),
        ("0-3, 8-11, 14,17", {0, 1, 2, 3, 8, 9, 10, 11, 14, 17}),  # the ABI document's example
        ("3-3", {3}),
        ("5,1,5", {1, 5}),  # duplicates and disorder are harmless
        ("0 2", {0, 2}),  # the kernel takes whitespace as a separator too
        ("0,,2,", {0, 2}),  # and skips empty regions
        ("007", {7}),
        ("0-7:1/2", {0, 2, 4, 6}),
        ("0-7:2/4", {0, 1, 4, 5}),
        ("100-160:2/25", {100, 101, 125, 126, 150, 151}),  # kernel-parameters.rst's example
        ("0-9:3/3", set(range(10))),
        ("0-3:0/4", set()),
        ("2-9:1/4,0", {0, 2, 6}),
        (f"{MAX_CPUS - 1}", {MAX_CPUS - 1}),
    ],
)
def test_parse_good(text: str, cpus: set[int]) -> None:
    assert parse_cpu_list(text) == frozenset(cpus)


@pytest.mark.parametrize(
    ("text", "bad_part", "why"),
    [
        ("0-x", "'0-x'", "not a CPU number"),
        ("a", "'a'", "not a CPU number"),
        ("1-", "'1-'", "not a CPU number"),
        ("-1", "'-1'", "not a CPU number"),
        ("0-3,8-", "'8-'", "not a CPU number"),
        ("0--3", "'0--3'", "not a CPU number"),
        ("1_0", "'1_0'", "not a CPU number"),  # int() would take it
        ("\u0663", "'\u0663'", "not a CPU number"),  # an Arabic-Indic 3: int() would take it
        ("0x10", "'0x10'", "not a CPU number"),
        ("3-1", "'3-1'", "runs backwards"),
        ("0-7:2", "'0-7:2'", "used/group"),  # a plain stride is not kernel syntax
        ("0-7:3/2", "'0-7:3/2'", "more CPUs than its group has"),
        ("0-7:0/0", "'0-7:0/0'", "group size of 0"),
        ("5:1/2", "'5:1/2'", "not a CPU number"),  # a pattern needs a range
        ("0-N", "'0-N'", "only the kernel knows"),  # N depends on the kernel, not the text
        ("ALL", "'ALL'", "only the kernel knows"),
        (f"0-{MAX_CPUS}", f"'0-{MAX_CPUS}'", f"below {MAX_CPUS}"),
        ("0-4000000000", "'0-4000000000'", "CPU 4000000000"),
    ],
)
def test_parse_bad(text: str, bad_part: str, why: str) -> None:
    with pytest.raises(ValueError, match=r"^bad cpu list ") as caught:
        parse_cpu_list(text)
    message = str(caught.value)
    assert message.startswith(f"bad cpu list {text!r}: {bad_part}")
    assert why in message


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        (set(), ""),
        ({0}, "0"),
        ({0, 1}, "0-1"),
        ({0, 1, 2, 3, 8}, "0-3,8"),
        ({8, 3, 2, 1, 0}, "0-3,8"),
        ([3, 3, 1], "1,3"),
        ({0, 2, 4}, "0,2,4"),
        ({0, 1, 2, 3, 8, 10, 11}, "0-3,8,10-11"),
        (range(28, 35), "28-34"),
        ({0, 28, 1, 29}, "0-1,28-29"),
    ],
)
def test_format(cpus: set[int], text: str) -> None:
    assert format_cpu_list(cpus) == text


def test_format_takes_any_iterable_once() -> None:
    assert format_cpu_list(iter([5, 4, 6])) == "4-6"


def test_format_refuses_negative_cpus() -> None:
    with pytest.raises(ValueError, match="negative CPU -1"):
        format_cpu_list({-1, 0})


cpu_sets = st.frozensets(st.integers(min_value=0, max_value=4096), max_size=200)


@given(cpu_sets)
def test_round_trip_from_sets(cpus: frozenset[int]) -> None:
    assert parse_cpu_list(format_cpu_list(cpus)) == cpus


@given(cpu_sets)
def test_formatted_lists_are_canonical(cpus: frozenset[int]) -> None:
    text = format_cpu_list(cpus)
    assert format_cpu_list(parse_cpu_list(text)) == text
    # Canonical means: ascending, disjoint runs that do not touch each other.
    runs = [run.split("-") for run in text.split(",") if run]
    for previous, following in itertools.pairwise(runs):
        assert int(following[0]) > int(previous[-1]) + 1


@given(
    st.integers(min_value=0, max_value=300),
    st.integers(min_value=0, max_value=300),
    st.integers(min_value=1, max_value=40),
    st.data(),
)
def test_patterns_match_their_expansion(
    start: int, length: int, group: int, data: st.DataObject
) -> None:
    used = data.draw(st.integers(min_value=0, max_value=group))
    end = start + length
    expected = {cpu for cpu in range(start, end + 1) if (cpu - start) % group < used}
    assert parse_cpu_list(f"{start}-{end}:{used}/{group}") == expected
    # The same CPUs in the plain form parse back to the same set.
    assert parse_cpu_list(format_cpu_list(expected)) == expected
