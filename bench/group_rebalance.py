#!/usr/bin/env python3
"""Rebalance cost of a consumer group, the classic protocol against KIP-848's, on one
server in one sitting (issue #20's figures).

For each protocol a group of three confluent-kafka members subscribes to a topic of 12
partitions that a producer writes to all along (a record every 4 ms, round robin), and
settles at 4/4/4 (the three subscribe 170 ms apart, so that their heartbeats do not line
up); then a fourth member subscribes and the group settles at 3/3/3/3.
Reported per run:

- join to stable: from the three members' subscribe to 4/4/4, and from the fourth's
  subscribe to 3/3/3/3 (as the members' own assignments show it);
- the longest pause of a partition that stayed with its member through the fourth's join
  (no delivery from it for that long, between the fourth's subscribe and a second after
  the group settled), and of a partition that moved.

Protocols: `eager` (classic, `range`: every member gives everything up at each
rebalance), `cooperative` (classic, `cooperative-sticky`: two rounds, only moving
partitions revoked) and `consumer` (KIP-848: the broker assigns, members reconcile on
their heartbeats). The classic members heartbeat every 500 ms with a 6 s session; the
broker gives consumer members the same (`group.consumer.*`).

    target/e2e-venv/bin/python bench/group_rebalance.py --runs 5
    RILL_BIN=target/release/rill target/e2e-venv/bin/python bench/group_rebalance.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))

from kafka_helpers import create_topic, unique_topic, wait_for  # noqa: E402
from rill_harness import RillServer  # noqa: E402
from test_consumer_protocol import (  # noqa: E402
    CONSUMER_OVERRIDES,
    Member,
    SteadyProducer,
    longest_gap,
    settled,
)

PARTITIONS = 12
PROTOCOLS = {
    "eager": {"group.protocol": "classic", "partition.assignment.strategy": "range"},
    "cooperative": {"group.protocol": "classic", "partition.assignment.strategy": "cooperative-sticky"},
    "consumer": {"group.protocol": "consumer"},
}
CLASSIC_TIMING = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
# Between the three members' subscribes.
STAGGER_S = 0.17


def one_run(bootstrap: str, protocol: str) -> dict:
    topic = unique_topic(f"rebalance-{protocol}")
    create_topic(bootstrap, topic, PARTITIONS)
    producer = SteadyProducer(bootstrap, topic, PARTITIONS)
    extra = dict(PROTOCOLS[protocol])
    if extra["group.protocol"] == "classic":
        extra.update(CLASSIC_TIMING)
    group = f"bench-{protocol}-{uuid.uuid4().hex[:6]}"
    members = []
    try:
        started = time.monotonic()
        for _ in range(3):
            # Started apart, as processes are: their heartbeats do not line up.
            members.append(Member(bootstrap, group, [topic], **extra))
            time.sleep(STAGGER_S)
        wait_for(lambda: settled(members, topic, PARTITIONS, [4, 4, 4]), 120, "4/4/4", interval_s=0.01)
        first = time.monotonic() - started
        time.sleep(2.0)
        before = [m.assignment() for m in members]
        joined = time.monotonic()
        members.append(Member(bootstrap, group, [topic], **extra))
        wait_for(lambda: settled(members, topic, PARTITIONS, [3, 3, 3, 3]), 120, "3/3/3/3", interval_s=0.01)
        stable = time.monotonic()
        time.sleep(1.0)
        end = stable + 1.0
        stayed_gaps, moved_gaps = [], []
        every = [d for m in members for d in list(m.deliveries)]
        for i, m in enumerate(members[:3]):
            after = m.assignment()
            for _, p in before[i]:
                gap = longest_gap(every, topic, p, joined, end)
                (stayed_gaps if (topic, p) in after else moved_gaps).append(gap)
        return {
            "three_to_stable": first,
            "fourth_to_stable": stable - joined,
            "stayed_pause": max(stayed_gaps) if stayed_gaps else 0.0,
            "moved_pause": max(moved_gaps) if moved_gaps else 0.0,
        }
    finally:
        producer.stop()
        for m in members:
            m.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--protocols", default="eager,cooperative,consumer")
    args = parser.parse_args()
    protocols = [p for p in args.protocols.split(",") if p]
    with tempfile.TemporaryDirectory() as work:
        server = RillServer(Path(work), overrides={"group.initial.rebalance.delay.ms": "0", **CONSUMER_OVERRIDES})
        server.start()
        try:
            results: dict[str, list[dict]] = {p: [] for p in protocols}
            for run in range(args.runs):
                for p in protocols:
                    r = one_run(server.bootstrap, p)
                    results[p].append(r)
                    print(f"run {run + 1} {p:12} 3 to stable {r['three_to_stable']:.2f} s, 4th to stable "
                          f"{r['fourth_to_stable']:.2f} s, longest pause stayed {r['stayed_pause'] * 1000:.0f} ms, "
                          f"moved {r['moved_pause'] * 1000:.0f} ms", flush=True)
            print()
            print(f"{'protocol':12} {'3 join→stable':>15} {'4th join→stable':>17} "
                  f"{'pause, stayed':>15} {'pause, moved':>14}   (median / max of {args.runs})")
            for p in protocols:
                rs = results[p]

                def med_max(key, scale=1.0, unit="s", digits=2):
                    values = [r[key] * scale for r in rs]
                    return f"{statistics.median(values):.{digits}f}/{max(values):.{digits}f} {unit}"

                print(f"{p:12} {med_max('three_to_stable'):>15} {med_max('fourth_to_stable'):>17} "
                      f"{med_max('stayed_pause', 1000, 'ms', 0):>15} {med_max('moved_pause', 1000, 'ms', 0):>14}")
        finally:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
