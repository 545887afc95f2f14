"""``nodedra status``: the node's CPU map, fetched from a running instance and drawn.

The instance's ``/status`` (:mod:`nodedra.status`) says who holds each CPU, what each
container should run on and which cgroup the runtime put it in. This side looks at what the
kernel applies: the cpuset of the container's cgroup in the host's cgroup filesystem
(:mod:`nodedra.cgroupcheck`), which nodedra's pod mounts read-only, so that ``kubectl exec``
into it gives real verdicts though the pod sees no other pod's processes. Where the cgroup
cannot be read, the container's first process in ``/proc`` is looked for instead (found by
its cgroup: the runtime's container ID is in its path, whichever cgroup driver or runtime
made it), which works on the node itself; each verdict says which it came from.

The text is for a person at a terminal: one block per NUMA node, one ``[cpu:mark ...]``
group per core, a letter per claim listed below. Colour only on a terminal and without
``NO_COLOR`` (https://no-color.org); the letters say everything without it.
"""

from __future__ import annotations

import json
import string
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

from nodedra import cgroupcheck, endpoints
from nodedra.cgroupcheck import MATCH, MISMATCH, NOT_CHECKED
from nodedra.topology.cpulist import parse_cpu_list

SCHEMA = 1
"""The layout of ``/status`` this command reads (``nodedra.status.SCHEMA``)."""
RESERVED = "R"
SHARED = "."
ISOLATED = "-"
"""An isolated CPU no claim holds: kept for claims, out of the shared pool."""
LABELS = string.ascii_uppercase.replace(RESERVED, "")
"""The letters of claims: R marks reserved CPUs."""
CLAIM_COLOURS = ("1;32", "1;34", "1;35", "1;36", "1;33", "1;92", "1;94", "1;95", "1;96", "1;93")
"""ANSI colours of claims, in turn (no red: red is for a cpuset that does not match)."""
DIM, GOOD, BAD, UNKNOWN = "2", "32", "1;31", "33"

OUTCOMES = ("ok", "update pending", MISMATCH, NOT_CHECKED)
"""What the text says of a container, in the order it counts them."""


class StatusError(Exception):
    """``/status`` could not be read; the message says where and why."""


def fetch(address: str, timeout: float = 10.0) -> dict[str, Any]:
    """The CPU map a running nodedra serves at ``address``; StatusError if it cannot."""
    try:
        answer = endpoints.get(address, "/status", timeout)
    except endpoints.EndpointError as err:
        raise StatusError(str(err)) from None
    if not answer.ok:
        body = answer.body.decode(errors="replace")
        raise StatusError(f"{answer.url} answered {answer.code}: {body}")
    try:
        data = json.loads(answer.body)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("numa_nodes"), list):
        raise StatusError(f"{answer.url} answered no CPU map: is nodedra serving there?")
    if data.get("schema") != SCHEMA:
        raise StatusError(
            f"{answer.url} answered a CPU map of schema {data.get('schema')}, this command "
            f"reads schema {SCHEMA}: run the nodedra status of the instance's own version"
        )
    return data


# What the kernel says ----------------------------------------------------------------------


def check(
    cpu_map: dict[str, Any], cgroup_root: Path | None, proc: Path = Path("/proc")
) -> dict[str, Any]:
    """``cpu_map`` with each container's ``kernel``: what the machine lets it run on.

    Read from the container's cgroup under ``cgroup_root`` (:mod:`nodedra.cgroupcheck`);
    where that cannot be read (no root given, the cgroup not found), from its first process
    in ``proc``. ``source`` says which (``cgroup`` or ``proc``); ``check`` is ``match``
    when the container may run on exactly the CPUs (and memory nodes, where nodedra sets
    them) nodedra says, ``mismatch`` when not, ``not checked`` when neither could be read,
    with ``detail`` saying why.
    """
    containers = cpu_map.get("containers")
    if containers is None:
        return {**cpu_map, "containers": None}
    found: dict[str, dict[str, Any]] = {}
    why: dict[str, str] = {}
    for container in containers:
        if cgroup_root is None:
            why[container["id"]] = "no cgroup root given"
            continue
        try:
            found[container["id"]] = cgroupcheck.verdict(container, cgroup_root)
        except cgroupcheck.CgroupError as err:
            why[container["id"]] = str(err)
    pids = container_processes(why, proc) if why else {}
    checked = [
        {**c, "kernel": found.get(c["id"]) or _look(c, pids.get(c["id"]), proc, why[c["id"]])}
        for c in containers
    ]
    return {**cpu_map, "containers": checked}


def container_processes(ids: Collection[str], proc: Path = Path("/proc")) -> dict[str, int]:
    """The lowest PID in each of the containers ``ids`` that runs here, found by cgroup."""
    wanted = set(ids)
    found: dict[str, int] = {}
    try:
        entries = list(proc.iterdir())
    except OSError:
        return found
    for entry in entries:
        if not (entry.name.isascii() and entry.name.isdigit()):
            continue
        try:
            text = (entry / "cgroup").read_text()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        pid = int(entry.name)
        for cid in cgroup_names(text) & wanted:
            found[cid] = min(pid, found.get(cid, pid))
    return found


def cgroup_names(text: str) -> set[str]:
    """What may be a container ID in a ``/proc/<pid>/cgroup``.

    Each path component, and what follows its last ``-`` (``.scope`` dropped): ``<id>``
    (containerd with cgroupfs), ``crio-<id>`` (CRI-O with cgroupfs),
    ``cri-containerd-<id>.scope`` and ``crio-<id>.scope`` (systemd); never CRI-O's
    ``crio-conmon-<id>.scope``, its monitor's.
    """
    names = set()
    for line in text.splitlines():
        for part in line.split(":", 2)[-1].split("/"):
            if part and "conmon" not in part:
                names.add(part)
                names.add(part.removesuffix(".scope").rpartition("-")[2])
    return names


def _look(
    container: Mapping[str, Any], pid: int | None, proc: Path, cgroup_problem: str
) -> dict[str, Any]:
    if pid is None:
        return _unchecked(f"{cgroup_problem}; and no process of it is visible in {proc}")
    try:
        fields = dict(
            line.split(":", 1) for line in (proc / str(pid) / "status").read_text().splitlines()
        )
        cpus, mems = fields["Cpus_allowed_list"].strip(), fields["Mems_allowed_list"].strip()
        runs_on = parse_cpu_list(cpus), parse_cpu_list(mems)
    except (OSError, KeyError, ValueError) as err:
        return _unchecked(f"{cgroup_problem}; and cannot read {proc}/{pid}/status: {err}")
    should = parse_cpu_list(container["cpus"])
    ok = runs_on[0] == should and (
        not container["mems"] or runs_on[1] == parse_cpu_list(container["mems"])
    )
    return {
        "source": "proc",
        "where": str(proc / str(pid)),
        "pid": pid,
        "cpus": cpus,
        "mems": mems,
        "check": MATCH if ok else MISMATCH,
    }


def _unchecked(why: str) -> dict[str, Any]:
    return {
        "source": None,
        "where": None,
        "pid": None,
        "cpus": None,
        "mems": None,
        "check": NOT_CHECKED,
        "detail": why,
    }


# Drawing ----------------------------------------------------------------------------------


def use_colour(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Colour for a terminal only, unless ``NO_COLOR`` is set (to anything) or TERM=dumb."""
    return stream.isatty() and "NO_COLOR" not in environ and environ.get("TERM") != "dumb"


def render_json(cpu_map: Mapping[str, Any]) -> str:
    """``nodedra status --json``: one JSON object."""
    return json.dumps(cpu_map, indent=2, sort_keys=True) + "\n"


def label(index: int) -> str:
    """The letters of the claim at ``index``: A, B, ... Z, then AA, AB, ... (never R)."""
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, len(LABELS))
        letters = LABELS[rest] + letters
    return letters


QUIET_KINDS = (
    ("interrupts", "device interrupts"),
    ("unboundWork", "unbound kernel work"),
    ("hostProcesses", "host processes"),
)
"""The kinds of host work in ``/status``'s ``quiet_cpus``, for people."""


def render_text(cpu_map: Mapping[str, Any], *, colour: bool = False, width: int = 100) -> str:
    """``nodedra status``: the CPU map for people, ``width`` columns wide."""
    return "\n".join(_Drawing(cpu_map, colour, width).lines()) + "\n"


class _Drawing:
    def __init__(self, cpu_map: Mapping[str, Any], colour: bool, width: int) -> None:
        self.map = cpu_map
        self.colour = colour
        self.width = width
        self.labels = {c["uid"]: label(i) for i, c in enumerate(cpu_map["claims"])}
        self.colours = {
            c["uid"]: CLAIM_COLOURS[i % len(CLAIM_COLOURS)] for i, c in enumerate(cpu_map["claims"])
        }

    def paint(self, text: str, code: str | None) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour and code else text

    def lines(self) -> Iterator[str]:
        m = self.map
        runtime = {True: "runtime connected", False: "runtime NOT connected", None: "off"}
        pinning = (
            m["pinning"]
            if m["runtime_connected"] is None
            else (f"{m['pinning']}, {runtime[m['runtime_connected']]}")
        )
        as_of = f"   as of {m['as_of']}" if m.get("as_of") else ""
        yield f"node {m['node']}   driver {m['driver']}   pinning {pinning}{as_of}"
        yield (
            f"CPUs {m['online']}: reserved {m['reserved'] or 'none'}, claimed "
            f"{m['claimed'] or 'none'}, shared pool {m['shared']}"
            + (f", isolated {m['isolated']}" if m["isolated"] else "")
        )
        yield from self.grid()
        yield ""
        isolated = f"{self.paint(ISOLATED, DIM)} isolated, for claims   " if m["isolated"] else ""
        yield (
            f"{self.paint(RESERVED, DIM)} reserved   {SHARED} shared pool   {isolated}"
            + ("A, B, ...: the claims below" if m["claims"] else "no claims held")
        )
        yield from self.claims()
        yield from self.quiet()
        yield from self.containers()

    def quiet(self) -> Iterator[str]:
        """What of the host's own work is kept off the claimed CPUs (``quietCPUs``)."""
        quiet = self.map.get("quiet_cpus") or {}
        kinds = [name for key, name in QUIET_KINDS if quiet.get(key)]
        if not kinds:
            return
        yield ""
        claimed = quiet["claimed"] or "none"
        named = ", ".join(kinds[:-1]) + " and " + kinds[-1] if len(kinds) > 1 else kinds[0]
        yield f"quiet CPUs: {named} kept off claimed CPUs {claimed}"
        for left in quiet["left"]:
            yield f"  still on {left['cpus']}: {left['source']}: {left['why']}"
        for kind, why in (quiet.get("unavailable") or {}).items():
            yield f"  not kept off: {kind}: {why}"

    def grid(self) -> Iterator[str]:
        cpus = [cpu for n in self.map["numa_nodes"] for core in n["cores"] for cpu in core["cpus"]]
        digits = max((len(str(cpu["id"])) for cpu in cpus), default=1)
        marks = max((len(mark) for mark in self.labels.values()), default=1)
        for node in self.map["numa_nodes"]:
            yield ""
            memory = f", memory {_size(node['memory'])}" if node["memory"] else ""
            yield f"NUMA node {node['id']}: CPUs {node['cpus'] or 'none'}{memory}"
            caches: dict[int | None, list[tuple[str, str]]] = {}
            for core in node["cores"]:
                caches.setdefault(core.get("l3_cache"), []).append(self.core(core, digits, marks))
            cell_width = max((len(p) for cells in caches.values() for p, _ in cells), default=0)
            per_line = max(1, (self.width - 2) // (cell_width + 1))
            for cache, cells in caches.items():
                if len(caches) > 1:  # the node's cores by the L3 cache they share
                    yield f"  L3 cache {cache}:"
                for start in range(0, len(cells), per_line):
                    row = cells[start : start + per_line]
                    yield (
                        "  "
                        + " ".join(
                            painted + " " * (cell_width - len(plain)) for plain, painted in row
                        ).rstrip()
                    )

    def core(self, core: Mapping[str, Any], digits: int, marks: int) -> tuple[str, str]:
        """A core's cell, plain (for its width) and painted."""
        plain, painted = [], []
        for cpu in core["cpus"]:
            if cpu["state"] == "claimed":
                mark, code = self.labels.get(cpu["claim"], "?"), self.colours.get(cpu["claim"])
            elif cpu["state"] == "reserved":
                mark, code = RESERVED, DIM
            elif cpu["state"] == "isolated":
                mark, code = ISOLATED, DIM
            else:
                mark, code = SHARED, None
            text = f"{cpu['id']:>{digits}}:{mark:<{marks}}"
            plain.append(text)
            painted.append(self.paint(text, code))
        return "[" + " ".join(plain) + "]", "[" + " ".join(painted) + "]"

    def claims(self) -> Iterator[str]:
        for claim in self.map["claims"]:
            mark = self.paint(f"{self.labels[claim['uid']]:>3}", self.colours[claim["uid"]])
            name = f"{claim['namespace']}/{claim['name']}" if claim["name"] else "(name unknown)"
            pods = ", ".join(_pod(p) for p in claim["pods"]) or "none known"
            yield f"{mark}  claim {name}  CPUs {claim['cpus']}  pods {pods}"
            yield f"     uid {claim['uid']}"
            for result in claim["results"]:
                mems = f", memory nodes {result['mems']}" if result["mems"] else ""
                memory = f" ({_size(result['memory'])})" if result["memory"] else ""
                yield (
                    f"     result {result['index']}: request {result['request']}, device "
                    f"{result['device']}, CPUs {result['cpus']}{mems}{memory}"
                )

    def containers(self) -> Iterator[str]:
        containers = self.map.get("containers")
        if containers is None:
            yield ""
            yield "containers: pinning is off, nodedra does not know them"
            return
        pinned = [c for c in containers if c["claims"]]
        shared = [c for c in containers if not c["claims"]]
        yield ""
        yield f"containers on claims ({len(pinned)}):" if pinned else "no container on claims"
        for container in pinned:
            marks = ",".join(self.labels.get(uid, "?") for uid in container["claims"])
            yield (
                f"{self.paint(f'{marks:>3}', self.colours.get(next(iter(container['claims']))))}"
                f"  {_pod(container['pod'])} {container['name']}  CPUs {container['cpus']}  "
                + self.verdict(container)
            )
        if shared:
            outcomes = [self.outcome(c) for c in shared]
            tally = ", ".join(
                f"{outcomes.count(word)} {word}" for word in OUTCOMES if word in outcomes
            )
            yield f"containers on the shared pool ({len(shared)}): {tally}"
        for container in shared:
            if self.outcome(container) not in ("ok", NOT_CHECKED):
                yield (
                    f"  {SHARED}  {_pod(container['pod'])} {container['name']}  CPUs "
                    f"{container['cpus']}  " + self.verdict(container)
                )
        unchecked = [c for c in containers if _kernel(c)["check"] == NOT_CHECKED]
        if unchecked:
            yield (
                f"(not checked, {len(unchecked)}: neither the cgroup nor a process of the "
                "container is readable here;"
            )
            yield f" the first: {_kernel(unchecked[0]).get('detail') or 'nobody looked'})"

    @staticmethod
    def outcome(container: Mapping[str, Any]) -> str:
        """One word for a container: ok, mismatch, update pending or not checked."""
        check = _kernel(container)["check"]
        if check == MISMATCH:
            return MISMATCH
        if not container["in_sync"]:
            return "update pending"
        return "ok" if check == MATCH else NOT_CHECKED

    def verdict(self, container: Mapping[str, Any]) -> str:
        """What the machine says of the container, and whether the runtime was told."""
        kernel = _kernel(container)
        seen = "its cgroup" if kernel.get("source") == "cgroup" else f"pid {kernel.get('pid')}"
        if kernel["check"] == MATCH:
            words, code = f"ok: {seen} runs on {kernel['cpus']}", GOOD
        elif kernel["check"] == MISMATCH:
            words, code = f"MISMATCH: {seen} runs on {kernel['cpus']}", BAD
        else:
            words, code = NOT_CHECKED, UNKNOWN
        if not container["in_sync"]:
            told = container["told"]
            words += "; update pending (runtime told " + (
                f"{told['cpus']})" if told else "nothing known)"
            )
        return self.paint(words, code)


def _kernel(container: Mapping[str, Any]) -> Mapping[str, Any]:
    """What the machine said of ``container`` (not checked if nobody looked)."""
    return container.get("kernel") or {"check": NOT_CHECKED}


def _pod(pod: Mapping[str, Any]) -> str:
    return f"{pod['namespace']}/{pod['name']}" if pod["name"] else f"(uid {pod['uid'] or '?'})"


def _size(count: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.1f} {unit}".replace(".0 ", " ")
    return f"{count} B"
