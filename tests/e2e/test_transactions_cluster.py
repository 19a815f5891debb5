"""Transactions on three nodes (issue #16): every topic with RF 3 and `min.insync.replicas=2`,
`__transaction_state` too, driven by confluent-kafka (librdkafka) and kafka-python.

- A consume-transform-produce loop (`send_offsets_to_transaction`) copies 100,000 records
  while the transaction coordinator's node, then a partition leader, is killed with SIGKILL
  and restarted: the copy holds every input record exactly once, in order, for
  read_committed, and the group's committed offsets are the input's ends.
- Commit and abort alternately: read_committed sees the committed records only,
  read_uncommitted all of them, with both clients.
- Two producers of one `transactional.id`: the older is fenced, and none of what it writes
  afterwards reaches the log.
- A producer killed in the middle of a transaction, and the coordinator's node killed too:
  the new coordinator aborts the transaction after its timeout and the LSO moves on.
- SIGKILL of a partition leader right after EndTxn was answered (the coordinator is then
  writing the markers): after the restart, that node's log, LSO and aborted transactions
  agree with the coordinator's outcome once it leads the partition again.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
import uuid

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_INVALID,
    Consumer,
    ConsumerGroupTopicPartitions,
    ElectionType,
    IsolationLevel,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec
from kafka import KafkaAdminClient

from kafka_helpers import admin, unique_topic, wait_for
from test_cluster import SETTLE_TIMEOUT_S, all_in_sync, create_replicated_topic, leader_of
from test_txn_markers import Wire, describe_producers, kafka_python_read

MIN_ISR_2 = {"min.insync.replicas": "2"}
TXN_CLUSTER = {
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "transaction.state.log.num.partitions": "3",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
}


def txn_cluster(rill_cluster_factory):
    return rill_cluster_factory(overrides=TXN_CLUSTER)


def txn_producer(bootstrap: str, transactional_id: str, **extra) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": 60_000,
            "topic.metadata.refresh.interval.ms": 1000,
            **extra,
        }
    )


def describe(bootstrap: str, transactional_id: str):
    """DescribeTransactions through a fresh kafka-python admin client (it keeps a dead node
    in its metadata otherwise)."""
    client = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        return client.describe_transactions([transactional_id])[transactional_id]
    finally:
        client.close()


def read_to_end(bootstrap: str, topic: str, partitions: int, isolation: str) -> dict[int, list[bytes]]:
    """Every partition's values from the start to its end as `isolation` sees it (the LSO
    for read_committed, which librdkafka asks ListOffsets for): {partition: values}."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "auto.offset.reset": "error",
            "fetch.max.bytes": 16 << 20,
        }
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        ends = {
            tp.partition: consumer.get_watermark_offsets(tp, timeout=10, cached=False)[1]
            for tp in tps
        }
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        values: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        deadline = time.monotonic() + 120

        def at_end() -> bool:
            # Before the first record a position may still be invalid (negative); a
            # partition that is empty to its end has nothing to wait for.
            return all(
                ends[tp.partition] == 0 or tp.offset >= ends[tp.partition]
                for tp in consumer.position(tps)
            )

        while not at_end():
            assert time.monotonic() < deadline, f"{isolation} read of {topic} stuck short of {ends}"
            for m in consumer.consume(num_messages=10_000, timeout=0.5):
                assert m.error() is None, m.error()
                values[m.partition()].append(m.value())
        for m in consumer.consume(num_messages=100, timeout=1.0):
            assert m.error() is not None, f"read past the end: {m.value()!r}"
        return values
    finally:
        consumer.close()


def stable_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    """{partition: (last stable offset, high watermark)} from ListOffsets."""
    client = admin(bootstrap)

    def ask(isolation):
        request = {TopicPartition(topic, p): OffsetSpec.latest() for p in range(partitions)}
        futures = client.list_offsets(request, isolation_level=isolation, request_timeout=10)
        return {tp.partition: f.result(timeout=10).offset for tp, f in futures.items()}

    lso, hw = ask(IsolationLevel.READ_COMMITTED), ask(IsolationLevel.READ_UNCOMMITTED)
    return {p: (lso[p], hw[p]) for p in range(partitions)}


def group_offsets(bootstrap: str, group: str) -> dict[int, int]:
    client = admin(bootstrap)
    request = [ConsumerGroupTopicPartitions(group)]
    result = client.list_consumer_group_offsets(request, require_stable=True)[group].result(timeout=30)
    return {tp.partition: tp.offset for tp in result.topic_partitions}


def group_coordinator_of(bootstrap: str, group: str) -> int:
    client = admin(bootstrap)
    # The first FindCoordinator creates `__consumer_offsets`; until its partitions are led
    # the answer is COORDINATOR_NOT_AVAILABLE.
    return wait_for(
        lambda: client.describe_consumer_groups([group], request_timeout=5)[group]
        .result(timeout=10).coordinator.id,
        60,
        f"the coordinator of group {group}",
    )


def producer_coordinated_away_from(bootstrap: str, prefix: str, node_id: int, **extra):
    """A transactional producer, initialised, whose transaction coordinator is not on
    `node_id`; returns it and its transactional id."""
    for attempt in range(12):
        tid = f"{prefix}-{attempt}-{uuid.uuid4().hex[:8]}"
        producer = txn_producer(bootstrap, tid, **extra)
        producer.init_transactions(60)
        if describe(bootstrap, tid).coordinator_id != node_id:
            return producer, tid
    raise AssertionError(f"every transactional id tried had its coordinator on node {node_id}")


class Outage:
    """One node SIGKILLed now and started again `down_s` later, by `due()` on the test's
    own thread (the harness makes a node die with the thread that started it)."""

    def __init__(self, cluster, node_id: int, down_s: float):
        self.cluster, self.node_id = cluster, node_id
        self.restart_at = time.monotonic() + down_s
        self.over = False
        cluster.node(node_id).kill9()

    def due(self) -> None:
        if not self.over and time.monotonic() >= self.restart_at:
            self.cluster.start_node(self.node_id)
            self.over = True

    def end(self) -> None:
        time.sleep(max(0.0, self.restart_at - time.monotonic()))
        self.due()


# --- consume-transform-produce ----------------------------------------------------------

RECORDS = 100_000
PARTITIONS = 3
RECORDS_PER_TRANSACTION = 2_000
ABORTED_ON_PURPOSE = 20


def fill(bootstrap: str, topic: str) -> None:
    """Values 0..RECORDS-1, value i to partition i % PARTITIONS, idempotent and acks=all."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1 << 20,
        }
    )
    for i in range(RECORDS):
        while True:
            try:
                producer.produce(topic, value=b"%d" % i, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0


def retrying(what: str, call, deadline: float):
    """Calls `call` until it does not raise a retriable KafkaException (librdkafka's rule
    for commit_transaction and abort_transaction, whose outcome is unknown on a timeout)."""
    while True:
        try:
            return call()
        except KafkaException as raised:
            error = raised.args[0]
            if not error.retriable() or time.monotonic() > deadline:
                raise
            print(f"{what}: retrying after {error}")


def rewind(consumer: Consumer, deadline: float) -> dict[int, int]:
    """Back to the group's committed offsets, after an abort: what the aborted transaction
    consumed is copied again by the next one. Returns them ({partition: offset})."""
    assignment = consumer.assignment()
    committed = retrying("committed", lambda: consumer.committed(assignment, timeout=10), deadline)
    for tp in committed:
        # Nothing committed yet: the log's start, 0 here (librdkafka's seek to a logical
        # offset is a lookup of its own).
        offset = tp.offset if tp.offset != OFFSET_INVALID else 0
        consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
    return {tp.partition: tp.offset for tp in committed if tp.offset >= 0}


def test_consume_transform_produce_copies_exactly_once_through_kill9s(rill_cluster_factory):
    cluster = txn_cluster(rill_cluster_factory)
    source, sink = unique_topic("ctp-in"), unique_topic("ctp-out")
    client = create_replicated_topic(cluster.bootstrap, source, PARTITIONS, 3, MIN_ISR_2)
    create_replicated_topic(cluster.bootstrap, sink, PARTITIONS, 3, MIN_ISR_2)
    fill(cluster.bootstrap, source)
    ends = {p: end for p, (_lso, end) in stable_offsets(cluster.bootstrap, source, PARTITIONS).items()}
    assert sum(ends.values()) == RECORDS

    group = f"ctp-{uuid.uuid4().hex[:8]}"
    group_coordinator = group_coordinator_of(cluster.bootstrap, group)
    # The group's coordinator stays up: librdkafka's send_offsets_to_transaction hangs,
    # past its timeout, when the group coordinator's broker goes away (librdkafka issues
    # 5456 and 5511, open), against Kafka as against Rill. So the transaction coordinator
    # is on another node.
    producer, tid = producer_coordinated_away_from(cluster.bootstrap, "ctp", group_coordinator,
                                                   **{"linger.ms": 5})
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "topic.metadata.refresh.interval.ms": 1000,
        }
    )
    started = time.monotonic()
    deadline = started + 240
    consumer.subscribe([source])
    copied = transactions = aborted = 0
    # The group's committed offset of each partition, as this loop committed it.
    progress: dict[int, int] = {}
    kills: list[str] = []
    outages: list[Outage] = []

    def inject_faults():
        """Each fault once, in the middle of a transaction: its records sent, its offsets and
        its end still to come."""
        if not kills and copied >= RECORDS // 4:
            coordinator = describe(cluster.running_bootstrap(), tid).coordinator_id
            kills.append(f"coordinator {coordinator} at {copied}")
            outages.append(Outage(cluster, coordinator, 2.0))
        elif len(kills) == 1 and copied >= RECORDS * 3 // 5:
            outages[0].end()
            wait_for(lambda: all_in_sync(client, sink, PARTITIONS, 3), SETTLE_TIMEOUT_S,
                     "the restarted node back in the ISR")
            coordinator = describe(cluster.bootstrap, tid).coordinator_id
            leaders = {leader_of(client, t, p) for t in (source, sink) for p in range(PARTITIONS)}
            # Not the group's coordinator (see above); not the transaction's either
            # when another node leads a partition.
            candidates = sorted(leaders - {group_coordinator, -1},
                                key=lambda n: n == coordinator)
            assert candidates, f"only the group coordinator {group_coordinator} leads"
            victim = candidates[0]
            kills.append(f"leader {victim} (coordinators: transaction {coordinator}, "
                         f"group {group_coordinator}) at {copied}")
            outages.append(Outage(cluster, victim, 2.0))

    try:
        done = False
        while not done:
            assert time.monotonic() < deadline, f"copy stuck at {copied} of {RECORDS}"
            messages = []
            for m in consumer.consume(num_messages=RECORDS_PER_TRANSACTION, timeout=1.0):
                if m.error() is None:
                    messages.append(m)
                else:
                    # A broker going away is reported, and retried by librdkafka.
                    assert not m.error().fatal(), m.error()
                    print(f"consumer: {m.error()}")
            for outage in outages:
                outage.due()
            if not messages:
                continue
            producer.begin_transaction()
            for m in messages:
                while True:
                    try:
                        producer.produce(sink, value=m.value(), partition=m.partition())
                        break
                    except BufferError:
                        producer.poll(0.1)
            inject_faults()
            if transactions == ABORTED_ON_PURPOSE and not aborted:
                # One abort by choice, with its records in the log: read_committed must
                # skip them, and the rewind copies them again.
                assert producer.flush(60) == 0
                retrying("abort", lambda: producer.abort_transaction(60), deadline)
                aborted += 1
                progress = rewind(consumer, deadline)
                continue
            try:
                offsets = consumer.position(consumer.assignment())
                producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 60)
                retrying("commit", lambda: producer.commit_transaction(60), deadline)
                copied += len(messages)
                transactions += 1
                # A partition with nothing consumed since a rewind has no position.
                progress.update((tp.partition, tp.offset) for tp in offsets if tp.offset >= 0)
                done = all(progress.get(p) == end for p, end in ends.items())
            except KafkaException as raised:
                if not raised.args[0].txn_requires_abort():
                    raise
                print(f"aborting after {raised.args[0]}")
                retrying("abort", lambda: producer.abort_transaction(60), deadline)
                aborted += 1
                progress = rewind(consumer, deadline)
                continue

        for outage in outages:
            outage.end()
    finally:
        consumer.close()
    elapsed = time.monotonic() - started
    print(f"copied {RECORDS} records in {transactions} transactions ({aborted} aborted) "
          f"in {elapsed:.1f} s; killed {kills}")
    assert len(kills) == 2, kills
    assert copied >= RECORDS

    # Exactly once and in order, partition by partition.
    got = read_to_end(cluster.bootstrap, sink, PARTITIONS, "read_committed")
    for p in range(PARTITIONS):
        expected = [b"%d" % i for i in range(p, RECORDS, PARTITIONS)]
        if got[p] != expected:
            seen = set(got[p])
            missing = [v for v in expected if v not in seen]
            raise AssertionError(f"partition {p}: {len(got[p])} records, {len(missing)} missing "
                                 f"(e.g. {missing[:5]}), expected {len(expected)}")
    uncommitted = read_to_end(cluster.bootstrap, sink, PARTITIONS, "read_uncommitted")
    assert sum(map(len, uncommitted.values())) > RECORDS, "no aborted record in the log"
    assert group_offsets(cluster.bootstrap, group) == ends
    # Nothing is left open: every partition is stable up to its high watermark.
    for p, (lso, hw) in stable_offsets(cluster.bootstrap, sink, PARTITIONS).items():
        assert lso == hw, f"partition {p}: LSO {lso} below the high watermark {hw}"
    assert describe(cluster.bootstrap, tid).state.value == "CompleteCommit"


# --- the other scenarios, on three nodes -------------------------------------------------


def test_commit_and_abort_alternately_on_three_nodes(rill_cluster_factory):
    cluster = txn_cluster(rill_cluster_factory)
    topic = unique_topic("alternate")
    create_replicated_topic(cluster.bootstrap, topic, 2, 3, MIN_ISR_2)
    producer = txn_producer(cluster.bootstrap, f"alternate-{uuid.uuid4().hex[:8]}")
    producer.init_transactions(60)
    for i in range(6):
        producer.begin_transaction()
        for p in range(2):
            producer.produce(topic, b"%d" % i, partition=p)
        # Written before the end, so that the aborted records are in the log (an abort
        # purges what librdkafka has not sent).
        assert producer.flush(30) == 0
        if i % 2 == 0:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    committed, everything = [b"0", b"2", b"4"], [b"%d" % i for i in range(6)]
    assert read_to_end(cluster.bootstrap, topic, 2, "read_committed") == {0: committed, 1: committed}
    assert read_to_end(cluster.bootstrap, topic, 2, "read_uncommitted") == {0: everything, 1: everything}
    # kafka-python's consumer (partition 0) agrees.
    assert kafka_python_read(cluster.bootstrap, topic, "read_committed", 3) == ["0", "2", "4"]
    assert kafka_python_read(cluster.bootstrap, topic, "read_uncommitted", 6) == [
        str(i) for i in range(6)
    ]
    for p, (lso, hw) in stable_offsets(cluster.bootstrap, topic, 2).items():
        assert lso == hw, f"partition {p}: LSO {lso}, high watermark {hw}"


def test_the_older_of_two_producers_is_fenced_and_writes_nothing_more(rill_cluster_factory):
    cluster = txn_cluster(rill_cluster_factory)
    topic = unique_topic("zombie")
    create_replicated_topic(cluster.bootstrap, topic, 2, 3, MIN_ISR_2)
    tid = f"zombie-{uuid.uuid4().hex[:8]}"
    older = txn_producer(cluster.bootstrap, tid, **{"message.timeout.ms": 10_000})
    older.init_transactions(60)
    older.begin_transaction()
    older.produce(topic, b"before", partition=0)
    assert older.flush(30) == 0

    # The new producer's InitProducerId bumps the epoch and aborts the older one's
    # transaction, markers included, before it is answered.
    newer = txn_producer(cluster.bootstrap, tid)
    newer.init_transactions(60)

    # To a partition already in the transaction (straight to its leader, which has the
    # new epoch from the abort marker) and to a new one (AddPartitionsToTxn first).
    try:
        older.produce(topic, b"after", partition=0)
        older.produce(topic, b"after", partition=1)
        older.flush(30)
    except KafkaException as raised:
        # Refused once librdkafka knows it is fenced: that is the point.
        assert raised.args[0].fatal(), raised.args[0]
    try:
        older.commit_transaction(30)
        raise AssertionError("the fenced producer committed")
    except KafkaException as raised:
        error = raised.args[0]
        assert error.fatal() or error.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED,
                                                 KafkaError.INVALID_PRODUCER_EPOCH), error

    newer.begin_transaction()
    newer.produce(topic, b"newer", partition=0)
    newer.produce(topic, b"newer", partition=1)
    newer.commit_transaction(30)

    assert read_to_end(cluster.bootstrap, topic, 2, "read_committed") == {0: [b"newer"], 1: [b"newer"]}
    # Not even read_uncommitted shows the fenced producer's later writes.
    assert read_to_end(cluster.bootstrap, topic, 2, "read_uncommitted") == {
        0: [b"before", b"newer"],
        1: [b"newer"],
    }
    # Two bumps, as Kafka's coordinator makes them: one fences the older producer and
    # aborts its transaction, one more answers the newer producer's retried
    # InitProducerId (CONCURRENT_TRANSACTIONS until that abort is complete).
    d = describe(cluster.bootstrap, tid)
    assert d.state.value == "CompleteCommit" and d.producer_epoch == 2, d


DYING_PRODUCER = textwrap.dedent(
    """
    import sys, time
    from confluent_kafka import Producer
    bootstrap, tid, topic = sys.argv[1:4]
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                  "transaction.timeout.ms": %d, "message.timeout.ms": %d})
    p.init_transactions(60)
    p.begin_transaction()
    for partition in (0, 1):
        p.produce(topic, b"open", partition=partition)
    assert p.flush(30) == 0
    print("open", flush=True)
    time.sleep(600)
    """
)


def test_a_dead_producers_transaction_is_aborted_by_the_next_coordinator(rill_cluster_factory):
    cluster = txn_cluster(rill_cluster_factory)
    topic = unique_topic("orphan")
    create_replicated_topic(cluster.bootstrap, topic, 2, 3, MIN_ISR_2)
    tid = f"orphan-{uuid.uuid4().hex[:8]}"
    timeout_ms = 8_000
    dying = subprocess.Popen(
        [sys.executable, "-c", DYING_PRODUCER % (timeout_ms, timeout_ms), cluster.bootstrap, tid, topic],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert dying.stdout.readline().strip() == "open"
    finally:
        dying.kill()
        dying.wait(timeout=10)
    opened = wait_for(
        lambda: (lambda d: d if d.state.value == "Ongoing" and len(d.topic_partitions) == 2 else None)(
            describe(cluster.bootstrap, tid)
        ),
        30,
        "the transaction to be Ongoing on two partitions",
    )
    cluster.node(opened.coordinator_id).kill9()
    killed_at_ms = time.time() * 1000
    # Killed before the timeout: the abort is the next coordinator's.
    assert killed_at_ms < opened.transaction_start_time_ms + timeout_ms

    # Committed records behind the open transaction wait for it to end.
    plain = Producer({"bootstrap.servers": cluster.running_bootstrap(), "enable.idempotence": True})
    for p in range(2):
        plain.produce(topic, b"later", partition=p)
    assert plain.flush(60) == 0

    survivors = cluster.running_bootstrap()
    aborted = wait_for(
        lambda: (lambda d: d if d.state.value == "CompleteAbort" else None)(describe(survivors, tid)),
        SETTLE_TIMEOUT_S + timeout_ms / 1000,
        "the new coordinator to abort the expired transaction",
        interval_s=0.5,
    )
    assert aborted.coordinator_id != opened.coordinator_id
    assert (aborted.producer_id, aborted.producer_epoch) == (opened.producer_id, opened.producer_epoch + 1)
    assert read_to_end(survivors, topic, 2, "read_committed") == {0: [b"later"], 1: [b"later"]}
    assert read_to_end(survivors, topic, 2, "read_uncommitted") == {
        0: [b"open", b"later"],
        1: [b"open", b"later"],
    }
    for p, (lso, hw) in stable_offsets(survivors, topic, 2).items():
        assert lso == hw, f"partition {p}: LSO {lso} below the high watermark {hw}"


def test_leader_kill9_between_markers_and_completion(rill_cluster_factory):
    cluster = txn_cluster(rill_cluster_factory)
    topic = unique_topic("marked")
    client = create_replicated_topic(cluster.bootstrap, topic, 2, 3, MIN_ISR_2)
    victim = leader_of(client, topic, 0)
    # A transactional id whose coordinator is not the victim, so that only the partition
    # side is killed.
    producer, tid = producer_coordinated_away_from(cluster.bootstrap, "marked", victim)

    for value, commit in ((b"committed", True), (b"aborted", False)):
        producer.begin_transaction()
        for p in range(2):
            producer.produce(topic, value, partition=p)
        assert producer.flush(30) == 0
        if commit:
            producer.commit_transaction(30)
        else:
            # Answered once PrepareAbort is replicated; the markers are written after.
            producer.abort_transaction(30)
    cluster.node(victim).kill9()
    survivors = cluster.running_bootstrap()
    wait_for(
        lambda: describe(survivors, tid).state.value == "CompleteAbort",
        SETTLE_TIMEOUT_S,
        "the coordinator to finish the abort at the partition's new leader",
    )
    cluster.start_node(victim)
    wait_for(lambda: all_in_sync(client, topic, 2, 3), SETTLE_TIMEOUT_S, "the victim in the ISR")
    # The victim was the partition's first (preferred) replica: it leads it again.
    if leader_of(client, topic, 0) != victim:
        client.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0)]).result(timeout=30)
    wait_for(lambda: leader_of(client, topic, 0) == victim, SETTLE_TIMEOUT_S, "the victim to lead again")

    expected = {"read_committed": [b"committed"], "read_uncommitted": [b"committed", b"aborted"]}
    for isolation, values in expected.items():
        got = wait_for(
            lambda: (lambda v: v if v[0] == values else None)(read_to_end(cluster.bootstrap, topic, 1, isolation)),
            SETTLE_TIMEOUT_S,
            f"{isolation} from the restarted leader",
        )
        assert got == {0: values}
    (lso, hw) = stable_offsets(cluster.bootstrap, topic, 1)[0]
    # Two records and two markers, all stable; or three markers: a leader killed after it
    # appended the abort marker but before it answered is sent the marker again, and its
    # successor appends it again, as Kafka's would (a marker for a transaction that is no
    # longer open changes nothing). The reads above show no record was added.
    assert lso == hw and hw in (4, 5), (lso, hw)
    wire = Wire(cluster.node(victim).bootstrap)
    try:
        producers = describe_producers(wire, topic)
    finally:
        wire.close()
    d = describe(cluster.bootstrap, tid)
    assert producers[d.producer_id]["txn_start"] == -1, producers
    assert producers[d.producer_id]["epoch"] == d.producer_epoch, (producers, d)
