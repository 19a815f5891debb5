"""Retention, DeleteRecords and compaction on a replicated cluster (issue #6, item 4).

Three real nodes, a topic with three replicas. Every replica runs retention and the
cleaner on its own log; followers also adopt the leader's log start offset from each
fetch response. Only the leader answers ListOffsets and serves consumers, so each
replica is checked by making it the leader — a reassignment that puts it first in the
replica list, then a preferred-leader election (`rill topic reassign`, `rill cluster
elect-leaders`) — and asking it, with real clients, where the log starts and what a
consumer from the beginning reads.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

from kafka_helpers import unique_topic, wait_for
from test_cluster import create_replicated_topic

FAST_MAINTENANCE = {
    "log.retention.check.interval.ms": "200",
    "log.cleaner.backoff.ms": "200",
    # Leadership moves only when the test moves it.
    "auto.leader.rebalance.enable": "false",
}
CLI_TIMEOUT_S = 30.0
MOVE_TIMEOUT_S = 30.0


def rill_json(cluster, *args: str):
    node = next(iter(cluster.nodes.values()))
    command = [str(node.binary), *args, "--bootstrap-server", cluster.running_bootstrap()]
    command += ["--output", "json"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=CLI_TIMEOUT_S)
    assert result.returncode == 0, f"{' '.join(args)}: {result.stderr.strip()}"
    return json.loads(result.stdout)


def describe_partition(cluster, topic: str) -> dict:
    described = rill_json(cluster, "topic", "describe", topic)
    return next(p for p in described[0]["partitions"] if p["partition"] == 0)


def settled_partition(cluster, topic: str) -> dict:
    """Partition 0 as described once the answering broker knows it led and in sync: a
    broker that has not applied the latest metadata yet may not know the topic at all."""
    return wait_for(
        lambda: (p := describe_partition(cluster, topic))["leader"] >= 0
        and len(p["isr"]) == len(p["replicas"])
        and p,
        MOVE_TIMEOUT_S,
        f"{topic}-0 to be described with a leader and every replica in sync",
    )


def lead_by(cluster, topic: str, node_id: int) -> None:
    """Makes `node_id` the leader of partition 0: first in the replica list, then the
    preferred-leader election; returns once it leads with every replica in sync."""
    current = settled_partition(cluster, topic)
    if current["leader"] != node_id:
        replicas = [node_id] + [r for r in current["replicas"] if r != node_id]
        rill_json(
            cluster,
            "topic",
            "reassign",
            topic,
            "--partition",
            "0",
            "--replicas",
            ",".join(map(str, replicas)),
        )
        wait_for(
            lambda: describe_partition(cluster, topic)["replicas"] == replicas,
            MOVE_TIMEOUT_S,
            f"the replicas of {topic}-0 to become {replicas}",
        )

        def elected():
            rill_json(cluster, "cluster", "elect-leaders", "--topic", topic, "--partition", "0")
            return describe_partition(cluster, topic)["leader"] == node_id

        wait_for(elected, MOVE_TIMEOUT_S, f"broker {node_id} to lead {topic}-0")
    wait_for(
        lambda: len(describe_partition(cluster, topic)["isr"]) == 3,
        MOVE_TIMEOUT_S,
        f"all replicas of {topic}-0 in sync",
    )


def produce(bootstrap: str, topic: str, records) -> None:
    # acks=all: when it returns, every follower has fetched past these records, so it
    # has had a fetch response sent after anything the leader did before.
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all", "batch.size": 16384}
    )
    errors = []
    for key, value in records:
        while True:
            try:
                producer.produce(
                    topic,
                    key=key,
                    value=value,
                    partition=0,
                    on_delivery=lambda e, _m: e is not None and errors.append(e),
                )
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0
    assert errors == [], f"{len(errors)} deliveries failed, first: {errors[:3]}"


def consumer_for(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )


def watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    """ListOffsets earliest and latest, as the current leader answers them."""
    consumer = consumer_for(bootstrap)
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
    finally:
        consumer.close()


def read_from_beginning(bootstrap: str, topic: str, timeout_s: float = 60) -> dict[int, tuple]:
    """Everything a consumer starting at the beginning reads: {offset: (key, value)}."""
    consumer = consumer_for(bootstrap)
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        got: dict[int, tuple] = {}
        at_end = False
        deadline = time.monotonic() + timeout_s
        while not (at_end and (not got or max(got) + 1 >= high)):
            assert time.monotonic() < deadline, f"reading {topic} timed out at {len(got)} records"
            for message in consumer.consume(num_messages=1000, timeout=1.0):
                error = message.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, f"consumer error: {error}"
                    at_end = True
                    continue
                assert message.offset() not in got, f"offset {message.offset()} read twice"
                got[message.offset()] = (message.key(), message.value())
                at_end = False
        return got
    finally:
        consumer.close()


def value_of(i: int) -> bytes:
    return f"v{i:06d};".encode() * 8


def check_leader_starts_at(cluster, topic: str, node_id: int, at_least: int, end: int) -> int:
    """Node `node_id` leads: its log start is at least `at_least`, a consumer from the
    beginning starts exactly there and reads every record up to `end`, unchanged."""
    lead_by(cluster, topic, node_id)
    low, high = wait_for(
        lambda: (w := watermarks(cluster.running_bootstrap(), topic))[1] == end and w,
        MOVE_TIMEOUT_S,
        f"broker {node_id} to answer ListOffsets for {topic}-0",
    )
    assert low >= at_least, f"broker {node_id}: log start {low}, expected at least {at_least}"
    got = read_from_beginning(cluster.running_bootstrap(), topic)
    assert min(got) == low, f"broker {node_id}: consumer started at {min(got)}, log start {low}"
    assert sorted(got) == list(range(low, high)), f"broker {node_id}: offsets not dense"
    for offset, (_key, value) in got.items():
        assert value == value_of(offset), f"broker {node_id}: record {offset} changed"
    return low


def test_log_start_offset_reaches_every_replica(rill_cluster_factory):
    cluster = rill_cluster_factory(overrides=FAST_MAINTENANCE)
    topic = unique_topic("repl-retention")
    client = create_replicated_topic(
        cluster.bootstrap, topic, 1, 3, config={"segment.bytes": "16384"}
    )
    nodes = settled_partition(cluster, topic)["replicas"]
    produce(cluster.bootstrap, topic, [(None, value_of(i)) for i in range(5000)])

    # DeleteRecords on the leader; followers adopt its log start from their fetches.
    result = client.delete_records([TopicPartition(topic, 0, 1200)])
    assert result[TopicPartition(topic, 0, 1200)].result(timeout=30).low_watermark == 1200
    produce(cluster.bootstrap, topic, [(None, value_of(i)) for i in range(5000, 5050)])
    for node_id in [*nodes[1:], nodes[0]]:
        check_leader_starts_at(cluster, topic, node_id, 1200, 5050)

    # A live retention.ms change: every replica deletes its closed segments, and none
    # starts before the leader that applied it.
    resource = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    client.incremental_alter_configs([resource])[resource].result(timeout=30)
    leader_start = wait_for(
        lambda: (low := watermarks(cluster.running_bootstrap(), topic)[0]) > 4000 and low,
        60,
        "retention to delete the old segments on the leader",
    )
    produce(cluster.bootstrap, topic, [(None, value_of(i)) for i in range(5050, 5100)])
    starts = {nodes[0]: leader_start}
    for node_id in nodes[1:]:
        starts[node_id] = check_leader_starts_at(cluster, topic, node_id, leader_start, 5100)
    print(f"\nlog start offsets after retention.ms=1, by broker: {starts}")


def partition_bytes(cluster, node_id: int, topic: str) -> int:
    directory = cluster.nodes[node_id].data_dir / f"{topic}-0"
    return sum(f.stat().st_size for f in directory.glob("*.log"))


def test_every_replica_compacts(rill_cluster_factory):
    cluster = rill_cluster_factory(overrides=FAST_MAINTENANCE)
    topic = unique_topic("repl-compacted")
    create_replicated_topic(
        cluster.bootstrap,
        topic,
        1,
        3,
        config={
            "cleanup.policy": "compact",
            "segment.bytes": "16384",
            "segment.ms": "1000",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "0",
        },
    )
    nodes = settled_partition(cluster, topic)["replicas"]
    keys, total = 200, 20_000
    records = [(f"key-{i % keys}".encode(), f"value-{i}".encode() * 4) for i in range(total)]
    produce(cluster.bootstrap, topic, records)
    latest = {key: (offset, value) for offset, (key, value) in enumerate(records)}
    raw = sum(len(k) + len(v) for k, v in records)

    # Each replica cleans its own log: every one shrinks, leader and followers alike.
    def all_compacted():
        sizes = {n: partition_bytes(cluster, n, topic) for n in nodes}
        return all(size < raw / 5 for size in sizes.values()) and sizes

    sizes = wait_for(
        all_compacted,
        120,
        f"every replica of {topic}-0 to compact",
        interval_s=1.0,
    )
    print(f"\n{raw} bytes of keys and values, on disk after compaction by broker: {sizes}")

    for node_id in [*nodes[1:], nodes[0]]:
        lead_by(cluster, topic, node_id)

        def compacted():
            got = read_from_beginning(cluster.running_bootstrap(), topic)
            return len(got) == keys and got

        got = wait_for(compacted, 60, f"broker {node_id} to serve one record per key", 1.0)
        for offset, (key, value) in got.items():
            assert (offset, value) == latest[
                key
            ], f"broker {node_id}: {key!r} at {offset} is not the latest value"
