"""Log lifecycle against the real broker: compaction keeps the latest value per key,
DeleteRecords and a live retention.ms change take effect without a restart, and a consumer
whose offset fell below the log start resets as configured; the cleaner's I/O bound is
set at run time and slows a clean down to it."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)
from kafka_helpers import create_topic, read_all, unique_topic, wait_for
from test_configs import alter_cluster_default

FAST_MAINTENANCE = {
    "log.retention.check.interval.ms": "200",
    "log.cleaner.backoff.ms": "200",
}


def partition_bytes(data_dir: Path, topic: str) -> int:
    """Bytes in the partition's segment files now. The cleaner and retention run in the
    background and may delete a segment between the listing and its stat: a file that
    is gone by then holds no bytes."""
    total = 0
    for f in (data_dir / f"{topic}-0").glob("*.log"):
        try:
            total += f.stat().st_size
        except FileNotFoundError:
            pass
    return total


def produce(bootstrap: str, topic: str, records) -> None:
    # Batches must fit the small segments these tests use: Kafka refuses a batch larger
    # than segment.bytes (RECORD_LIST_TOO_LARGE).
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all", "batch.size": 16384}
    )
    errors = []

    def report(error, _message):
        if error is not None:
            errors.append(error)

    for key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value, partition=0, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0
    assert errors == [], f"{len(errors)} deliveries failed, first: {errors[:3]}"


def test_compaction_keeps_the_latest_value_per_key(rill_factory):
    rill = rill_factory(overrides=FAST_MAINTENANCE)
    topic = unique_topic("compacted")
    create_topic(
        rill.bootstrap,
        topic,
        1,
        {
            "cleanup.policy": "compact",
            "segment.bytes": "65536",
            "segment.ms": "1000",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "0",
        },
    )
    keys = 1000
    total = 100_000
    records = [(f"key-{i % keys}".encode(), f"value-{i}".encode()) for i in range(total)]
    produce(rill.bootstrap, topic, records)
    latest = {}
    for offset, (key, value) in enumerate(records):
        latest[key] = (offset, value)
    before = partition_bytes(rill.data_dir, topic)

    def compacted():
        got = read_all(rill.bootstrap, topic, 1)[0]
        return len(got) == keys and got

    got = wait_for(compacted, 120, "the log to hold one record per key", interval_s=1.0)
    for offset, record in got.items():
        expected_offset, expected_value = latest[record.key]
        assert offset == expected_offset, "compaction must keep original offsets"
        assert record.value == expected_value
    after = partition_bytes(rill.data_dir, topic)
    print(f"\ncompaction: {before} bytes -> {after} bytes")
    assert after < before / 5


def test_compaction_removes_aborted_transactions_and_then_their_markers(rill_factory):
    """A compacted topic written by a transactional producer: the cleaner removes what
    aborted transactions wrote (a read_uncommitted reader no longer sees it), keeps each
    key's latest committed value, and once nothing of a transaction is left removes its
    marker after delete.retention.ms (0 here), the ABORT markers with their entries in the
    aborted-transaction index, whose files then go."""
    from chaos_txn import read_isolated

    rill = rill_factory(overrides=FAST_MAINTENANCE)
    topic = unique_topic("compacted-txn")
    create_topic(
        rill.bootstrap,
        topic,
        1,
        {
            "cleanup.policy": "compact",
            "segment.bytes": "65536",
            "segment.ms": "500",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "0",
        },
    )
    producer = Producer({"bootstrap.servers": rill.bootstrap, "transactional.id": f"tx-{topic}",
                         "linger.ms": 5})
    producer.init_transactions(30)
    latest, aborted = {}, set()
    # The last one commits: the producer's latest batch is kept (emptied) with the
    # marker after it, which would hold an aborted transaction's index entry.
    for t in range(21):
        producer.begin_transaction()
        values = {f"key-{(t * 7 + i) % 10}".encode(): f"t{t}-{i}".encode() for i in range(5)}
        for key, value in values.items():
            producer.produce(topic, key=key, value=value, partition=0)
        if t % 2:
            # Flushed first: librdkafka purges at an abort what it has not sent.
            assert producer.flush(30) == 0
            producer.abort_transaction(30)
            aborted.update(values.values())
        else:
            producer.commit_transaction(30)
            latest.update(values)
    ticker = Producer({"bootstrap.servers": rill.bootstrap, "linger.ms": 0})
    partition_dir = rill.data_dir / f"{topic}-0"

    def cleaned():
        # Segments roll by time on the next append; the active one is never cleaned.
        ticker.produce(topic, key=b"tick", value=b"tick", partition=0)
        ticker.flush(10)
        uncommitted = read_isolated(rill.bootstrap, topic, 1, "read_uncommitted")[0]
        seen = {v for _o, _k, v in uncommitted}
        txn_indexes = list(partition_dir.glob("*.txnindex"))
        return not (seen & aborted) and not txn_indexes and uncommitted

    uncommitted = wait_for(cleaned, 90, "the aborted records and the ABORT markers' index entries to go",
                           interval_s=1.0)
    committed = read_isolated(rill.bootstrap, topic, 1, "read_committed")[0]
    for records in (uncommitted, committed):
        got = {k: v for _o, k, v in records if k != b"tick"}
        assert got == latest, (got, latest)


def test_delete_records_and_live_retention(rill_factory):
    rill = rill_factory(overrides=FAST_MAINTENANCE)
    topic = unique_topic("retention")
    admin = create_topic(rill.bootstrap, topic, 1, {"segment.bytes": "16384"})
    produce(rill.bootstrap, topic, [(None, f"v{i}".encode() * 10) for i in range(5000)])

    consumer = Consumer(
        {
            "bootstrap.servers": rill.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        assert (low, high) == (0, 5000)

        # DeleteRecords moves the low watermark at once.
        result = admin.delete_records([TopicPartition(topic, 0, 1200)])
        deleted = result[TopicPartition(topic, 0, 1200)].result(timeout=30)
        assert deleted.low_watermark == 1200
        low, _ = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
        assert low == 1200

        # A consumer positioned below the log start resets by its policy (earliest).
        consumer.assign([TopicPartition(topic, 0, 10)])
        first = None
        deadline = time.monotonic() + 30
        while first is None and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                first = message.offset()
        assert first == 1200

        # A live retention.ms change deletes every closed segment without a restart.
        resource = ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)
            ],
        )
        admin.incremental_alter_configs([resource])[resource].result(timeout=30)
        described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, topic)])
        entries = list(described.values())[0].result(timeout=30)
        assert entries["retention.ms"].value == "1"

        def trimmed():
            low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, 0), timeout=10, cached=False
            )
            return low > 4000 and high == 5000

        wait_for(trimmed, 60, "retention to delete the old segments")
    finally:
        consumer.close()
    assert isinstance(admin, AdminClient)


CLEANED = re.compile(r"cleaned log.*?bytes_read=(\d+).*?clean_ms=([\d.]+).*?throttled_ms=([\d.]+)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_cleaner_backoff_is_dynamic(rill_factory):
    """log.cleaner.backoff.ms is dynamic, as in Kafka: a cleaner started with a ten-minute
    wait cleans a dirty log within seconds once the wait is lowered at run time."""
    rill = rill_factory(overrides={"log.cleaner.backoff.ms": "600000"})
    topic = unique_topic("backoff-clean")
    create_topic(
        rill.bootstrap,
        topic,
        1,
        {
            "cleanup.policy": "compact",
            "segment.bytes": "16384",
            "min.cleanable.dirty.ratio": "0.01",
        },
    )
    produce(rill.bootstrap, topic, [(f"key-{i % 10}".encode(), bytes(500)) for i in range(400)])

    def cleaned() -> bool:
        return "cleaned log" in ANSI.sub("", rill.log_text())

    time.sleep(3)
    assert not cleaned(), "the cleaner ran inside its ten-minute wait"
    assert alter_cluster_default(rill.bootstrap, {"log.cleaner.backoff.ms": "200"}) == (0, None)
    wait_for(cleaned, 30, "a clean once the wait is 200 ms", interval_s=0.5)


def test_cleaner_io_bound_is_dynamic_and_slows_cleaning(rill_factory):
    """log.cleaner.io.max.bytes.per.second is a dynamic cluster-wide config: a bad value
    is refused with INVALID_REQUEST (Kafka's answer on a BROKER resource), and a set
    bound makes the next clean sleep so that it
    reads no faster than the bound allows (the broker's `cleaned log` line says how long)."""
    rill = rill_factory(overrides=FAST_MAINTENANCE)
    key = "log.cleaner.io.max.bytes.per.second"
    assert alter_cluster_default(rill.bootstrap, {key: "0"})[0] == 42  # INVALID_REQUEST
    rate = 1_000_000
    assert alter_cluster_default(rill.bootstrap, {key: str(rate)}) == (0, None)
    topic = unique_topic("throttled-clean")
    create_topic(
        rill.bootstrap,
        topic,
        1,
        {
            "cleanup.policy": "compact",
            "segment.bytes": "65536",
            "segment.ms": "1000",
            "min.cleanable.dirty.ratio": "0.01",
            # Nothing is cleanable until it is 5 s old, so that the first clean takes the
            # whole 2 MB at once however slowly a loaded machine produces it (cleans
            # that ran while it was being written each read less than the 1 MB below).
            "min.compaction.lag.ms": "5000",
        },
    )
    # About 2 MB over 50 keys: cleaning it reads far more than one interval's allowance.
    records = [(f"key-{i % 50}".encode(), bytes(1000)) for i in range(2000)]
    produce(rill.bootstrap, topic, records)

    def cleans():
        text = ANSI.sub("", rill.log_text())
        return [tuple(map(float, m.groups())) for m in CLEANED.finditer(text)]

    found = wait_for(
        lambda: [c for c in cleans() if c[0] > 1_000_000] or None,
        120,
        "a clean of more than 1 MB",
        interval_s=0.5,
    )
    for bytes_read, clean_ms, throttled_ms in found:
        assert throttled_ms > 0, (bytes_read, clean_ms, throttled_ms)
        # At most one 300 ms interval's allowance (0.3 MB at 1 MB/s) goes unthrottled.
        floor_ms = (bytes_read - 0.3 * rate) / rate * 1000
        assert clean_ms >= floor_ms, (bytes_read, clean_ms, floor_ms)
