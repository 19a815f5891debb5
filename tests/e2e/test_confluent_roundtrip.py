"""confluent-kafka (librdkafka) against rill: an idempotent, compressed produce of 30,000
keyed records with headers and explicit timestamps, read back by explicit assignment and
compared record by record at the offsets the producer was given; then watermarks,
offsets_for_times, DescribeConfigs and topic deletion."""

import bisect
import functools
import time

import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import ConfigResource, ResourceType

from kafka_helpers import (
    ADMIN_TIMEOUT_S,
    Record,
    create_topic,
    read_all,
    reading_consumer,
    topic_names,
    unique_topic,
    wait_for,
    watermarks,
)

RECORDS = 30_000
PARTITIONS = 3
RETENTION_MS = "172800000"  # two days: set at creation, so DescribeConfigs must echo it


def record_for(i: int, base_ts: int) -> Record:
    # Values mix a repeated text with varying bytes so that every codec has work to do.
    value = f"value-{i:06d}|".encode() + bytes((i * 31 + j * 7) % 251 for j in range(48))
    headers = (("seq", str(i).encode()), ("source", b"e2e"), ("empty", b""), ("null", None))
    return Record(f"key-{i % 997}".encode(), value, headers, base_ts + i)


@pytest.mark.parametrize("compression", ["lz4", "gzip", "snappy", "zstd"])
def test_confluent_roundtrip(rill, compression):
    topic = unique_topic(f"roundtrip-{compression}")
    admin = create_topic(rill.bootstrap, topic, PARTITIONS, {"retention.ms": RETENTION_MS})

    # Explicit timestamps one millisecond apart, in produce order: the idempotent producer
    # keeps order per partition, so timestamps increase with offset in every partition and
    # offsets_for_times has exactly one right answer.
    base_ts = int(time.time() * 1000) - 3_600_000
    produced = [record_for(i, base_ts) for i in range(RECORDS)]
    delivered: dict[int, tuple[int, int]] = {}
    errors = []

    def on_delivery(i, error, message):
        if error is not None:
            errors.append((i, error))
        else:
            delivered[i] = (message.partition(), message.offset())

    producer = Producer(
        {
            "bootstrap.servers": rill.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": compression,
            "linger.ms": 5,
        }
    )
    for i, record in enumerate(produced):
        while True:
            try:
                producer.produce(
                    topic,
                    key=record.key,
                    value=record.value,
                    headers=list(record.headers),
                    timestamp=record.timestamp,
                    on_delivery=functools.partial(on_delivery, i),
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(120) == 0, "not every record was delivered within 120 s"
    assert errors == [], f"{len(errors)} deliveries failed, first: {errors[:3]}"
    assert len(delivered) == RECORDS

    # The offsets the broker gave are dense per partition.
    counts = {}
    for p in range(PARTITIONS):
        offsets = sorted(o for (dp, o) in delivered.values() if dp == p)
        assert offsets, f"partition {p} got no records (keys should spread over all)"
        assert offsets == list(range(len(offsets))), f"partition {p} offsets are not dense"
        counts[p] = len(offsets)

    # Every record reads back, unchanged, at the offset its delivery report named.
    got = read_all(rill.bootstrap, topic, PARTITIONS)
    assert {p: len(records) for p, records in got.items()} == counts
    for i, (p, offset) in delivered.items():
        assert got[p][offset] == produced[i], f"record {i} at {p}/{offset} differs"

    consumer = reading_consumer(rill.bootstrap)
    try:
        assert watermarks(consumer, topic, PARTITIONS) == {p: (0, counts[p]) for p in counts}

        # offsets_for_times: the earliest offset whose timestamp is >= the one asked for.
        for p in range(PARTITIONS):
            timestamps = [got[p][o].timestamp for o in range(counts[p])]
            assert timestamps == sorted(timestamps)
            probes = {base_ts - 60_000, timestamps[0], timestamps[-1], timestamps[-1] + 1}
            for offset in range(0, counts[p], max(1, counts[p] // 25)):
                probes |= {timestamps[offset], timestamps[offset] - 1}
            # One partition per call: a ListOffsets request may name a partition only once
            # (Kafka answers duplicates with INVALID_REQUEST), so probes go one at a time.
            for ts in sorted(probes):
                query = TopicPartition(topic, p, ts)
                answers = consumer.offsets_for_times([query], timeout=10)
                assert len(answers) == 1
                answer = answers[0]
                assert answer.error is None, f"offsets_for_times({query.offset}): {answer.error}"
                index = bisect.bisect_left(timestamps, query.offset)
                expected = index if index < len(timestamps) else -1
                assert answer.offset == expected, (
                    f"partition {p}: offsets_for_times({query.offset}) gave {answer.offset}, "
                    f"expected {expected}"
                )
    finally:
        consumer.close()

    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource], request_timeout=ADMIN_TIMEOUT_S)[resource].result(
        timeout=ADMIN_TIMEOUT_S
    )
    assert entries["retention.ms"].value == RETENTION_MS
    assert entries["cleanup.policy"].value == "delete"

    admin.delete_topics([topic], operation_timeout=ADMIN_TIMEOUT_S)[topic].result(
        timeout=ADMIN_TIMEOUT_S
    )
    wait_for(lambda: topic not in topic_names(admin), 30, f"{topic} to leave list_topics")
