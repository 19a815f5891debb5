"""Crash consistency with `flush.messages=1` (group commit of the fsyncs): several
producers write to the same partitions at once, so that appends share fsyncs; kill -9 in
the middle, restart, and every acknowledged record is still there at its offset, with
offsets dense."""

import time

from confluent_kafka import Producer

from kafka_helpers import create_topic, restart_and_check_acknowledged, unique_topic

PARTITIONS = 2
PRODUCERS = 4
PRODUCE_BEFORE_KILL_S = 2.0
MIN_ACKED = 100  # a stream that acknowledged almost nothing proves nothing


def value_for(producer: int, sequence: int) -> bytes:
    return f"p={producer};seq={sequence:09d};".encode() + b"x" * 200


def test_acknowledged_records_survive_kill9_with_flush_every_message(rill):
    topic = unique_topic("crashflush")
    admin = create_topic(rill.bootstrap, topic, PARTITIONS, {"flush.messages": "1"})

    acked: list[tuple[int, int, bytes]] = []
    failed = []

    def on_delivery(error, message):
        if error is None:
            acked.append((message.partition(), message.offset(), message.value()))
        else:
            failed.append(error)

    producers = [
        Producer(
            {
                "bootstrap.servers": rill.bootstrap,
                # acks=1 and acks=all alike must wait for the fsync.
                "acks": "1" if i % 2 == 0 else "all",
                "linger.ms": 1,
                "message.timeout.ms": 5000,
                "reconnect.backoff.max.ms": 500,
            }
        )
        for i in range(PRODUCERS)
    ]
    started = time.monotonic()
    sequences = [0] * PRODUCERS
    while time.monotonic() - started < PRODUCE_BEFORE_KILL_S:
        for i, producer in enumerate(producers):
            for _ in range(20):
                try:
                    producer.produce(
                        topic,
                        key=f"{i}-{sequences[i] % 16}".encode(),
                        value=value_for(i, sequences[i]),
                        on_delivery=on_delivery,
                    )
                    sequences[i] += 1
                except BufferError:
                    break
            producer.poll(0)
        time.sleep(0.001)
    killed_at_acked = len(acked)
    rill.kill9()
    for producer in producers:
        producer.flush(15)
    del producers

    assert (
        killed_at_acked >= MIN_ACKED
    ), f"only {killed_at_acked} records acknowledged in {PRODUCE_BEFORE_KILL_S} s"
    assert sum(sequences) > len(acked), "the kill must land mid-stream, with records in flight"

    stored = restart_and_check_acknowledged(rill, admin, topic, PARTITIONS, acked)
    print(
        f"produced {sum(sequences)}, acknowledged {len(acked)} ({killed_at_acked} before "
        f"the kill), stored {sum(len(r) for r in stored.values())}"
    )
