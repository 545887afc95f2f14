"""The configuration watcher: what it applies, what it offers again, what it reports once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nodedra.configwatch import ConfigWatcher
from nodedra.policy import PolicyConfig, PolicyError


class Blocked:
    """A policy refusing configurations while a claim holds the CPUs they reserve."""

    def __init__(self) -> None:
        self.reason: str | None = "CPU 1 is held by claim u1"
        self.offered: list[PolicyConfig] = []
        self.applied: list[PolicyConfig] = []

    def apply(self, config: PolicyConfig) -> None:
        self.offered.append(config)
        if self.reason is not None:
            raise PolicyError(f"cannot reserve CPUs: {self.reason}")
        self.applied.append(config)


def test_a_refused_configuration_is_applied_once_what_refused_it_is_gone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("reservedCPUs: 0\n")
    policy = Blocked()
    results: list[str] = []
    watcher = ConfigWatcher(path, policy.apply, results.append)
    path.write_text("reservedCPUs: 0-1\n")
    with caplog.at_level(logging.ERROR, "nodedra.configwatch"):
        assert watcher.check() == "refused"
        assert watcher.check() is None, "the same refusal is reported once"
        assert len(policy.offered) == 2, "but the file is offered again at every check"
        policy.reason = "CPU 1 is held by claim u2"
        assert watcher.check() == "refused", "a refusal for a new reason is reported"
        assert watcher.check() is None
    assert len(caplog.records) == 2
    policy.reason = None  # the claim went
    assert watcher.check() == "applied"
    assert policy.applied[-1].reserved_cpus == {0, 1}
    assert watcher.check() is None
    assert len(policy.offered) == 5, "an applied file is not offered again"
    assert results == ["refused", "refused", "applied"]


def test_a_file_that_does_not_parse_is_not_parsed_again_until_it_changes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("reservedCPUs: 0\n")
    applied: list[PolicyConfig] = []
    watcher = ConfigWatcher(path, applied.append)
    path.write_text("reservedCPUs: [\n")
    with caplog.at_level(logging.ERROR, "nodedra.configwatch"):
        assert watcher.check() == "refused"
        assert watcher.check() is None
    assert len(caplog.records) == 1
    assert "not valid YAML" in caplog.text
    path.write_text("reservedCPUs: 0\n")  # back to the file in force: nothing to do
    assert watcher.check() is None
    path.write_text("reservedCPUs: [\n")  # the broken file again: news again
    assert watcher.check() == "refused"
    assert applied == []


def test_config_watcher(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("reservedCPUs: 0\n")
    applied: list[PolicyConfig] = []
    results: list[str] = []
    watcher = ConfigWatcher(path, applied.append, results.append)
    assert watcher.check() is None, "the file as it was at start is in force already"
    path.write_text("reservedCPUs: 0-1\n")
    assert watcher.check() == "applied"
    assert applied[-1].reserved_cpus == {0, 1}
    assert watcher.check() is None
    path.write_text("reservedCPUs: nonsense\n")
    assert watcher.check() == "refused"
    assert watcher.check() is None, "a refused file is reported once"
    path.unlink()
    assert watcher.check() is None
    assert results == ["applied", "refused"]
    assert len(applied) == 1
