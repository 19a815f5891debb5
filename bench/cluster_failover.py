#!/usr/bin/env python3
"""Failover time of a three-node Rill cluster, measured the way a producer feels it.

Each run starts three real `rill server` nodes on loopback (the e2e harness), creates a
topic with one partition, three replicas and min.insync.replicas=2, runs an idempotent
acks=all confluent-kafka producer against it, injects one fault and reports the time from
the fault to the first acknowledgement of a record produced after it. Prints every run
and the distribution (min, median, p90, max).

    target/e2e-venv/bin/python bench/cluster_failover.py --runs 20
    target/e2e-venv/bin/python bench/cluster_failover.py --runs 20 --victim controller
    target/e2e-venv/bin/python bench/cluster_failover.py --runs 20 --fault stop

--victim picks the node: `leader` (the partition's leader, whatever else it is),
`leader-only` (a leader that is not the active controller: the topic is moved so that
it is), or `controller` (the active controller, made the partition's leader too).
--fault is `kill` (SIGKILL), `stop` (SIGSTOP, held for --stop-seconds, then SIGCONT) or
`partition`: the victim is cut off from its peers, and so from the controller quorum,
while the producer still reaches it (the nodes run in network namespaces of their own,
`tests/e2e/netns.py`, the fault-injection suite's network; needs root and `ip`). A
frozen process answers no one; a partitioned one goes on answering its clients, as
leader, until it learns or decides otherwise. A killed one is noticed at once because its
quorum port refuses connections. The cut is healed once the run has its figure (or after
120 s without one, which is reported as such). RILL_BIN picks the binary.

    target/e2e-venv/bin/python bench/cluster_failover.py --runs 20 --fault partition --victim leader-only
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402
from kafka_helpers import ADMIN_TIMEOUT_S, admin, wait_for  # noqa: E402
from netns import Network, namespaced_cluster  # noqa: E402
from rill_harness import RillCluster  # noqa: E402
from test_cluster import (  # noqa: E402
    AckedProducer,
    all_in_sync,
    create_replicated_topic,
    leader_of,
)

TOPIC = "failover"
# A run without an acknowledgement this long after the fault reports no figure.
RECOVERY_LIMIT_S = 120.0


def active_controller(bootstrap: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.describe_cluster(request_timeout=10).result(timeout=15).controller.id


def create_topic_led_by(bootstrap: str, preferred: int, nodes: list[int]):
    """The test topic, with `preferred` first in its replica list so that it leads."""
    client = admin(bootstrap)
    replicas = [preferred, *[n for n in nodes if n != preferred]]
    futures = client.create_topics(
        [
            NewTopic(
                TOPIC,
                num_partitions=1,
                replica_assignment=[replicas],
                config={"min.insync.replicas": "2"},
            )
        ],
        operation_timeout=ADMIN_TIMEOUT_S,
        request_timeout=ADMIN_TIMEOUT_S,
    )
    futures[TOPIC].result(timeout=ADMIN_TIMEOUT_S)
    wait_for(lambda: all_in_sync(client, TOPIC, 1, 3), 30, "the topic led and in sync")
    return client


def one_run(workdir: Path, overrides: dict[str, str], victim_kind: str, fault: str,
            stop_s: float, net: Network | None,
            recovery_limit_s: float = RECOVERY_LIMIT_S) -> tuple[float | None, str]:
    """Seconds from the fault to the first acknowledgement of a record produced after it
    (None: none within `recovery_limit_s`), and what the victim was."""
    if net is None:
        cluster = RillCluster(workdir, 3, overrides)
    else:
        cluster = namespaced_cluster(workdir, net, overrides)
    cluster.start()
    try:
        nodes = sorted(cluster.nodes)
        if victim_kind == "leader":
            client = create_replicated_topic(
                cluster.bootstrap, TOPIC, 1, 3, {"min.insync.replicas": "2"}
            )
        else:
            controller = active_controller(cluster.bootstrap)
            preferred = (
                controller
                if victim_kind == "controller"
                else next(n for n in nodes if n != controller)
            )
            client = create_topic_led_by(cluster.bootstrap, preferred, nodes)
        producer = AckedProducer(cluster.bootstrap, TOPIC, 0, rate_per_s=500)
        producer.start()
        try:
            deadline = time.monotonic() + 30
            while producer.acked_count() < 1000 and time.monotonic() < deadline:
                time.sleep(0.05)
            victim = leader_of(client, TOPIC, 0)
            role = "controller+leader" if victim == active_controller(cluster.bootstrap) else "leader"
            node = cluster.node(victim)
            if fault == "kill":
                node.kill9()
            elif fault == "stop":
                os.kill(node.pid, signal.SIGSTOP)
            else:
                net.partition(victim)
            faulted_at = time.monotonic()
            try:
                deadline = faulted_at + recovery_limit_s
                while time.monotonic() < deadline:
                    after = [
                        t
                        for t, v in list(producer.ack_times)
                        if producer.sent_at[v] > faulted_at
                    ]
                    if after:
                        return min(after) - faulted_at, role
                    time.sleep(0.01)
                return None, role
            finally:
                if fault == "stop":
                    time.sleep(max(0.0, faulted_at + stop_s - time.monotonic()))
                    os.kill(node.pid, signal.SIGCONT)
                elif fault == "partition":
                    net.heal()
        finally:
            producer.stop()
    finally:
        cluster.teardown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--victim", choices=["leader", "leader-only", "controller"],
                        default="leader")
    parser.add_argument("--fault", choices=["kill", "stop", "partition"], default="kill")
    parser.add_argument("--stop-seconds", type=float, default=20.0,
                        help="how long a stopped node stays frozen (--fault stop)")
    parser.add_argument("--session-timeout-ms", type=int, default=None)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=None)
    parser.add_argument("--recovery-limit-s", type=float, default=RECOVERY_LIMIT_S,
                        help="how long a run waits for the first acknowledgement after the fault")
    args = parser.parse_args()
    overrides = {"group.initial.rebalance.delay.ms": "0"}
    if args.session_timeout_ms is not None:
        overrides["broker.session.timeout.ms"] = str(args.session_timeout_ms)
    if args.heartbeat_interval_ms is not None:
        overrides["broker.heartbeat.interval.ms"] = str(args.heartbeat_interval_ms)
    net = None
    if args.fault == "partition":
        net, why = Network.make()
        if net is None:
            raise SystemExit(f"--fault partition needs network namespaces: {why}")
        # Before any thread starts: every client of the runs lives in the hub namespace.
        net.enter_hub()
        # A SIGTERM ends the runs through the `finally` below, which deletes the namespaces.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    times, missing = [], 0
    try:
        for i in range(args.runs):
            with tempfile.TemporaryDirectory(prefix="rill-failover-") as tmp:
                seconds, role = one_run(Path(tmp), overrides, args.victim, args.fault,
                                        args.stop_seconds, net, args.recovery_limit_s)
            if seconds is None:
                missing += 1
                print(f"run {i + 1}: no acknowledgement within {args.recovery_limit_s:.0f} s "
                      f"({args.fault} of the {role})", flush=True)
                continue
            times.append(seconds)
            print(f"run {i + 1}: {seconds:.2f} s ({args.fault} of the {role})", flush=True)
    finally:
        if net is not None:
            net.teardown()
    if not times:
        raise SystemExit(f"{args.fault} of {args.victim}: no run recovered within "
                         f"{args.recovery_limit_s:.0f} s")
    times.sort()
    p90 = times[min(len(times) - 1, int(round(0.9 * (len(times) - 1))))]
    print(
        f"{args.fault} of {args.victim}, {len(times)} runs: min {times[0]:.2f} s, median "
        f"{statistics.median(times):.2f} s, p90 {p90:.2f} s, max {times[-1]:.2f} s"
        + (f"; {missing} more without an acknowledgement within {args.recovery_limit_s:.0f} s"
           if missing else "")
    )


if __name__ == "__main__":
    main()
