#!/usr/bin/env python3
"""Failover time of a three-node Rill cluster, measured the way a producer feels it.

Each run starts three real `rill server` nodes on loopback (the e2e harness), creates a
topic with one partition, three replicas and min.insync.replicas=2, runs an idempotent
acks=all confluent-kafka producer against it, kills the partition leader with SIGKILL and
reports the time from the kill to the first acknowledgement of a record produced after
the kill. Prints every run and the distribution (min, median, p90, max).

    target/e2e-venv/bin/python bench/cluster_failover.py --runs 10
    target/e2e-venv/bin/python bench/cluster_failover.py --runs 10 --session-timeout-ms 2000

The broker's defaults are Kafka's (broker.session.timeout.ms=9000,
broker.heartbeat.interval.ms=2000); a lease must lapse before the controller moves
leadership, so failover time follows the session timeout. RILL_BIN picks the binary.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

from rill_harness import RillCluster  # noqa: E402
from test_cluster import AckedProducer, create_replicated_topic, leader_of  # noqa: E402


def one_run(workdir: Path, overrides: dict[str, str]) -> float:
    cluster = RillCluster(workdir, 3, overrides).start()
    try:
        client = create_replicated_topic(
            cluster.bootstrap, "failover", 1, 3, {"min.insync.replicas": "2"}
        )
        producer = AckedProducer(cluster.bootstrap, "failover", 0, rate_per_s=500)
        producer.start()
        try:
            deadline = time.monotonic() + 30
            while producer.acked_count() < 1000 and time.monotonic() < deadline:
                time.sleep(0.05)
            victim = leader_of(client, "failover", 0)
            cluster.node(victim).kill9()
            killed_at = time.monotonic()
            deadline = killed_at + 120
            while time.monotonic() < deadline:
                after = [
                    t
                    for t, v in list(producer.ack_times)
                    if producer.sent_at[v] > killed_at
                ]
                if after:
                    return min(after) - killed_at
                time.sleep(0.01)
            raise RuntimeError("no acknowledgement within 120 s of the kill")
        finally:
            producer.stop()
    finally:
        cluster.teardown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--session-timeout-ms", type=int, default=None)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=None)
    args = parser.parse_args()
    overrides = {"group.initial.rebalance.delay.ms": "0"}
    if args.session_timeout_ms is not None:
        overrides["broker.session.timeout.ms"] = str(args.session_timeout_ms)
    if args.heartbeat_interval_ms is not None:
        overrides["broker.heartbeat.interval.ms"] = str(args.heartbeat_interval_ms)
    times = []
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="rill-failover-") as tmp:
            seconds = one_run(Path(tmp), overrides)
        times.append(seconds)
        print(f"run {i + 1}: {seconds:.2f} s", flush=True)
    times.sort()
    p90 = times[min(len(times) - 1, int(round(0.9 * (len(times) - 1))))]
    print(
        f"failover over {len(times)} runs: min {times[0]:.2f} s, median "
        f"{statistics.median(times):.2f} s, p90 {p90:.2f} s, max {times[-1]:.2f} s"
    )


if __name__ == "__main__":
    main()
