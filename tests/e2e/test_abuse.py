"""Socket-level abuse of a real `rill server` (issue 7): bad frames, absurd lengths, random
bytes, hostile record batches, a decompression bomb, a slow-loris peer, thousands of idle
connections and a pipelining flood.

Each test passes when: the abusive connection gets an error (a response carrying an error
code, or a closed connection) within a few seconds; the server is still running; its
resident memory grew by less than RSS_GROWTH_LIMIT over the test; a normal confluent-kafka
client still produces and consumes right after; and a canary topic written before the
abuse reads back unchanged afterwards.
"""

from __future__ import annotations

import random
import resource
import socket
import struct
import time
import zlib

import pytest
from confluent_kafka import Producer, TopicPartition

from kafka_helpers import (
    create_topic,
    produce_and_read_back,
    read_all,
    reading_consumer,
    unique_topic,
)

ANSWER_TIMEOUT_S = 5.0
RSS_GROWTH_LIMIT = 256 << 20
CORRELATION_ID = 0x0BAD_F00D

PRODUCE, METADATA, API_VERSIONS = 0, 3, 18
CORRUPT_MESSAGE, INVALID_RECORD = 2, 87

# --------------------------------------------------------------------------------------
# Wire helpers


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def string(s: bytes) -> bytes:
    return struct.pack(">h", len(s)) + s


def header_v1(api_key: int, version: int, client_id: bytes = b"e2e-abuse") -> bytes:
    return struct.pack(">hhi", api_key, version, CORRELATION_ID) + string(client_id)


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def varint(n: int) -> bytes:
    return uvarint((n << 1) ^ (n >> 63))


def api_versions_v0() -> bytes:
    return frame(header_v1(API_VERSIONS, 0))


def connect(bootstrap: str) -> socket.socket:
    host, port = bootstrap.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=ANSWER_TIMEOUT_S)


def read_response(sock: socket.socket, timeout_s: float = ANSWER_TIMEOUT_S) -> bytes | None:
    """The next response body after its correlation id, or None when the server closed.

    Fails when it does neither within the timeout.
    """
    deadline = time.monotonic() + timeout_s

    def read_exactly(n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"no answer and no close within {timeout_s} s", pytrace=False)
            sock.settimeout(left)
            try:
                chunk = sock.recv(n - len(buf))
            except socket.timeout:
                continue
            except (ConnectionResetError, BrokenPipeError):
                return None
            if not chunk:
                return None
            buf += chunk
        return buf

    size = read_exactly(4)
    if size is None:
        return None
    (n,) = struct.unpack(">i", size)
    assert 4 <= n <= 64 << 20, f"response frame claims {n} bytes"
    body = read_exactly(n)
    if body is None:
        return None
    (cid,) = struct.unpack(">i", body[:4])
    assert cid == CORRELATION_ID, f"response to the wrong request ({cid:#x})"
    return body[4:]


def send_quietly(sock: socket.socket, data: bytes) -> bool:
    """Sends; False when the server already closed (which is a fine answer to abuse)."""
    try:
        sock.sendall(data)
        return True
    except (BrokenPipeError, ConnectionResetError):
        return False


def refused_or_answered(bootstrap: str, data: bytes, greet: bool = False) -> bytes | None:
    """Sends `data` on a fresh connection (after one ApiVersions when `greet`); returns the
    response body or None when the server closed the connection."""
    with connect(bootstrap) as sock:
        if greet:
            sock.sendall(api_versions_v0())
            assert read_response(sock) is not None, "ApiVersions must be answered"
        if not send_quietly(sock, data):
            return None
        return read_response(sock)


def closed_within(sock: socket.socket, timeout_s: float) -> bool:
    sock.settimeout(timeout_s)
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


# --------------------------------------------------------------------------------------
# Record batches (magic 2) built by hand, so that each field can be made wrong on purpose


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def record(value: bytes, offset_delta: int = 0, key: bytes | None = b"k") -> bytes:
    body = b"\x00" + varint(0) + varint(offset_delta)
    body += varint(-1) if key is None else varint(len(key)) + key
    body += varint(len(value)) + value + varint(0)
    return varint(len(body)) + body


def batch(
    records_payload: bytes,
    count: int,
    attributes: int = 0,
    magic: int = 2,
    crc: int | None = None,
    batch_length: int | None = None,
) -> bytes:
    now = int(time.time() * 1000)
    after_crc = struct.pack(">hiqqqhii", attributes, count - 1, now, now, -1, -1, -1, count)
    after_crc += records_payload
    computed = crc32c(after_crc)
    tail = struct.pack(">bI", magic, computed if crc is None else crc) + after_crc
    # partitionLeaderEpoch + magic + crc + the rest.
    length = 4 + len(tail) if batch_length is None else batch_length
    return struct.pack(">qii", 0, length, -1) + tail


def produce_v3(topic: str, records: bytes, acks: int = -1) -> bytes:
    body = struct.pack(">hhi", -1, acks, 10_000) + struct.pack(">i", 1) + string(topic.encode())
    body += struct.pack(">ii", 1, 0) + struct.pack(">i", len(records)) + records
    return frame(header_v1(PRODUCE, 3) + body)


def produce_error(response: bytes) -> int:
    """The error code of the single partition in a ProduceResponse v3."""
    (topics,) = struct.unpack(">i", response[:4])
    assert topics == 1
    (name_len,) = struct.unpack(">h", response[4:6])
    at = 6 + name_len
    partitions, _index, error = struct.unpack(">iih", response[at : at + 10])
    assert partitions == 1
    return error


# --------------------------------------------------------------------------------------
# The pass criteria


class Canary:
    """A topic written before the abuse; it must read back the same afterwards."""

    def __init__(self, bootstrap: str, count: int = 50) -> None:
        self.bootstrap = bootstrap
        self.topic = unique_topic("canary")
        create_topic(bootstrap, self.topic, 1)
        producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
        for i in range(count):
            producer.produce(self.topic, key=b"c%d" % i, value=b"canary-%d" % i)
        assert producer.flush(30) == 0
        self.expected = {i: (b"c%d" % i, b"canary-%d" % i) for i in range(count)}

    def check(self) -> None:
        stored = read_all(self.bootstrap, self.topic, 1, timeout_s=60)[0]
        assert {
            o: (r.key, r.value) for o, r in stored.items()
        } == self.expected, "stored data changed under abuse"


@pytest.fixture
def abused(rill_factory, request):
    """A server with a canary topic; after the test, the pass criteria are checked."""
    overrides = getattr(request, "param", None) or {}
    server = rill_factory(overrides=overrides)
    canary = Canary(server.bootstrap)
    baseline = server.rss_bytes()
    yield server
    assert server.is_running(), "the server died under abuse\n" + server.log_excerpt()
    grown = server.rss_bytes() - baseline
    assert grown < RSS_GROWTH_LIMIT, f"server RSS grew by {grown >> 20} MiB under abuse"
    produce_and_read_back(server.bootstrap)
    canary.check()


def topic_for(server) -> str:
    topic = unique_topic("abuse")
    create_topic(server.bootstrap, topic, 1)
    return topic


# --------------------------------------------------------------------------------------
# Frames


@pytest.mark.parametrize(
    "prefix,greet",
    [
        (0x7FFF_FFFF, False),
        (0x7FFF_FFFF, True),
        (100 * 1024 * 1024 + 1, True),
        (-1, False),
        (-1, True),
        (-(1 << 31), False),
        (512 * 1024 + 1, False),
    ],
    ids=[
        "2gib",
        "2gib_after_request",
        "cap_plus_1",
        "minus_1",
        "minus_1_after_request",
        "min_int",
        "first_frame_512kib_plus_1",
    ],
)
def test_frame_length_refused_before_buffering(abused, prefix, greet):
    # Only the prefix is sent: a server that waits for the body instead of refusing the
    # size at once fails the timeout.
    with connect(abused.bootstrap) as sock:
        if greet:
            sock.sendall(api_versions_v0())
            assert read_response(sock) is not None
        sock.sendall(struct.pack(">i", prefix))
        assert closed_within(sock, ANSWER_TIMEOUT_S), f"prefix {prefix:#x} not refused"


def test_large_frame_allowed_after_first_request(abused):
    # 600 KiB is over the first-frame limit (sasl.server.max.receive.size) but under
    # socket.request.max.bytes: after one valid request the server reads and answers it.
    # Metadata v4 with auto-creation off, 20 (invalid, 30,000-byte) topic names.
    names = [(b"%02d" % i) * 15_000 for i in range(20)]
    body = struct.pack(">i", len(names)) + b"".join(string(n) for n in names) + b"\x00"
    request = frame(header_v1(METADATA, 4) + body)
    assert len(request) > 512 * 1024
    with connect(abused.bootstrap) as sock:
        # The server may close as soon as it has the size prefix, while we still write.
        sent = send_quietly(sock, request)
        assert not sent or closed_within(sock, ANSWER_TIMEOUT_S), "first frame over 512 KiB was read"
    response = refused_or_answered(abused.bootstrap, request, greet=True)
    assert response is not None, "a 600 KiB request after ApiVersions must be served"


def test_empty_and_short_frames(abused):
    for payload in [b"", b"\x00", b"\x00\x12\x00\x00\x00\x00\x00"]:
        assert refused_or_answered(abused.bootstrap, frame(payload)) is None


def test_truncated_frame_then_half_close(abused):
    with connect(abused.bootstrap) as sock:
        sock.sendall(struct.pack(">i", 100) + header_v1(API_VERSIONS, 0))
        sock.shutdown(socket.SHUT_WR)
        assert closed_within(sock, ANSWER_TIMEOUT_S)


@pytest.mark.parametrize("abused", [{"connections.max.idle.ms": "1500"}], indirect=True)
def test_truncated_frame_left_open_is_closed_when_idle(abused):
    with connect(abused.bootstrap) as sock:
        sock.sendall(struct.pack(">i", 100) + header_v1(API_VERSIONS, 0))
        started = time.monotonic()
        assert closed_within(sock, 10), "a stalled frame must not hold a connection forever"
        assert time.monotonic() - started < 8


# --------------------------------------------------------------------------------------
# Headers and bodies


def test_unknown_api_keys_and_versions(abused):
    cases = [frame(header_v1(key, 0)) for key in (-1, 99, 9999, 32767, -32768)]
    for key in (PRODUCE, 1, 2, METADATA, 8, 9, 10, 11, 19, 20, 22, 32, 60):
        for version in (-1, 99, 32767):
            cases.append(frame(header_v1(key, version) + b"\x00" * 16))
    for data in cases:
        refused_or_answered(abused.bootstrap, data)


def test_tagged_field_flood_in_flexible_header(abused):
    # ApiVersions v3 uses request header v2: its tagged-field section here claims 40,000
    # fields of one byte each (about 160 KB, within the first-frame limit).
    fields = b"".join(uvarint(tag) + uvarint(1) + b"x" for tag in range(40_000))
    header = header_v1(API_VERSIONS, 3) + uvarint(40_000) + fields
    body = bytes([5]) + b"e2e-" + bytes([4]) + b"1.0" + b"\x00"
    started = time.monotonic()
    refused_or_answered(abused.bootstrap, frame(header + body))
    assert time.monotonic() - started < ANSWER_TIMEOUT_S
    # Tagged fields whose sizes claim more than the frame holds.
    for count, size in [(1, 0x7FFF_FFFF), (0xFFFF_FFFF, 1), (3, 0xFFFF_FFFF)]:
        header = header_v1(API_VERSIONS, 3) + uvarint(count) + uvarint(0) + uvarint(size) + b"x"
        refused_or_answered(abused.bootstrap, frame(header + body))


def test_absurd_array_and_string_lengths(abused):
    topic = b"t"
    cases = [
        # Metadata v1 topic array of 2^31-1 entries, none present.
        frame(header_v1(METADATA, 1) + struct.pack(">i", 0x7FFF_FFFF)),
        # A topic name claiming 32767 bytes, 1 present.
        frame(header_v1(METADATA, 1) + struct.pack(">i", 1) + struct.pack(">h", 32767) + b"a"),
        # Negative string length other than -1.
        frame(header_v1(METADATA, 1) + struct.pack(">i", 1) + struct.pack(">h", -7)),
        # Metadata v9 (flexible): compact array length 2^32-1 as a varint.
        frame(header_v1(METADATA, 9) + b"\x00" + uvarint(0xFFFF_FFFF) + b"\x00\x00\x00"),
        # Produce v3 whose records bytes claim 2 GiB.
        frame(
            header_v1(PRODUCE, 3)
            + struct.pack(">hhi", -1, -1, 1000)
            + struct.pack(">i", 1)
            + string(topic)
            + struct.pack(">iii", 1, 0, 0x7FFF_FFFF)
        ),
        # Produce v3 with a partition array of 2^31-1 entries.
        frame(
            header_v1(PRODUCE, 3)
            + struct.pack(">hhi", -1, -1, 1000)
            + struct.pack(">i", 1)
            + string(topic)
            + struct.pack(">i", 0x7FFF_FFFF)
        ),
        # Client id claiming 32767 bytes.
        frame(struct.pack(">hhih", API_VERSIONS, 0, CORRELATION_ID, 32767) + b"c"),
    ]
    for data in cases:
        for greet in (False, True):
            refused_or_answered(abused.bootstrap, data, greet=greet)


def test_random_frames(abused):
    rng = random.Random(7)
    api_keys = [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 18, 19, 20, 22, 32, 36, 37, 44, 60, 68]
    for i in range(300):
        size = rng.choice([0, 1, 7, 8, 12, 40, 200, 2000, 20_000])
        noise = rng.randbytes(size)
        if i % 3 == 0:
            payload = noise  # pure noise
        else:
            # A plausible header (known key, version around its range) then noise, so that
            # the body decoders see the bytes.
            key, version = rng.choice(api_keys), rng.randrange(-1, 16)
            payload = struct.pack(">hhi", key, version, CORRELATION_ID)
            payload += rng.choice([string(b"fuzz"), b"\xff\xff", b""]) + noise
        with connect(abused.bootstrap) as sock:
            if not send_quietly(sock, frame(payload)):
                continue
            try:
                body = read_response(sock)
            except AssertionError:
                # Noise may carry a correlation id other than ours; an answer is an answer.
                continue
            del body


# --------------------------------------------------------------------------------------
# Record batches


def produce_raw(server, records: bytes) -> int | None:
    """Produces a hand-made records field to a fresh topic; the partition's error code, or
    None when the server closed the connection instead."""
    topic = topic_for(server)
    response = refused_or_answered(server.bootstrap, produce_v3(topic, records), greet=True)
    return None if response is None else produce_error(response)


def test_valid_hand_made_batch_is_accepted(abused):
    # The reference point for the negative cases below: the builder itself is right.
    assert produce_raw(abused, batch(record(b"v"), 1)) == 0


def test_wrong_crc_is_corrupt_message(abused):
    good = batch(record(b"value"), 1)
    (crc,) = struct.unpack(">I", good[17:21])
    assert produce_raw(abused, batch(record(b"value"), 1, crc=crc ^ 1)) == CORRUPT_MESSAGE


@pytest.mark.parametrize("magic", [0, 1, 3, -1])
def test_wrong_magic_is_refused(abused, magic):
    error = produce_raw(abused, batch(record(b"value"), 1, magic=magic))
    assert error is None or error != 0, f"magic {magic} accepted"


def test_batch_length_beyond_frame_is_refused(abused):
    data = batch(record(b"value"), 1, batch_length=1 << 20)
    assert produce_raw(abused, data) in (None, CORRUPT_MESSAGE, INVALID_RECORD)
    # And shorter than its own header.
    data = batch(record(b"value"), 1, batch_length=20)
    assert produce_raw(abused, data) in (None, CORRUPT_MESSAGE, INVALID_RECORD)


def test_record_count_lies_are_refused(abused):
    for count in (2, 0, -1, 0x7FFF_FFFF):
        records = record(b"value")
        data = batch(records, 1)
        # Rewrite recordCount (CRC recomputed) so that only the count is wrong.
        after = data[21:57] + struct.pack(">i", count) + records
        fixed = data[:17] + struct.pack(">I", crc32c(after)) + after
        error = produce_raw(abused, fixed)
        assert error is None or error != 0, f"record count {count} accepted"


def test_control_batch_from_a_client_is_refused(abused):
    # A COMMIT marker: key (version 0, type 1), value (version 0, coordinator epoch 0).
    key = struct.pack(">hh", 0, 1)
    value = struct.pack(">hi", 0, 0)
    control = batch(record(value, key=key), 1, attributes=0x20 | 0x10)
    error = produce_raw(abused, control)
    assert error is None or error != 0, "a client wrote a control batch"


def test_decompression_bomb(abused):
    # One record whose value is 256 MiB of zeros, gzip-compressed to about 250 KiB. Kafka
    # accepts it (max.message.bytes bounds the compressed batch, and its validator streams
    # through the records without holding them); what the server must not do is inflate it
    # into memory, on produce or on the paths that decode batches (ListOffsets by time).
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    value_len = 256 << 20
    body_prefix = b"\x00" + varint(0) + varint(0) + varint(1) + b"k" + varint(value_len)
    body_len = len(body_prefix) + value_len + 1
    packed = compressor.compress(varint(body_len) + body_prefix)
    zeros = b"\x00" * (1 << 20)
    for _ in range(value_len >> 20):
        packed += compressor.compress(zeros)
    packed += compressor.compress(varint(0)) + compressor.flush()
    assert len(packed) < 512 * 1024
    bomb = batch(packed, 1, attributes=1)
    topic = topic_for(abused)
    before = abused.rss_bytes()
    response = refused_or_answered(abused.bootstrap, produce_v3(topic, bomb), greet=True)
    error = None if response is None else produce_error(response)
    print(f"decompression bomb ({len(packed)} bytes -> {value_len >> 20} MiB): error {error}")
    if error == 0:
        # Stored: the record-level paths must stay bounded too.
        consumer = reading_consumer(abused.bootstrap)
        try:
            found = consumer.offsets_for_times([TopicPartition(topic, 0, 1)], timeout=10)
            print(f"offsets_for_times on the bomb: {found}")
        finally:
            consumer.close()
    grown = abused.rss_bytes() - before
    assert grown < RSS_GROWTH_LIMIT, f"RSS grew by {grown >> 20} MiB on a decompression bomb"


@pytest.mark.parametrize("attributes", [0, 1], ids=["uncompressed", "gzip"])
def test_garbage_records_behind_a_valid_crc_are_refused(abused, attributes):
    # The CRC covers the payload, so it is right; the records inside are not records.
    payload = b"\xff" * 40 if attributes == 0 else b"\x1f\x8b\x08\x00garbage-not-deflate"
    error = produce_raw(abused, batch(payload, 1, attributes=attributes))
    # Produce decodes every record as Kafka's LogValidator does, so this is refused.
    assert error in (CORRUPT_MESSAGE, INVALID_RECORD), f"stored (error {error})"


# --------------------------------------------------------------------------------------
# Connections


def test_slow_loris_does_not_block_others(abused):
    data = api_versions_v0()
    with connect(abused.bootstrap) as slow:
        started = time.monotonic()
        # Half the frame, one byte at a time, while a normal client does its work.
        for byte in data[: len(data) // 2]:
            slow.sendall(bytes([byte]))
            time.sleep(0.05)
        produce_and_read_back(abused.bootstrap, count=20)
        for byte in data[len(data) // 2 :]:
            slow.sendall(bytes([byte]))
            time.sleep(0.05)
        assert read_response(slow) is not None, "the trickled request was still valid"
        print(f"slow client took {time.monotonic() - started:.1f} s")


def test_two_thousand_idle_connections(abused):
    wanted = 2000
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, wanted + 500), hard))
    server_limit = None
    for line in open(f"/proc/{abused.pid}/limits"):
        if line.startswith("Max open files"):
            server_limit = int(line.split()[3])
    if server_limit is not None and server_limit < wanted + 100:
        pytest.skip(f"the server's RLIMIT_NOFILE is {server_limit}; main must raise it")
    before = abused.rss_bytes()
    sockets = []
    try:
        for i in range(wanted):
            sockets.append(connect(abused.bootstrap))
            if i % 4 == 0:
                # Some of them half-way into a frame, the rest silent.
                sockets[-1].sendall(struct.pack(">i", 50))
        time.sleep(1)
        grown = abused.rss_bytes() - before
        print(f"{wanted} idle connections: RSS +{grown >> 20} MiB")
        assert grown < RSS_GROWTH_LIMIT
        produce_and_read_back(abused.bootstrap, count=20)
        # A few of them still work as connections.
        for sock in sockets[1:40:4]:
            sock.sendall(api_versions_v0())
            assert read_response(sock) is not None
    finally:
        for sock in sockets:
            sock.close()


def test_pipelining_flood_is_back_pressured(abused):
    # 100,000 requests sent without reading a single response: the server must stop reading
    # (its responses fill our receive buffer) rather than queue everything in memory.
    before = abused.rss_bytes()
    request = api_versions_v0()
    with connect(abused.bootstrap) as sock:
        sock.setblocking(False)
        sent = 0
        stalled_since = None
        deadline = time.monotonic() + 20
        data = request * 100_000
        while sent < len(data) and time.monotonic() < deadline:
            try:
                sent += sock.send(data[sent : sent + 65536])
                stalled_since = None
            except BlockingIOError:
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > 2:
                    break  # back-pressure: the server stopped reading
                time.sleep(0.01)
        grown = abused.rss_bytes() - before
        print(f"flood: sent {sent} of {len(data)} bytes, RSS +{grown >> 20} MiB")
        assert grown < RSS_GROWTH_LIMIT
