"""The documentation cannot drift from the code: README.md and docs/*.md, read as GitHub shows them.

Every relative link resolves (a file, and an ``#anchor`` as GitHub makes one of a heading);
and what the pages quote in code exists: ``tox -e`` environments (tox.ini), ``nodedra``
subcommands and flags (the real parser of nodedra.cli), metric names (the registry
nodedra.observability builds), Helm values (the chart's values.yaml), repository paths and the
tests named in them, modules run with ``python -m`` and ``NODEDRA_*`` variables.
"""

from __future__ import annotations

import argparse
import configparser
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

from nodedra import cli
from nodedra.observability import (
    ClaimWatchCounts,
    Metrics,
    NodeUsage,
    PinningUsage,
    StatusCounts,
)
from nodedra.settings import FLAGS
from tests.peers.peer_groups import ENV_OVERRIDES

ROOT = Path(__file__).resolve().parents[2]
#: The README first; the rest are the pages it links.
PAGES = (
    ROOT / "README.md",
    ROOT / "CHANGELOG.md",
    ROOT / "SECURITY.md",
    *sorted((ROOT / "docs").glob("*.md")),
)

#: Flags the pages quote on their own (in a code span) that are other programs' flags, not
#: nodedra's: each with whose it is.
OTHER_PROGRAMS_FLAGS = {
    "--reserved-cpus": "the kubelet",
    "--kube-reserved": "the kubelet",
    "--system-reserved": "the kubelet",
    "--cpu-manager-policy": "the kubelet",
    "--root-dir": "the kubelet",
    "--runtime-config": "kube-apiserver",
}
#: Top-level directories of the repository: a quoted path that starts with one is a path of it.
REPO_DIRS = (".ci", "bench", "charts", "deploy", "docs", "grpc_gen", "image", "manifests")
REPO_DIRS_PATTERN = "|".join(re.escape(d) for d in (*REPO_DIRS, "operator", "tests"))
#: Subpackages of nodedra, which the architecture page names without operator/nodedra/.
PACKAGES = ("dra", "nri", "resmgr", "claims", "policy", "topology", "lib", "nodedra")
SOURCE = ROOT / "operator" / "nodedra"


# --- reading a page -----------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """A markdown page: its prose (code blocks blanked out), and every piece of code in it."""

    path: Path
    prose: str
    code: tuple[str, ...]
    """Inline code spans (whitespace made single spaces) and the lines of fenced blocks
    (with a shell comment cut off)."""
    spans: tuple[str, ...]
    """The inline code spans alone."""


FENCE = re.compile(r"^ {0,3}(```|~~~)")
SPAN = re.compile(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)


@functools.cache
def read_page(path: Path) -> Page:
    prose_lines: list[str] = []
    block_lines: list[str] = []
    fence: str | None = None
    for line in path.read_text().splitlines():
        opening = FENCE.match(line)
        if fence is None and opening:
            fence = opening.group(1)
            prose_lines.append("")
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            else:
                block_lines.append(re.split(r"\s#\s", line, maxsplit=1)[0])
            prose_lines.append("")
        else:
            prose_lines.append(line)
    prose = "\n".join(prose_lines)
    spans = tuple(" ".join(m.group(2).split()) for m in SPAN.finditer(prose))
    return Page(path, prose, spans + tuple(block_lines), spans)


def pages() -> list[Any]:
    return [pytest.param(read_page(path), id=str(path.relative_to(ROOT))) for path in PAGES]


def without_code_spans(prose: str) -> str:
    return SPAN.sub(lambda m: " " * len(m.group(0)), prose)


# --- links --------------------------------------------------------------------------------

LINK = re.compile(r"!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", re.MULTILINE)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text, lower case, without punctuation but
    hyphens and underscores, each space a hyphen."""
    text = re.sub(r"\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\([^)]*\)", r"\1", heading)  # links: text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


@functools.cache
def anchors(path: Path) -> frozenset[str]:
    """The anchors of ``path``'s headings, a repeated one numbered as GitHub numbers it."""
    seen: dict[str, int] = {}
    found = set()
    for match in HEADING.finditer(read_page(path).prose):
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return frozenset(found)


def link_problems(page: Page) -> Iterator[str]:
    for match in LINK.finditer(without_code_spans(page.prose)):
        target = match.group(2)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        file_part, _, anchor = target.partition("#")
        path = (page.path.parent / file_part).resolve() if file_part else page.path
        if not path.exists():
            yield f"{target}: no file {path}"
        elif ROOT not in (path, *path.parents):
            yield f"{target}: outside the repository"
        elif anchor and (path.suffix != ".md" or anchor not in anchors(path)):
            yield f"{target}: no heading of {path.relative_to(ROOT)} has the anchor #{anchor}"


@pytest.mark.parametrize("page", pages())
def test_every_relative_link_resolves(page: Page) -> None:
    assert list(link_problems(page)) == []


def test_the_readme_links_every_page_of_docs() -> None:
    linked = {
        (ROOT / m.group(2).partition("#")[0]).resolve()
        for m in LINK.finditer(read_page(ROOT / "README.md").prose)
    }
    assert set(PAGES[1:]) - linked == set()


def test_anchors_are_made_as_github_makes_them() -> None:
    assert slug("The node's CPUs are not promised twice") == "the-nodes-cpus-are-not-promised-twice"
    assert slug("What the node has: `nodedra topology`") == "what-the-node-has-nodedra-topology"
    assert slug("Using `nodedra.dra`") == "using-nodedradra"
    assert slug("A pod stays in `ContainerCreating`") == "a-pod-stays-in-containercreating"


# --- tox ----------------------------------------------------------------------------------


@functools.cache
def tox_environments() -> frozenset[str]:
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(ROOT / "tox.ini")
    listed = ini.get("tox", "envlist", fallback="").replace(",", " ").split()
    sections = [s.removeprefix("testenv:") for s in ini.sections() if s.startswith("testenv:")]
    return frozenset((*listed, *sections))


@pytest.mark.parametrize("page", pages())
def test_every_tox_environment_quoted_is_in_tox_ini(page: Page) -> None:
    quoted = {
        env
        for code in page.code
        for names in re.findall(r"\btox\s+-e\s+([\w.,-]+)", code)
        for env in names.split(",")
    }
    assert quoted - tox_environments() == set()


# --- nodedra's command line -----------------------------------------------------------------


class _Parsed(Exception):  # noqa: N818 (not an error: how the parser is caught)
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


@functools.cache
def nodedra_parser() -> argparse.ArgumentParser:
    """The parser ``nodedra`` builds, caught as it is about to parse."""

    def caught(parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> NoReturn:
        raise _Parsed(parser)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_args", caught)
        with pytest.raises(_Parsed) as parsed:
            cli.main([])
    return parsed.value.parser


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = nodedra_parser()
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    choices: dict[str, argparse.ArgumentParser] = action.choices
    return choices


def options(parser: argparse.ArgumentParser) -> frozenset[str]:
    return frozenset(parser._option_string_actions)


def nodedra_commands(page: Page) -> Iterator[list[str]]:
    """Each command line the page quotes that runs nodedra, as words from ``nodedra`` on."""
    for code in page.code:
        for segment in re.split(r"&&|\|\||;|\|", code):
            words = [w.strip("'\"") for w in segment.split()]
            if words[:2] in (["python", "-m"], ["python3", "-m"]):
                words = words[2:]
            if len(words) > 1 and words[0] == "nodedra":
                yield words


@pytest.mark.parametrize("page", pages())
def test_every_nodedra_command_and_flag_quoted_exists(page: Page) -> None:
    commands = subcommands()
    problems = []
    for words in nodedra_commands(page):
        # "nodedra run: cannot start: ...": what the subcommand prints, flags and all.
        subcommand = words[1].removesuffix(":")
        parser = commands.get(subcommand)
        if parser is None and not subcommand.startswith("-"):
            problems.append(f"{' '.join(words)}: nodedra has no subcommand {subcommand!r}")
            continue
        known = options(parser or nodedra_parser())
        for word in words[1:]:
            if word.startswith("--") and word.split("=", 1)[0] not in known:
                problems.append(f"{' '.join(words)}: no flag {word.split('=', 1)[0]}")
    assert problems == []


@pytest.mark.parametrize("page", pages())
def test_every_flag_quoted_on_its_own_is_nodedra_s_or_named_as_another_program_s(
    page: Page,
) -> None:
    nodedra = options(nodedra_parser()).union(*(options(p) for p in subcommands().values()))
    quoted = {
        span.split("=", 1)[0] for span in page.spans if re.fullmatch(r"--[a-z][\w-]*(=\S*)?", span)
    }
    assert quoted - nodedra - set(OTHER_PROGRAMS_FLAGS) == set()


def test_the_other_programs_flags_are_not_nodedra_s() -> None:
    nodedra = options(nodedra_parser()).union(*(options(p) for p in subcommands().values()))
    assert set(OTHER_PROGRAMS_FLAGS) & nodedra == set()


VARIABLE = r"\bNODEDRA_[A-Z0-9_]*[A-Z0-9]\b"


@pytest.mark.parametrize("page", pages())
def test_every_nodedra_variable_quoted_is_read(page: Page) -> None:
    """A ``NODEDRA_*`` variable is a setting's, a peer's the tests take instead of building it,
    or one the code or the tests read by name."""
    settings = {flag.env for flag in FLAGS} | set(ENV_OVERRIDES.values())
    quoted = {v for code in page.code for v in re.findall(VARIABLE, code)}
    assert quoted - settings - variables_in_the_code() == set()


@functools.cache
def variables_in_the_code() -> frozenset[str]:
    """Every ``NODEDRA_*`` name that tox.ini or a Python file (but this one) spells out."""
    files = [ROOT / "tox.ini"] + [
        path
        for top in ("operator", "tests", "bench")
        for path in sorted((ROOT / top).rglob("*.py"))
        if path != Path(__file__).resolve()
    ]
    return frozenset(v for path in files for v in re.findall(VARIABLE, path.read_text()))


# --- metrics ------------------------------------------------------------------------------

SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": (),
}


@functools.cache
def metric_names() -> frozenset[str]:
    """Every name nodedra's registry exposes: with pinning, the claim watch, a gate and the
    quiet CPUs."""
    pinning = PinningUsage(connected=True, pinned=0, containers=0, shared_cpus=1, unreserved=0)
    usage = NodeUsage(1, 0, {0: 0}, {0: 1}, pinning, {"DRANodeAllocatableResources": True})
    metrics = Metrics(lambda: usage)
    metrics.count_claim_watch(lambda: ClaimWatchCounts(0, 0, 0, 0), lambda: StatusCounts(0, 0, 0))
    metrics.show_quiet_cpus(lambda: {"sources": 2, "left": [{}]}, lambda: (3, 0.5))
    names = set()
    for family in metrics.registry.collect():
        names.add(family.name)
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
        names.update(sample.name for sample in family.samples)
    return frozenset(names)


@pytest.mark.parametrize("page", pages())
def test_every_metric_quoted_is_one_nodedra_exposes(page: Page) -> None:
    quoted = {
        name
        for code in page.code
        for name in re.findall(r"(?<![\w./-])nodedra_[a-z0-9_]+(?![\w./])", code)
    }
    assert quoted - metric_names() == set()


def test_the_metrics_are_read_from_the_registry() -> None:
    """The registry seen above is nodedra's whole: every kind of metric is in it."""
    names = metric_names()
    assert {"nodedra_requests_total", "nodedra_request_seconds_bucket"} <= names
    assert {"nodedra_nri_connected", "nodedra_claim_status_retrying"} <= names
    assert {"nodedra_api_feature_gate", "nodedra_cpus_free"} <= names


# --- the Helm chart -------------------------------------------------------------------------


@functools.cache
def chart_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((ROOT / "charts/nodedra/values.yaml").read_text())
    return values


def has_value(key: str) -> bool:
    node: Any = chart_values()
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


@pytest.mark.parametrize("page", pages())
def test_every_helm_value_quoted_is_in_the_chart(page: Page) -> None:
    # --set, --set-string and --set-json; of a list's entry (key[0]=, key[0].field=), the list.
    setting = r"--set(?:-string|-json)?[ =]'?([\w.]+)(?:\[\d+\][\w.\[\]]*)?="
    quoted = {key for code in page.code for key in re.findall(setting, code)}
    quoted |= set(re.findall(r"chart value `([\w.]+)`", without_newlines(page.prose)))
    assert {key for key in quoted if not has_value(key)} == set()


def without_newlines(text: str) -> str:
    return " ".join(text.split())


# --- repository paths -------------------------------------------------------------------------


def quoted_paths(page: Page) -> Iterator[tuple[str, Path]]:
    """Each repository path the page's code names, and where it is."""
    for code in page.code:
        for path in re.findall(rf"(?<![\w./<>-])((?:{REPO_DIRS_PATTERN})/[\w./-]*)", code):
            yield path, ROOT / path.rstrip(".,:")
        packages = "|".join(PACKAGES)
        for path in re.findall(rf"(?<![\w./<>-])((?:{packages})/[\w/]+\.py)\b", code):
            source = ROOT / "operator" if path.startswith("nodedra/") else SOURCE
            yield path, source / path


@pytest.mark.parametrize("page", pages())
def test_every_repository_path_quoted_exists(page: Page) -> None:
    assert [quoted for quoted, path in quoted_paths(page) if not path.exists()] == []


@pytest.mark.parametrize("page", pages())
def test_every_test_named_exists(page: Page) -> None:
    """``tests/...py::test_name``: the file defines that test."""
    missing = []
    for code in page.code:
        for path, name in re.findall(r"((?:tests|bench)/[\w/.-]+\.py)::(\w+)", code):
            source = ROOT / path
            if not source.exists() or not re.search(
                rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b", source.read_text(), re.MULTILINE
            ):
                missing.append(f"{path}::{name}")
    assert missing == []


@pytest.mark.parametrize("page", pages())
def test_every_module_run_with_python_m_exists(page: Page) -> None:
    missing = []
    for code in page.code:
        for module in re.findall(r"\bpython3?\s+-m\s+([\w.]+)", code):
            top, *rest = module.split(".")
            if top not in ("tests", "bench", "grpc_gen", "nodedra"):
                continue  # pip, venv: not ours
            base = (ROOT / "operator" if top == "nodedra" else ROOT).joinpath(top, *rest)
            candidates = (base.with_suffix(".py"), base / "__main__.py")
            if not any(c.exists() for c in candidates):
                missing.append(module)
    assert missing == []


# --- that the checks see what they check ------------------------------------------------------


def test_the_checks_find_what_the_pages_quote() -> None:
    """Each kind of quotation above occurs in the pages: a regular expression that stopped
    matching would otherwise pass every page."""
    everything = [read_page(path) for path in PAGES]
    assert sum(1 for p in everything for _ in LINK.finditer(without_code_spans(p.prose))) > 20
    assert sum(1 for p in everything for _ in nodedra_commands(p)) > 3
    assert sum(1 for p in everything for _ in quoted_paths(p)) > 20
    code = "\n".join(c for p in everything for c in p.code)
    assert len(re.findall(r"\btox\s+-e\s+", code)) > 3
    assert len(re.findall(r"(?<![\w./-])nodedra_[a-z0-9_]+", code)) > 20
    assert len(re.findall(r"--set(?:-string)?[ =][\w.]+=", code)) > 0
    assert len(re.findall(r"(?:tests|bench)/[\w/.-]+\.py::\w+", code)) > 10
