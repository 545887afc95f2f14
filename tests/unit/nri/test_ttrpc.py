"""ttrpc on the multiplexed socket: calls, answers, errors, and a peer that misbehaves.

The far end of a socket pair is driven byte by byte here (with nodedra.nri.wire to make and
read the bytes), so that what a runtime might send, good or bad, can be sent on purpose.
The real runtime side, NRI's adaptation, is in the integration tests.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from nodedra.grpc_gen import ttrpc_pb2
from nodedra.nri.ttrpc import (
    RESOURCE_EXHAUSTED,
    UNIMPLEMENTED,
    Call,
    Connection,
    ConnectionClosedError,
    RPCError,
)
from nodedra.nri.wire import (
    FRAME_HEADER,
    MAX_MESSAGE,
    MESSAGE_HEADER,
    PLUGIN_CONN,
    REQUEST,
    RESPONSE,
    RUNTIME_CONN,
    Demultiplexer,
    Message,
    MessageReader,
    encode_message,
    frames,
)
from tests.peers.cluster import poll


class Peer:
    """The runtime's end of the socket, spoken by hand."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.demux = Demultiplexer()
        self.readers = {PLUGIN_CONN: MessageReader(), RUNTIME_CONN: MessageReader()}
        self.pending: list[tuple[int, Message]] = []

    def send(self, conn_id: int, stream_id: int, kind: int, payload: bytes) -> None:
        for frame in frames(conn_id, encode_message(stream_id, kind, payload)):
            self.sock.sendall(frame)

    def call(self, stream_id: int, service: str, method: str, payload: bytes = b"") -> None:
        request = ttrpc_pb2.Request(service=service, method=method, payload=payload)
        self.send(PLUGIN_CONN, stream_id, REQUEST, request.SerializeToString())

    def receive(self) -> tuple[int, Message]:
        while not self.pending:
            data = self.sock.recv(65536)
            assert data, "the connection closed"
            for conn_id, payload in self.demux.feed(data):
                for message in self.readers[conn_id].feed(payload):
                    assert isinstance(message, Message)
                    self.pending.append((conn_id, message))
        return self.pending.pop(0)

    def answer(self, stream_id: int, payload: bytes = b"", code: int = 0) -> None:
        response = ttrpc_pb2.Response(payload=payload)
        if code:
            response.status.code = code
            response.status.message = "refused"
        self.send(RUNTIME_CONN, stream_id, RESPONSE, response.SerializeToString())


def echo(call: Call) -> bytes:
    if call.method == "Fail":
        raise RPCError(UNIMPLEMENTED, f"method {call.method}")
    return call.service.encode() + b"." + call.method.encode() + b":" + call.payload


@pytest.fixture
def pair() -> Iterator[tuple[Connection, Peer]]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    connection = Connection(ours, echo, name="test")
    connection.start()
    yield connection, Peer(theirs)
    connection.close()
    theirs.close()


def test_requests_are_answered_on_their_stream(pair: tuple[Connection, Peer]) -> None:
    _connection, peer = pair
    peer.call(1, "svc", "Echo", b"one")
    peer.call(3, "svc", "Fail")
    conn_id, first = peer.receive()
    assert (conn_id, first.stream_id, first.kind) == (PLUGIN_CONN, 1, RESPONSE)
    response = ttrpc_pb2.Response.FromString(first.payload)
    assert not response.HasField("status"), "success carries no status"
    assert response.payload == b"svc.Echo:one"
    _, second = peer.receive()
    failed = ttrpc_pb2.Response.FromString(second.payload)
    assert (second.stream_id, failed.status.code) == (3, UNIMPLEMENTED)
    assert failed.status.message == "method Fail"


def test_our_calls_get_odd_strictly_increasing_stream_ids(pair: tuple[Connection, Peer]) -> None:
    """Many threads call at once; the IDs on the wire still only go up, by two."""
    connection, peer = pair
    seen: list[int] = []

    def runtime() -> None:
        for _ in range(40):
            conn_id, message = peer.receive()
            assert conn_id == RUNTIME_CONN
            request = ttrpc_pb2.Request.FromString(message.payload)
            seen.append(message.stream_id)
            peer.answer(message.stream_id, request.payload)

    server = threading.Thread(target=runtime)
    server.start()
    with ThreadPoolExecutor(8) as pool:
        payloads = [f"call {i}".encode() for i in range(40)]
        answers = list(pool.map(lambda p: connection.call("rt", "M", p, 10), payloads))
    server.join(timeout=30)
    assert answers == payloads, "each call got its own answer"
    assert seen == list(range(1, 81, 2))


def test_answers_out_of_order_reach_their_callers(pair: tuple[Connection, Peer]) -> None:
    connection, peer = pair
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(connection.call, "rt", "A", b"a", 10)
        _, one = peer.receive()
        second = pool.submit(connection.call, "rt", "B", b"b", 10)
        _, three = peer.receive()
        peer.answer(three.stream_id, b"for B")
        peer.answer(one.stream_id, b"", code=RESOURCE_EXHAUSTED)
        assert second.result(10) == b"for B"
        with pytest.raises(RPCError) as refused:
            first.result(10)
    assert refused.value.code == RESOURCE_EXHAUSTED


def test_an_oversized_request_is_answered_resource_exhausted(
    pair: tuple[Connection, Peer],
) -> None:
    _connection, peer = pair
    header = MESSAGE_HEADER.pack(MAX_MESSAGE + 1, 5, REQUEST, 0)
    body = header + bytes(MAX_MESSAGE + 1)
    for start in range(0, len(body), 1 << 20):
        chunk = body[start : start + (1 << 20)]
        peer.sock.sendall(FRAME_HEADER.pack(PLUGIN_CONN, len(chunk)) + chunk)
    _, message = peer.receive()
    assert message.stream_id == 5
    assert ttrpc_pb2.Response.FromString(message.payload).status.code == RESOURCE_EXHAUSTED
    peer.call(7, "svc", "Echo", b"still here")
    _, after = peer.receive()
    assert ttrpc_pb2.Response.FromString(after.payload).payload == b"svc.Echo:still here"


def test_a_peer_that_closes_mid_message_ends_the_connection(
    pair: tuple[Connection, Peer],
) -> None:
    """Calls in flight fail at once, with why; later ones fail too."""
    connection, peer = pair
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(connection.call, "rt", "M", b"", 30)
        peer.receive()
        half = frames(RUNTIME_CONN, encode_message(1, RESPONSE, bytes(100)))[0][:50]
        peer.sock.sendall(half)
        peer.sock.close()
        with pytest.raises(ConnectionClosedError, match="the runtime closed the connection"):
            waiting.result(10)
    assert connection.wait_closed(10)
    with pytest.raises(ConnectionClosedError):
        connection.call("rt", "M", b"", 1)


def test_garbage_on_the_socket_drops_the_connection_with_the_reason(
    pair: tuple[Connection, Peer],
) -> None:
    connection, peer = pair
    peer.sock.sendall(b"SSH-2.0-OpenSSH_9.2\r\n" + bytes(range(256)))
    assert connection.wait_closed(10)
    assert connection.close_reason is not None
    assert "larger than any the multiplexer writes" in connection.close_reason


def test_requests_are_handled_on_the_reader_while_inline_is_allowed() -> None:
    """The hand-off to the handler thread is skipped while the owner says it is idle."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    inline = threading.Event()
    handled_on: list[str] = []

    def handler(call: Call) -> bytes:
        handled_on.append(threading.current_thread().name)
        return b"ok"

    connection = Connection(ours, handler, name="test", inline=inline.is_set)
    connection.start()
    peer = Peer(theirs)
    try:
        peer.call(1, "svc", "A")
        peer.receive()
        # The handler thread lets go just after the answer is on the wire.
        poll(lambda: connection._handed == 0 or None, 30, lambda: "the handler thread done")
        inline.set()
        peer.call(3, "svc", "B")
        peer.receive()
    finally:
        connection.close()
        theirs.close()
    assert handled_on == ["test-handler", "test-reader"]


def test_a_request_behind_one_on_the_handler_thread_waits_its_turn() -> None:
    """Requests are answered in order: one that comes while the handler thread still has
    another goes to that thread too, however idle the owner says it is meanwhile."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    inline = threading.Event()
    first_began, release_first = threading.Event(), threading.Event()
    order: list[tuple[str, str]] = []
    answered: list[str] = []

    def handler(call: Call) -> bytes:
        if call.method == "First":
            first_began.set()
            release_first.wait(30)
        order.append((call.method, threading.current_thread().name))
        return b""

    connection = Connection(
        ours, handler, name="test", inline=inline.is_set, on_answered=lambda: answered.append("")
    )
    connection.start()
    peer = Peer(theirs)
    try:
        peer.call(1, "svc", "First")
        assert first_began.wait(30)
        inline.set()  # the owner looks idle now, but the first is still being handled
        peer.call(3, "svc", "Second")
        poll(lambda: connection._handed == 2 or None, 30, lambda: "the second handed over")
        release_first.set()
        assert [peer.receive()[1].stream_id for _ in range(2)] == [1, 3]
        poll(lambda: connection._handed == 0 or None, 30, lambda: "the handler thread done")
        peer.call(5, "svc", "Third")  # the handler thread is done: this one goes inline
        peer.receive()
        # Reported once the answer is on the wire: just after the peer may have it.
        poll(lambda: len(answered) >= 3 or None, 30, lambda: f"3 answers told: {answered}")
    finally:
        connection.close()
        theirs.close()
    assert order == [
        ("First", "test-handler"),
        ("Second", "test-handler"),
        ("Third", "test-reader"),
    ]
    assert len(answered) >= 3, "every answer is reported, inline ones too"
