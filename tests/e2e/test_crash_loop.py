"""Crash loop: kill -9 the server again and again under one idempotent acks=all producer,
with small segments so that crashes land around segment rolls too, and check the log after
every restart and at the end.

What the server promises (and this test holds it to):
- every acknowledged record is stored at exactly the offset it was acknowledged with;
- offsets are dense in every partition (no gap, no offset twice);
- nothing is stored twice: the idempotent producer's retries after a restart are
  recognised as duplicates (producer state rebuilt from the log), so each record the
  producer sent appears at most once, and, since it retries until delivered, exactly once.

The kill moments are random; the seed is printed and `RILL_CRASH_SEED=<n>` replays it.
"""

from __future__ import annotations

import os
import random
import time

from confluent_kafka import Producer

from kafka_helpers import create_topic, read_all, unique_topic, wait_for_leaders

PARTITIONS = 3
ITERATIONS = 20
SEGMENT_BYTES = 65536
TIME_BUDGET_S = 150  # stop adding iterations past this, whatever ITERATIONS says
VALUE_PAD = b"p" * 150


def value_for(sequence: int) -> bytes:
    return b"seq=%09d;" % sequence + VALUE_PAD


def sequence_of(value: bytes) -> int:
    return int(value[4:13])


def test_kill9_loop_under_idempotent_producer(rill_factory):
    seed = int(os.environ.get("RILL_CRASH_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    print(f"crash loop seed {seed} (replay with RILL_CRASH_SEED={seed})")
    rill = rill_factory(overrides={"log.segment.bytes": str(SEGMENT_BYTES)})
    topic = unique_topic("crashloop")
    admin = create_topic(rill.bootstrap, topic, PARTITIONS)

    acked: dict[int, tuple[int, int]] = {}  # sequence -> (partition, offset)
    failed: list[str] = []

    def on_delivery(error, message):
        if error is not None:
            failed.append(f"{error} ({error.code()})")
            return
        acked[sequence_of(message.value())] = (message.partition(), message.offset())

    producer = Producer(
        {
            "bootstrap.servers": rill.bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            # Batches must fit a 64 KiB segment (a larger one is refused, as in Kafka);
            # 16 KiB is the Java client's default.
            "batch.size": 16384,
            # Retry through every restart rather than give up: the test checks that those
            # retries do not duplicate anything.
            "message.timeout.ms": 120_000,
            "reconnect.backoff.ms": 20,
            "reconnect.backoff.max.ms": 200,
            "retry.backoff.ms": 20,
        }
    )
    sequence = 0
    started = time.monotonic()
    iterations = 0
    while iterations < ITERATIONS or (time.monotonic() - started) < 5:
        if time.monotonic() - started > TIME_BUDGET_S:
            break
        iterations += 1
        run_for = rng.uniform(0.1, 1.5)
        until = time.monotonic() + run_for
        while time.monotonic() < until:
            try:
                producer.produce(
                    topic,
                    key=str(sequence % 97).encode(),
                    value=value_for(sequence),
                    on_delivery=on_delivery,
                )
                sequence += 1
            except BufferError:
                producer.poll(0.01)
            producer.poll(0)
            if rng.random() < 0.02:
                time.sleep(0.001)
        rill.kill9()
        time.sleep(rng.uniform(0, 0.3))
        rill.start()
        if rng.random() < 0.2:
            # A second kill right after recovery, before the producer has caught up.
            time.sleep(rng.uniform(0, 0.2))
            rill.kill9()
            rill.start()
        check_log(rill, topic, acked, final=False)
    remaining = producer.flush(90)
    assert remaining == 0, f"{remaining} records still undelivered 90 s after the last restart"
    assert not failed, f"{len(failed)} deliveries failed, first: {failed[:3]}"
    wait_for_leaders(admin, topic, PARTITIONS)
    stored = check_log(rill, topic, acked, final=True)
    total = sum(len(r) for r in stored.values())
    assert total == sequence, f"{sequence} records produced and delivered, {total} stored"
    print(
        f"{iterations} kill -9s in {time.monotonic() - started:.0f} s: produced {sequence}, "
        f"acknowledged {len(acked)}, stored {total}"
    )


def check_log(rill, topic, acked, final: bool):
    """The promises above, on what the server stores now; returns what it stores."""
    stored = read_all(rill.bootstrap, topic, PARTITIONS, timeout_s=60)
    seen: dict[int, tuple[int, int]] = {}
    for p, records in stored.items():
        offsets = sorted(records)
        assert offsets == list(range(len(offsets))), f"partition {p}: offsets not dense"
        for offset, record in records.items():
            seq = sequence_of(record.value)
            assert seq not in seen, f"record {seq} stored twice: {seen[seq]} and {(p, offset)}"
            seen[seq] = (p, offset)
    for seq, (p, offset) in list(acked.items()):
        assert seq in seen, f"acknowledged record {seq} ({p}/{offset}) missing"
        if offset >= 0:
            assert seen[seq] == (
                p,
                offset,
            ), f"acknowledged record {seq} at {p}/{offset}, stored at {seen[seq]}"
    if final:
        missing_offsets = [s for s, (_p, o) in acked.items() if o < 0]
        assert not missing_offsets, f"{len(missing_offsets)} acks without an offset"
    return stored
