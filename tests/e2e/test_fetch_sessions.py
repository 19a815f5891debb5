"""KIP-227's incremental fetch sessions against real `rill` processes: the protocol in raw
Fetch v7 frames (a full fetch opens a session; an incremental one reads the whole session
and answers only what is new; the session errors), kafka-python's consumer (which fetches
in sessions by default) reading everything, and followers replicating in sessions."""

from __future__ import annotations

import struct
import time

from confluent_kafka import Producer
from kafka import KafkaConsumer, TopicPartition as KTopicPartition

from kafka_helpers import create_topic, read_all, unique_topic, wait_for
from kafka_wire import call, kstring
from test_cluster import create_replicated_topic
from test_metrics import HTTP_ON, scrape, value

FETCH = 1
SESSIONS = "kafka_server_fetchsessioncache_num_incremental_fetch_sessions"
CACHED = "kafka_server_fetchsessioncache_num_incremental_fetch_partitions_cached"
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71


def fetch_v7(host: str, session_id: int, epoch: int, topic: str,
             partitions: dict[int, int], forgotten: list[int] = (),
             max_wait_ms: int = 0) -> tuple[int, int, dict[int, tuple[int, int, bytes]]]:
    """Fetch v7 as a consumer: (error, session id, {partition: (error, high watermark,
    records)}) for the partitions answered. `partitions` maps partition to fetch offset."""
    body = struct.pack(">iiiibii", -1, max_wait_ms, 1, 1 << 20, 0, session_id, epoch)
    if partitions:
        body += struct.pack(">i", 1) + kstring(topic) + struct.pack(">i", len(partitions))
        for p, offset in partitions.items():
            body += struct.pack(">iqqi", p, offset, -1, 1 << 20)
    else:
        body += struct.pack(">i", 0)
    if forgotten:
        body += struct.pack(">i", 1) + kstring(topic) + struct.pack(">i", len(forgotten))
        body += b"".join(struct.pack(">i", p) for p in forgotten)
    else:
        body += struct.pack(">i", 0)
    payload, pos = call(host, FETCH, 7, body, max_wait_ms / 1000 + 10)
    _throttle, error, answered_session, topics = struct.unpack_from(">ihii", payload, pos)
    pos += 14
    answered = {}
    for _ in range(topics):
        (name_len,) = struct.unpack_from(">h", payload, pos)
        name = payload[pos + 2:pos + 2 + name_len].decode()
        pos += 2 + name_len
        assert name == topic, name
        (count,) = struct.unpack_from(">i", payload, pos)
        pos += 4
        for _ in range(count):
            p, p_error, hw, _lso, _start, aborted = struct.unpack_from(">ihqqqi", payload, pos)
            pos += 34
            pos += 16 * max(aborted, 0)
            (size,) = struct.unpack_from(">i", payload, pos)
            pos += 4
            records = payload[pos:pos + max(size, 0)]
            pos += max(size, 0)
            assert p not in answered, f"partition {p} answered twice"
            answered[p] = (p_error, hw, records)
    return error, answered_session, answered


def produce(bootstrap: str, topic: str, partition: int, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    failures = []
    for i in range(count):
        producer.produce(topic, value=b"r%d" % i, partition=partition,
                         on_delivery=lambda err, _msg: err and failures.append(err))
    assert producer.flush(30) == 0
    assert not failures, failures[:3]


def test_an_incremental_fetch_answers_only_what_is_new_and_session_errors_alone(rill_factory):
    rill = rill_factory(overrides=HTTP_ON)
    host, address = rill.bootstrap, rill.http_address()
    topic = unique_topic("sessions")
    create_topic(host, topic, 3)
    produce(host, topic, 1, 2)

    # A full fetch (epoch 0) answers every partition and opens a session.
    error, session, answered = fetch_v7(host, 0, 0, topic, {0: 0, 1: 0, 2: 0})
    assert (error, sorted(answered)) == (0, [0, 1, 2])
    assert session > 0
    assert answered[1][1] == 2 and answered[1][2], "partition 1's two records"
    assert answered[0][1] == 0 and not answered[0][2]
    samples = scrape(address)
    assert value(samples, SESSIONS) == 1
    assert value(samples, CACHED) == 3

    # Epoch 1 names nothing: the session still reads partition 1 from offset 0 (its
    # records are new to the fetcher); the other two have nothing new and are left out.
    error, same, answered = fetch_v7(host, session, 1, topic, {})
    assert (error, same, sorted(answered)) == (0, session, [1])
    assert answered[1][2]

    # Epoch 2 moves partition 1 to its end: nothing is new anywhere.
    error, same, answered = fetch_v7(host, session, 2, topic, {1: 2}, max_wait_ms=100)
    assert (error, same, answered) == (0, session, {})

    # A record for partition 2 wakes epoch 3, which names nothing and waits for any.
    produce(host, topic, 2, 1)
    error, same, answered = fetch_v7(host, session, 3, topic, {}, max_wait_ms=5000)
    assert (error, same, sorted(answered)) == (0, session, [2])
    assert answered[2][1] == 1 and answered[2][2]

    # The same epoch again, and a session nobody opened: the error alone.
    assert fetch_v7(host, session, 3, topic, {}) == (INVALID_FETCH_SESSION_EPOCH, 0, {})
    other = session + 1 if session < 2**31 - 1 else 1
    assert fetch_v7(host, other, 1, topic, {}) == (FETCH_SESSION_ID_NOT_FOUND, 0, {})

    # Epoch 4 forgets every partition: the session closes, and it is gone.
    error, closed, answered = fetch_v7(host, session, 4, topic, {}, forgotten=[0, 1, 2])
    assert (error, closed, answered) == (0, 0, {})
    assert fetch_v7(host, session, 5, topic, {}) == (FETCH_SESSION_ID_NOT_FOUND, 0, {})
    assert value(scrape(address), SESSIONS) == 0

    # Epoch -1 is a fetch without a session: every partition, no session opened.
    error, none, answered = fetch_v7(host, 0, -1, topic, {0: 0, 1: 0, 2: 0})
    assert (error, none, sorted(answered)) == (0, 0, [0, 1, 2])
    assert value(scrape(address), SESSIONS) == 0


def test_kafka_python_reads_everything_in_an_incremental_session(rill_factory):
    rill = rill_factory(overrides=HTTP_ON)
    host, address = rill.bootstrap, rill.http_address()
    topic = unique_topic("kp-sessions")
    partitions = 12
    create_topic(host, topic, partitions)
    for p in range(partitions):
        produce(host, topic, p, 20)
    consumer = KafkaConsumer(bootstrap_servers=host, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=200)
    try:
        consumer.assign([KTopicPartition(topic, p) for p in range(partitions)])
        got: dict[int, list[int]] = {p: [] for p in range(partitions)}

        def read_until(total: int) -> bool:
            for tp, messages in consumer.poll(timeout_ms=500).items():
                got[tp.partition].extend(m.offset for m in messages)
            return sum(len(v) for v in got.values()) >= total

        wait_for(lambda: read_until(20 * partitions), 30, "the first 240 records")
        # The consumer now fetches in a session holding all twelve partitions.
        samples = scrape(address)
        assert value(samples, SESSIONS) >= 1
        assert value(samples, CACHED) >= partitions
        # More records while it fetches incrementally: three partitions only.
        for p in (2, 7, 11):
            produce(host, topic, p, 15)
        wait_for(lambda: read_until(20 * partitions + 45), 30, "the 45 later records")
        time.sleep(1)
        read_until(0)
        for p in range(partitions):
            expected = 35 if p in (2, 7, 11) else 20
            assert got[p] == list(range(expected)), (p, got[p])
    finally:
        consumer.close()


def test_followers_replicate_in_incremental_sessions(rill_cluster_factory):
    cluster = rill_cluster_factory(overrides=HTTP_ON)
    topic = unique_topic("follower-sessions")
    partitions = 6
    create_replicated_topic(cluster.bootstrap, topic, partitions, 3, {"min.insync.replicas": "3"})
    for p in range(partitions):
        produce(cluster.bootstrap, topic, p, 50)
    # min.insync.replicas=3: every acknowledged record reached both followers, which
    # fetch in sessions; the high watermark reached the end on each leader.
    records = read_all(cluster.bootstrap, topic, partitions)
    assert all(sorted(records[p]) == list(range(50)) for p in range(partitions))

    def held() -> float:
        return sum(value(scrape(n.http_address()), CACHED) for n in cluster.brokers().values())

    # Each partition is in a session of each of its two followers, on its leader (the
    # internal topics' partitions, if any, add to it).
    wait_for(lambda: held() >= 2 * partitions, 30, "follower sessions holding the topic")
    sessions = sum(value(scrape(n.http_address()), SESSIONS) for n in cluster.brokers().values())
    assert sessions >= 2
