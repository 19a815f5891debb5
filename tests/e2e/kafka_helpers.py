"""confluent-kafka helpers shared by the end-to-end tests: topics, bounded waits, reading a
whole topic back by explicit assignment (no group coordination involved)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

# Every client call is bounded; these are the bounds.
ADMIN_TIMEOUT_S = 30.0
METADATA_TIMEOUT_S = 30.0
CONSUME_TIMEOUT_S = 120.0


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.2):
    """Polls `predicate` until it returns something truthy; fails with `what` on timeout."""
    deadline = time.monotonic() + timeout_s
    last_error = None
    while time.monotonic() < deadline:
        try:
            result = predicate()
            if result:
                return result
        except Exception as error:  # a broker still settling may answer with errors
            last_error = error
        time.sleep(interval_s)
    detail = f" (last error: {last_error!r})" if last_error else ""
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}{detail}")


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(
    bootstrap: str, topic: str, partitions: int, config: dict[str, str] | None = None
) -> AdminClient:
    """Creates the topic and waits until metadata shows every partition with a leader."""
    client = admin(bootstrap)
    futures = client.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})],
        operation_timeout=ADMIN_TIMEOUT_S,
        request_timeout=ADMIN_TIMEOUT_S,
    )
    futures[topic].result(timeout=ADMIN_TIMEOUT_S)
    wait_for_leaders(client, topic, partitions)
    return client


def wait_for_leaders(client: AdminClient, topic: str, partitions: int) -> None:
    def ready():
        metadata = client.list_topics(topic=topic, timeout=5)
        described = metadata.topics.get(topic)
        if described is None or described.error is not None:
            return False
        return len(described.partitions) == partitions and all(
            p.leader >= 0 and p.error is None for p in described.partitions.values()
        )

    wait_for(ready, METADATA_TIMEOUT_S, f"topic {topic} to have {partitions} led partitions")


def topic_names(client: AdminClient) -> set[str]:
    return set(client.list_topics(timeout=10).topics)


@dataclass(frozen=True)
class Record:
    key: bytes | None
    value: bytes | None
    headers: tuple
    timestamp: int


def watermarks(consumer: Consumer, topic: str, partitions: int) -> dict[int, tuple[int, int]]:
    return {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
        for p in range(partitions)
    }


def reading_consumer(bootstrap: str, **extra) -> Consumer:
    """A consumer for explicit assignment: a group id (librdkafka wants one) but no commits."""
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": f"e2e-reader-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",
    }
    config.update(extra)
    return Consumer(config)


def read_all(
    bootstrap: str, topic: str, partitions: int, timeout_s: float = CONSUME_TIMEOUT_S
) -> dict[int, dict[int, Record]]:
    """Reads every partition from offset 0 to its end.

    The end is where the consumer reports end-of-partition, and never before the high
    watermark taken first, so a broker that under-reports its watermark still shows all
    it stores. Returns {partition: {offset: Record}}; fails on a consumer error, on an
    offset delivered twice, or when the end is not reached in time.
    """
    consumer = reading_consumer(bootstrap, **{"enable.partition.eof": True})
    try:
        ends = {p: high for p, (_low, high) in watermarks(consumer, topic, partitions).items()}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got: dict[int, dict[int, Record]] = {p: {} for p in range(partitions)}
        next_offset = {p: 0 for p in range(partitions)}
        at_eof: set[int] = set()
        deadline = time.monotonic() + timeout_s

        def done() -> bool:
            return all(p in at_eof and next_offset[p] >= ends[p] for p in range(partitions))

        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"read_all({topic}) timed out after {timeout_s:.0f} s: positions "
                    f"{next_offset}, watermarks {ends}, at end {sorted(at_eof)}"
                )
            for message in consumer.consume(num_messages=1000, timeout=1.0):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        at_eof.add(message.partition())
                        continue
                    raise AssertionError(f"consumer error: {error}")
                p, offset = message.partition(), message.offset()
                assert offset not in got[p], f"offset {offset} of partition {p} delivered twice"
                _ts_type, timestamp = message.timestamp()
                got[p][offset] = Record(
                    message.key(), message.value(), tuple(message.headers() or ()), timestamp
                )
                next_offset[p] = max(next_offset[p], offset + 1)
                at_eof.discard(p)
        return got
    finally:
        consumer.close()


def produce_and_read_back(bootstrap: str, count: int = 100) -> None:
    """A small end-to-end check that the server still serves ordinary clients."""
    topic = unique_topic("alive")
    create_topic(bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    delivered = []

    def on_delivery(error, message):
        assert error is None, f"delivery failed: {error}"
        delivered.append(message.offset())

    for i in range(count):
        producer.produce(
            topic, key=f"k{i}".encode(), value=f"v{i}".encode(), on_delivery=on_delivery
        )
    assert producer.flush(30) == 0, "producer did not deliver everything within 30 s"
    assert sorted(delivered) == list(range(count))
    records = read_all(bootstrap, topic, 1, timeout_s=60)[0]
    assert sorted(records) == list(range(count))
    for offset, record in records.items():
        assert (record.key, record.value) == (f"k{offset}".encode(), f"v{offset}".encode())


def restart_and_check_acknowledged(rill, client: AdminClient, topic: str, partitions: int, acked):
    """Restarts `rill` (after a kill), reads the topic back and checks the server's promise:
    offsets dense in every partition, and every acknowledged `(partition, offset, value)`
    stored at its offset with its value. Returns what was stored."""
    rill.restart()
    wait_for_leaders(client, topic, partitions)
    stored = read_all(rill.bootstrap, topic, partitions)
    for p, records in stored.items():
        assert sorted(records) == list(range(len(records))), f"partition {p} has offset gaps"
    for p, offset, value in acked:
        assert offset in stored[p], f"acknowledged record {p}/{offset} is missing after restart"
        assert stored[p][offset].value == value, (
            f"acknowledged record {p}/{offset} changed: {stored[p][offset].value[:24]!r} "
            f"!= {value[:24]!r}"
        )
    return stored
