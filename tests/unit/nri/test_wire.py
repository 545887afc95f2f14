"""The bytes of NRI's socket: frames and ttrpc messages, split and joined anywhere."""

from __future__ import annotations

import pytest

from nodedra.nri.wire import (
    FRAME_HEADER,
    GO_READ_BUFFER,
    MAX_FRAME,
    MAX_MESSAGE,
    MESSAGE_HEADER,
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


def test_a_message_header_is_ten_bytes_big_endian() -> None:
    assert (
        encode_message(7, REQUEST, b"abc", flags=2)
        == b"\x00\x00\x00\x03\x00\x00\x00\x07\x01\x02abc"
    )


def test_the_register_plugin_frame_of_the_reference() -> None:
    """A 60-byte request on connection 2 is one 78-byte frame (nri-protocol.md, §4)."""
    message = encode_message(1, REQUEST, bytes(50))
    (frame,) = frames(RUNTIME_CONN, message)
    assert len(frame) == 68
    assert frame[:8] == bytes.fromhex("00000002 0000003c")


@pytest.mark.parametrize("size", [0, 1, GO_READ_BUFFER - MESSAGE_HEADER.size])
def test_a_message_that_fits_go_s_buffer_is_one_frame(size: int) -> None:
    message = encode_message(1, RESPONSE, bytes(size))
    (frame,) = frames(PLUGIN_CONN, message)
    assert FRAME_HEADER.unpack_from(frame) == (PLUGIN_CONN, len(message))


@pytest.mark.parametrize("size", [GO_READ_BUFFER - MESSAGE_HEADER.size + 1, 100_000, MAX_MESSAGE])
def test_a_larger_message_starts_with_a_frame_of_exactly_4096(size: int) -> None:
    """Go's ttrpc reads 4096 bytes at a time; its mux refuses a frame that does not fit."""
    message = encode_message(3, RESPONSE, bytes(size))
    parts = frames(PLUGIN_CONN, message)
    lengths = [FRAME_HEADER.unpack_from(f)[1] for f in parts]
    assert lengths[0] == GO_READ_BUFFER
    assert all(length <= MAX_FRAME for length in lengths)
    assert sum(lengths) == len(message)
    assert b"".join(f[FRAME_HEADER.size :] for f in parts) == message


def test_messages_over_the_limit_are_refused_before_they_are_sent() -> None:
    with pytest.raises(ValueError, match="4194304"):
        encode_message(1, RESPONSE, bytes(MAX_MESSAGE + 1))


def _stream(*messages: bytes, conn_id: int = PLUGIN_CONN) -> bytes:
    return b"".join(frame for m in messages for frame in frames(conn_id, m))


def _read_in_pieces(data: bytes, cut: int) -> list[Message | Oversized]:
    """Feed ``data`` to a demultiplexer and reader in pieces of ``cut`` bytes."""
    demux, reader = Demultiplexer(), MessageReader()
    out: list[Message | Oversized] = []
    for start in range(0, len(data), cut):
        for _, payload in demux.feed(data[start : start + cut]):
            out += reader.feed(payload)
    assert demux.pending == 0
    assert reader.pending == 0
    return out


def test_frames_split_and_joined_at_every_boundary() -> None:
    """Whatever the reads deliver, the same two messages come out."""
    first = encode_message(1, REQUEST, b"first")
    second = encode_message(3, REQUEST, bytes(range(256)) * 20)  # over 4096: two frames
    data = _stream(first, second)
    expected = [
        Message(1, REQUEST, 0, b"first"),
        Message(3, REQUEST, 0, bytes(range(256)) * 20),
    ]
    for cut in range(1, 64):
        assert _read_in_pieces(data, cut) == expected, cut
    assert _read_in_pieces(data, len(data)) == expected, "two messages in one read"


def test_a_message_may_span_frames_as_any_writer_cuts_it() -> None:
    """Frame boundaries mean nothing: a message cut into one-byte frames is the same."""
    message = encode_message(5, REQUEST, b"hello, runtime")
    data = b"".join(FRAME_HEADER.pack(PLUGIN_CONN, 1) + bytes([b]) for b in message)
    assert _read_in_pieces(data, 7) == [Message(5, REQUEST, 0, b"hello, runtime")]


def test_a_message_near_4_mib_comes_through() -> None:
    payload = bytes(range(256)) * (MAX_MESSAGE // 256)
    data = _stream(encode_message(9, RESPONSE, payload))
    (message,) = _read_in_pieces(data, 65536)
    assert isinstance(message, Message)
    assert message.payload == payload


def test_frames_of_connections_nobody_opened_are_dropped() -> None:
    demux = Demultiplexer()
    got = demux.feed(FRAME_HEADER.pack(7, 3) + b"abc" + FRAME_HEADER.pack(1, 2) + b"ok")
    assert got == [(1, b"ok")]


def test_an_oversized_message_is_skipped_and_reported() -> None:
    """A peer sending more than 4 MiB gets an error on that stream; what follows is read."""
    reader = MessageReader()
    huge = MESSAGE_HEADER.pack(MAX_MESSAGE + 1, 11, REQUEST, 0)
    out = reader.feed(huge + bytes(1000))
    assert out == [Oversized(11, REQUEST, MAX_MESSAGE + 1)]
    rest = MAX_MESSAGE + 1 - 1000
    assert reader.feed(bytes(rest - 5)) == []
    after = encode_message(13, REQUEST, b"next")
    assert reader.feed(bytes(5) + after) == [Message(13, REQUEST, 0, b"next")]


def test_garbage_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="larger than any the multiplexer writes"):
        Demultiplexer().feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises(ProtocolError, match="unknown type 9"):
        MessageReader().feed(MESSAGE_HEADER.pack(1, 1, 9, 0) + b"x")
