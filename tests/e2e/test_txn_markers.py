"""The partition side of transactions (issue #16), without the transaction coordinator:
transactional batches produced with a raw Produce request, COMMIT and ABORT markers
written with a hand-built WriteTxnMarkers v1 request (what the coordinator sends to a
partition leader), then read back by confluent-kafka and kafka-python consumers in
read_committed and read_uncommitted, before and after a kill -9 of the leader.

The log this builds in one partition (P1, P2, P3 are transactional producers):

    0-2  P1 "c1-0..2"   3-4  P2 "a2-0..1"   5-6  plain "p-0..1"   7  P1 "c1-3"
    8    P1 COMMIT      9    P2 ABORT       10-11 P3 "o3-0..1" (left open)   12 plain "p-2"

so the last stable offset is 10 until P3's transaction ends. On three nodes (RF 3,
`min.insync.replicas=2`) the followers copy the markers and build the same transaction
state, so that a new leader after a kill -9 of the old one serves the same answers.

A batch written the same way for a producer no coordinator knows is a hanging transaction
(KIP-664), which `rill transaction find-hanging` finds and `rill transaction abort` ends.

Every node runs with `transaction.partition.verification.enable=false`: with KIP-890's
verification on, a leader refuses a transactional batch its producer's coordinator does
not list, which is every batch here (test_txn_verification.py covers that).
"""

from __future__ import annotations

import socket
import struct
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTopicPartition
from kafka.record.default_records import DefaultRecordBatchBuilder

from kafka_helpers import admin, create_topic, unique_topic, wait_for, wait_for_leaders
from test_cluster import SETTLE_TIMEOUT_S, create_replicated_topic, leader_of

PRODUCE, WRITE_TXN_MARKERS, DESCRIBE_PRODUCERS = 0, 27, 61
P1, P2, P3 = 7_001, 7_002, 7_003
EPOCH = 0
COORDINATOR_EPOCH = 4

# The partition side alone: no coordinator knows these producers (see the module doc).
UNVERIFIED = {"transaction.partition.verification.enable": "false"}

# Kafka error codes.
NONE, UNKNOWN_TOPIC_OR_PARTITION, TRANSACTION_COORDINATOR_FENCED = 0, 3, 52


# --- a minimal wire client -------------------------------------------------------------


def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def compact_string(s: str) -> bytes:
    raw = s.encode()
    return uvarint(len(raw) + 1) + raw


def string(s: str | None) -> bytes:
    if s is None:
        return struct.pack(">h", -1)
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


class Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            b = self.data[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def compact_string(self) -> str | None:
        n = self.uvarint()
        if n == 0:
            return None
        raw = self.data[self.pos : self.pos + n - 1]
        self.pos += n - 1
        return raw.decode()

    def string(self) -> str:
        n = self.take(">h")
        raw = self.data[self.pos : self.pos + n]
        self.pos += n
        return raw.decode()

    def tagged_fields(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()


class Wire:
    """One connection; `call` sends a request and returns the response body."""

    def __init__(self, bootstrap: str):
        host, port = bootstrap.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=60)
        self.correlation_id = 0

    def call(self, api_key: int, version: int, body: bytes, flexible: bool) -> Reader:
        self.correlation_id += 1
        header = struct.pack(">hhi", api_key, version, self.correlation_id) + string("txnp-e2e")
        if flexible:
            header += b"\x00"
        frame = header + body
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        (size,) = struct.unpack(">i", self._exact(4))
        reader = Reader(self._exact(size))
        assert reader.take(">i") == self.correlation_id
        if flexible:
            reader.tagged_fields()
        return reader

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            assert chunk, "connection closed"
            buf += chunk
        return bytes(buf)

    def close(self) -> None:
        self.sock.close()


def batch(values: list[str], producer_id: int = -1, sequence: int = -1,
          timestamp_ms: int | None = None) -> bytes:
    transactional = producer_id >= 0
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=transactional,
        producer_id=producer_id,
        producer_epoch=EPOCH if transactional else -1,
        base_sequence=sequence,
        batch_size=1 << 20,
    )
    now = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    for i, value in enumerate(values):
        builder.append(i, timestamp=now, key=None, value=value.encode(), headers=[])
    return bytes(builder.build())


def produce(wire: Wire, topic: str, records: bytes, transactional_id: str | None) -> int:
    """Produce v3, acks=all; returns the base offset."""
    body = (
        string(transactional_id)
        + struct.pack(">hi", -1, 30_000)
        + struct.pack(">i", 1)
        + string(topic)
        + struct.pack(">i", 1)
        + struct.pack(">ii", 0, len(records))
        + records
    )
    r = wire.call(PRODUCE, 3, body, flexible=False)
    assert r.take(">i") == 1 and r.string() == topic and r.take(">i") == 1
    assert r.take(">i") == 0
    error = r.take(">h")
    base_offset = r.take(">q")
    assert error == NONE, f"produce error {error}"
    return base_offset


def write_txn_markers(wire: Wire, markers: list[tuple[int, bool, int, dict[str, list[int]]]]):
    """WriteTxnMarkers v1: (producer id, commit, coordinator epoch, {topic: partitions})
    each; returns {(producer id, topic, partition): error code}."""
    body = uvarint(len(markers) + 1)
    for producer_id, commit, coordinator_epoch, topics in markers:
        body += struct.pack(">qh?", producer_id, EPOCH, commit)
        body += uvarint(len(topics) + 1)
        for name, partitions in topics.items():
            body += compact_string(name) + uvarint(len(partitions) + 1)
            body += b"".join(struct.pack(">i", p) for p in partitions) + b"\x00"
        body += struct.pack(">i", coordinator_epoch) + b"\x00"
    body += b"\x00"
    r = wire.call(WRITE_TXN_MARKERS, 1, body, flexible=True)
    out = {}
    for _ in range(r.uvarint() - 1):
        producer_id = r.take(">q")
        for _ in range(r.uvarint() - 1):
            name = r.compact_string()
            for _ in range(r.uvarint() - 1):
                partition, error = r.take(">i"), r.take(">h")
                r.tagged_fields()
                out[(producer_id, name, partition)] = error
            r.tagged_fields()
        r.tagged_fields()
    return out


def describe_producers(wire: Wire, topic: str) -> dict[int, dict]:
    """DescribeProducers v0 of partition 0: {producer id: fields}."""
    body = uvarint(2) + compact_string(topic) + uvarint(2) + struct.pack(">i", 0) + b"\x00\x00"
    r = wire.call(DESCRIBE_PRODUCERS, 0, body, flexible=True)
    r.take(">i")  # throttle
    out = {}
    assert r.uvarint() == 2 and r.compact_string() == topic and r.uvarint() == 2
    assert r.take(">i") == 0
    error = r.take(">h")
    r.compact_string()
    assert error == NONE, f"describe producers error {error}"
    for _ in range(r.uvarint() - 1):
        producer_id = r.take(">q")
        out[producer_id] = {
            "epoch": r.take(">i"),
            "last_sequence": r.take(">i"),
            "last_timestamp": r.take(">q"),
            "coordinator_epoch": r.take(">i"),
            "txn_start": r.take(">q"),
        }
        r.tagged_fields()
    return out


# --- consumers -------------------------------------------------------------------------


def confluent_read(bootstrap: str, topic: str, isolation: str) -> tuple[list[str], int]:
    """Reads partition 0 from the start to its end as `isolation` sees it (librdkafka asks
    ListOffsets with the same isolation level: the end is the LSO for read_committed).
    Returns the values and that end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"txnp-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "auto.offset.reset": "error",
        }
    )
    try:
        tp = TopicPartition(topic, 0)
        _low, end = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        values: list[str] = []
        deadline = time.monotonic() + 60
        at_eof = False
        # Before the first record the position may still be invalid (negative).
        while not at_eof or max(consumer.position([tp])[0].offset, 0) < end:
            assert time.monotonic() < deadline, f"{isolation} read stuck at {values}, end {end}"
            for message in consumer.consume(num_messages=100, timeout=1.0):
                error = message.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, f"consumer error: {error}"
                    at_eof = True
                    continue
                at_eof = False
                values.append(message.value().decode())
        # Nothing more shows up past the end.
        for message in consumer.consume(num_messages=100, timeout=1.0):
            assert message.error() is not None, f"read past the end: {message.value()!r}"
        return values, end
    finally:
        consumer.close()


def kafka_python_read(bootstrap: str, topic: str, isolation: str, expected: int) -> list[str]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level=isolation,
        enable_auto_commit=False,
        group_id=None,
        request_timeout_ms=30_000,
    )
    try:
        tp = KpTopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        values: list[str] = []
        deadline = time.monotonic() + 60
        while len(values) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(r.value.decode() for r in records)
        # A little longer, to see that nothing past the expected records arrives.
        quiet_until = time.monotonic() + 1.5
        while time.monotonic() < quiet_until:
            for records in consumer.poll(timeout_ms=300).values():
                values.extend(r.value.decode() for r in records)
        return values
    finally:
        consumer.close()


# --- the scenario ----------------------------------------------------------------------

COMMITTED = ["c1-0", "c1-1", "c1-2", "p-0", "p-1", "c1-3"]
EVERYTHING = ["c1-0", "c1-1", "c1-2", "a2-0", "a2-1", "p-0", "p-1", "c1-3", "o3-0", "o3-1", "p-2"]


def build_log(wire: Wire, topic: str) -> None:
    # Metadata names a leader (with every replica in the ISR) as soon as the controller
    # created the topic, possibly before that node opened its log.
    wait_for(lambda: describe_producers(wire, topic) == {}, 30, f"{topic} to be led")
    assert produce(wire, topic, batch(["c1-0", "c1-1", "c1-2"], P1, 0), "t1") == 0
    assert produce(wire, topic, batch(["a2-0", "a2-1"], P2, 0), "t2") == 3
    assert produce(wire, topic, batch(["p-0", "p-1"]), None) == 5
    assert produce(wire, topic, batch(["c1-3"], P1, 3), "t1") == 7


def test_markers_decide_what_read_committed_consumers_see(rill_factory):
    rill = rill_factory(UNVERIFIED)
    topic = unique_topic("txn-markers")
    create_topic(rill.bootstrap, topic, 1)
    wire = Wire(rill.bootstrap)
    try:
        build_log(wire, topic)
        # Both transactions open: read_committed sees nothing, its end (the LSO) is 0.
        assert confluent_read(rill.bootstrap, topic, "read_committed") == ([], 0)
        assert confluent_read(rill.bootstrap, topic, "read_uncommitted")[0] == EVERYTHING[:8]

        errors = write_txn_markers(
            wire,
            [
                (P1, True, COORDINATOR_EPOCH, {topic: [0], "no-such-topic": [0]}),
                (P2, False, COORDINATOR_EPOCH, {topic: [0]}),
            ],
        )
        assert errors == {
            (P1, topic, 0): NONE,
            (P1, "no-such-topic", 0): UNKNOWN_TOPIC_OR_PARTITION,
            (P2, topic, 0): NONE,
        }
        assert produce(wire, topic, batch(["o3-0", "o3-1"], P3, 0), "t3") == 10
        assert produce(wire, topic, batch(["p-2"]), None) == 12

        assert confluent_read(rill.bootstrap, topic, "read_committed") == (COMMITTED, 10)
        assert confluent_read(rill.bootstrap, topic, "read_uncommitted") == (EVERYTHING, 13)
        assert kafka_python_read(rill.bootstrap, topic, "read_committed", 6) == COMMITTED
        assert kafka_python_read(rill.bootstrap, topic, "read_uncommitted", 11) == EVERYTHING

        # A marker from an older coordinator epoch is from a fenced coordinator.
        stale = write_txn_markers(wire, [(P1, True, COORDINATOR_EPOCH - 1, {topic: [0]})])
        assert stale == {(P1, topic, 0): TRANSACTION_COORDINATOR_FENCED}

        producers = describe_producers(wire, topic)
        assert producers[P1]["txn_start"] == -1 and producers[P2]["txn_start"] == -1
        assert producers[P1]["coordinator_epoch"] == COORDINATOR_EPOCH
        assert producers[P3]["txn_start"] == 10 and producers[P3]["last_sequence"] == 1
    finally:
        wire.close()


def test_kill_9_after_markers_keeps_lso_and_aborted_index(rill_factory):
    rill = rill_factory(UNVERIFIED)
    topic = unique_topic("txn-kill9")
    client = create_topic(rill.bootstrap, topic, 1)
    wire = Wire(rill.bootstrap)
    try:
        build_log(wire, topic)
        errors = write_txn_markers(
            wire,
            [
                (P1, True, COORDINATOR_EPOCH, {topic: [0]}),
                (P2, False, COORDINATOR_EPOCH, {topic: [0]}),
            ],
        )
        assert set(errors.values()) == {NONE}
        assert produce(wire, topic, batch(["o3-0", "o3-1"], P3, 0), "t3") == 10
        assert produce(wire, topic, batch(["p-2"]), None) == 12
    finally:
        wire.close()

    rill.kill9()
    rill.restart()
    wait_for_leaders(client, topic, 1)
    # Rebuilt from the log: P3 still open (the LSO stays at 10), P2's abort still known.
    wait_for(
        lambda: confluent_read(rill.bootstrap, topic, "read_committed") == (COMMITTED, 10),
        30,
        "read_committed to see the committed records after the restart",
    )
    assert confluent_read(rill.bootstrap, topic, "read_uncommitted") == (EVERYTHING, 13)
    wire = Wire(rill.bootstrap)
    try:
        assert describe_producers(wire, topic)[P3]["txn_start"] == 10
        # The coordinator's late ABORT for P3 releases the rest.
        assert write_txn_markers(wire, [(P3, False, COORDINATOR_EPOCH, {topic: [0]})]) == {
            (P3, topic, 0): NONE
        }
    finally:
        wire.close()
    assert confluent_read(rill.bootstrap, topic, "read_committed") == (COMMITTED + ["p-2"], 14)
    assert kafka_python_read(rill.bootstrap, topic, "read_committed", 7) == COMMITTED + ["p-2"]


def test_markers_replicate_and_a_new_leader_serves_the_same_answers(rill_cluster_factory):
    cluster = rill_cluster_factory(overrides=UNVERIFIED)
    topic = unique_topic("txn-cluster")
    client = create_replicated_topic(cluster.bootstrap, topic, 1, 3, {"min.insync.replicas": "2"})
    leader = leader_of(client, topic, 0)
    wire = Wire(cluster.node(leader).bootstrap)
    try:
        build_log(wire, topic)
        # Answered only once every in-sync replica has the markers (acks=all).
        errors = write_txn_markers(
            wire,
            [
                (P1, True, COORDINATOR_EPOCH, {topic: [0]}),
                (P2, False, COORDINATOR_EPOCH, {topic: [0]}),
            ],
        )
        assert set(errors.values()) == {NONE}
        assert produce(wire, topic, batch(["o3-0", "o3-1"], P3, 0), "t3") == 10
        assert produce(wire, topic, batch(["p-2"]), None) == 12
    finally:
        wire.close()
    assert confluent_read(cluster.bootstrap, topic, "read_committed") == (COMMITTED, 10)

    cluster.node(leader).kill9()
    survivors = ",".join(n.bootstrap for i, n in cluster.nodes.items() if i != leader)
    survivor_admin = admin(survivors)
    wait_for(
        lambda: leader_of(survivor_admin, topic, 0) not in (-1, leader),
        SETTLE_TIMEOUT_S,
        "a new leader",
    )
    wait_for(
        lambda: confluent_read(survivors, topic, "read_committed") == (COMMITTED, 10),
        SETTLE_TIMEOUT_S,
        "the new leader to serve read_committed as the old one did",
    )
    assert confluent_read(survivors, topic, "read_uncommitted") == (EVERYTHING, 13)
    new_leader = leader_of(survivor_admin, topic, 0)
    wire = Wire(cluster.node(new_leader).bootstrap)
    try:
        producers = describe_producers(wire, topic)
        assert producers[P3]["txn_start"] == 10
        assert producers[P2]["coordinator_epoch"] == COORDINATOR_EPOCH
        # The new leader takes the coordinator's COMMIT of P3 with two replicas in sync.
        assert write_txn_markers(wire, [(P3, True, COORDINATOR_EPOCH, {topic: [0]})]) == {
            (P3, topic, 0): NONE
        }
    finally:
        wire.close()
    assert confluent_read(survivors, topic, "read_committed") == (
        COMMITTED + ["o3-0", "o3-1", "p-2"],
        14,
    )


def test_a_hanging_transaction_is_found_and_aborted_by_the_cli(rill_factory):
    """A transactional batch no coordinator knows of (KIP-664's hanging transaction: here
    written by hand, with a create time an hour old): it holds the last stable offset back
    until `rill transaction find-hanging` names it and `rill transaction abort` ends it with
    an ABORT marker at the partition leader (verification off, as KIP-890 would refuse
    the batch)."""
    from test_transaction_coordinator import rill_cli_json

    rill = rill_factory(UNVERIFIED)

    topic = unique_topic("txn-hanging")
    create_topic(rill.bootstrap, topic, 1)
    hour_ago = int(time.time() * 1000) - 3_600_000
    wire = Wire(rill.bootstrap)
    try:
        wait_for(lambda: describe_producers(wire, topic) == {}, 30, f"{topic} to be led")
        assert produce(wire, topic, batch(["h-0", "h-1"], P1, 0, timestamp_ms=hour_ago), "lost") == 0
        assert produce(wire, topic, batch(["p-0"]), None) == 2
    finally:
        wire.close()
    # Stuck: the plain record behind the hanging transaction is not readable committed.
    assert confluent_read(rill.bootstrap, topic, "read_committed") == ([], 0)

    hanging = rill_cli_json(rill, "transaction", "find-hanging", "--topic", topic)
    assert [(h["partition"], h["producer_id"], h["current_txn_start_offset"]) for h in hanging] == [
        (0, P1, 0)
    ], hanging
    assert hanging[0]["producer_epoch"] == EPOCH and hanging[0]["last_timestamp"] == hour_ago
    # Younger than a 90-minute limit: not hanging by that measure.
    assert rill_cli_json(rill, "transaction", "find-hanging", "--topic", topic,
                         "--max-transaction-timeout", "90") == []
    # Any broker's partitions can be searched too.
    by_broker = rill_cli_json(rill, "transaction", "find-hanging", "--broker-id", "1")
    assert [h["topic"] for h in by_broker] == [topic], by_broker

    aborted = rill_cli_json(rill, "transaction", "abort", "--topic", topic, "--partition", "0",
                            "--start-offset", "0")
    assert aborted["aborted"]["producer_id"] == P1, aborted
    assert confluent_read(rill.bootstrap, topic, "read_committed") == (["p-0"], 4)
    assert confluent_read(rill.bootstrap, topic, "read_uncommitted") == (["h-0", "h-1", "p-0"], 4)
    assert rill_cli_json(rill, "transaction", "find-hanging", "--topic", topic) == []
    (producer,) = rill_cli_json(rill, "transaction", "describe-producers", "--topic", topic,
                                "--partition", "0")
    assert (producer["producer_id"], producer["current_txn_start_offset"]) == (P1, -1)
    # Nothing left to abort at that offset.
    from rill_harness import rill_binary
    import subprocess
    again = subprocess.run([str(rill_binary()), "transaction", "abort", "--topic", topic,
                            "--partition", "0", "--start-offset", "0", "-b", rill.bootstrap],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "no open transaction" in again.stderr, again
