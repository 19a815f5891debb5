"""The replicated cluster (issue #5): three real `rill server` nodes on loopback, each a
controller and a broker, driven by confluent-kafka (librdkafka).

What these tests hold the cluster to:
- every node answers Metadata with the same brokers, controller and leaders;
- an idempotent acks=all producer loses nothing, duplicates nothing and never sees one
  offset hold two records while a partition leader is killed with SIGKILL and restarted,
  and the restarted node returns to the ISR;
- with five one-record requests in flight (pipelined at the leader), a leader killed with
  SIGKILL leaves every value stored once and in the order produced;
- CreatePartitions and DeleteTopics act on every node (and every node's disk);
- the active controller can die and a new one takes over (topics can still be created);
- with two of three nodes down, acks=all writes are refused, never acknowledged;
- a rolling restart of all three nodes, with a producer and a consumer group running,
  loses nothing (committed offsets survive the group coordinator moving);
- an acknowledged OffsetCommit survives SIGKILL of the group coordinator right after it.
"""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, Producer
from confluent_kafka.admin import NewTopic

from kafka_helpers import ADMIN_TIMEOUT_S, admin, read_all, unique_topic, wait_for

SETTLE_TIMEOUT_S = 30.0


def create_replicated_topic(bootstrap: str, topic: str, partitions: int, rf: int, config=None):
    client = admin(bootstrap)
    futures = client.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=rf, config=config or {})],
        operation_timeout=ADMIN_TIMEOUT_S,
        request_timeout=ADMIN_TIMEOUT_S,
    )
    futures[topic].result(timeout=ADMIN_TIMEOUT_S)
    wait_for(
        lambda: all_in_sync(client, topic, partitions, rf),
        SETTLE_TIMEOUT_S,
        f"{topic}: {partitions} partitions led, with {rf} replicas in sync",
    )
    return client


def partition_metadata(client, topic: str):
    described = client.list_topics(topic=topic, timeout=5).topics.get(topic)
    if described is None or described.error is not None:
        return None
    return described.partitions


def all_in_sync(client, topic: str, partitions: int, rf: int) -> bool:
    parts = partition_metadata(client, topic)
    return (
        parts is not None
        and len(parts) == partitions
        and all(p.leader >= 0 and len(p.isrs) == rf for p in parts.values())
    )


def leader_of(client, topic: str, partition: int) -> int:
    parts = partition_metadata(client, topic)
    return parts[partition].leader if parts else -1


class AckedProducer(threading.Thread):
    """Produces the values 0, 1, 2, … to one partition until stopped, recording what the
    cluster acknowledged and when."""

    def __init__(self, bootstrap: str, topic: str, partition: int, rate_per_s: float = 400):
        super().__init__(daemon=True)
        self.topic = topic
        self.partition = partition
        self.interval = 1.0 / rate_per_s
        self.producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                # Long enough to ride out a failover: librdkafka retries meanwhile.
                "message.timeout.ms": 60000,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        self.acked: dict[int, int] = {}  # value -> offset
        self.sent_at: dict[int, float] = {}  # value -> monotonic time it was produced
        self.ack_times: list[tuple[float, int]] = []  # (monotonic time, value)
        self.errors: list[str] = []
        self.sent = 0
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def _on_delivery(self, err, msg):
        with self._lock:
            if err is not None:
                self.errors.append(str(err))
                return
            value = int(msg.value())
            assert msg.partition() == self.partition
            self.acked[value] = msg.offset()
            self.ack_times.append((time.monotonic(), value))

    def run(self):
        while not self._halt.is_set():
            try:
                self.sent_at[self.sent] = time.monotonic()
                self.producer.produce(
                    self.topic,
                    value=str(self.sent).encode(),
                    partition=self.partition,
                    on_delivery=self._on_delivery,
                )
                self.sent += 1
            except BufferError:
                pass
            self.producer.poll(0)
            time.sleep(self.interval)
        remaining = self.producer.flush(90)
        if remaining:
            with self._lock:
                self.errors.append(f"{remaining} messages still undelivered after flush")

    def acked_count(self) -> int:
        with self._lock:
            return len(self.acked)

    def stop(self):
        self._halt.set()
        self.join(timeout=120)
        assert not self.is_alive(), "producer did not finish flushing"


def check_log_matches_acks(bootstrap: str, topic: str, partitions: int, acked: dict[int, int], p: int):
    """Every acknowledged value is at its acknowledged offset; no value appears twice."""
    log = read_all(bootstrap, topic, partitions)[p]
    by_value: dict[int, list[int]] = {}
    for offset, record in log.items():
        by_value.setdefault(int(record.value), []).append(offset)
    duplicated = {v: o for v, o in by_value.items() if len(o) > 1}
    assert not duplicated, f"values stored more than once: {dict(list(duplicated.items())[:5])}"
    lost = [v for v in acked if v not in by_value]
    assert not lost, f"{len(lost)} acknowledged values missing, e.g. {lost[:10]}"
    moved = [(v, o, by_value[v]) for v, o in acked.items() if by_value[v] != [o]]
    assert not moved, f"acknowledged offsets now hold other records: {moved[:5]}"
    offsets = sorted(log)
    assert offsets == list(range(offsets[0], offsets[0] + len(offsets))), "offsets not dense"
    return log


def test_three_nodes_agree_on_metadata(rill_cluster_factory):
    cluster = rill_cluster_factory()
    topic = unique_topic("agree")
    create_replicated_topic(cluster.node(1).bootstrap, topic, 6, 3)
    views = []
    for node in cluster.nodes.values():
        md = admin(node.bootstrap).list_topics(topic=topic, timeout=10)
        views.append(
            (
                sorted(md.brokers),
                md.controller_id,
                {p: (m.leader, tuple(m.replicas)) for p, m in md.topics[topic].partitions.items()},
            )
        )
    assert views[0][0] == [1, 2, 3]
    assert all(v == views[0] for v in views), f"nodes disagree: {views}"
    leaders = [leader for leader, _ in views[0][2].values()]
    # Round-robin placement spreads leadership: two partitions led by each node.
    assert sorted(leaders.count(n) for n in (1, 2, 3)) == [2, 2, 2], views[0][2]



def test_the_last_node_to_stop_does_not_wait_out_its_session(rill_cluster_factory):
    """A controlled shutdown waits for the controller to move the broker's leaderships
    away. The last node of a cluster to stop has no quorum left to answer, and no broker
    left to move them to: it stops without waiting out its session (30 s here, longer
    than the harness gives a SIGTERM), while the first two complete theirs."""
    cluster = rill_cluster_factory(overrides={"broker.session.timeout.ms": "30000"})
    topic = unique_topic("last")
    create_replicated_topic(cluster.node(1).bootstrap, topic, 3, 3)
    for node_id in (1, 2, 3):
        assert cluster.node(node_id).stop() == 0
    for node_id in (1, 2):
        assert "controlled shutdown complete" in cluster.node(node_id).log_text()
    last = cluster.node(3).log_text()
    assert "no other broker is live" in last, last[-2000:]
    assert "controlled shutdown timed out" not in last


def test_create_partitions_and_delete_topics_across_the_cluster(rill_cluster_factory):
    """CreatePartitions grows a replicated topic on every node (new partitions led, in
    sync, writable); DeleteTopics removes it from every node's metadata and disk."""
    from confluent_kafka.admin import NewPartitions

    cluster = rill_cluster_factory()
    topic = unique_topic("grow")
    client = create_replicated_topic(cluster.bootstrap, topic, 2, 3)
    futures = client.create_partitions([NewPartitions(topic, 4)], operation_timeout=ADMIN_TIMEOUT_S)
    futures[topic].result(timeout=ADMIN_TIMEOUT_S)
    for node in cluster.nodes.values():
        node_admin = admin(node.bootstrap)
        wait_for(
            lambda: all_in_sync(node_admin, topic, 4, 3),
            SETTLE_TIMEOUT_S,
            f"node {node.port}: four partitions led and in sync",
        )
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for p in range(4):
        producer.produce(topic, value=f"p{p}".encode(), partition=p)
    assert producer.flush(30) == 0
    stored = read_all(cluster.bootstrap, topic, 4)
    assert {p: [r.value for r in recs.values()] for p, recs in stored.items()} == {
        p: [f"p{p}".encode()] for p in range(4)
    }
    for node in cluster.nodes.values():
        assert len(list(node.data_dir.glob(f"{topic}-*"))) == 4, "every node hosts all four"
    client.delete_topics([topic], operation_timeout=ADMIN_TIMEOUT_S)[topic].result(
        timeout=ADMIN_TIMEOUT_S
    )

    def gone_everywhere():
        for node in cluster.nodes.values():
            if topic in admin(node.bootstrap).list_topics(timeout=10).topics:
                return False
            if any(node.data_dir.glob(f"{topic}-*")):
                return False
        return True

    wait_for(gone_everywhere, SETTLE_TIMEOUT_S, "the topic gone from every node and disk")


def test_leader_kill9_loses_no_acknowledged_record(rill_cluster_factory):
    cluster = rill_cluster_factory()
    topic = unique_topic("failover")
    client = create_replicated_topic(
        cluster.bootstrap, topic, 1, 3, {"min.insync.replicas": "2"}
    )
    producer = AckedProducer(cluster.bootstrap, topic, 0)
    producer.start()
    try:
        wait_for(lambda: producer.acked_count() > 500, 30, "500 acknowledged records")
        victim = leader_of(client, topic, 0)
        cluster.node(victim).kill9()
        killed_at = time.monotonic()
        survivors = ",".join(n.bootstrap for i, n in cluster.nodes.items() if i != victim)
        survivor_admin = admin(survivors)
        wait_for(
            lambda: leader_of(survivor_admin, topic, 0) not in (-1, victim),
            SETTLE_TIMEOUT_S,
            "a new leader",
        )
        def first_ack_after_kill():
            after = [t for t, v in list(producer.ack_times) if producer.sent_at[v] > killed_at]
            return min(after) if after else None

        first = wait_for(first_ack_after_kill, SETTLE_TIMEOUT_S, "a write produced after the kill acknowledged")
        failover_s = first - killed_at
        print(f"failover (kill -9 to first acknowledged write): {failover_s:.2f} s")
        acked_while_down = producer.acked_count()
        cluster.start_node(victim)
        wait_for(
            lambda: victim in partition_metadata(client, topic)[0].isrs,
            SETTLE_TIMEOUT_S,
            f"node {victim} back in the ISR",
        )
        wait_for(
            lambda: producer.acked_count() > acked_while_down + 300,
            30,
            "writes after the restart",
        )
    finally:
        producer.stop()
    assert not producer.errors, producer.errors[:5]
    assert len(producer.acked) == producer.sent
    check_log_matches_acks(cluster.bootstrap, topic, 1, producer.acked, 0)
    # The restarted replica holds the same log: read it through a leader change to it.
    parts = partition_metadata(client, topic)
    assert sorted(parts[0].isrs) == [1, 2, 3]


def test_pipelined_produce_keeps_the_order_through_a_leader_kill9(rill_cluster_factory):
    """An idempotent producer with five requests in flight and one record per request
    (`linger.ms=0`): the leader appends each Produce while the ones before it still wait
    for their replicas (pipelined produce, issue #25). Through a leader killed with
    SIGKILL in the middle — appends beyond the high watermark truncated, the producer's
    requests retried on the new leader — the partition holds every value once, in the
    order produced."""
    cluster = rill_cluster_factory()
    topic = unique_topic("pipelined")
    client = create_replicated_topic(
        cluster.bootstrap, topic, 1, 3, {"min.insync.replicas": "2"}
    )
    producer = Producer({
        "bootstrap.servers": cluster.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 0,
        "max.in.flight.requests.per.connection": 5,
        "message.timeout.ms": 60000,
        "topic.metadata.refresh.interval.ms": 1000,
    })
    acked: dict[int, int] = {}
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            acked[int(msg.value())] = msg.offset()

    # The leader dies with 10,000 records acknowledged and 10,000 more queued or in
    # flight; 10,000 more are produced after.
    total, queued_at_kill, acked_at_kill = 30_000, 20_000, 10_000
    victim = None
    for value in range(total):
        while True:
            try:
                producer.produce(topic, str(value).encode(), partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
        if value + 1 == queued_at_kill:
            deadline = time.monotonic() + 60
            while len(acked) < acked_at_kill and time.monotonic() < deadline:
                producer.poll(0.001)
            assert len(acked) < queued_at_kill, "everything was acknowledged before the kill"
            victim = leader_of(client, topic, 0)
            cluster.node(victim).kill9()
    assert producer.flush(90) == 0, "records undelivered"
    assert victim is not None
    assert not errors, errors[:5]
    assert len(acked) == total
    log = check_log_matches_acks(cluster.bootstrap, topic, 1, acked, 0)
    values = [int(log[o].value) for o in sorted(log)]
    assert values == list(range(total)), "values out of order, missing or repeated"
    cluster.start_node(victim)
    wait_for(
        lambda: victim in partition_metadata(client, topic)[0].isrs,
        SETTLE_TIMEOUT_S,
        f"node {victim} back in the ISR",
    )


def test_active_controller_failover(rill_cluster_factory):
    cluster = rill_cluster_factory()
    client = admin(cluster.bootstrap)
    controller = client.list_topics(timeout=10).controller_id
    assert controller in (1, 2, 3)
    cluster.node(controller).kill9()
    survivors = admin(cluster.running_bootstrap())
    wait_for(
        lambda: survivors.list_topics(timeout=5).controller_id not in (-1, controller),
        SETTLE_TIMEOUT_S,
        "a new active controller",
    )
    # The new controller gives every broker a fresh lease at takeover (as Kafka's does);
    # the dead one is fenced, and leaves the broker list, one session later.
    wait_for(
        lambda: controller not in survivors.list_topics(timeout=5).brokers,
        SETTLE_TIMEOUT_S,
        f"node {controller} fenced",
    )
    topic = unique_topic("after-controller-loss")
    create_replicated_topic(cluster.running_bootstrap(), topic, 2, 2)
    parts = partition_metadata(survivors, topic)
    assert all(controller not in p.replicas for p in parts.values()), "placed on a dead node"


def test_two_of_three_down_refuses_acks_all(rill_cluster_factory):
    cluster = rill_cluster_factory()
    topic = unique_topic("minisr")
    client = create_replicated_topic(cluster.bootstrap, topic, 1, 3, {"min.insync.replicas": "2"})
    leader = leader_of(client, topic, 0)
    others = [i for i in (1, 2, 3) if i != leader]
    for node_id in others:
        cluster.node(node_id).kill9()
    producer = Producer(
        {
            "bootstrap.servers": cluster.node(leader).bootstrap,
            "acks": "all",
            "message.timeout.ms": 8000,
            "request.timeout.ms": 3000,
        }
    )
    outcomes = []
    for i in range(20):
        producer.produce(topic, value=f"v{i}".encode(), partition=0,
                         on_delivery=lambda err, msg: outcomes.append(err))
    producer.flush(30)
    assert len(outcomes) == 20
    acknowledged = [e for e in outcomes if e is None]
    assert not acknowledged, f"{len(acknowledged)} writes acknowledged with two of three nodes down"
    codes = {e.code() for e in outcomes}
    assert codes <= {
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._MSG_TIMED_OUT,
        KafkaError._TIMED_OUT,
    }, codes
    # Back to full strength, writes are acknowledged again.
    for node_id in others:
        cluster.node(node_id).launch()
    for node_id in others:
        cluster.node(node_id).wait_ready()
    wait_for(lambda: all_in_sync(client, topic, 1, 3), SETTLE_TIMEOUT_S, "ISR back to 3")
    ok = []
    producer.produce(topic, value=b"after", partition=0, on_delivery=lambda e, m: ok.append(e))
    producer.flush(30)
    assert ok == [None]


def test_rolling_restart_with_producer_and_group(rill_cluster_factory):
    cluster = rill_cluster_factory()
    topic = unique_topic("rolling")
    client = create_replicated_topic(cluster.bootstrap, topic, 1, 3, {"min.insync.replicas": "2"})
    producer = AckedProducer(cluster.bootstrap, topic, 0, rate_per_s=200)
    group = unique_topic("rolling-group")
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 500,
            "session.timeout.ms": 10000,
        }
    )
    consumer.subscribe([topic])
    seen: set[int] = set()
    stop = threading.Event()
    consume_errors: list[str] = []

    def consume():
        while not stop.is_set():
            for m in consumer.consume(num_messages=500, timeout=0.5):
                if m.error() is None:
                    seen.add(int(m.value()))
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    consume_errors.append(str(m.error()))

    reader = threading.Thread(target=consume, daemon=True)
    producer.start()
    reader.start()
    try:
        wait_for(lambda: len(seen) > 200, 30, "the group to consume")
        for node_id in (1, 2, 3):
            node = cluster.node(node_id)
            node.stop()  # SIGTERM: controlled shutdown moves leadership away first
            cluster.start_node(node_id)
            wait_for(
                lambda: all_in_sync(client, topic, 1, 3),
                SETTLE_TIMEOUT_S,
                f"node {node_id} back in the ISR",
            )
        target = producer.acked_count() + 200
        wait_for(lambda: producer.acked_count() > target, 30, "writes after the restarts")
    finally:
        producer.stop()
    try:
        wait_for(
            lambda: set(producer.acked) <= seen,
            60,
            "the group to consume every acknowledged record",
        )
    finally:
        stop.set()
        reader.join(timeout=10)
        consumer.close()
    assert not producer.errors, producer.errors[:5]
    check_log_matches_acks(cluster.bootstrap, topic, 1, producer.acked, 0)
    # The group's committed position survived three coordinator moves.
    group_admin = admin(cluster.bootstrap)

    def committed_offset():
        request = [ConsumerGroupTopicPartitions(group)]
        result = group_admin.list_consumer_group_offsets(request)[group].result(timeout=10)
        return result.topic_partitions[0].offset

    assert wait_for(committed_offset, 30, "the committed offset") > 0


def test_acknowledged_offset_commits_survive_coordinator_kill9(rill_cluster_factory):
    """An OffsetCommit is answered only once the commit is on every in-sync replica of its
    `__consumer_offsets` partition, so SIGKILL of the coordinator right after the answer
    cannot take it away."""
    from confluent_kafka import TopicPartition

    cluster = rill_cluster_factory()
    topic = unique_topic("commits")
    create_replicated_topic(cluster.bootstrap, topic, 1, 3)
    group = unique_topic("commits-group")
    committed = 0
    for round_ in range(2):
        consumer = Consumer(
            {
                "bootstrap.servers": cluster.running_bootstrap(),
                "group.id": group,
                "enable.auto.commit": False,
            }
        )
        try:
            # Commits from a consumer outside any generation (Kafka's "simple" commits).
            consumer.commit(offsets=[TopicPartition(topic, 0, committed + 1)], asynchronous=False)
            committed += 1
            group_admin = admin(cluster.running_bootstrap())
            described = group_admin.describe_consumer_groups([group])[group].result(timeout=10)
            coordinator = described.coordinator.id
            for _ in range(50):
                consumer.commit(
                    offsets=[TopicPartition(topic, 0, committed + 1)], asynchronous=False
                )
                committed += 1
        finally:
            consumer.close()
        cluster.node(coordinator).kill9()  # right after the last answer
        survivors = admin(cluster.running_bootstrap())

        def committed_offset():
            # A fresh client per attempt: one made just after the kill can be told the
            # dead node by a survivor that has not applied its fencing yet; librdkafka's
            # admin then waits on that broker's handle, which it destroys once Metadata
            # stops listing the node, and the call never completes (librdkafka 2.16;
            # seen in about 1 run in 10 on a loaded machine).
            client = admin(cluster.running_bootstrap())
            request = [ConsumerGroupTopicPartitions(group)]
            result = client.list_consumer_group_offsets(request)[group].result(timeout=10)
            return result.topic_partitions[0].offset

        got = wait_for(committed_offset, 60, f"the committed offset after killing node {coordinator}")
        assert got == committed, f"round {round_}: committed {committed}, the new coordinator has {got}"
        cluster.start_node(coordinator)
        wait_for(
            lambda: all_in_sync(survivors, topic, 1, 3),
            SETTLE_TIMEOUT_S,
            f"node {coordinator} back in the ISR",
        )


def test_native_consumer_is_not_paced_by_a_quiet_leader(rill_cluster_factory):
    """`rill bench consume` (the native client) reads a partition whose leader has data
    while the other leaders' partitions are empty. The client keeps one Fetch in flight
    per leader across polls; when it waited for every leader's answer before the next
    round, each 1 MiB round took the quiet leaders' whole fetch wait (500 ms), and a
    three-node cluster was read at 2 MB/s."""
    import json
    import subprocess

    from rill_harness import rill_binary

    cluster = rill_cluster_factory()
    bootstrap = cluster.node(1).bootstrap
    topic = unique_topic("quiet-leaders")
    create_replicated_topic(bootstrap, topic, 3, 1)
    md = admin(bootstrap).list_topics(topic=topic, timeout=10)
    leaders = {p: m.leader for p, m in md.topics[topic].partitions.items()}
    assert len(set(leaders.values())) == 3, leaders

    records = 16_000  # 16 MiB in partition 0: 16 rounds of max.partition.fetch.bytes
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    value = b"x" * 1024
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, value=value, partition=0)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0

    out = subprocess.run(
        [str(rill_binary()), "bench", "consume", "--topic", topic, "--records", str(records),
         "-b", bootstrap, "--output", "json", "--idle-timeout-ms", "60000"],
        check=True, capture_output=True, text=True, timeout=120,
    )
    report = json.loads(out.stdout)
    assert report["records"] == records, report
    # Paced by the quiet leaders this takes 16 x 500 ms = 8 s at the least; unpaced it
    # is a fraction of a second even on a loaded machine.
    assert report["seconds"] < 4.0, report


def _internal_topic_layout(bootstrap: str, topic: str) -> tuple[set[int], str]:
    """(the replica counts of `topic`'s partitions, its min.insync.replicas)."""
    from confluent_kafka.admin import ConfigResource

    client = admin(bootstrap)
    md = client.list_topics(topic=topic, timeout=10)
    counts = {len(p.replicas) for p in md.topics[topic].partitions.values()}
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = client.describe_configs([resource])[resource].result(timeout=10)
    return counts, configs["min.insync.replicas"].value


def _use_groups_and_transactions(bootstrap: str, topic: str) -> None:
    """Creates `__consumer_offsets` (a commit) and `__transaction_state` (a transaction)."""
    from confluent_kafka import TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("g")})
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
    finally:
        consumer.close()
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": unique_topic("t")})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"v")
    producer.commit_transaction(30)


def test_internal_topics_default_to_three_replicas_on_three_nodes(rill_cluster_factory):
    """Unset, `offsets.topic.replication.factor` and `transaction.state.log.replication.factor`
    are Kafka's 3 and `transaction.state.log.min.isr` Kafka's 2, so a default cluster's
    coordinators fail over; after a SIGKILL a transaction still commits."""
    cluster = rill_cluster_factory(overrides={"offsets.topic.replication.factor": None})
    topic = unique_topic("internal-rf")
    create_replicated_topic(cluster.bootstrap, topic, 1, 3)
    _use_groups_and_transactions(cluster.bootstrap, topic)
    assert _internal_topic_layout(cluster.bootstrap, "__consumer_offsets")[0] == {3}
    assert _internal_topic_layout(cluster.bootstrap, "__transaction_state") == ({3}, "2")
    cluster.node(3).kill9()
    _use_groups_and_transactions(cluster.running_bootstrap(), topic)


def test_internal_topics_on_a_single_node_get_one_replica(rill):
    """The default of 3 is capped at the brokers live when the topic is made: a single node
    gets one replica (and a min ISR of 1), where Kafka's default would refuse groups and
    transactions until the cluster had three brokers."""
    topic = unique_topic("internal-rf1")
    create_replicated_topic(rill.bootstrap, topic, 1, 1)
    _use_groups_and_transactions(rill.bootstrap, topic)
    assert _internal_topic_layout(rill.bootstrap, "__consumer_offsets")[0] == {1}
    assert _internal_topic_layout(rill.bootstrap, "__transaction_state") == ({1}, "1")
