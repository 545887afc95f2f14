"""ttrpc over NRI's multiplexed socket: we serve one logical connection and call on the other.

The runtime calls the plugin service on connection 1 (we answer each request on its
stream) and serves the runtime service on connection 2 (we call it: client stream IDs are
odd and must strictly increase on the wire, so an ID is allocated and its request written
under one lock). Calls are unary; responses may come in any order.

Requests are handled one at a time on a worker thread of their own, in arrival order, so
that the reader goes on reading (our own calls' responses among others) while a handler
waits for the resource manager's lock.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from nodedra.grpc_gen import ttrpc_pb2

from .wire import (
    PLUGIN_CONN,
    REQUEST,
    RESPONSE,
    RUNTIME_CONN,
    Demultiplexer,
    Message,
    MessageReader,
    Oversized,
    ProtocolError,
    encode_message,
    frames,
)

log = logging.getLogger(__name__)

# gRPC status codes, as ttrpc uses them.
OK = 0
CANCELLED = 1
UNKNOWN = 2
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
RESOURCE_EXHAUSTED = 8
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14

READ_SIZE = 1 << 16


class RPCError(Exception):
    """A call answered with an error status, or one to answer with."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"code {code}: {message}")
        self.code = code
        self.message = message


class ConnectionClosedError(ConnectionError):
    """The socket is closed: calls in flight and later ones fail with this."""


@dataclass(frozen=True)
class Call:
    """A request the runtime made of us."""

    service: str
    method: str
    payload: bytes
    timeout: float | None
    """Seconds the runtime waits for the answer; None if it did not say."""


Handler = Callable[[Call], bytes]
"""Answers a call with the serialized result, or raises RPCError."""


class Connection:
    """One connection to the runtime's NRI socket, until it closes."""

    def __init__(
        self,
        sock: socket.socket,
        handler: Handler,
        name: str = "nri",
        on_answered: Callable[[], None] = lambda: None,
        inline: Callable[[], bool] = lambda: False,
    ) -> None:
        self._sock = sock
        self._handler = handler
        self._on_answered = on_answered
        """Called once each call's answer is on the wire (or the connection is gone)."""
        self._inline = inline
        """Whether a request may be handled on the reader thread now (the handler would
        not wait): it then saves the hand-off to the handler thread, about a tenth of a
        millisecond of a runtime's wait. The handler never waits for the reader (it makes
        no calls of its own), so handling on it cannot deadlock, only delay reading."""
        self._handing = threading.Lock()
        self._handed = 0
        """Requests handed to the handler thread and not answered yet (under ``_handing``)."""
        self._name = name
        self._write_lock = threading.Lock()
        self._stream_ids = itertools.count(1, 2)
        self._calls: dict[int, Future[bytes]] = {}
        self._calls_lock = threading.Lock()
        self._requests: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self._closed = threading.Event()
        self.close_reason: str | None = None
        self._reader = threading.Thread(target=self._read, name=f"{name}-reader", daemon=True)
        self._worker = threading.Thread(target=self._serve, name=f"{name}-handler", daemon=True)

    def start(self) -> None:
        """Start reading the socket and serving requests."""
        self._reader.start()
        self._worker.start()

    @property
    def closed(self) -> bool:
        """Whether the connection has ended."""
        return self._closed.is_set()

    def wait_closed(self, timeout: float | None = None) -> bool:
        """Wait until the connection ends; whether it did."""
        return self._closed.wait(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the connection's threads have ended (after it closed); whether they did.

        The handler ends after the request it is handling: no request is handled once the
        connection has ended, but one begun before may still be.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in (self._worker, self._reader):
            if thread.ident is None or thread is threading.current_thread():
                continue
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                return False
        return True

    def close(self, reason: str = "closed by nodedra") -> None:
        """End the connection: calls in flight fail, the threads stop."""
        if self._closed.is_set():
            return
        self.close_reason = self.close_reason or reason
        self._closed.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._requests.put(None)
        with self._calls_lock:
            calls, self._calls = self._calls, {}
        for future in calls.values():
            future.set_exception(ConnectionClosedError(f"NRI connection closed: {reason}"))

    # Calling the runtime ---------------------------------------------------------------

    def call(self, service: str, method: str, payload: bytes, timeout: float) -> bytes:
        """Call ``service``'s ``method`` on the runtime and wait for its answer.

        Raises RPCError for an error status, ConnectionClosedError if the connection ends
        first, TimeoutError if no answer comes within ``timeout`` seconds.
        """
        future: Future[bytes] = Future()
        request = ttrpc_pb2.Request(
            service=service, method=method, payload=payload, timeout_nano=int(timeout * 1e9)
        ).SerializeToString()
        with self._write_lock:  # the ID and its request reach the wire in the same order
            stream_id = next(self._stream_ids)
            with self._calls_lock:
                if self._closed.is_set():
                    raise ConnectionClosedError(f"NRI connection closed: {self.close_reason}")
                self._calls[stream_id] = future
            self._send_locked(RUNTIME_CONN, encode_message(stream_id, REQUEST, request))
        try:
            return future.result(timeout)
        except TimeoutError:
            with self._calls_lock:
                self._calls.pop(stream_id, None)
            raise TimeoutError(f"{service}.{method}: no answer in {timeout:.1f} s") from None

    # Internals -------------------------------------------------------------------------

    def _send_locked(self, conn_id: int, message: bytes) -> None:
        try:
            for frame in frames(conn_id, message):
                self._sock.sendall(frame)
        except OSError as err:
            self.close(f"writing to the socket failed: {err}")
            raise ConnectionClosedError(f"NRI connection closed: {err}") from err

    def _send(self, conn_id: int, message: bytes) -> None:
        with self._write_lock:
            self._send_locked(conn_id, message)

    def _read(self) -> None:
        demux = Demultiplexer()
        readers = {PLUGIN_CONN: MessageReader(), RUNTIME_CONN: MessageReader()}
        try:
            while not self._closed.is_set():
                data = self._sock.recv(READ_SIZE)
                if not data:
                    self.close("the runtime closed the connection")
                    return
                for conn_id, payload in demux.feed(data):
                    for message in readers[conn_id].feed(payload):
                        self._dispatch(conn_id, message)
        except ProtocolError as err:
            log.error("NRI: %s; dropping the connection", err)
            self.close(str(err))
        except OSError as err:
            self.close(f"reading the socket failed: {err}")

    def _dispatch(self, conn_id: int, message: Message | Oversized) -> None:
        if conn_id == RUNTIME_CONN:
            if message.kind == RESPONSE:
                self._answered(message)
            return  # the runtime does not call us on its own connection
        if message.kind != REQUEST:
            return  # no streams in NRI: data messages have no meaning here
        if isinstance(message, Oversized):
            log.error("NRI: a request of %d bytes, over ttrpc's limit", message.length)
            self._respond_error(message.stream_id, RPCError(RESOURCE_EXHAUSTED, "too large"))
            return
        with self._handing:  # in order: only when the handler thread has nothing left
            now = not self._handed and self._inline()
            if not now:
                self._handed += 1
        if now:
            try:
                self._serve_one(message)
            finally:
                self._on_answered()
        else:
            self._requests.put(message)

    def _answered(self, message: Message | Oversized) -> None:
        with self._calls_lock:
            future = self._calls.pop(message.stream_id, None)
        if future is None:
            return  # answered after we gave up waiting
        if isinstance(message, Oversized):
            future.set_exception(RPCError(RESOURCE_EXHAUSTED, "the answer is over ttrpc's limit"))
            return
        try:
            response = ttrpc_pb2.Response.FromString(message.payload)
        except Exception as err:  # protobuf raises DecodeError and others
            future.set_exception(RPCError(INTERNAL, f"undecodable response: {err}"))
            return
        if response.HasField("status") and response.status.code != OK:
            future.set_exception(RPCError(response.status.code, response.status.message))
        else:
            future.set_result(response.payload)

    def _serve(self) -> None:
        try:
            while (message := self._requests.get()) is not None:
                if self._closed.is_set():
                    return  # nobody to answer: the runtime forgets what it asked on this one
                try:
                    self._serve_one(message)
                finally:
                    self._on_answered()
                    with self._handing:  # answered first: the next may go inline
                        self._handed -= 1
        finally:
            self._on_answered()

    def _serve_one(self, message: Message) -> None:
        try:
            request = ttrpc_pb2.Request.FromString(message.payload)
        except Exception as err:
            self._respond_error(message.stream_id, RPCError(INVALID_ARGUMENT, str(err)))
            return
        timeout = request.timeout_nano / 1e9 if request.timeout_nano > 0 else None
        call = Call(request.service, request.method, request.payload, timeout)
        try:
            payload = self._handler(call)
        except RPCError as err:
            self._respond_error(message.stream_id, err)
            return
        except Exception as err:  # a bug of ours: the runtime must still get an answer
            log.exception("NRI: handling %s.%s failed", call.service, call.method)
            self._respond_error(message.stream_id, RPCError(INTERNAL, str(err)))
            return
        self._respond(message.stream_id, ttrpc_pb2.Response(payload=payload))

    def _respond_error(self, stream_id: int, err: RPCError) -> None:
        status = ttrpc_pb2.Status(code=err.code, message=err.message)
        self._respond(stream_id, ttrpc_pb2.Response(status=status))

    def _respond(self, stream_id: int, response: ttrpc_pb2.Response) -> None:
        data = response.SerializeToString()
        try:
            self._send(PLUGIN_CONN, encode_message(stream_id, RESPONSE, data))
        except ValueError as err:  # over the limit: say so instead of sending nothing
            self._respond_error(stream_id, RPCError(RESOURCE_EXHAUSTED, str(err)))
        except ConnectionClosedError:
            pass  # the reader reports why
