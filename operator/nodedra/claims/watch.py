"""The ResourceClaim watch: every claim of the cluster streams past, only ours are parsed.

The API server cannot narrow a ResourceClaim watch to a node or a driver (the only fields
of a claim it selects on are ``metadata.name`` and ``metadata.namespace``), so every node's
watch carries every claim of the cluster. What that costs a node must not grow with the
cluster: each watch event is one line of JSON, and a line is parsed only when it can
concern us, that is when it names our driver and our pool, or the UID of a claim we hold
in the index (``nodedra.claims.index``). Any other line costs two substring searches and is
dropped; nothing is kept.

The watch runs in a thread of its own on the official client, not as a kopf handler: kopf
keeps state for every object it has seen (about 1 KB each, until the object is deleted) and
runs a task per object before any handler can say "not ours".

The watch starts with a complete list of the cluster's claims, streamed as watch events
(``sendInitialEvents``, the WatchList feature, on by default from Kubernetes 1.34) so that
its lines are filtered like the others, or else as a paged LIST. It then follows the watch
with bookmarks, resumes from the last resourceVersion seen whenever the server ends a watch
or the connection drops, and lists again only when the server says that version is gone
(410). A watch that ends at once, again and again, is reopened with backoff, not in a loop.

The index is synced only while it follows the cluster: from a complete list or a resumed
watch until that watch ends or fails. The orphan check (``nodedra.claims.orphans``) trusts
nothing else.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kubernetes import client as k8s

from nodedra.dra import ClaimRef, KubeAPIError
from nodedra.dra.kube import JSON, REQUEST_TIMEOUT, RESOURCE_API
from nodedra.observability import ClaimWatchCounts

from .index import ClaimIndex

log = logging.getLogger(__name__)

CLAIMS = f"{RESOURCE_API}/resourceclaims"
PAGE_SIZE = 100
"""Claims per LIST page: a page is parsed whole, so this bounds the memory a list takes."""
LIST_END = "k8s.io/initial-events-end"
"""The annotation of the bookmark that ends a streamed list."""
WATCH_SECONDS = (300, 600)
"""How long the server keeps one watch open, drawn per watch so that nodes spread out."""
BACKOFF = (0.5, 30.0)
"""First and longest wait, in seconds, before trying again after a failed call."""
STEADY_SECONDS = 10.0
"""A watch open this long (or half the time it asks for, if less) ran normally, events or not."""

# A watch event as Go's encoder writes it: the type first, then the object. Lines that do
# not look like this are parsed, so the pattern only has to be right, not complete.
_EVENT = re.compile(rb'\{\s*"type"\s*:\s*"(ADDED|MODIFIED|DELETED)"')
# The first resourceVersion of an event is the object's: ObjectMeta writes it right
# after the name, namespace and UID, before anything a user can fill in.
_VERSION = re.compile(rb'"resourceVersion"\s*:\s*"([^"]*)"')


class _GoneError(Exception):
    """The server no longer has the version the watch would resume from."""


class _NoStreamedListError(Exception):
    """The server refused to stream a list as watch events."""


class ClaimFeed:
    """Lists and watches ResourceClaims into ``index``; ``on_claim`` for each of ours.

    ``on_claim(ref, claim)`` is called on the feed's thread for every event of a claim that
    is allocated to us (and not deleted), with the claim as the server sent it.
    """

    def __init__(
        self,
        api_client: k8s.ApiClient,
        index: ClaimIndex,
        on_claim: Callable[[ClaimRef, JSON], None],
        *,
        page_size: int = PAGE_SIZE,
        watch_seconds: tuple[int, int] = WATCH_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = api_client
        self._index = index
        self._on_claim = on_claim
        self._page_size = page_size
        self._watch_seconds = watch_seconds
        self._steady = min(STEADY_SECONDS, watch_seconds[0] / 2)
        self._clock = clock
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._response: Any = None  # the open watch response, for stop() to cut
        self._response_lock = threading.Lock()
        self._lists = self._watches = self._parsed = self._skipped = 0
        self._stream_list = True  # until the server refuses to

    def counts(self) -> ClaimWatchCounts:
        """LISTs and WATCHes made, and watch events parsed and dropped unparsed, so far."""
        return ClaimWatchCounts(self._lists, self._watches, self._parsed, self._skipped)

    def start(self) -> None:
        """Start the watch thread."""
        self._thread = threading.Thread(target=self._run, name="claim-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Cut the open watch and wait for the thread."""
        self._stopping.set()
        with self._response_lock:
            if self._response is not None:
                with contextlib.suppress(Exception):  # already closed or never connected
                    self._response.shutdown()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout=REQUEST_TIMEOUT)

    def _run(self) -> None:
        version: str | None = None  # None: the next watch starts from a complete list
        delay = BACKOFF[0]
        while not self._stopping.is_set():
            started, seen = self._clock(), self._parsed + self._skipped
            failed: Exception | None = None
            try:
                if version is None and not self._stream_list:
                    version = self._list()
                for newer in self._watch(version):
                    version = newer
            except _GoneError:
                log.info("the ResourceClaim watch fell behind the server; listing again")
                version = None
            except _NoStreamedListError as err:
                log.info("the API server does not stream lists (%s); listing in pages", err)
                self._stream_list = False
                continue
            except Exception as err:  # the API server is away or refused: try again later
                failed = err
            finally:
                self._index.lost()
            if self._stopping.is_set():
                break
            # Backoff starts again after a watch that ran normally, which the server ended
            # or the connection cut; one that ends at once, again and again, must not spin.
            if self._parsed + self._skipped > seen or self._clock() - started >= self._steady:
                delay = BACKOFF[0]
                if failed is None:
                    continue
            if failed is not None:
                log.warning("ResourceClaim watch: %s; retrying in %.1f s", failed, delay)
            else:
                log.info("the ResourceClaim watch ended at once; reopening in %.1f s", delay)
            self._pause(delay)
            delay = min(2 * delay, BACKOFF[1])

    def _pause(self, seconds: float) -> None:
        """Wait before trying again; stop() ends the wait."""
        self._stopping.wait(seconds)

    def _list(self) -> str:
        """Index every claim of ours, page by page; the list's resourceVersion.

        Where the API server cannot stream the list as watch events (WatchList off). Each
        page is parsed whole, so pages are kept small.
        """
        self._lists += 1
        ours: set[str] = set()
        token = ""
        while True:
            query = {"limit": str(self._page_size)}
            if token:
                query["continue"] = token
            response = self._get(query, REQUEST_TIMEOUT)
            try:
                page = json.loads(response.read())
            finally:
                response.close()
            for claim in page.get("items") or []:
                ref = self._index.observe(None, claim)
                if ref is not None:
                    ours.add(ref.uid)
                    self._on_claim(ref, claim)
            meta = page.get("metadata") or {}
            token = meta.get("continue") or ""
            if not token:
                self._index.listed(ours)
                return str(meta.get("resourceVersion") or "")

    def _watch(self, version: str | None) -> Iterator[str]:
        """Follow the watch from ``version``; yields the newest version after each event.

        Without a version, the server first sends every claim as an ADDED event, then a
        bookmark that ends the list (a streamed list: its lines are filtered like any
        other). Versions are yielded only after it: the listed claims' own versions come
        in no order, and a watch resumed from one of them could miss events.
        """
        low, high = self._watch_seconds
        seconds = random.randint(low, high)
        query = {"watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(seconds)}
        listing: set[str] | None = None  # while streaming a list: the UIDs of ours in it
        if version is None:
            query.update(sendInitialEvents="true", resourceVersionMatch="NotOlderThan")
            listing = set()
        else:
            query["resourceVersion"] = version
        response = self._get(query, seconds + REQUEST_TIMEOUT, listing=listing is not None)
        self._watches += 1
        self._lists += listing is not None
        with self._response_lock:
            self._response = response
        try:
            if self._stopping.is_set():
                return
            if listing is None:
                self._index.following()
            for line in _lines(response):
                newer, listed = self._event(line, listing)
                if listed and listing is not None:
                    self._index.listed(listing)
                    listing = None
                if newer and listing is None:
                    yield newer
        finally:
            with self._response_lock:
                self._response = None
            response.close()

    def _event(self, line: bytes, listing: set[str] | None) -> tuple[str | None, bool]:
        """Take one watch event; the resourceVersion it carries, and whether it ends a list.

        Our claims in a streamed list are added to ``listing``.
        """
        if not self._index.mentioned_in(line) and (event := _EVENT.match(line)):
            self._skipped += 1
            version = _VERSION.search(line, event.end())
            return (version.group(1).decode() if version else None), False
        self._parsed += 1
        raw = json.loads(line)
        kind, claim = raw.get("type"), raw.get("object") or {}
        if kind == "ERROR":
            if claim.get("code") == 410:
                raise _GoneError()
            raise KubeAPIError(int(claim.get("code") or 0), str(claim.get("message") or raw))
        meta = claim.get("metadata") or {}
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            ref = self._index.observe(kind, claim)
            if ref is not None:
                if listing is not None:
                    listing.add(ref.uid)
                self._on_claim(ref, claim)
        ends_list = kind == "BOOKMARK" and (meta.get("annotations") or {}).get(LIST_END) == "true"
        version = meta.get("resourceVersion")
        return (str(version) if version else None), ends_list

    def _get(self, query: Mapping[str, str], read_timeout: float, *, listing: bool = False) -> Any:
        """GET the claims with ``query``; the open response (urllib3's), or why not.

        ``listing``: the query asks for a streamed list, which a server without it refuses.
        """
        params = self._client.param_serialize(
            method="GET",
            resource_path=CLAIMS,
            query_params=list(query.items()),
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        answer = self._client.call_api(*params, _request_timeout=(REQUEST_TIMEOUT, read_timeout))
        response = answer.response
        if response.status == 410:
            response.close()
            raise _GoneError()
        if not 200 <= response.status < 300:
            text = response.data.decode("utf-8", "replace").strip()
            response.close()
            if listing and response.status in (400, 422):
                raise _NoStreamedListError(f"HTTP {response.status}: {text}")
            raise KubeAPIError(response.status, f"GET {CLAIMS}: {text or response.reason}")
        return response


def _lines(response: Any) -> Iterator[bytes]:
    """The lines of a streamed response, as they arrive."""
    pending = b""
    for chunk in response.stream(1 << 16):
        pending += chunk
        *lines, pending = pending.split(b"\n")
        yield from (line for line in lines if line.strip())
    if pending.strip():
        yield pending
