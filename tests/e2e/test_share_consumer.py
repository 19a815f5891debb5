"""Share groups end to end (KIP-932, issue #21) with confluent-kafka's `ShareConsumer`
(librdkafka's share consumer): consumers that split one partition, a consumer killed with
SIGKILL whose records go to the others once their locks expire, REJECT, RELEASE and the
delivery limit, and a partition leader killed with SIGKILL under a three-node cluster —
with no record accepted (its acknowledgement answered) ever delivered again.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from kafka_wire import read_exact
from rill_harness import rill_binary
from test_share_coordinator import TAGS, Reader, carray, cstring

# A short lock, so that redelivery after a consumer's death takes seconds.
LOCK_MS = 3000
SHARE_OVERRIDES = {
    "share.coordinator.state.topic.num.partitions": "3",
    "group.share.min.record.lock.duration.ms": "1000",
    "group.share.record.lock.duration.ms": str(LOCK_MS),
    "group.share.min.heartbeat.interval.ms": "500",
    "group.share.heartbeat.interval.ms": "500",
}


def create_topic(bootstrap: str, topic: str, partitions: int = 1, rf: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, rf)])[topic].result(30)


def start_at_earliest(bootstrap: str, group: str) -> None:
    """`share.auto.offset.reset=earliest` for the group (a GROUP config), so that it reads
    what was produced before it joined."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    resource = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest",
                        incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(30)


def produce(bootstrap: str, topic: str, count: int, partition: int = 0) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    for i in range(count):
        producer.produce(topic, str(i).encode(), partition=partition)
        if i % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def describe_group(bootstrap: str, group: str) -> dict:
    out = subprocess.run(
        [str(rill_binary()), "group", "describe", group, "-b", bootstrap, "--output", "json"],
        capture_output=True, text=True, timeout=30, check=True,
    )
    [described] = json.loads(out.stdout)
    return described


def wait_for_members(bootstrap: str, group: str, want: int, timeout: float = 60) -> None:
    """Until `want` members have each been given an assignment at the group's current
    assignment epoch (their heartbeat carried it to them)."""
    deadline = time.monotonic() + timeout
    described: dict = {}
    while time.monotonic() < deadline:
        try:
            described = describe_group(bootstrap, group)
        except subprocess.CalledProcessError:
            described = {}  # the group does not exist until its first member's heartbeat
        members = described.get("members", [])
        if len(members) == want and all(
            m["assignment"] and m["member_epoch"] == described["assignment_epoch"]
            for m in members
        ):
            return
        time.sleep(0.2)
    raise AssertionError(f"{want} members never held their assignment: {described}")


def share_consumer(bootstrap: str, group: str, topic: str, **extra) -> ShareConsumer:
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, **extra})
    c.subscribe([topic])
    return c


def test_four_share_consumers_split_one_partition(rill_factory):
    """Four share consumers on a one-partition topic split 100,000 records, each record
    delivered once and accepted once (implicit acknowledgement)."""
    server = rill_factory(SHARE_OVERRIDES)
    topic, group, total = "queue", "workers", 100_000
    create_topic(server.bootstrap, topic)
    start_at_earliest(server.bootstrap, group)

    seen: list[list[tuple[int, int]]] = [[] for _ in range(4)]
    lock = threading.Lock()
    count = [0]
    done = threading.Event()
    errors: list[str] = []

    def work(i: int) -> None:
        try:
            consume(i)
        except BaseException as e:  # noqa: BLE001 (reported by the test's thread)
            errors.append(repr(e))

    def consume(i: int) -> None:
        c = share_consumer(server.bootstrap, group, topic)
        try:
            deadline = time.monotonic() + 240
            while not done.is_set() and time.monotonic() < deadline:
                for m in c.poll(0.5):
                    if m.error():
                        errors.append(str(m.error()))
                        continue
                    seen[i].append((int(m.value()), m.delivery_count()))
                    with lock:
                        count[0] += 1
                        if count[0] >= total:
                            done.set()
            # Accepts what the last poll returned before leaving.
            c.commit_sync(30)
        finally:
            c.close()

    started = time.monotonic()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    # The records go in once every member holds the partition: produced before, they all
    # went to whichever consumer's assignment reached it first (one drains 100,000 records
    # in about a second, less than a heartbeat interval apart from the next).
    wait_for_members(server.bootstrap, group, 4)
    produce(server.bootstrap, topic, total)
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    values = [v for per in seen for v, _ in per]
    print(f"4 share consumers: {len(values)} records in {elapsed:.1f}s; per consumer "
          f"{[len(per) for per in seen]}")
    assert not errors, errors[:5]
    assert sorted(values) == list(range(total)), "every record delivered exactly once"
    assert all(dc == 1 for per in seen for _, dc in per), "no record was redelivered"
    assert sum(1 for per in seen if per) >= 2, "the partition was shared"
    # `rill group describe` shows where the group stands: everything delivered for good.
    described = describe_group(server.bootstrap, group)
    assert described["type"] == "share"
    assert described["offsets"] == [
        {"topic": topic, "partition": 0, "start_offset": total, "lag": 0}
    ]


CHILD = textwrap.dedent("""
    import json, sys
    from confluent_kafka import ShareConsumer
    bootstrap, group, topic, want = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                       "share.acknowledgement.mode": "explicit"})
    c.subscribe([topic])
    got = []
    while len(got) < want:
        got += [m.offset() for m in c.poll(1.0) if not m.error()]
    print(json.dumps(got), flush=True)
    sys.stdin.read()  # holds its records, unacknowledged, until killed
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_records_of_a_dead_consumer_go_to_another(rill_factory, sig):
    """A consumer killed with SIGKILL closes its connection: its share session ends and its
    records go to the others at once (Kafka 4.1's ShareSessionCache does the same). One
    frozen with SIGSTOP keeps its connection: its records go to the others when their
    acquisition locks expire, on their second delivery; a session's end gives them back
    as a member's leaving does, with the delivery count of before (Kafka 4.1 counts them
    as fetched, not delivered)."""
    redelivery_count = 1 if sig == signal.SIGKILL else 2
    server = rill_factory(SHARE_OVERRIDES)
    topic, group = "jobs", f"redelivery-{sig.name}"
    create_topic(server.bootstrap, topic)
    start_at_earliest(server.bootstrap, group)
    produce(server.bootstrap, topic, 100)

    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, server.bootstrap, group, topic, "1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        held = json.loads(child.stdout.readline())
        assert held, "the doomed consumer acquired records"
        os.kill(child.pid, sig)
        stopped = time.monotonic()

        c = share_consumer(server.bootstrap, group, topic, **{"share.acknowledgement.mode": "explicit"})
        redelivered: dict[int, float] = {}
        others: set[int] = set()
        try:
            deadline = time.monotonic() + 60
            while (len(redelivered) < len(held) or len(others) + len(redelivered) < 100) \
                    and time.monotonic() < deadline:
                for m in c.poll(0.2):
                    assert m.error() is None, m.error()
                    if m.offset() in held:
                        assert m.delivery_count() == redelivery_count, (m.offset(), m.delivery_count())
                        redelivered.setdefault(m.offset(), time.monotonic() - stopped)
                    else:
                        assert m.delivery_count() == 1
                        others.add(m.offset())
                    c.acknowledge(m)
                c.commit_sync(30)
        finally:
            c.close()
    finally:
        child.kill()
        child.wait()
    latency = max(redelivered.values(), default=float("nan"))
    print(f"redelivery after SIG{sig.name[3:]}: {latency:.2f}s (lock {LOCK_MS} ms)")
    assert sorted(redelivered) == sorted(held)
    assert others | set(redelivered) == set(range(100))
    if sig == signal.SIGKILL:
        # Released when the connection closed, long before the lock would have expired.
        assert latency < LOCK_MS / 1000 * 0.5
    else:
        # Held until the lock expired: the frozen consumer still owned them.
        assert latency >= LOCK_MS / 1000 * 0.8


def test_reject_release_and_the_delivery_limit(rill_factory):
    server = rill_factory({**SHARE_OVERRIDES, "group.share.delivery.count.limit": "3"})
    topic, group = "tasks", "acks"
    create_topic(server.bootstrap, topic)
    start_at_earliest(server.bootstrap, group)
    produce(server.bootstrap, topic, 10)
    c = share_consumer(server.bootstrap, group, topic, **{"share.acknowledgement.mode": "explicit"})
    deliveries: dict[int, list[int]] = {}
    try:
        deadline = time.monotonic() + 60
        quiet_since = None
        while time.monotonic() < deadline:
            msgs = [m for m in c.poll(0.5) if m.error() is None]
            for m in msgs:
                deliveries.setdefault(m.offset(), []).append(m.delivery_count())
                if m.offset() == 0:
                    c.acknowledge(m, AcknowledgeType.REJECT)
                elif m.offset() in (1, 2):
                    # 1 is released once and then accepted; 2 always, until the limit.
                    once = m.offset() == 1 and len(deliveries[1]) > 1
                    c.acknowledge(m, AcknowledgeType.ACCEPT if once else AcknowledgeType.RELEASE)
                else:
                    c.acknowledge(m, AcknowledgeType.ACCEPT)
            if msgs:
                c.commit_sync(30)
                quiet_since = None
            elif len(deliveries) == 10:
                quiet_since = quiet_since or time.monotonic()
                if time.monotonic() - quiet_since > 2:
                    break
    finally:
        c.close()
    assert deliveries[0] == [1], "a rejected record is never redelivered"
    assert deliveries[1] == [1, 2], "a released record is redelivered"
    assert deliveries[2] == [1, 2, 3], "released up to the limit, then archived"
    assert all(deliveries[o] == [1] for o in range(3, 10))


def test_share_consumers_across_a_leader_kill9(rill_cluster_factory):
    """Three nodes, the topic replicated three ways; the partition's leader is killed with
    SIGKILL while two share consumers work. Every tenth record is rejected, every tenth
    from the fifth released on its first delivery and accepted on a later one, the rest
    accepted. Every record's fate is settled in the end, and none whose acceptance or
    rejection the broker confirmed is delivered again; every released one comes back."""
    cluster = rill_cluster_factory(3, {
        **SHARE_OVERRIDES,
        "share.coordinator.state.topic.replication.factor": "3",
    })
    bootstrap = cluster.bootstrap
    topic, group, total = "orders", "survivors", 20_000
    create_topic(bootstrap, topic, 1, 3)
    start_at_earliest(bootstrap, group)
    produce(bootstrap, topic, total)

    confirmed: set[int] = set()
    released_confirmed: set[int] = set()
    redelivered_after_confirm: list[int] = []
    lock = threading.Lock()
    stop = threading.Event()
    failures: list[BaseException] = []

    def fate(m) -> AcknowledgeType:
        if m.offset() % 10 == 0:
            return AcknowledgeType.REJECT
        if m.offset() % 10 == 5 and m.offset() not in released_confirmed:
            return AcknowledgeType.RELEASE
        return AcknowledgeType.ACCEPT

    def work() -> None:
        try:
            consume()
        except BaseException as e:  # noqa: BLE001 (reported by the test's thread)
            failures.append(e)

    def consume() -> None:
        c = share_consumer(bootstrap, group, topic, **{"share.acknowledgement.mode": "explicit"})
        try:
            deadline = time.monotonic() + 180
            while not stop.is_set() and time.monotonic() < deadline:
                msgs = [m for m in c.poll(0.5) if m.error() is None]
                if not msgs:
                    continue
                # Work that takes time, so that the kill comes in the middle of it.
                time.sleep(0.2)
                with lock:
                    redelivered_after_confirm.extend(
                        m.offset() for m in msgs if m.offset() in confirmed)
                    fates = [(m, fate(m)) for m in msgs]
                for m, ty in fates:
                    c.acknowledge(m, ty)
                try:
                    results = c.commit_sync(30)
                except Exception:  # noqa: BLE001 (a failed commit confirms nothing)
                    continue
                if all(err is None for err in results.values()):
                    with lock:
                        for m, ty in fates:
                            if ty == AcknowledgeType.RELEASE:
                                released_confirmed.add(m.offset())
                            else:
                                confirmed.add(m.offset())
                        if len(confirmed) >= total:
                            stop.set()
        finally:
            c.close()

    threads = [threading.Thread(target=work) for _ in range(2)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while len(confirmed) < total // 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    leader = partition_leader(bootstrap, topic)
    cluster.node(leader).kill9()
    with lock:
        before_kill = len(confirmed)
    print(f"killed the leader, node {leader}, with {before_kill} of {total} settled")
    assert total // 4 <= before_kill < total
    for t in threads:
        t.join()
    assert not failures, failures
    assert not redelivered_after_confirm, redelivered_after_confirm[:10]
    assert confirmed == set(range(total))
    # A released record came back (and was accepted then), across the kill too.
    assert released_confirmed == {o for o in range(total) if o % 10 == 5}


def partition_leader(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(topic, timeout=10)
    return md.topics[topic].partitions[0].leader


# ---- share sessions on the wire (ShareFetch v1, ShareAcknowledge v1) ----

SHARE_FETCH, SHARE_ACKNOWLEDGE = 78, 79
INVALID_REQUEST, INVALID_RECORD_STATE = 42, 121
SHARE_SESSION_NOT_FOUND, INVALID_SHARE_SESSION_EPOCH = 122, 123
ACCEPT, RELEASE = 1, 2


def topic_id_of(bootstrap: str, topic: str) -> bytes:
    from confluent_kafka import TopicCollection

    admin = AdminClient({"bootstrap.servers": bootstrap})
    desc = admin.describe_topics(TopicCollection([topic]))[topic].result(30)
    tid = desc.topic_id
    return struct.pack(">qq", tid.get_most_significant_bits(), tid.get_least_significant_bits())


def ack_batches(acks) -> bytes:
    return carray([struct.pack(">qq", first, last) + carray([struct.pack(">b", t) for t in types]) + TAGS
                   for first, last, types in acks])


class Connection:
    """One connection for a whole share session: the session ends with its connection."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.correlation_id = 0

    def call(self, api_key: int, version: int, body: bytes) -> Reader:
        self.correlation_id += 1
        client_id = b"share-session-test"
        header = struct.pack(">hhih", api_key, version, self.correlation_id, len(client_id))
        header += client_id + TAGS
        self.sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        (size,) = struct.unpack(">i", read_exact(self.sock, 4))
        r = Reader(read_exact(self.sock, size))
        assert r.take(">i") == self.correlation_id
        r.tags()
        return r

    def close(self) -> None:
        self.sock.close()


def topic_partitions(r, partition) -> list:
    """The partitions of a ShareFetch or ShareAcknowledge response's topics (the node
    endpoints after them are left unread)."""

    def topic(t):
        t.uuid()
        parts = t.array(partition)
        t.tags()
        return parts

    return [p for ps in r.array(topic) for p in ps]


def share_fetch(conn, group, member, epoch, topic_id, acks=(), fetch=True, wait_ms=500):
    partitions = [struct.pack(">i", 0) + ack_batches(acks) + TAGS] if fetch or acks else []
    topics = [topic_id + carray(partitions) + TAGS] if partitions else []
    body = (cstring(group) + cstring(member)
            + struct.pack(">iiiiii", epoch, wait_ms, 1, 1 << 20, 500, 500)
            + carray(topics) + carray([]) + TAGS)
    r = conn.call(SHARE_FETCH, 1, body)
    _throttle, error = r.take(">ih")
    r.cstring()
    lock_ms = r.take(">i")

    def partition(p):
        index, err = p.take(">ih")
        p.cstring()
        ack_err = p.take(">h")
        p.cstring()
        p.take(">ii")
        p.tags()
        records = p.uvarint() - 1  # the records' length, skipped
        p.pos += records
        acquired = p.array(lambda a: (a.take(">qqh"), a.tags())[0])
        p.tags()
        return index, err, ack_err, acquired

    return error, lock_ms, topic_partitions(r, partition)


def share_acknowledge(conn, group, member, epoch, topic_id, acks):
    body = (cstring(group) + cstring(member) + struct.pack(">i", epoch)
            + carray([topic_id + carray([struct.pack(">i", 0) + ack_batches(acks) + TAGS]) + TAGS])
            + TAGS)
    r = conn.call(SHARE_ACKNOWLEDGE, 1, body)
    _throttle, error = r.take(">ih")
    r.cstring()
    if error:
        return error, []

    def partition(p):
        index, err = p.take(">ih")
        p.cstring()
        p.take(">ii")
        p.tags()
        p.tags()
        return index, err

    return error, topic_partitions(r, partition)


def test_share_sessions_on_the_wire(rill_factory):
    server = rill_factory(SHARE_OVERRIDES)
    group, member = "wire", "member-1"
    create_topic(server.bootstrap, "wire")
    start_at_earliest(server.bootstrap, group)
    produce(server.bootstrap, "wire", 10)
    tid = topic_id_of(server.bootstrap, "wire")
    port = Connection(server.port)

    # No session yet; a session cannot be opened with acknowledgements.
    assert share_fetch(port, group, member, 3, tid)[0] == SHARE_SESSION_NOT_FOUND
    assert share_fetch(port, group, member, 0, tid, acks=[(0, 0, [ACCEPT])])[0] == INVALID_REQUEST
    # Opened: the records are acquired (the share-partition may still be loading).
    error, lock_ms, parts = share_fetch(port, group, member, 0, tid, wait_ms=5000)
    assert (error, lock_ms) == (0, LOCK_MS)
    assert parts == [(0, 0, 0, [(0, 9, 1)])]
    # The next epoch is 1; ShareAcknowledge cannot open a session.
    assert share_fetch(port, group, member, 2, tid)[0] == INVALID_SHARE_SESSION_EPOCH
    assert share_acknowledge(port, group, member, 0, tid, [(0, 0, [ACCEPT])])[0] == INVALID_SHARE_SESSION_EPOCH
    # Acknowledging what another member holds, or an unknown type, fails per partition.
    assert share_acknowledge(port, group, "member-2", 1, tid, [(0, 0, [ACCEPT])])[0] == SHARE_SESSION_NOT_FOUND
    assert share_acknowledge(port, group, member, 1, tid, [(0, 0, [9])]) == (0, [(0, INVALID_REQUEST)])
    assert share_acknowledge(port, group, member, 2, tid, [(0, 4, [ACCEPT])]) == (0, [(0, 0)])
    # 5 released: AVAILABLE, no longer held, so acknowledging it again is refused.
    assert share_acknowledge(port, group, member, 3, tid, [(5, 5, [RELEASE])]) == (0, [(0, 0)])
    assert share_acknowledge(port, group, member, 4, tid, [(5, 5, [ACCEPT])]) == (0, [(0, INVALID_RECORD_STATE)])
    # Closing (epoch -1) gives the rest back at once, as never delivered (Kafka 4.1's
    # count on a member's leaving): another member gets 5 on its second delivery, 6-9
    # on their first; 0-4 were accepted and never come back.
    assert share_fetch(port, group, member, -1, tid, fetch=False)[0] == 0
    assert share_fetch(port, group, member, 5, tid)[0] == SHARE_SESSION_NOT_FOUND
    error, _, parts = share_fetch(port, group, "member-2", 0, tid)
    assert (error, parts) == (0, [(0, 0, 0, [(5, 5, 2), (6, 9, 1)])])
    # The session ends with its connection: member-2's records come back at once too.
    port.close()
    # The server learns of the close on its next read of the socket: at once, but not
    # before this test's next request on another connection can arrive.
    time.sleep(1)
    other = Connection(server.port)
    assert share_fetch(other, group, "member-2", 1, tid)[0] == SHARE_SESSION_NOT_FOUND
    deadline = time.monotonic() + 10
    while True:
        error, _, parts = share_fetch(other, group, "member-3", 0, tid, wait_ms=1000)
        if parts and parts[0][3] or time.monotonic() > deadline:
            break
        share_fetch(other, group, "member-3", -1, tid, fetch=False)
    assert (error, parts) == (0, [(0, 0, 0, [(5, 5, 2), (6, 9, 1)])])
    other.close()
