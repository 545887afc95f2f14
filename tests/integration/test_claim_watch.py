"""The ResourceClaim watch against the real API server: every claim streams past, only ours
are kept, the watch resumes where it was, and lists again only when the server says so."""

from __future__ import annotations

import base64
import functools
import json
import logging
import threading
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient

from nodedra.claims.index import ClaimIndex
from nodedra.claims.watch import ClaimFeed
from nodedra.dra import ClaimRef, KubeAPIError
from tests.conftest import admin_client
from tests.integration.test_claim_api_real import allocate, allocation, claims_path, create_claim
from tests.peers.build import PeerBinaries
from tests.peers.cluster import ensure_test_namespace, poll
from tests.peers.controlplane import ControlPlane

NODE = "node-a"
TIMEOUT = 30


class Watch:
    """A feed (made by ``make``) on our driver and node, and what it told its ``on_claim``."""

    def __init__(
        self, api: ApiClient, driver: str, make: Callable[..., ClaimFeed], **options: Any
    ) -> None:
        self.index = ClaimIndex(driver, NODE)
        self.told: list[ClaimRef] = []
        self.feed = make(api, self.index, lambda ref, _: self.told.append(ref), **options)

    def wait(self, uids: set[str]) -> None:
        """Until the index holds exactly ``uids``."""
        poll(
            lambda: (self.index.synced and self.index.uids() == uids) or None,
            TIMEOUT,
            lambda: f"index {set(self.index.uids())} to be {uids} ({self.feed.counts()})",
        )


@pytest.fixture
def driver() -> str:
    return f"c{uuid.uuid4().hex[:8]}.nri.io"


StartWatch = Callable[..., Watch]
"""``start_watch(api, make=ClaimFeed, **options)``: a started Watch of the test's driver."""


@pytest.fixture
def start_watch(driver: str) -> Iterator[StartWatch]:
    """Starts watches for a test and stops them after it."""
    made: list[Watch] = []

    def start(api: ApiClient, make: Callable[..., ClaimFeed] = ClaimFeed, **options: Any) -> Watch:
        watch = Watch(api, driver, make, **options)
        made.append(watch)
        watch.feed.start()
        return watch

    yield start
    for watch in made:
        watch.feed.stop()


def allocated(cp: ControlPlane, namespace: str, name: str, driver: str, node: str) -> str:
    """A claim allocated to ``driver`` on ``node``; its UID."""
    claim = create_claim(cp, namespace, name, driver)
    allocate(cp, claim, allocation(driver, node, consumed=False))
    return str(claim["metadata"]["uid"])


def test_only_our_claims_are_indexed_from_the_list_and_the_watch(
    control_plane: ControlPlane,
    namespace: str,
    admin_api: ApiClient,
    driver: str,
    start_watch: StartWatch,
) -> None:
    cp = control_plane
    ours = {allocated(cp, namespace, f"ours-{i}", driver, NODE) for i in range(2)}
    allocated(cp, namespace, "elsewhere", driver, "node-b")
    allocated(cp, namespace, "other-driver", "gpu.example.com", NODE)
    create_claim(cp, namespace, "unallocated", driver)

    watch = start_watch(admin_api)
    watch.wait(ours)
    assert set(r.uid for r in watch.told) == ours
    assert watch.feed.counts().lists == 1

    # Claims created while it watches: ours is kept, the others' events are dropped unparsed.
    skipped = watch.feed.counts().skipped
    later = allocated(cp, namespace, "later", driver, NODE)
    allocated(cp, namespace, "later-elsewhere", driver, "node-b")
    watch.wait(ours | {later})
    poll(
        lambda: watch.feed.counts().skipped >= skipped + 2 or None,
        TIMEOUT,
        lambda: f"the other node's claim's two events to be skipped ({watch.feed.counts()})",
    )

    # Deallocated and deleted claims of ours leave the index.
    first, second = sorted(ours)
    by_uid = {c["metadata"]["uid"]: c for c in cp.request("GET", claims_path(namespace))["items"]}
    cp.request(
        "PUT",
        claims_path(namespace, by_uid[first]["metadata"]["name"]) + "/status",
        {**by_uid[first], "status": {}},
    )
    cp.request("DELETE", claims_path(namespace, by_uid[second]["metadata"]["name"]))
    watch.wait({later})
    assert watch.feed.counts().lists == 1


def test_a_watch_the_server_ends_is_resumed_without_listing_again(
    control_plane: ControlPlane,
    namespace: str,
    admin_api: ApiClient,
    driver: str,
    start_watch: StartWatch,
) -> None:
    watch = start_watch(admin_api, watch_seconds=(1, 1))
    watch.wait(set())
    poll(
        lambda: watch.feed.counts().watches >= 3 or None,
        TIMEOUT,
        lambda: f"the server to end two watches ({watch.feed.counts()})",
    )
    uid = allocated(control_plane, namespace, "after-resumes", driver, NODE)
    watch.wait({uid})
    assert watch.feed.counts().lists == 1


class FailingFeed(ClaimFeed):
    """Its first ``failures`` resumed watches fail before they reach the server; during the
    first, a claim of ours is allocated."""

    def __init__(
        self, cp: ControlPlane, driver: str, namespace: str, failures: int, *args: Any, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self._cp = cp
        self._driver = driver
        self._namespace = namespace
        self.failures = failures
        self.synced_while_failing: list[bool] = []
        self.made: list[str] = []

    def _watch(self, version: str | None) -> Iterator[str]:
        if version is not None and self.failures > 0:
            self.failures -= 1
            self.synced_while_failing.append(self._index.synced)
            if not self.made:
                self.made.append(
                    allocated(self._cp, self._namespace, "while-away", self._driver, NODE)
                )
            raise KubeAPIError(0, "connection refused (as the test says)")
        return super()._watch(version)


def test_the_index_is_not_synced_while_the_watch_fails_and_is_once_it_resumes(
    control_plane: ControlPlane,
    namespace: str,
    admin_api: ApiClient,
    driver: str,
    start_watch: StartWatch,
) -> None:
    failing = functools.partial(FailingFeed, control_plane, driver, namespace, 3)
    watch = start_watch(admin_api, failing, watch_seconds=(1, 1))
    feed = watch.feed
    assert isinstance(feed, FailingFeed)
    poll(lambda: feed.made or None, TIMEOUT, lambda: f"a failed watch ({feed.counts()})")
    watch.wait(set(feed.made))  # synced again: the resumed watch sent what it missed
    assert feed.synced_while_failing == [False, False, False]
    assert feed.counts().lists == 1


@pytest.fixture(scope="module", params=["streamed lists", "paged lists"])
def uncached(
    request: pytest.FixtureRequest,
    peer_binaries: PeerBinaries,
    dra_gates: dict[str, bool],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[ControlPlane]:
    """A control plane serving claims from etcd, without its watch cache, as an admin can
    configure it: etcd's compaction then expires the versions a watch would resume from.
    With "paged lists", WatchList is off: the server refuses to stream a list."""
    gates = {**dra_gates, "WatchList": request.param == "streamed lists"}
    with ControlPlane(
        peer_binaries,
        tmp_path_factory.mktemp("uncached"),
        gates,
        apiserver_args=["--watch-cache-sizes=resourceclaims.resource.k8s.io#0"],
    ) as cp:
        ensure_test_namespace(cp, "watch")
        yield cp


def compact_etcd(cp: ControlPlane) -> None:
    """Compact etcd's history up to now, as the API server does every few minutes."""

    def call(path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        request = urllib.request.Request(cp.etcd_url + path, data, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            answer: dict[str, Any] = json.loads(response.read())
        return answer

    # One more write: the last version the watch saw is then strictly older than etcd's.
    cp.request("POST", "/api/v1/namespaces", {"metadata": {"generateName": "compact-"}})
    key = base64.b64encode(b"/").decode()
    revision = call("/v3/kv/range", {"key": key})["header"]["revision"]
    call("/v3/kv/compaction", {"revision": revision, "physical": True})


class StaleFeed(ClaimFeed):
    """Before its first watch resumes, a claim of ours comes and etcd forgets the version."""

    def __init__(self, cp: ControlPlane, driver: str, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self._cp = cp
        self._driver = driver
        self._compacted = False

    def _watch(self, version: str | None) -> Iterator[str]:
        if version is not None and not self._compacted:
            self._compacted = True
            allocated(self._cp, "watch", f"while-away-{uuid.uuid4().hex[:6]}", self._driver, NODE)
            compact_etcd(self._cp)
        return super()._watch(version)


def test_a_version_the_server_forgot_makes_it_list_again(
    uncached: ControlPlane, driver: str, start_watch: StartWatch
) -> None:
    """The server ends the first watch after a second; the claim allocated before it resumes
    is found by the second list."""
    with admin_client(uncached) as api:
        stale = functools.partial(StaleFeed, uncached, driver)
        watch = start_watch(api, stale, watch_seconds=(1, 1))
        poll(
            lambda: (watch.feed.counts().lists == 2 and len(watch.index) == 1) or None,
            TIMEOUT,
            lambda: f"a second list after the server's 410 ({watch.feed.counts()})",
        )
        watch.feed.stop()


def test_a_list_is_streamed_or_else_paged(
    uncached: ControlPlane,
    driver: str,
    start_watch: StartWatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Our claims are found either way (in pages of 2 when paged: 3 pages); claims of other
    nodes or drivers are not kept."""
    cp = uncached
    ours = {allocated(cp, "watch", f"ours-{uuid.uuid4().hex[:6]}", driver, NODE) for _ in range(3)}
    allocated(cp, "watch", f"elsewhere-{uuid.uuid4().hex[:6]}", driver, "node-b")
    allocated(cp, "watch", f"other-{uuid.uuid4().hex[:6]}", "gpu.example.com", NODE)
    with admin_client(cp) as api, caplog.at_level(logging.INFO, "nodedra.claims.watch"):
        watch = start_watch(api, page_size=2)
        watch.wait(ours)
        watch.feed.stop()
    paged = "does not stream lists" in caplog.text
    assert paged == (cp.feature_gates["WatchList"] is False), caplog.text
    assert watch.feed.counts().lists == 1


def test_stop_cuts_an_open_watch(admin_api: ApiClient, start_watch: StartWatch) -> None:
    feed = start_watch(admin_api).feed
    poll(lambda: feed.counts().watches == 1 or None, TIMEOUT, lambda: f"a watch ({feed.counts()})")
    (thread,) = [t for t in threading.enumerate() if t.name == "claim-watch"]
    feed.stop()  # the server would keep this watch open for 5 to 10 minutes
    assert not thread.is_alive()
