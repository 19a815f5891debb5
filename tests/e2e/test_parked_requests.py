"""Requests that wait in the broker (long-poll fetches of quiet partitions) must not stop
it from serving anyone else, and must still wake as soon as their data arrives.

Kafka's `queued.max.requests` bounds the queue in front of the request handlers; a fetch
parked in the purgatory holds no place in it. The broker here runs with a bound of 4 and
8 consumers each long-polling its own empty partition with a 30 s fetch wait: if parked
fetches held their places, the producer below would wait out those 30 s.
"""

import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Producer, TopicPartition

from kafka_helpers import create_topic, reading_consumer, unique_topic, wait_for

FETCH_WAIT_MS = 30_000
CONSUMERS = 8
SLOTS = 4


def test_parked_fetches_do_not_hold_request_slots(rill_factory):
    rill = rill_factory(overrides={"queued.max.requests": str(SLOTS)})
    quiet = unique_topic("quiet")
    busy = unique_topic("busy")
    create_topic(rill.bootstrap, quiet, CONSUMERS)
    create_topic(rill.bootstrap, busy, 1)

    consumers = []
    try:
        for p in range(CONSUMERS):
            c = reading_consumer(
                rill.bootstrap,
                **{"fetch.wait.max.ms": FETCH_WAIT_MS, "fetch.min.bytes": 1},
            )
            c.assign([TopicPartition(quiet, p, OFFSET_BEGINNING)])
            consumers.append(c)
        # Each consumer's first fetch goes out and parks (nothing to read).
        for c in consumers:
            assert c.poll(0.5) is None
        time.sleep(1.0)

        # Twice as many fetches parked as there are slots, yet a producer is served.
        producer = Producer({"bootstrap.servers": rill.bootstrap, "acks": "all", "linger.ms": 0})
        delivered = []
        for i in range(200):
            producer.produce(busy, value=b"v%d" % i, on_delivery=lambda e, m: delivered.append(e))
        remaining = producer.flush(10.0)
        assert remaining == 0, f"{remaining} records not delivered while fetches were parked"
        assert delivered == [None] * 200

        # A record for one parked consumer wakes its fetch long before the 30 s wait.
        target = 3
        sent_at = time.monotonic()
        producer.produce(quiet, value=b"wake", partition=target)
        assert producer.flush(10.0) == 0
        message = None
        deadline = time.monotonic() + 10.0
        while message is None and time.monotonic() < deadline:
            message = consumers[target].poll(0.5)
        assert message is not None and message.error() is None, message and message.error()
        assert message.value() == b"wake"
        assert time.monotonic() - sent_at < FETCH_WAIT_MS / 1000 / 2
    finally:
        for c in consumers:
            c.close()


def test_a_group_larger_than_the_request_slots_settles(rill_factory):
    """JoinGroup waits for the rest of the group in the coordinator: six members each
    parked there at once, with two slots, must still all get in."""
    from test_groups import PARTITIONS, Member, settled

    rill = rill_factory(overrides={"queued.max.requests": "2"})
    topic = unique_topic("slots-group")
    create_topic(rill.bootstrap, topic, PARTITIONS)
    group = f"g-{uuid.uuid4().hex[:8]}"
    members = [Member(rill.bootstrap, group, topic, "range") for _ in range(PARTITIONS)]
    try:
        wait_for(lambda: settled(members, [1] * PARTITIONS), 60, "one partition for each of six members")
    finally:
        for m in members:
            m.close()
