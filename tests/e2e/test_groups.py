"""Consumer groups against the real broker: confluent-kafka and kafka-python members join,
rebalance on leave and on a killed member, commit offsets that survive a broker restart,
and the admin API lists, describes and deletes groups."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
from kafka_helpers import create_topic, unique_topic, wait_for

PARTITIONS = 6
PER_PARTITION = 100
SESSION_TIMEOUT_MS = 6000


def produce_keyed(bootstrap: str, topic: str) -> set[tuple[int, int]]:
    """Writes PER_PARTITION records to every partition; returns every (partition, offset)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    delivered = set()
    errors = []

    def report(error, message):
        if error is not None:
            errors.append(error)
        else:
            delivered.add((message.partition(), message.offset()))

    for p in range(PARTITIONS):
        for i in range(PER_PARTITION):
            producer.produce(topic, key=f"k{i}", value=f"v{p}-{i}", partition=p, on_delivery=report)
    assert producer.flush(60) == 0
    assert errors == []
    assert len(delivered) == PARTITIONS * PER_PARTITION
    return delivered


class Member:
    """A confluent-kafka group member polling on its own thread."""

    def __init__(self, bootstrap: str, group: str, topic: str, assignor: str, **extra):
        config = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "partition.assignment.strategy": assignor,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": 500,
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 200,
        }
        config.update(extra)
        self.consumer = Consumer(config)
        self.consumer.subscribe([topic])
        self.seen: set[tuple[int, int]] = set()
        self.errors: list = []
        self.lock = threading.Lock()
        self.assigned: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            message = self.consumer.poll(0.1)
            with self.lock:
                self.assigned = {tp.partition for tp in self.consumer.assignment()}
            if message is None:
                continue
            if message.error():
                self.errors.append(message.error())
                continue
            with self.lock:
                self.seen.add((message.partition(), message.offset()))
        self.consumer.close()

    def assignment(self) -> set[int]:
        with self.lock:
            return set(self.assigned)

    def close(self):
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "consumer did not close"


class RebalanceStory(logging.Handler):
    """Keeps kafka-python's rebalance and metadata events (not its per-poll chatter) so a
    failure on a loaded machine can say what the client saw and when."""

    KEEP = ("JoinGroup", "SyncGroup", "Heartbeat", "Updated metadata", "No partition metadata",
            "assignment_snapshot !=", "joined_subscription !=", "LeaveGroup", "Performing assignment",
            "Discovered coordinator", "Error", "failed")

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.started = time.monotonic()

    def emit(self, record):
        if record.name.startswith(("kafka.protocol", "kafka.net")):
            return  # the same requests again, as bytes on the wire
        message = record.getMessage()
        routine = ("Heartbeat success", "Sending HeartbeatRequest", "error_code=0)")
        if any(r in message for r in routine):
            return
        if any(k in message for k in self.KEEP) and len(self.lines) < 400:
            at = time.monotonic() - self.started
            self.lines.append(f"{at:7.3f} {record.name} {message[:300]}")

    @contextlib.contextmanager
    def attached(self):
        logger = logging.getLogger("kafka")
        level = logger.level
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self)
        try:
            yield self
        except AssertionError as error:
            story = "\n".join(self.lines)
            raise AssertionError(f"{error}\nkafka-python's story:\n{story}") from None
        finally:
            logger.removeHandler(self)
            logger.setLevel(level)


def settled(members, sizes) -> bool:
    """True when the members' assignments are disjoint, cover every partition, and have
    the expected sizes."""
    assignments = [m.assignment() for m in members]
    union = set().union(*assignments)
    disjoint = sum(len(a) for a in assignments) == len(union)
    return disjoint and union == set(range(PARTITIONS)) and sorted(map(len, assignments)) == sizes


@pytest.mark.parametrize("assignor", ["range", "roundrobin", "cooperative-sticky"])
def test_three_members_share_then_rebalance_on_leave(rill, assignor):
    topic = unique_topic(f"group-{assignor}")
    create_topic(rill.bootstrap, topic, PARTITIONS)
    produced = produce_keyed(rill.bootstrap, topic)
    group = f"g-{uuid.uuid4().hex[:8]}"
    members = [Member(rill.bootstrap, group, topic, assignor) for _ in range(3)]
    try:
        wait_for(lambda: settled(members, [2, 2, 2]), 60, f"{assignor}: a 2/2/2 assignment")
        leaving = members.pop()
        started = time.monotonic()
        leaving.close()
        wait_for(lambda: settled(members, [3, 3]), 60, f"{assignor}: a 3/3 assignment after a leave")
        print(f"\n{assignor}: clean leave to stable 3/3 in {time.monotonic() - started:.2f} s")
        everyone = members + [leaving]

        def all_read():
            seen = set()
            for m in everyone:
                with m.lock:
                    seen |= m.seen
            return seen >= produced

        wait_for(all_read, 60, "every record to be read by the group")
        for m in everyone:
            assert m.errors == [], m.errors
    finally:
        for m in members:
            m.close()


KILLABLE_MEMBER = r"""
import sys
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "partition.assignment.strategy": "range", "auto.offset.reset": "earliest",
              "session.timeout.ms": int(sys.argv[4]), "heartbeat.interval.ms": 500})
c.subscribe([sys.argv[3]])
while True:
    m = c.poll(0.2)
    if c.assignment():
        print("assigned", flush=True)
"""


def test_killed_member_is_evicted_after_session_timeout(rill):
    topic = unique_topic("group-kill")
    create_topic(rill.bootstrap, topic, PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    members = [Member(rill.bootstrap, group, topic, "range") for _ in range(2)]
    victim = subprocess.Popen(
        [sys.executable, "-c", KILLABLE_MEMBER, rill.bootstrap, group, topic, str(SESSION_TIMEOUT_MS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        # Two of three members hold four partitions: the third (the victim) holds two.
        wait_for(
            lambda: len(members[0].assignment() | members[1].assignment()) == 4
            and not (members[0].assignment() & members[1].assignment()),
            60,
            "the victim to hold two partitions",
        )
        os.killpg(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: settled(members, [3, 3]), 60, "the survivors to take every partition")
        elapsed = time.monotonic() - killed
        print(f"\nkill -9 to stable 3/3 in {elapsed:.2f} s (session.timeout.ms={SESSION_TIMEOUT_MS})")
        # Not before the session timeout could have expired, and not long after it.
        assert elapsed >= SESSION_TIMEOUT_MS / 1000 - 1
        assert elapsed < SESSION_TIMEOUT_MS / 1000 + 20
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        for m in members:
            m.close()


def test_committed_offsets_survive_a_broker_restart(rill):
    topic = unique_topic("group-commit")
    create_topic(rill.bootstrap, topic, PARTITIONS)
    produce_keyed(rill.bootstrap, topic)
    group = f"g-{uuid.uuid4().hex[:8]}"
    config = {
        "bootstrap.servers": rill.bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    first = Consumer(config)
    first.subscribe([topic])
    consumed = 0
    deadline = time.monotonic() + 60
    while consumed < 300 and time.monotonic() < deadline:
        message = first.poll(0.5)
        if message is not None and not message.error():
            consumed += 1
    assert consumed == 300
    committed = first.commit(asynchronous=False)
    expected = {tp.partition: tp.offset for tp in committed if tp.offset >= 0}
    assert sum(expected.values()) == 300
    first.close()

    rill.restart()

    from confluent_kafka.admin import AdminClient

    client = AdminClient({"bootstrap.servers": rill.bootstrap})
    listed = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    offsets = listed[group].result(timeout=30)
    assert {tp.partition: tp.offset for tp in offsets.topic_partitions if tp.topic == topic} == expected

    second = Consumer(config)
    second.subscribe([topic])
    firsts: dict[int, int] = {}
    remaining = PARTITIONS * PER_PARTITION - 300
    got = 0
    deadline = time.monotonic() + 60
    while got < remaining and time.monotonic() < deadline:
        message = second.poll(0.5)
        if message is None or message.error():
            continue
        firsts.setdefault(message.partition(), message.offset())
        got += 1
    second.close()
    assert got == remaining, "the new member did not read exactly what was left"
    for partition, offset in firsts.items():
        assert offset == expected.get(partition, 0), f"partition {partition} resumed at {offset}"


def test_kafka_python_group_reads_everything(rill):
    from kafka import KafkaConsumer

    topic = unique_topic("group-kp")
    create_topic(rill.bootstrap, topic, PARTITIONS)
    produced = produce_keyed(rill.bootstrap, topic)
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumers = [
        KafkaConsumer(
            bootstrap_servers=rill.bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=500,
        )
        for _ in range(2)
    ]
    # As in the mixed-group test: a member that subscribes before it knows the topic can
    # lead a rebalance from a view without it ("No partition metadata for topic", seen in
    # CI), and the group then never splits the partitions. Knowing it first keeps this
    # test about the group.
    for c in consumers:
        wait_for(
            lambda c=c: c.partitions_for_topic(topic) == set(range(PARTITIONS)),
            30,
            "kafka-python to see the topic",
        )
        c.subscribe([topic])
    seen = set()
    try:
        deadline = time.monotonic() + 90
        while seen < produced and time.monotonic() < deadline:
            for c in consumers:
                for records in c.poll(timeout_ms=200).values():
                    seen |= {(r.partition, r.offset) for r in records}
        assert seen >= produced
        wait_for(
            lambda: [c.poll(timeout_ms=100) is not None for c in consumers]
            and sum(len(c.assignment()) for c in consumers) == PARTITIONS
            and all(c.assignment() for c in consumers),
            60,
            "both kafka-python members to hold partitions",
        )
    finally:
        for c in consumers:
            c.close()


def test_mixed_group_agrees_on_one_assignment(rill):
    topic = unique_topic("group-mixed")
    create_topic(rill.bootstrap, topic, PARTITIONS)
    produced = produce_keyed(rill.bootstrap, topic)
    group = f"g-{uuid.uuid4().hex[:8]}"
    with RebalanceStory().attached():
        mixed_group_reads_everything(rill, topic, group, produced)


def mixed_group_reads_everything(rill, topic, group, produced):
    from kafka import KafkaConsumer
    from kafka.coordinator.assignors.range import RangePartitionAssignor

    librdkafka_member = Member(rill.bootstrap, group, topic, "range")
    python_member = KafkaConsumer(
        bootstrap_servers=rill.bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=500,
        partition_assignment_strategy=[RangePartitionAssignor],
    )
    # kafka-python builds its first metadata request before it knows the subscription;
    # when that answer lands after `subscribe` asked for the topic, it clears the pending
    # refresh, and the client can lead a rebalance from a view without the topic (seen
    # once on a loaded CI machine). Knowing the topic first keeps this test about the group.
    wait_for(
        lambda: python_member.partitions_for_topic(topic) == set(range(PARTITIONS)),
        30,
        "kafka-python to see the topic",
    )
    python_member.subscribe([topic])
    seen = set()
    try:
        def agreed():
            for records in python_member.poll(timeout_ms=200).values():
                seen.update((r.partition, r.offset) for r in records)
            mine = {tp.partition for tp in python_member.assignment()}
            theirs = librdkafka_member.assignment()
            last.update(kafka_python=sorted(mine), librdkafka=sorted(theirs))
            return len(mine) == 3 and len(theirs) == 3 and mine | theirs == set(range(PARTITIONS))

        last = {}
        try:
            wait_for(agreed, 60, "the two client libraries to split the partitions 3/3")
        except AssertionError as error:
            raise AssertionError(f"{error}; last seen: {last}") from None

        def all_read():
            for records in python_member.poll(timeout_ms=200).values():
                seen.update((r.partition, r.offset) for r in records)
            with librdkafka_member.lock:
                return (seen | librdkafka_member.seen) >= produced

        wait_for(all_read, 60, "the mixed group to read every record")
    finally:
        python_member.close()
        librdkafka_member.close()


def test_admin_lists_describes_and_deletes_groups(rill):
    from confluent_kafka.admin import AdminClient

    topic = unique_topic("group-admin")
    create_topic(rill.bootstrap, topic, PARTITIONS)
    produce_keyed(rill.bootstrap, topic)
    group = f"g-{uuid.uuid4().hex[:8]}"
    client = AdminClient({"bootstrap.servers": rill.bootstrap})
    member = Member(rill.bootstrap, group, topic, "range")
    try:
        wait_for(lambda: len(member.assignment()) == PARTITIONS, 60, "the member to own everything")
        listed = client.list_consumer_groups().result(timeout=30)
        assert group in {g.group_id for g in listed.valid}
        described = client.describe_consumer_groups([group])[group].result(timeout=30)
        assert described.group_id == group
        assert str(described.state).endswith("STABLE")
        assert len(described.members) == 1
        assigned = {tp.partition for tp in described.members[0].assignment.topic_partitions}
        assert assigned == set(range(PARTITIONS))
        # A group with members cannot be deleted.
        with pytest.raises(Exception, match="NON_EMPTY_GROUP|not empty"):
            client.delete_consumer_groups([group])[group].result(timeout=30)
        wait_for(lambda: len(member.seen) == PARTITIONS * PER_PARTITION, 60, "the member to read all")
    finally:
        member.close()
    wait_for(
        lambda: str(client.describe_consumer_groups([group])[group].result(timeout=30).state).endswith("EMPTY"),
        30,
        "the group to become empty",
    )
    offsets = client.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=30)
    assert sum(tp.offset for tp in offsets.topic_partitions) == PARTITIONS * PER_PARTITION
    client.delete_consumer_groups([group])[group].result(timeout=30)
    listed = client.list_consumer_groups().result(timeout=30)
    assert group not in {g.group_id for g in listed.valid}


def test_commit_for_a_topic_that_does_not_exist_is_refused_per_partition(rill):
    """As Kafka (librdkafka's test 0030): OffsetCommit of a partition whose topic or
    partition does not exist answers UNKNOWN_TOPIC_OR_PARTITION for it, and the
    partitions that exist in the same request are committed."""
    from confluent_kafka import KafkaError, KafkaException

    topic = unique_topic("commit-known")
    create_topic(rill.bootstrap, topic, 1)
    group = f"commit-unknown-{uuid.uuid4().hex[:8]}"
    consumer = Consumer({
        "bootstrap.servers": rill.bootstrap,
        "group.id": group,
        "enable.auto.commit": False,
    })
    try:
        missing = f"no-such-topic-{uuid.uuid4().hex[:8]}"
        offsets = [
            TopicPartition(topic, 0, 5),
            TopicPartition(missing, 0, 7),
            TopicPartition(topic, 3, 9),
        ]
        try:
            results = consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as e:
            # librdkafka raises when any partition failed; the per-partition results are
            # what the broker answered.
            assert e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, e
            results = None
        if results is not None:
            errors = {(r.topic, r.partition): (r.error.code() if r.error else None) for r in results}
            assert errors == {
                (topic, 0): None,
                (missing, 0): KafkaError.UNKNOWN_TOPIC_OR_PART,
                (topic, 3): KafkaError.UNKNOWN_TOPIC_OR_PART,
            }, errors
        committed = consumer.committed([TopicPartition(topic, 0), TopicPartition(missing, 0)],
                                       timeout=30)
        by_tp = {(c.topic, c.partition): c.offset for c in committed}
        assert by_tp[(topic, 0)] == 5, committed
        assert by_tp[(missing, 0)] < 0, committed
    finally:
        consumer.close()
