"""Produce and consume throughput of one broker, measured with librdkafka (confluent-kafka).

    python bench/rdkafka_throughput.py --bootstrap 127.0.0.1:9092 [--records 500000]
        [--record-size 1024] [--acks 1] [--compression none] [--partitions 6] [--pid PID]

Prints records/s and MB/s for a produce run and a consume run of the same records, and,
with --pid, the broker's RSS (VmRSS, VmHWM) before and after. Uses one topic per run.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def rss(pid: int | None) -> str:
    if pid is None:
        return "n/a"
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return f"VmRSS {fields.get('VmRSS')}, VmHWM {fields.get('VmHWM')}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--acks", default="1")
    ap.add_argument("--compression", default="none")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--pid", type=int)
    args = ap.parse_args()

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result(30)
    print(f"before: {rss(args.pid)}")

    payload = os.urandom(args.record_size)
    producer = Producer(
        {
            "bootstrap.servers": args.bootstrap,
            "acks": args.acks,
            "compression.type": args.compression,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
        }
    )
    started = time.perf_counter()
    for _ in range(args.records):
        while True:
            try:
                producer.produce(topic, payload)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(300) == 0
    elapsed = time.perf_counter() - started
    mb = args.records * args.record_size / 1e6
    print(
        f"produce: {args.records / elapsed:,.0f} records/s, {mb / elapsed:,.1f} MB/s "
        f"({args.records} x {args.record_size} B, acks={args.acks}, {args.compression})"
    )
    print(f"after produce: {rss(args.pid)}")

    consumer = Consumer(
        {
            "bootstrap.servers": args.bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760,
        }
    )
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(args.partitions)])
    got = 0
    started = time.perf_counter()
    deadline = time.monotonic() + 300
    while got < args.records and time.monotonic() < deadline:
        for message in consumer.consume(10_000, 1.0):
            if message.error() is None:
                got += 1
    elapsed = time.perf_counter() - started
    consumer.close()
    assert got == args.records, f"consumed {got} of {args.records}"
    print(f"consume: {got / elapsed:,.0f} records/s, {mb / elapsed:,.1f} MB/s")
    print(f"after consume: {rss(args.pid)}")


if __name__ == "__main__":
    main()
