"""Which container gets which CPUs, decided from the books alone."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nodedra.nri import Container, CPUSet, Pod, Update
from nodedra.policy import Grant
from nodedra.policy.ledger import results_named
from nodedra.resmgr.pinning import Books, Pinning, Reservation, same
from nodedra.topology import parse_cpu_list

DRIVER = "topology-aware.nri.io"
UID = "0b7a6c2e-6a0d-4c4e-9d64-7f2b1c3d4e5f"
POD = Pod("sandbox-1", "pod-uid-1", "ns", "p")


def grant(cpus: str, mems: str = "0") -> Grant:
    return Grant("r", "cpudevnuma000", parse_cpu_list(cpus), 0, parse_cpu_list(mems))


BOOKS = Books(
    grants={UID: (grant("4-5", "0"), grant("30", "1"))},
    reservations={UID: Reservation("ns", "c", frozenset({"pod-uid-1"}))},
    online=parse_cpu_list("0-55"),
    allocated=parse_cpu_list("4-5,30"),
)


def container(cdi: tuple[str, ...] = (), env: frozenset[str] = frozenset()) -> Container:
    return Container("c1", POD.id, "main", cdi, env, CPUSet(""))


def pinning() -> Pinning:
    return Pinning(DRIVER, results_named)


def test_the_results_a_container_holds_give_it_their_cpus_and_memory() -> None:
    both = container(cdi=(f"{DRIVER}/device=claim-{UID}-0", f"{DRIVER}/device=claim-{UID}-1"))
    decision = pinning().decide(POD, both, BOOKS)
    assert decision.cpuset == CPUSet("4-5,30", "0-1")
    first = container(cdi=(f"{DRIVER}/device=claim-{UID}-0",))
    assert pinning().decide(POD, first, BOOKS).cpuset == CPUSet("4-5", "0")


def test_the_environment_names_a_claim_where_the_runtime_passes_no_cdi_names() -> None:
    marked = container(env=frozenset({f"DRA_CPUSET_{UID.replace('-', '_')}_1", "PATH"}))
    assert pinning().decide(POD, marked, BOOKS).cpuset == CPUSet("30", "1")


def test_cdi_names_when_there_are_some_environment_names_are_not_looked_at() -> None:
    """On a runtime that passes CDI names, a container without ours holds none of ours."""
    other = container(
        cdi=("gpu.example.com/gpu=gpu0",),
        env=frozenset({f"DRA_CPUSET_{UID.replace('-', '_')}_0"}),
    )
    assert pinning().decide(POD, other, BOOKS).cpuset == CPUSet("0-3,6-29,31-55")


def test_a_claim_not_reserved_for_the_pod_counts_for_nothing() -> None:
    stranger = Pod("sandbox-2", "pod-uid-2", "ns", "q")
    named = container(cdi=(f"{DRIVER}/device=claim-{UID}-0",))
    decision = pinning().decide(stranger, named, BOOKS)
    assert decision.cpuset == CPUSet("0-3,6-29,31-55")
    assert decision.unreserved == (UID,)
    assert decision.claims == {}


def test_claims_not_held_and_results_out_of_range_are_ignored() -> None:
    unknown = container(cdi=(f"{DRIVER}/device=claim-other-0", f"{DRIVER}/device=claim-{UID}-7"))
    decision = pinning().decide(POD, unknown, BOOKS)
    assert decision.cpuset.cpus == "0-3,6-29,31-55"
    assert decision.unreserved == ()


def test_only_containers_behind_what_they_should_have_are_updated() -> None:
    books = pinning()
    shared = container()
    books.track(POD, shared, books.decide(POD, shared, BOOKS), CPUSet("0-3,6-29,31-55"))
    assert books.stale(BOOKS) == []
    freed = Books(BOOKS.grants, BOOKS.reservations, BOOKS.online, parse_cpu_list("4-5"))
    assert books.stale(freed) == [], "nothing changed as far as the books know"
    books.books_changed()  # a commit: claim(s) came or went
    (update,) = books.stale_to_send(freed)
    assert update.cpuset.cpus == "0-3,6-55"
    books.sent([update])
    assert books.stale(freed) == []
    books.behind = True
    assert books.stale(freed) == [], "told: it has what it should"
    books.behind = True
    assert books.stale_to_send(BOOKS) == [Update("c1", CPUSet("0-3,6-29,31-55"))]
    books.sent([Update("c1", CPUSet("0-3,6-29,31-55"))], failed=["c1"])
    assert books.behind, "a failed update is tried again"
    assert books.stale_to_send(BOOKS) == [Update("c1", CPUSet("0-3,6-29,31-55"))]


def test_a_crossed_update_is_known_again_once_a_current_one_is_applied() -> None:
    """An update computed before the books changed leaves its container's cpuset unknown;
    the next one, computed from the books as they are and applied, makes it known again.

    The claim's container is sent its CPUs and memory nodes, the shared one its CPUs only:
    its memory nodes stay unknown (""), which ``same`` never takes for wanted ones.
    """
    books = pinning()
    holder = Container(
        "c1", POD.id, "main", (f"{DRIVER}/device=claim-{UID}-0",), frozenset(), CPUSet("")
    )
    shared = Container("c2", POD.id, "side", (), frozenset(), CPUSet(""))
    for ctr in (holder, shared):
        books.track(POD, ctr, books.decide(POD, ctr, BOOKS), CPUSet("0-55"))
    books.books_changed()  # a prepare commits: both are behind
    crossed = books.stale_to_send(BOOKS)
    assert len(crossed) == 2
    books.books_changed()  # another commit while the sender's updates travel
    books.sent(crossed)
    assert [v.told for v in books.view(BOOKS, books.tracked())] == [None, None], (
        "either may be applied last"
    )
    current = books.stale_to_send(BOOKS)
    assert len(current) == 2
    books.sent(current)
    views = {v.container.id: v for v in books.view(BOOKS, books.tracked())}
    assert views["c1"].told == CPUSet("4-5", "0")
    assert views["c2"].told == CPUSet("0-3,6-29,31-55"), "its memory nodes: still unknown"
    assert all(v.in_sync for v in views.values()), "no update pending any more"
    books.books_changed()  # a later commit that changes nothing for them
    assert books.stale(BOOKS) == [], "not resent on every commit"


def test_a_failed_or_crossed_update_leaves_what_was_known() -> None:
    """Only an update the runtime applied, computed from the books as they are, is known."""
    books = pinning()
    shared = container()
    books.track(POD, shared, books.decide(POD, shared, BOOKS), CPUSet("0-55"))
    books.books_changed()
    crossed = books.stale_to_send(BOOKS)
    books.books_changed()
    books.sent(crossed)
    failed = books.stale_to_send(BOOKS)
    books.sent(failed, failed=["c1"])
    assert books.view(BOOKS, books.tracked())[0].told is None, "a failed update says nothing"
    assert books.behind
    (answer,) = books.stale(BOOKS)  # an event's answer carries it: known from the books now
    books.told([answer])
    assert books.view(BOOKS, books.tracked())[0].in_sync


def test_cpu_lists_are_compared_as_sets() -> None:
    assert same(CPUSet("0-3"), CPUSet("0,1,2,3", "0"))
    assert not same(CPUSet("0-3", "1"), CPUSet("0-3", "0"))
    assert same(CPUSet("0-3"), CPUSet("0-3", "1")), "mems unset: any"


def test_variable_names_map_back_to_claims_and_results() -> None:
    names = {
        f"DRA_CPUSET_{UID.replace('-', '_')}_0",
        f"DRA_CPUSET_{UID.replace('-', '_')}_12",
        f"DRA_MEMSET_{UID.replace('-', '_')}_3",
        "DRA_CPUSET_x",
        "DRA_CPUSET__1",
        "DRA_CPUSET_a_b",
    }
    assert results_named(names) == {UID: frozenset({0, 12})}


ANY_TEXT = st.text(st.characters(codec="utf-8"), max_size=80)
NAMES = st.one_of(
    ANY_TEXT,
    st.builds(lambda s: f"DRA_CPUSET_{s}", ANY_TEXT),
    st.builds(lambda u, i: f"DRA_CPUSET_{u}_{i}", ANY_TEXT, st.integers(min_value=0)),
    st.builds(lambda n: f"DRA_CPUSET_x_{'7' * n}", st.integers(0, 6000)),
)
CDI_NAMES = st.one_of(
    ANY_TEXT,
    st.builds(lambda s: f"{DRIVER}/device=claim-{s}", ANY_TEXT),
    st.builds(lambda n: f"{DRIVER}/device=claim-{UID}-{'1' * n}", st.integers(0, 6000)),
)


@settings(max_examples=300, deadline=None)
@given(
    env=st.frozensets(NAMES, max_size=6),
    cdi=st.lists(CDI_NAMES, max_size=4),
    cpus=ANY_TEXT,
    uid=ANY_TEXT,
)
def test_whatever_a_container_is_made_of_it_gets_a_decision(
    env: frozenset[str], cdi: list[str], cpus: str, uid: str
) -> None:
    """Names, devices and cpusets are untrusted: every parser on the way is total."""
    pod = Pod("sb", uid, "ns", "p")
    odd = Container("c", pod.id, "main", tuple(cdi), env, CPUSet(cpus, cpus))
    books = pinning()
    decision = books.decide(pod, odd, BOOKS)
    assert decision.error == ""
    assert decision.cpuset == BOOKS.shared_cpuset or decision.claims
    assert isinstance(same(decision.cpuset, odd.cpuset), bool)
    books.track(pod, odd, decision, odd.cpuset)
    assert isinstance(books.stale(BOOKS), list)
