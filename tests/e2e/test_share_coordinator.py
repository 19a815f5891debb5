"""The share coordinator (KIP-932, issue #21) on the wire: the share-group state RPCs a
share-partition leader sends (InitializeShareGroupState, WriteShareGroupState,
ReadShareGroupState, ReadShareGroupStateSummary, DeleteShareGroupState) and FindCoordinator's
SHARE key, built by hand as Kafka's brokers send them (flexible versions, request header
v2), against a real single node and a real three-node cluster whose coordinator is killed
with SIGKILL; and their CLUSTER_ACTION authorization.

A share-partition's coordinator is the leader of `__share_group_state` partition
abs(hash("group:topicId:partition")) % partitions, with Java's String hash: the test
computes it and checks that FindCoordinator names that partition's leader.
"""

from __future__ import annotations

import base64
import socket
import struct
import time
import uuid

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from kafka_wire import read_exact
from test_acls import acl_server  # noqa: F401 (the fixture)

NONE = 0
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16
CLUSTER_AUTHORIZATION_FAILED = 31
INVALID_REQUEST = 42
FENCED_LEADER_EPOCH = 74
FENCED_STATE_EPOCH = 124
RETRIABLE = {COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR}

FIND_COORDINATOR, INITIALIZE, READ, WRITE, DELETE, SUMMARY = 10, 83, 84, 85, 86, 87
SHARE = 2
# RecordState's DeliveryState byte.
AVAILABLE, ACKNOWLEDGED, ARCHIVED = 0, 2, 4
STATE_PARTITIONS = 3
TIMEOUT_S = 10.0


# ---- the flexible wire format ----


def uvarint(n: int) -> bytes:
    out = b""
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out += bytes([byte | 0x80])
        else:
            return out + bytes([byte])


def cstring(s: str) -> bytes:
    raw = s.encode()
    return uvarint(len(raw) + 1) + raw


def carray(items: list[bytes]) -> bytes:
    return uvarint(len(items) + 1) + b"".join(items)


TAGS = b"\x00"


class Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return values if len(values) > 1 else values[0]

    def uvarint(self) -> int:
        shift = value = 0
        while True:
            byte = self.data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def cstring(self) -> str | None:
        n = self.uvarint() - 1
        if n < 0:
            return None
        s = self.data[self.pos:self.pos + n].decode()
        self.pos += n
        return s

    def uuid(self) -> bytes:
        u = self.data[self.pos:self.pos + 16]
        self.pos += 16
        return u

    def tags(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.pos += self.uvarint()

    def array(self, item) -> list:
        return [item(self) for _ in range(self.uvarint() - 1)]


def call(port: int, api_key: int, version: int, body: bytes) -> Reader:
    """One flexible request (header v2) on a fresh connection; the body of its answer."""
    client_id = b"share-coordinator-test"
    header = struct.pack(">hhih", api_key, version, 7, len(client_id)) + client_id + TAGS
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT_S) as sock:
        sock.settimeout(TIMEOUT_S)
        sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        (size,) = struct.unpack(">i", read_exact(sock, 4))
        payload = read_exact(sock, size)
    r = Reader(payload)
    assert r.take(">i") == 7
    r.tags()  # response header v1
    return r


# ---- the share-group state RPCs, one share-partition each ----


def partition_results(r: Reader, partition) -> list:
    def topic(t: Reader):
        t.uuid()
        parts = t.array(partition)
        t.tags()
        return parts

    results = [p for ps in r.array(topic) for p in ps]
    r.tags()
    return results


def error_only(p: Reader) -> int:
    _partition, error = p.take(">ih")
    p.cstring()
    p.tags()
    return error


def topic_entry(topic_id: bytes, partition_body: bytes) -> bytes:
    return carray([topic_id + carray([partition_body + TAGS]) + TAGS])


def initialize(port, group, topic_id, partition, state_epoch, start_offset) -> list[int]:
    body = cstring(group) + topic_entry(topic_id, struct.pack(">iiq", partition, state_epoch, start_offset)) + TAGS
    return partition_results(call(port, INITIALIZE, 0, body), error_only)


def write(port, group, topic_id, partition, state_epoch, leader_epoch, start_offset, batches) -> list[int]:
    wire_batches = carray([struct.pack(">qqbh", *b) + TAGS for b in batches])
    p = struct.pack(">iiiq", partition, state_epoch, leader_epoch, start_offset) + wire_batches
    body = cstring(group) + topic_entry(topic_id, p) + TAGS
    return partition_results(call(port, WRITE, 0, body), error_only)


def read(port, group, topic_id, partition, leader_epoch) -> list[tuple]:
    """[(error, state epoch, start offset, [(first, last, state, count)])]."""

    def answer(p: Reader):
        _partition, error = p.take(">ih")
        p.cstring()
        state_epoch, start_offset = p.take(">iq")

        def batch(b: Reader):
            values = b.take(">qqbh")
            b.tags()
            return values

        batches = p.array(batch)
        p.tags()
        return error, state_epoch, start_offset, batches

    body = cstring(group) + topic_entry(topic_id, struct.pack(">ii", partition, leader_epoch)) + TAGS
    return partition_results(call(port, READ, 0, body), answer)


def read_summary(port, group, topic_id, partition, leader_epoch) -> list[tuple]:
    """ReadShareGroupStateSummary v1: [(error, state epoch, leader epoch, start offset,
    delivery complete count)]."""

    def answer(p: Reader):
        _partition, error = p.take(">ih")
        p.cstring()
        values = p.take(">iiqi")
        p.tags()
        return (error, *values)

    body = cstring(group) + topic_entry(topic_id, struct.pack(">ii", partition, leader_epoch)) + TAGS
    return partition_results(call(port, SUMMARY, 1, body), answer)


def delete(port, group, topic_id, partition) -> list[int]:
    body = cstring(group) + topic_entry(topic_id, struct.pack(">i", partition)) + TAGS
    return partition_results(call(port, DELETE, 0, body), error_only)


def find_share_coordinator(port: int, key: str, version: int = 6) -> tuple[int, int]:
    """FindCoordinator (v6) for a SHARE key: (error, node id)."""
    body = struct.pack(">b", SHARE) + carray([cstring(key)]) + TAGS
    r = call(port, FIND_COORDINATOR, version, body)
    r.take(">i")  # throttle

    def coordinator(c: Reader):
        c.cstring()
        node_id = c.take(">i")
        c.cstring()
        _port, error = c.take(">ih")
        c.cstring()
        c.tags()
        return error, node_id

    (found,) = r.array(coordinator)
    return found


# ---- Kafka's placement of a share-partition ----


def kafka_uuid(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def java_hash(s: str) -> int:
    h = 0
    for unit in struct.unpack(f">{len(s.encode('utf-16-be')) // 2}H", s.encode("utf-16-be")):
        h = (31 * h + unit) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def state_partition(key: str, partitions: int) -> int:
    h = java_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def until(what, check, timeout_s: float = 30.0):
    """Calls `check` until it answers something other than None."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            answer = check()
        except OSError:
            answer = None
        if answer is not None:
            return answer
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def settled(errors_of):
    """`errors_of()`'s first answer that is not a coordinator still moving or loading."""

    def check():
        answer = errors_of()
        error = answer[0] if isinstance(answer[0], int) else answer[0][0]
        return None if error in RETRIABLE else answer

    return check


class SharePartition:
    def __init__(self) -> None:
        self.group = "sg-" + uuid.uuid4().hex[:8]
        self.topic_id = uuid.uuid4().bytes
        self.partition = 0
        self.key = f"{self.group}:{kafka_uuid(self.topic_id)}:{self.partition}"

    def args(self):
        return self.group, self.topic_id, self.partition


def state_leader(bootstrap: str, partition: int) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = admin.list_topics("__share_group_state", timeout=10).topics["__share_group_state"]
    assert topic.error is None, topic.error
    return topic.partitions[partition].leader


BATCHES = [(0, 9, ACKNOWLEDGED, 1), (10, 14, ARCHIVED, 5), (15, 19, AVAILABLE, 2)]


def write_and_check(port: int, sp: SharePartition) -> None:
    """Initialise, write, read back and be fenced at `port`, the share-partition's
    coordinator."""
    assert until("initialize", settled(lambda: initialize(port, *sp.args(), 1, 0))) == [NONE]
    assert write(port, *sp.args(), 1, 3, 0, BATCHES) == [NONE]
    # A write is answered once replicated: a read sees it at once.
    assert read(port, *sp.args(), 3) == [(NONE, 1, 0, BATCHES)]
    # An older leader epoch or state epoch is fenced, and leaves the state as it was.
    assert write(port, *sp.args(), 1, 2, 0, [(0, 19, AVAILABLE, 1)]) == [FENCED_LEADER_EPOCH]
    assert write(port, *sp.args(), 0, 3, 0, [(0, 19, AVAILABLE, 1)]) == [FENCED_STATE_EPOCH]
    assert read(port, *sp.args(), 2) == [(FENCED_LEADER_EPOCH, 0, -1, [])]
    # A newer leader moves the start offset past what was accepted; the batches after it
    # are kept.
    assert write(port, *sp.args(), 1, 4, 10, []) == [NONE]
    # The summary: a v0 write carries no delivery complete count, so Initialize's 0 stays.
    assert read_summary(port, *sp.args(), 4) == [(NONE, 1, 4, 10, 0)]


def test_single_node_share_state_round_trip(rill_factory):
    server = rill_factory({"share.coordinator.state.topic.num.partitions": str(STATE_PARTITIONS)})
    sp = SharePartition()
    error, node = until("a share coordinator", settled(lambda: find_share_coordinator(server.port, sp.key)))
    assert (error, node) == (NONE, 1)
    write_and_check(server.port, sp)
    assert read(server.port, *sp.args(), 4) == [(NONE, 1, 10, BATCHES[1:])]
    # FindCoordinator before v6 has no SHARE key, and a SHARE key is a share-partition's.
    assert find_share_coordinator(server.port, sp.key, version=5)[0] == INVALID_REQUEST
    assert find_share_coordinator(server.port, f"{sp.group}:not-a-topic:0") == (INVALID_REQUEST, -1)
    # Invalid share-partitions are refused, not stored.
    assert write(server.port, sp.group, bytes(16), 0, 1, 4, 0, []) == [INVALID_REQUEST]
    assert write(server.port, sp.group, sp.topic_id, 0, 1, 4, 0, [(5, 3, AVAILABLE, 1)]) == [INVALID_REQUEST]
    # Delete leaves nothing to read.
    assert delete(server.port, *sp.args()) == [NONE]
    assert read(server.port, *sp.args(), 4) == [(NONE, 0, -1, [])]
    # And the state outlives a restart of the node: written again, read after it.
    write_and_check(server.port, sp)
    server.restart()
    answer = until("a loaded coordinator", settled(lambda: read(server.port, *sp.args(), 4)))
    assert answer == [(NONE, 1, 10, BATCHES[1:])]


def test_pruned_state_reloads_the_same(rill_factory):
    """The prune job deletes the records no replay needs (a snapshot every two updates
    here, pruned every 300 ms); a restart loads what is left into the same state."""
    server = rill_factory({
        "share.coordinator.state.topic.num.partitions": str(STATE_PARTITIONS),
        "share.coordinator.snapshot.update.records.per.snapshot": "2",
        "share.coordinator.state.topic.prune.interval.ms": "300",
    })
    sp = SharePartition()
    port = server.port
    # FindCoordinator creates `__share_group_state`, as a share-partition leader's
    # persister does before its first call.
    assert until("a share coordinator", settled(lambda: find_share_coordinator(port, sp.key))) == (NONE, 1)
    assert until("initialize", settled(lambda: initialize(port, *sp.args(), 1, 0))) == [NONE]
    for i in range(10):
        batch = (10 * i, 10 * i + 9, ACKNOWLEDGED if i % 2 else ARCHIVED, 1)
        assert write(port, *sp.args(), 1, 1, 0, [batch]) == [NONE]
    want = read(port, *sp.args(), 1)
    assert want[0][0] == NONE and len(want[0][3]) == 10
    state = TopicPartition("__share_group_state", state_partition(sp.key, STATE_PARTITIONS))
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": "unused"})
    try:
        low = until("a pruned __share_group_state",
                    lambda: (lambda lo: lo if lo > 0 else None)(
                        consumer.get_watermark_offsets(state, timeout=5)[0]))
        high = consumer.get_watermark_offsets(state, timeout=5)[1]
    finally:
        consumer.close()
    # Initialize, then ten writes: the snapshots after them are kept, the rest pruned.
    assert 0 < low < high == 11
    server.restart()
    assert until("a loaded coordinator", settled(lambda: read(port, *sp.args(), 1))) == want


def test_cluster_share_state_survives_a_coordinator_kill9(rill_cluster_factory):
    cluster = rill_cluster_factory(3, {"share.coordinator.state.topic.num.partitions": str(STATE_PARTITIONS)})
    sp = SharePartition()
    ports = {node_id: node.port for node_id, node in cluster.nodes.items()}
    any_port = next(iter(ports.values()))
    error, coordinator = until(
        "a share coordinator", settled(lambda: find_share_coordinator(any_port, sp.key))
    )
    assert error == NONE
    # Kafka's placement: the leader of the share-partition's `__share_group_state` partition.
    assert coordinator == state_leader(cluster.bootstrap, state_partition(sp.key, STATE_PARTITIONS))
    # Every broker names the same coordinator, and the others refuse the share-partition.
    for node_id, port in ports.items():
        assert find_share_coordinator(port, sp.key) == (NONE, coordinator)
        if node_id != coordinator:
            assert write(port, *sp.args(), 1, 3, 0, BATCHES) == [NOT_COORDINATOR]
            assert read(port, *sp.args(), 3)[0][0] == NOT_COORDINATOR
    write_and_check(ports[coordinator], sp)

    cluster.node(coordinator).kill9()
    survivors = {n: p for n, p in ports.items() if n != coordinator}

    def moved():
        for port in survivors.values():
            error, node = find_share_coordinator(port, sp.key)
            if error == NONE and node in survivors:
                return node
        return None

    new = until("another share coordinator", moved)
    answer = until("the state on the new coordinator", settled(lambda: read(survivors[new], *sp.args(), 4)))
    assert answer == [(NONE, 1, 10, BATCHES[1:])]
    # The fencing is replicated too: the old leader epoch stays fenced.
    assert write(survivors[new], *sp.args(), 1, 3, 0, BATCHES) == [FENCED_LEADER_EPOCH]
    assert write(survivors[new], *sp.args(), 1, 5, 12, []) == [NONE]
    assert read(survivors[new], *sp.args(), 5) == [(NONE, 1, 12, [(12, 14, ARCHIVED, 5), (15, 19, AVAILABLE, 2)])]


def test_share_state_needs_cluster_action(acl_server):  # noqa: F811
    # ANONYMOUS (the PLAINTEXT listener) is no super user here: only admin is.
    s = acl_server({"super.users": "User:admin",
                    "share.coordinator.state.topic.num.partitions": str(STATE_PARTITIONS)})
    port = s.server.port
    sp = SharePartition()
    assert find_share_coordinator(port, sp.key) == (CLUSTER_AUTHORIZATION_FAILED, -1)
    assert initialize(port, *sp.args(), 1, 0) == [CLUSTER_AUTHORIZATION_FAILED]
    assert write(port, *sp.args(), 1, 3, 0, BATCHES) == [CLUSTER_AUTHORIZATION_FAILED]
    assert [r[0] for r in read(port, *sp.args(), 3)] == [CLUSTER_AUTHORIZATION_FAILED]
    assert [r[0] for r in read_summary(port, *sp.args(), 3)] == [CLUSTER_AUTHORIZATION_FAILED]
    assert delete(port, *sp.args()) == [CLUSTER_AUTHORIZATION_FAILED]
    # CLUSTER_ACTION on the cluster lets a broker's principal in.
    admin = AdminClient(s.sasl("admin"))
    for f in admin.create_acls([AclBinding(
            ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:ANONYMOUS",
            "*", AclOperation.CLUSTER_ACTION, AclPermissionType.ALLOW)]).values():
        f.result(timeout=15)
    error, node = until("an authorized FindCoordinator", settled(lambda: find_share_coordinator(port, sp.key)))
    assert (error, node) == (NONE, 1)
    assert until("initialize", settled(lambda: initialize(port, *sp.args(), 1, 0))) == [NONE]
    assert write(port, *sp.args(), 1, 3, 0, BATCHES) == [NONE]
    assert read(port, *sp.args(), 3) == [(NONE, 1, 0, BATCHES)]
