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

from kafka_helpers import (
    admin as admin_client,
    create_topic,
    read_all,
    reading_consumer,
    unique_topic,
    wait_for,
    wait_for_leaders,
)

PARTITIONS = 3
# CI runs ten kills per test (about a minute each on 2 cores); RILL_CRASH_ITERATIONS=N runs
# a longer loop, with the time budgets stretched to match.
ITERATIONS = int(os.environ.get("RILL_CRASH_ITERATIONS", "10"))
SEGMENT_BYTES = 65536
# Stop adding iterations past this, whatever ITERATIONS says.
TIME_BUDGET_S = 7.5 * ITERATIONS
VALUE_PAD = b"p" * 150


def value_for(sequence: int) -> bytes:
    return b"seq=%09d;" % sequence + VALUE_PAD


def sequence_of(value: bytes) -> int:
    return int(value[4:13])


def acked_producer(bootstrap: str):
    """An idempotent acks=all producer that retries through every restart, with what it
    was acknowledged ({sequence: (partition, offset)}) and its delivery failures."""
    acked: dict[int, tuple[int, int]] = {}
    failed: list[str] = []

    def on_delivery(error, message):
        if error is not None:
            failed.append(f"{error} ({error.code()})")
            return
        acked[sequence_of(message.value())] = (message.partition(), message.offset())

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            # Batches must fit a 64 KiB segment (a larger one is refused, as in Kafka);
            # 16 KiB is the Java client's default.
            "batch.size": 16384,
            # Retry through every restart rather than give up: the tests check that those
            # retries do not duplicate anything.
            "message.timeout.ms": 120_000,
            "reconnect.backoff.ms": 20,
            "reconnect.backoff.max.ms": 200,
            "retry.backoff.ms": 20,
            "on_delivery": on_delivery,
        }
    )
    return producer, acked, failed


def test_kill9_loop_under_idempotent_producer(rill_factory):
    seed = int(os.environ.get("RILL_CRASH_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    print(f"crash loop seed {seed} (replay with RILL_CRASH_SEED={seed})")
    rill = rill_factory(overrides={"log.segment.bytes": str(SEGMENT_BYTES)})
    topic = unique_topic("crashloop")
    admin = create_topic(rill.bootstrap, topic, PARTITIONS)

    producer, acked, failed = acked_producer(rill.bootstrap)
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


COMPACT_PARTITIONS = 2
COMPACT_KEYS = 40
COMPACT_TIME_BUDGET_S = 6 * ITERATIONS


def test_kill9_loop_while_cleaning_and_committing(rill_factory):
    """The same kind of loop, now over a compacted topic with small segments that the
    cleaner keeps rewriting, and a group committing offsets into a `__consumer_offsets`
    that rolls and is compacted too. After every restart:
    - a record the server acknowledged is either at its acknowledged offset or was
      removed by compaction because a later record with the same key exists;
    - the latest acknowledged value of every key is there;
    - no record is stored twice; a fetch from a stored offset starts at that offset
      (the offset index agrees with the log after recovery);
    - the group's committed offsets are at least the last ones acknowledged.
    """
    from confluent_kafka import Consumer, TopicPartition

    seed = int(os.environ.get("RILL_CRASH_SEED", time.time_ns() % 1_000_000))
    rng = random.Random(seed)
    print(f"crash loop seed {seed} (replay with RILL_CRASH_SEED={seed})")
    rill = rill_factory(
        overrides={
            "log.cleaner.backoff.ms": "100",
            "offsets.topic.num.partitions": "1",
            "offsets.topic.segment.bytes": "16384",
        }
    )
    topic = unique_topic("crashcompact")
    admin = create_topic(
        rill.bootstrap,
        topic,
        COMPACT_PARTITIONS,
        {
            "cleanup.policy": "compact",
            "segment.bytes": "32768",
            "segment.ms": "500",
            "min.cleanable.dirty.ratio": "0.01",
        },
    )
    producer, acked, failed = acked_producer(rill.bootstrap)
    key_of: dict[int, bytes] = {}
    group = unique_topic("crashcompact-group")
    commit_acked: dict[int, int] = {}
    commit_sent: dict[int, int] = {}

    def on_commit(error, partitions):
        if error is not None:
            return
        for tp in partitions:
            if tp.error is None and tp.offset >= 0:
                commit_acked[tp.partition] = max(commit_acked.get(tp.partition, -1), tp.offset)

    committer = Consumer(
        {
            "bootstrap.servers": rill.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "on_commit": on_commit,
            "reconnect.backoff.ms": 20,
            "reconnect.backoff.max.ms": 200,
        }
    )
    sequence = 0
    commits = 0
    started = time.monotonic()
    iterations = 0
    try:
        while iterations < ITERATIONS:
            if time.monotonic() - started > COMPACT_TIME_BUDGET_S:
                break
            iterations += 1
            until = time.monotonic() + rng.uniform(0.2, 1.5)
            next_commit = time.monotonic()
            while time.monotonic() < until:
                key = b"key-%d" % (sequence % COMPACT_KEYS)
                try:
                    producer.produce(
                        topic, key=key, value=value_for(sequence)
                    )
                    key_of[sequence] = key
                    sequence += 1
                except BufferError:
                    producer.poll(0.01)
                producer.poll(0)
                committer.poll(0)
                if time.monotonic() >= next_commit:
                    # Offsets that only grow, so "at least the last acknowledged" is exact.
                    commits += 1
                    offsets = [TopicPartition(topic, p, commits) for p in range(COMPACT_PARTITIONS)]
                    try:
                        committer.commit(offsets=offsets, asynchronous=True)
                        for p in range(COMPACT_PARTITIONS):
                            commit_sent[p] = commits
                    except Exception:  # the coordinator is down: the next one will do
                        pass
                    next_commit = time.monotonic() + 0.05
                if rng.random() < 0.02:
                    time.sleep(0.001)
            rill.kill9()
            time.sleep(rng.uniform(0, 0.3))
            rill.start()
            # What was in flight at the kill is retried now; once delivered, the latest
            # record of every key stays put, which the index check relies on.
            assert producer.flush(60) == 0, "records undelivered 60 s after a restart"
            check_compacted(rill, topic, acked, key_of, rng)
            check_commits(rill, group, topic, commit_acked, commit_sent)
        remaining = producer.flush(90)
        assert remaining == 0, f"{remaining} records undelivered 90 s after the last restart"
        assert not failed, f"{len(failed)} deliveries failed, first: {failed[:3]}"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and commit_acked != commit_sent:
            committer.poll(0.1)
    finally:
        committer.close()
    wait_for_leaders(admin, topic, COMPACT_PARTITIONS)
    stored = check_compacted(rill, topic, acked, key_of, rng)
    check_commits(rill, group, topic, commit_acked, commit_sent)
    total = sum(len(r) for r in stored.values())
    print(
        f"{iterations} kill -9s in {time.monotonic() - started:.0f} s: produced {sequence}, "
        f"acknowledged {len(acked)}, stored after compaction {total}; {commits} commits"
    )
    assert total < sequence, "the cleaner never removed a record"


def check_compacted(rill, topic, acked, key_of, rng):
    stored = read_all(rill.bootstrap, topic, COMPACT_PARTITIONS, timeout_s=60)
    position: dict[int, tuple[int, int]] = {}
    latest_offset: dict[tuple[int, bytes], int] = {}
    for p, records in stored.items():
        for offset, record in records.items():
            seq = sequence_of(record.value)
            assert seq not in position, f"record {seq} stored twice: {position[seq]} and {(p, offset)}"
            assert record.key == key_of.get(seq, record.key), f"record {seq} under another key"
            position[seq] = (p, offset)
            latest_offset[(p, record.key)] = max(latest_offset.get((p, record.key), -1), offset)
    newest_acked: dict[bytes, int] = {}
    for seq, (p, offset) in list(acked.items()):
        key = key_of[seq]
        newest_acked[key] = max(newest_acked.get(key, -1), seq)
        if offset < 0:
            continue  # acknowledged without an offset: the first test holds those
        if seq in position:
            assert position[seq] == (p, offset), (
                f"acknowledged record {seq} at {p}/{offset}, stored at {position[seq]}"
            )
        else:
            newer = latest_offset.get((p, key), -1)
            assert newer > offset, (
                f"acknowledged record {seq} ({p}/{offset}) is gone with no later record "
                f"for its key (latest stored offset of the key: {newer})"
            )
    for key, seq in newest_acked.items():
        stored_seqs = [s for s in position if key_of.get(s) == key]
        assert stored_seqs and max(stored_seqs) >= seq, (
            f"the latest acknowledged value of {key!r} (record {seq}) is lost"
        )
    check_fetch_starts_at(rill, topic, stored, rng)
    return stored


def check_fetch_starts_at(rill, topic, stored, rng, samples: int = 3):
    """A fetch from a stored offset must start at that very record: the offset index
    rebuilt or kept after the crash agrees with the log."""
    from confluent_kafka import TopicPartition

    choices = [(p, o) for p, records in stored.items() for o in records]
    if not choices:
        return
    consumer = reading_consumer(rill.bootstrap)
    try:
        for p, offset in rng.sample(choices, min(samples, len(choices))):
            consumer.assign([TopicPartition(topic, p, offset)])
            got = None
            deadline = time.monotonic() + 20
            while got is None and time.monotonic() < deadline:
                for m in consumer.consume(num_messages=1, timeout=1.0):
                    if m.error() is None:
                        got = m
            assert got is not None, f"nothing fetched from {p}/{offset}"
            key = stored[p][offset].key
            superseded = any(o > offset and r.key == key for o, r in stored[p].items())
            if got.offset() != offset and superseded:
                # The cleaner may have removed it since it was read: a later record
                # has its key. The fetch must then start past it, never before.
                assert got.offset() > offset, f"a fetch from {p}/{offset} went back"
                continue
            assert got.offset() == offset, (
                f"a fetch from {p}/{offset} started at {got.offset()}"
            )
            assert got.value() == stored[p][offset].value
    finally:
        consumer.close()


def check_commits(rill, group, topic, commit_acked, commit_sent):
    from confluent_kafka import ConsumerGroupTopicPartitions

    if not commit_acked:
        return
    client = admin_client(rill.bootstrap)
    request = [ConsumerGroupTopicPartitions(group)]
    result = wait_for(
        lambda: client.list_consumer_group_offsets(request)[group].result(timeout=10),
        60,
        "the group's committed offsets",
    )
    committed = {tp.partition: tp.offset for tp in result.topic_partitions if tp.topic == topic}
    for p, offset in commit_acked.items():
        assert committed.get(p, -1) >= offset, (
            f"partition {p}: commit {offset} was acknowledged, the group has {committed.get(p)}"
        )
        assert committed[p] <= commit_sent[p], f"partition {p}: a commit nobody sent"
