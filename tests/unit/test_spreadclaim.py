"""``nodedra claim-template``: a claim spread evenly over NUMA nodes of one socket.

The scheduler's side (distinct nodes of one package, each share granted on its node) is
shown through the real scheduler in tests/integration/test_wide_claims.py; here, what the
template holds and what it refuses.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodedra.cli import main
from nodedra.lib.quantity import parse_quantity
from nodedra.spreadclaim import MAX_REQUESTS, shares, spread_template


@pytest.mark.parametrize(("total", "parts"), [(24, 3), (25, 3), (7, 7), (100, 32), (1, 1)])
def test_shares_add_up_and_differ_by_at_most_one(total: int, parts: int) -> None:
    split = shares(total, parts)
    assert len(split) == parts
    assert sum(split) == total
    assert max(split) - min(split) <= 1
    assert split == sorted(split, reverse=True)


def capacities(template: dict[str, Any]) -> list[dict[str, str]]:
    requests = template["spec"]["spec"]["devices"]["requests"]
    return [r["exactly"]["capacity"]["requests"] for r in requests]


def test_a_template_asks_one_share_per_node_on_distinct_nodes_of_one_package() -> None:
    template = spread_template("wide", 25, 3, "3G")
    devices = template["spec"]["spec"]["devices"]
    names = [r["name"] for r in devices["requests"]]
    assert len(set(names)) == 3
    assert {r["exactly"]["deviceClassName"] for r in devices["requests"]} == {
        "topology-aware.nri.io"
    }
    asked = capacities(template)
    assert [int(c["cpu"]) for c in asked] == [9, 8, 8]
    memory = sum(parse_quantity(c["memory"]) for c in asked)
    assert 3 * 10**9 <= memory < 3 * 10**9 + 3 * (1 << 20), "3G, rounded up to whole MiB"
    assert all(parse_quantity(c["memory"]) % (1 << 20) == 0 for c in asked)
    assert devices["constraints"] == [
        {"requests": names, "distinctAttribute": "topology-aware.nri.io/numaNode"},
        {"requests": names, "matchAttribute": "topology-aware.nri.io/package"},
    ]


def test_one_node_needs_no_constraint() -> None:
    template = spread_template("narrow", 4, 1, "1Gi")
    assert "constraints" not in template["spec"]["spec"]["devices"]
    assert capacities(template) == [{"cpu": "4", "memory": "1024Mi"}]


@pytest.mark.parametrize(
    ("cpus", "nodes", "memory", "message"),
    [
        (8, 0, "0", "0 NUMA nodes: a claim spreads over 1 to 32"),
        (64, MAX_REQUESTS + 1, "0", "33 NUMA nodes"),
        (2, 3, "0", "2 CPUs cannot give each of 3 NUMA nodes one"),
        (8, 2, "lots", "memory 'lots'"),
        (8, 2, "-1Gi", "memory '-1Gi' is negative"),
    ],
)
def test_a_spread_that_cannot_be_asked_for_is_refused_saying_why(
    cpus: int, nodes: int, memory: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        spread_template("x", cpus, nodes, memory)


def test_the_command_prints_the_template_or_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["claim-template", "wide", "--cpus", "24", "--numa-nodes", "3", "--memory", "3Gi"]
    assert main(args) == 0
    assert yaml.safe_load(capsys.readouterr().out) == spread_template("wide", 24, 3, "3Gi")
    assert main(["claim-template", "x", "--cpus", "2", "--numa-nodes", "3"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "nodedra claim-template: 2 CPUs cannot give each of 3 NUMA nodes one" in captured.err


def test_the_latency_page_shows_what_the_command_writes() -> None:
    """docs/latency-sensitive-workloads.md's example is the output of the command it gives."""
    page = (Path(__file__).parents[2] / "docs" / "latency-sensitive-workloads.md").read_text()
    command = re.search(
        r"nodedra claim-template (\S+) --cpus (\d+) --numa-nodes (\d+) --memory (\S+)", page
    )
    assert command is not None
    name, cpus, nodes, memory = command.groups()
    written = yaml.safe_dump(spread_template(name, int(cpus), int(nodes), memory), sort_keys=False)
    assert f"```yaml\n{written}```" in page
