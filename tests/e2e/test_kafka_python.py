"""kafka-python (a pure-Python client, independent of librdkafka) against rill: its admin
client creates and deletes topics, its producer and consumer round-trip records."""

import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import TopicAlreadyExistsError

from kafka_helpers import unique_topic, wait_for

PARTITIONS = 2
RECORDS = 2_000


@pytest.fixture
def kp_admin(rill):
    client = KafkaAdminClient(bootstrap_servers=rill.bootstrap, request_timeout_ms=30_000)
    yield client
    client.close()


def create(kp_admin, topic, partitions):
    kp_admin.create_topics(
        {topic: {"num_partitions": partitions, "replication_factor": 1}},
        timeout_ms=30_000,
        wait_for_metadata=True,
    )


def partition_count(kp_admin, topic) -> int:
    (described,) = kp_admin.describe_topics([topic])
    return len(described["partitions"])


def test_kafka_python_admin_create_and_delete(kp_admin):
    topic = unique_topic("kp-admin")
    create(kp_admin, topic, 4)
    assert topic in kp_admin.list_topics()
    assert partition_count(kp_admin, topic) == 4

    with pytest.raises(TopicAlreadyExistsError):
        create(kp_admin, topic, 4)

    kp_admin.delete_topics([topic], timeout_ms=30_000)
    wait_for(lambda: topic not in kp_admin.list_topics(), 30, f"{topic} to be deleted")


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_kafka_python_roundtrip(rill, kp_admin, compression):
    topic = unique_topic("kp-roundtrip")
    create(kp_admin, topic, PARTITIONS)

    producer = KafkaProducer(
        bootstrap_servers=rill.bootstrap,
        acks="all",
        compression_type=compression,
        linger_ms=5,
        request_timeout_ms=30_000,
    )
    base_ts = int(time.time() * 1000) - 60_000
    futures = []
    for i in range(RECORDS):
        futures.append(
            producer.send(
                topic,
                key=f"key-{i}".encode(),
                value=f"value-{i}".encode() * 3,
                headers=[("seq", str(i).encode())],
                partition=i % PARTITIONS,
                timestamp_ms=base_ts + i,
            )
        )
    producer.flush(timeout=60)
    placed = {}
    for i, future in enumerate(futures):
        metadata = future.get(timeout=30)
        assert metadata.topic == topic and metadata.partition == i % PARTITIONS
        placed[(metadata.partition, metadata.offset)] = i
    producer.close(timeout=10)
    # Records sent to one partition in order get dense offsets in that order.
    for p in range(PARTITIONS):
        in_partition = sorted(offset for (q, offset) in placed if q == p)
        assert in_partition == list(range(RECORDS // PARTITIONS))
        assert [placed[(p, o)] for o in in_partition] == list(range(p, RECORDS, PARTITIONS))

    consumer = KafkaConsumer(
        bootstrap_servers=rill.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        request_timeout_ms=30_000,
    )
    try:
        partitions = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(partitions)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(partitions, timeout_ms=30_000)
        assert ends == {tp: RECORDS // PARTITIONS for tp in partitions}

        seen = {}
        deadline = time.monotonic() + 60
        while len(seen) < RECORDS and time.monotonic() < deadline:
            for tp, messages in consumer.poll(timeout_ms=1000).items():
                for message in messages:
                    key = (tp.partition, message.offset)
                    assert key not in seen, f"{key} delivered twice"
                    seen[key] = message
        assert len(seen) == RECORDS, f"read {len(seen)} of {RECORDS} records within 60 s"
        for (p, offset), message in seen.items():
            i = placed[(p, offset)]
            assert message.key == f"key-{i}".encode()
            assert message.value == f"value-{i}".encode() * 3
            assert list(message.headers) == [("seq", str(i).encode())]
            assert message.timestamp == base_ts + i
    finally:
        consumer.close()
