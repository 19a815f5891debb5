#!/usr/bin/env python3
"""Share-consumer throughput on one partition, and redelivery after a consumer's death
(issue #21's figures).

For each consumer count (1, 4, 8 by default) a fresh single-node server gets a
one-partition topic of `--records` records of `--size` bytes, produced before the
consumers start; then that many confluent-kafka `ShareConsumer`s, each in its own process
(librdkafka, implicit acknowledgement), consume the partition together until every record
was delivered. Reported: records per second from the consumers' start to the last
delivery, and how the records split between the consumers.

Redelivery: a consumer acquires records and is killed with SIGKILL (its connection
closes: the broker gives its records back at once) or frozen with SIGSTOP (its
connection stays: its records come back when their locks expire); the time from the
signal to another consumer receiving the last of them is reported, for a lock of
`--lock-ms`.

    target/e2e-venv/bin/python bench/share_consumers.py
    RILL_BIN=target/release/rill target/e2e-venv/bin/python bench/share_consumers.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))

from conftest import DEFAULT_OVERRIDES  # noqa: E402
from rill_harness import RillServer  # noqa: E402
from test_share_consumer import (  # noqa: E402
    CHILD,
    SHARE_OVERRIDES,
    create_topic,
    share_consumer,
    start_at_earliest,
)


def produce(bootstrap: str, topic: str, count: int, size: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 1 << 20,
                  "compression.type": "none"})
    value = b"x" * size
    for i in range(count):
        while True:
            try:
                p.produce(topic, value, key=str(i).encode(), partition=0)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(120) == 0


def consume(bootstrap, group, topic, total, counter, start, results, index) -> None:
    c = share_consumer(bootstrap, group, topic)
    mine = 0
    last = 0.0
    start.wait()
    deadline = time.monotonic() + 600
    while counter.value < total and time.monotonic() < deadline:
        got = sum(1 for m in c.poll(0.2) if m.error() is None)
        if got:
            mine += got
            last = time.time()
            with counter.get_lock():
                counter.value += got
    c.commit_sync(30)
    c.close()
    results[index] = (mine, last)


def throughput(rill_bin: str | None, consumers: int, records: int, size: int) -> tuple[float, list]:
    with tempfile.TemporaryDirectory() as work:
        server = RillServer(Path(work), overrides={**DEFAULT_OVERRIDES, **SHARE_OVERRIDES},
                            binary=rill_bin).start()
        try:
            topic, group = "queue", "bench"
            create_topic(server.bootstrap, topic)
            start_at_earliest(server.bootstrap, group)
            produce(server.bootstrap, topic, records, size)
            # Spawned, not forked: this process runs librdkafka's threads already.
            ctx = mp.get_context("spawn")
            counter = ctx.Value("q", 0)
            start = ctx.Event()
            manager = ctx.Manager()
            results = manager.list([None] * consumers)
            procs = [ctx.Process(target=consume, args=(server.bootstrap, group, topic, records,
                                                      counter, start, results, i))
                     for i in range(consumers)]
            for p in procs:
                p.start()
            # Each process joins the group; the clock starts when all are told to poll.
            time.sleep(3.0)
            t0 = time.time()
            start.set()
            for p in procs:
                p.join()
            split = [r[0] for r in results]
            end = max(r[1] for r in results)
            assert sum(split) >= records, split
            return records / (end - t0), split
        finally:
            server.stop()


def redelivery(rill_bin: str | None, sig: int) -> float:
    with tempfile.TemporaryDirectory() as work:
        server = RillServer(Path(work), overrides={**DEFAULT_OVERRIDES, **SHARE_OVERRIDES},
                            binary=rill_bin).start()
        try:
            topic, group = "jobs", "redelivery"
            create_topic(server.bootstrap, topic)
            start_at_earliest(server.bootstrap, group)
            produce(server.bootstrap, topic, 100, 100)
            child = subprocess.Popen([sys.executable, "-c", CHILD, server.bootstrap, group,
                                      topic, "1"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
            try:
                held = set(json.loads(child.stdout.readline()))
                os.kill(child.pid, sig)
                t0 = time.monotonic()
                c = share_consumer(server.bootstrap, group, topic)
                seen: set[int] = set()
                while not held <= seen and time.monotonic() - t0 < 120:
                    seen |= {m.offset() for m in c.poll(0.05) if m.error() is None}
                elapsed = time.monotonic() - t0
                c.close()
                return elapsed
            finally:
                child.kill()
                child.wait()
        finally:
            server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--consumers", default="1,4,8")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    rill_bin = os.environ.get("RILL_BIN")
    rill_bin = str(Path(rill_bin).resolve()) if rill_bin else None
    print(f"rill: {rill_bin or 'target/debug/rill'}; {args.records} records of {args.size} B, "
          f"one partition; lock {SHARE_OVERRIDES['group.share.record.lock.duration.ms']} ms")
    for n in (int(x) for x in args.consumers.split(",")):
        rates, splits = [], []
        for _ in range(args.runs):
            rate, split = throughput(rill_bin, n, args.records, args.size)
            rates.append(rate)
            splits.append(split)
        print(f"{n} consumer(s): {statistics.median(rates):,.0f} records/s "
              f"(runs {[round(r) for r in rates]}); split {splits[-1]}")
    for name, sig in (("SIGKILL", signal.SIGKILL), ("SIGSTOP", signal.SIGSTOP)):
        times = [redelivery(rill_bin, sig) for _ in range(args.runs)]
        print(f"redelivery after {name}: median {statistics.median(times):.2f} s "
              f"(runs {[round(t, 2) for t in times]})")


if __name__ == "__main__":
    main()
