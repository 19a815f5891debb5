"""Per-record produce errors (KIP-467): a batch with some invalid records is refused whole,
and the Produce response names the records at fault in `record_errors`, so that the
producer fails those with the broker's reason and the rest of the batch with
_INVALID_DIFFERENT_RECORD (librdkafka), instead of failing every record alike. This is
what librdkafka's test 0011 (`test_message_single_partition_record_fail`) checks.
confluent-kafka shows the codes; kafka-python, which keeps the broker's per-record
message, shows the words (Kafka's `LogValidator` messages)."""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, Producer
from kafka import KafkaProducer
from kafka_helpers import create_topic, read_all, unique_topic

TIMEOUT_S = 30


def produce_one_batch(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, int]]):
    """Sends the records as one batch to partition 0 and returns each one's delivery error
    (None when delivered), in order."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            # One batch: everything is queued before the first send.
            "linger.ms": 1000,
            "batch.num.messages": 10_000,
            "retries": 0,
            "enable.idempotence": False,
        }
    )
    outcomes: dict[int, KafkaError | None] = {}
    for index, (key, value, timestamp) in enumerate(records):
        producer.produce(
            topic,
            value=value,
            key=key,
            partition=0,
            timestamp=timestamp,
            on_delivery=lambda err, _msg, index=index: outcomes.__setitem__(index, err),
        )
    assert producer.flush(TIMEOUT_S) == 0, "deliveries outstanding"
    return [outcomes[i] for i in range(len(records))]


def produce_one_batch_kafka_python(bootstrap: str, topic: str, records) -> list[str | None]:
    """As `produce_one_batch`, through kafka-python: each record's exception text."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=1000, retries=0, enable_idempotence=False
    )
    try:
        futures = [
            producer.send(topic, value=value, key=key, partition=0, timestamp_ms=timestamp)
            for key, value, timestamp in records
        ]
        producer.flush(timeout=TIMEOUT_S)
        outcomes = []
        for future in futures:
            assert future.is_done, "a delivery is outstanding"
            outcomes.append(None if future.succeeded() else str(future.exception))
        return outcomes
    finally:
        producer.close(timeout=TIMEOUT_S)


OTHER_RECORD = "part of a batch which had one more more invalid records"


def test_keyless_records_in_a_compacted_topic_fail_alone(rill):
    topic = unique_topic("record-errors-compact")
    create_topic(rill.bootstrap, topic, 1, {"cleanup.policy": "compact"})
    now = int(time.time() * 1000)
    records = [(None if i % 3 == 0 else f"k{i}".encode(), f"v{i}".encode(), now) for i in range(10)]
    errors = produce_one_batch(rill.bootstrap, topic, records)

    keyless = [i for i, (key, _, _) in enumerate(records) if key is None]
    assert keyless == [0, 3, 6, 9]
    for i, error in enumerate(errors):
        assert error is not None, f"record {i} was written although its batch holds keyless records"
        if i in keyless:
            assert error.code() == KafkaError.INVALID_RECORD, (i, error)
        else:
            # Without record_errors every record gets INVALID_RECORD: this is the change.
            assert error.code() == KafkaError._INVALID_DIFFERENT_RECORD, (i, error)

    texts = produce_one_batch_kafka_python(rill.bootstrap, topic, records)
    for i, text in enumerate(texts):
        if i in keyless:
            assert (
                f"Compacted topic cannot accept message without key in topic partition {topic}-0"
                in text
            ), (i, text)
        else:
            assert OTHER_RECORD in text, (i, text)

    # Nothing of the refused batches was written; a batch of keyed records still is.
    assert produce_one_batch(rill.bootstrap, topic, [(b"k", b"ok", now)]) == [None]
    stored = read_all(rill.bootstrap, topic, 1)[0]
    assert [(offset, r.value) for offset, r in sorted(stored.items())] == [(0, b"ok")]


def test_an_old_timestamp_fails_alone_with_invalid_timestamp(rill):
    topic = unique_topic("record-errors-timestamp")
    create_topic(rill.bootstrap, topic, 1, {"message.timestamp.before.max.ms": "3600000"})
    now = int(time.time() * 1000)
    two_hours_ago = now - 2 * 3_600_000
    records = [(b"k", b"v0", now), (b"k", b"v1", two_hours_ago), (b"k", b"v2", now)]
    errors = produce_one_batch(rill.bootstrap, topic, records)

    # With a single record error librdkafka fails the whole batch with the partition's
    # code, as it does against Kafka 4.1; kafka-python tells the records apart.
    assert [e.code() if e else None for e in errors] == [KafkaError.INVALID_TIMESTAMP] * 3, errors

    texts = produce_one_batch_kafka_python(rill.bootstrap, topic, records)
    assert (
        f"Timestamp {two_hours_ago} of message with offset 1 is out of range. The timestamp "
        "should be within [" in texts[1]
    ), texts
    assert OTHER_RECORD in texts[0] and OTHER_RECORD in texts[2], texts
