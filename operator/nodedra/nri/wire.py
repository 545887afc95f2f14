"""The bytes on NRI's socket: multiplexer frames that carry ttrpc messages.

One Unix socket carries two logical connections. Every byte travels in a *frame*: a
4-byte big-endian connection ID, a 4-byte big-endian length, then that many bytes of the
connection's stream. Connection 1 carries the plugin service (the runtime calls us),
connection 2 the runtime service (we call it). Frame boundaries mean nothing: a logical
connection is a byte stream, and a ttrpc message may span frames.

A ttrpc message is a 10-byte header (4-byte payload length, 4-byte stream ID, 1-byte
type, 1-byte flags, big-endian) and the payload, at most 4 MiB.

Writing to a Go peer needs care: Go's ttrpc reads a connection through a 4096-byte buffer,
and Go's multiplexer fails such a read with ENOMEM when a frame does not fit in the buffer
(or truncates it silently). So a message is framed the way Go's own writer frames it: one
frame when it fits in 4096 bytes, otherwise a first frame of exactly 4096 bytes and the rest
in frames as large as the multiplexer allows, and never two messages in one frame.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

PLUGIN_CONN = 1
"""The logical connection on which we serve the plugin service."""
RUNTIME_CONN = 2
"""The logical connection on which we call the runtime service."""

FRAME_HEADER = struct.Struct(">II")
MESSAGE_HEADER = struct.Struct(">IIBB")
MAX_MESSAGE = 4 << 20
"""The largest payload of a ttrpc message (both sides refuse larger ones)."""
MAX_FRAME = MESSAGE_HEADER.size + MAX_MESSAGE
"""The largest frame payload the multiplexer writes."""
GO_READ_BUFFER = 4096
"""What Go's ttrpc reads a connection with: no frame may exceed it unless it starts a message."""

REQUEST = 1
RESPONSE = 2
DATA = 3
_TYPES = (REQUEST, RESPONSE, DATA)


class ProtocolError(Exception):
    """Bytes that are not NRI's protocol: the connection cannot go on."""


@dataclass(frozen=True)
class Message:
    """One ttrpc message of a logical connection."""

    stream_id: int
    kind: int
    """REQUEST, RESPONSE or DATA."""
    flags: int
    payload: bytes


@dataclass(frozen=True)
class Oversized:
    """A message too large to take: it was skipped, its stream should get an error."""

    stream_id: int
    kind: int
    length: int


def encode_message(stream_id: int, kind: int, payload: bytes, flags: int = 0) -> bytes:
    """A ttrpc message; ValueError if the payload is over the 4 MiB limit."""
    if len(payload) > MAX_MESSAGE:
        raise ValueError(f"a ttrpc message may carry {MAX_MESSAGE} bytes, not {len(payload)}")
    return MESSAGE_HEADER.pack(len(payload), stream_id, kind, flags) + payload


def frames(conn_id: int, message: bytes) -> list[bytes]:
    """The frames that carry one whole ttrpc message on ``conn_id``, framed as Go frames it."""
    if len(message) <= GO_READ_BUFFER:
        return [FRAME_HEADER.pack(conn_id, len(message)) + message]
    out = [FRAME_HEADER.pack(conn_id, GO_READ_BUFFER) + message[:GO_READ_BUFFER]]
    for start in range(GO_READ_BUFFER, len(message), MAX_FRAME):
        chunk = message[start : start + MAX_FRAME]
        out.append(FRAME_HEADER.pack(conn_id, len(chunk)) + chunk)
    return out


class Demultiplexer:
    """Splits the socket's bytes into the streams of the logical connections.

    Frames of connections nobody opened are dropped, as the multiplexer drops them.
    """

    def __init__(self, conn_ids: tuple[int, ...] = (PLUGIN_CONN, RUNTIME_CONN)) -> None:
        self._conn_ids = conn_ids
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The payloads of the frames ``data`` completes, with their connection IDs."""
        self._buffer += data
        out = []
        while len(self._buffer) >= FRAME_HEADER.size:
            conn_id, length = FRAME_HEADER.unpack_from(self._buffer)
            if length > MAX_FRAME:
                raise ProtocolError(
                    f"a frame of {length} bytes on connection {conn_id}: larger than any the "
                    f"multiplexer writes ({MAX_FRAME}); not NRI on this socket?"
                )
            end = FRAME_HEADER.size + length
            if len(self._buffer) < end:
                break
            payload = bytes(self._buffer[FRAME_HEADER.size : end])
            del self._buffer[:end]
            if conn_id in self._conn_ids:
                out.append((conn_id, payload))
        return out

    @property
    def pending(self) -> int:
        """Bytes of an unfinished frame."""
        return len(self._buffer)


class MessageReader:
    """Parses the ttrpc messages out of one logical connection's byte stream."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._skipping = 0  # bytes of an oversized message still to skip

    def feed(self, data: bytes) -> list[Message | Oversized]:
        """The messages ``data`` completes, in order."""
        if self._skipping:
            skipped = min(self._skipping, len(data))
            self._skipping -= skipped
            data = data[skipped:]
        self._buffer += data
        out: list[Message | Oversized] = []
        while not self._skipping and len(self._buffer) >= MESSAGE_HEADER.size:
            length, stream_id, kind, flags = MESSAGE_HEADER.unpack_from(self._buffer)
            if kind not in _TYPES:
                raise ProtocolError(f"a ttrpc message of unknown type {kind} on stream {stream_id}")
            if length > MAX_MESSAGE:
                out.append(Oversized(stream_id, kind, length))
                available = len(self._buffer) - MESSAGE_HEADER.size
                skipped = min(length, available)
                del self._buffer[: MESSAGE_HEADER.size + skipped]
                self._skipping = length - skipped
                continue
            end = MESSAGE_HEADER.size + length
            if len(self._buffer) < end:
                break
            payload = bytes(self._buffer[MESSAGE_HEADER.size : end])
            del self._buffer[:end]
            out.append(Message(stream_id, kind, flags, payload))
        return out

    @property
    def pending(self) -> int:
        """Bytes of an unfinished message (or left to skip of an oversized one)."""
        return len(self._buffer) + self._skipping
