"""A full disk stops the broker; it never acknowledges a write it could not store.

The server runs with RLIMIT_FSIZE set low (no root needed): the write that would grow the
segment past the limit fails with EFBIG, as a write to a full disk fails with ENOSPC
(`rill` ignores SIGXFSZ so that the write returns the error rather than killing it). Kafka's
behaviour for a single log directory follows: the produce gets KAFKA_STORAGE_ERROR, the
directory is marked failed, and the broker shuts down ("all log dirs ... have failed")
with a non-zero exit. Restarted without the limit, it has every acknowledged record at
its offset, nothing else, and serves produce and consume again. On a three-node cluster a
follower whose disk fills stops the same way while the leader carries on without it. A
write to the metadata log that fails stops the node too (Kafka halts on a metadata-log
fault), and no topic whose creation was acknowledged is lost. So does a read that fails.
"""

import time

import pytest
from confluent_kafka import Consumer, KafkaError, Producer

from confluent_kafka.admin import NewTopic

from kafka_helpers import admin, create_topic, read_all, unique_topic, wait_for_leaders
from test_cluster import create_replicated_topic
from test_replicated_lifecycle import lead_by, read_from_beginning, settled_partition

# Large enough for the metadata log and the server's own log, small enough to fill fast.
FILE_SIZE_LIMIT = 4 << 20
VALUE_BYTES = 1000
# Twice the limit: the stream surely reaches it.
MAX_RECORDS = 2 * FILE_SIZE_LIMIT // VALUE_BYTES
EXIT_LOG_DIR_FAILED = 3
EXIT_METADATA_LOG_FAILED = 4


def value_for(sequence: int) -> bytes:
    prefix = f"seq={sequence:09d};".encode()
    return prefix + b"v" * (VALUE_BYTES - len(prefix))


@pytest.mark.parametrize("acks", ["1", "all"])
def test_a_full_disk_stops_the_broker_and_loses_nothing_acknowledged(rill_factory, acks):
    rill = rill_factory(file_size_limit_bytes=FILE_SIZE_LIMIT)
    topic = unique_topic("full")
    client = create_topic(rill.bootstrap, topic, 1)

    # In delivery-report order, which is the partition's order: (offset or None, value,
    # error).
    reports: list[tuple[int | None, bytes, KafkaError | None]] = []

    def on_delivery(error, message):
        offset = message.offset() if error is None else None
        reports.append((offset, message.value(), error))

    producer = Producer(
        {
            "bootstrap.servers": rill.bootstrap,
            "acks": acks,
            "linger.ms": 5,
            # The broker's own error, not librdkafka's retries of it, is what is tested.
            "retries": 0,
            "message.timeout.ms": 10000,
            "reconnect.backoff.max.ms": 500,
        }
    )
    sequence = 0
    while sequence < MAX_RECORDS and rill.is_running():
        try:
            producer.produce(topic, key=b"k", value=value_for(sequence), on_delivery=on_delivery)
            sequence += 1
        except BufferError:
            producer.poll(0.05)
        producer.poll(0)
    code = rill.wait_exit(timeout_s=60)
    producer.flush(20)
    del producer

    log = rill.log_text()
    assert code == EXIT_LOG_DIR_FAILED, f"exit code {code}\n{rill.log_excerpt()}"
    assert "Shutdown broker because all log dirs in" in log, rill.log_excerpt()
    assert str(rill.data_dir) in log and "File too large" in log, rill.log_excerpt()

    acked = [(offset, value) for offset, value, error in reports if error is None]
    errors = [error for _, _, error in reports if error is not None]
    assert acked, "nothing was acknowledged before the disk filled up"
    assert errors, "records past the failure must fail, not succeed"
    assert any(
        e.code() == KafkaError.KAFKA_STORAGE_ERROR for e in errors
    ), f"no KAFKA_STORAGE_ERROR among {sorted({e.name() for e in errors})}"
    first_error = next(i for i, (_, _, e) in enumerate(reports) if e is not None)
    late = [offset for offset, _, error in reports[first_error:] if error is None]
    assert not late, f"records acknowledged after the failure, at offsets {late[:10]}"
    assert sum(len(v) for _, v in acked) >= FILE_SIZE_LIMIT // 2, "the limit hit too early"

    # The disk has room again.
    rill.file_size_limit_bytes = None
    rill.start()
    wait_for_leaders(client, topic, 1)
    stored = read_all(rill.bootstrap, topic, 1)[0]
    assert sorted(stored) == list(range(len(stored))), "offsets are not dense after recovery"
    for offset, value in acked:
        assert offset in stored, f"acknowledged record at {offset} is missing"
        assert stored[offset].value == value, f"acknowledged record at {offset} changed"
    # Records written but not acknowledged (the connection closed before the answer)
    # may be there too, whole; the torn batch that hit the limit is not.
    acked_offsets = {offset for offset, _ in acked}
    for offset, record in stored.items():
        if offset not in acked_offsets:
            assert (
                record.value.startswith(b"seq=") and len(record.value) == VALUE_BYTES
            ), f"unexpected record at {offset}: {record.value[:30]!r}"

    # And it serves again, at the offsets that follow.
    producer = Producer({"bootstrap.servers": rill.bootstrap, "acks": "all", "linger.ms": 5})
    after: list[int] = []
    for i in range(100):
        producer.produce(
            topic,
            value=value_for(sequence + i),
            on_delivery=lambda e, m: after.append(m.offset() if e is None else -1),
        )
    assert producer.flush(20) == 0
    assert after == list(range(len(stored), len(stored) + 100))
    again = read_all(rill.bootstrap, topic, 1)[0]
    assert len(again) == len(stored) + 100
    print(
        f"acks={acks}: produced {sequence}, acknowledged {len(acked)}, failed {len(errors)} "
        f"({sorted({e.name() for e in errors})}), stored after restart {len(stored)}"
    )


def test_a_follower_with_a_full_disk_stops_and_the_cluster_loses_nothing(rill_cluster_factory):
    """The follower's disk fills up: its replica fetcher's append fails, it stops with the
    same message, the leader carries on with the other replica (min.insync.replicas=2),
    and once restarted with room the follower catches up and, made leader, serves every
    acknowledged record."""
    cluster = rill_cluster_factory()
    topic = unique_topic("full-follower")
    create_replicated_topic(cluster.bootstrap, topic, 1, 3, config={"min.insync.replicas": "2"})
    partition = settled_partition(cluster, topic)
    follower_id = next(r for r in partition["replicas"] if r != partition["leader"])
    follower = cluster.node(follower_id)
    follower.stop()
    follower.file_size_limit_bytes = FILE_SIZE_LIMIT
    cluster.start_node(follower_id)
    settled_partition(cluster, topic)

    acked: dict[int, bytes] = {}
    errors = []

    def on_delivery(error, message):
        if error is None:
            acked[message.offset()] = message.value()
        else:
            errors.append(error)

    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 60000,
        }
    )
    for sequence in range(MAX_RECORDS):
        while True:
            try:
                producer.produce(
                    topic, key=b"k", value=value_for(sequence), on_delivery=on_delivery
                )
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    code = follower.wait_exit(timeout_s=60)
    assert producer.flush(90) == 0
    del producer

    assert code == EXIT_LOG_DIR_FAILED, f"exit code {code}\n{follower.log_excerpt()}"
    log = follower.log_text()
    assert "Shutdown broker because all log dirs in" in log, follower.log_excerpt()
    assert "follower append" in log and "File too large" in log, follower.log_excerpt()
    assert errors == [], f"{len(errors)} deliveries failed, first: {errors[:3]}"
    assert len(acked) == MAX_RECORDS

    follower.file_size_limit_bytes = None
    cluster.start_node(follower_id)
    lead_by(cluster, topic, follower_id)
    stored = read_from_beginning(cluster.running_bootstrap(), topic)
    assert sorted(stored) == sorted(acked), "the former follower's log differs from the acks"
    for offset, value in acked.items():
        assert stored[offset][1] == value, f"record {offset} changed"


def test_a_metadata_log_that_cannot_grow_stops_the_node_and_loses_no_created_topic(rill_factory):
    # Topics of many partitions grow the metadata log (a record per partition) far faster
    # than the server's own log (a line per topic), so the metadata log hits the limit
    # first, while the partition logs stay empty.
    limit = 128 << 10
    partitions = 100
    rill = rill_factory(file_size_limit_bytes=limit)
    client = admin(rill.bootstrap)
    created: list[str] = []
    failed = 0
    started = time.monotonic()
    for i in range(4 * limit // (partitions * 40)):
        if not rill.is_running():
            break
        name = f"meta-full-{i:03d}"
        future = client.create_topics(
            [NewTopic(name, partitions, 1)], operation_timeout=10, request_timeout=15
        )[name]
        try:
            future.result(timeout=30)
            created.append(name)
        except Exception:  # noqa: BLE001 - any failure: the node is going down
            failed += 1
    del client  # its reconnects to the stopped node would only fill the output
    code = rill.wait_exit(timeout_s=60)
    stopped_after = time.monotonic() - started
    log = rill.log_text()
    assert code == EXIT_METADATA_LOG_FAILED, f"exit code {code}\n{rill.log_excerpt()}"
    assert "the metadata log failed" in log and "File too large" in log, rill.log_excerpt()
    assert created, "no topic was created before the metadata log filled up"

    # Room again: every topic the controller acknowledged is there, with its partitions.
    rill.file_size_limit_bytes = None
    rill.start()
    client = admin(rill.bootstrap)
    for name in created:
        wait_for_leaders(client, name, partitions)
    print(
        f"created {len(created)} topics of {partitions} partitions, {failed} failed, "
        f"stopped after {stopped_after:.1f} s"
    )


def test_a_read_that_fails_stops_the_broker(rill_factory):
    """A segment that cannot be read back (here: cut short behind the broker's back, so
    a read past the new end fails) fails the data directory as a failed write does: Kafka
    treats a read IOException the same way. The restarted broker recovers the log to its
    last whole batch and serves again."""
    rill = rill_factory()
    topic = unique_topic("bad-read")
    create_topic(rill.bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": rill.bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(2000):
        producer.produce(topic, value=value_for(i))
    assert producer.flush(30) == 0
    segment = next((rill.data_dir / f"{topic}-0").glob("*.log"))
    size = segment.stat().st_size
    with open(segment, "r+b") as f:
        f.truncate(size // 2)

    consumer = Consumer(
        {
            "bootstrap.servers": rill.bootstrap,
            "group.id": unique_topic("g"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + 60
    while rill.is_running() and time.monotonic() < deadline:
        consumer.poll(0.2)
    consumer.close()
    code = rill.wait_exit(timeout_s=30)
    log = rill.log_text()
    assert code == EXIT_LOG_DIR_FAILED, f"exit code {code}\n{rill.log_excerpt()}"
    assert f"read of {topic}-0" in log, rill.log_excerpt()

    rill.start()
    stored = read_all(rill.bootstrap, topic, 1)[0]
    assert 0 < len(stored) < 2000
    assert sorted(stored) == list(range(len(stored))), "offsets are not dense after recovery"
    for offset, record in stored.items():
        assert record.value == value_for(offset)
