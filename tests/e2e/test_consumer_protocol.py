"""KIP-848's consumer group protocol (`group.protocol=consumer`, issue #20) against real
brokers with confluent-kafka: three members settle on a balanced assignment computed by
the broker; a fourth joins and only the partitions that move pause (the others stay
assigned and keep being read); a member killed with SIGKILL loses its partitions after
the session timeout the broker decides; committed offsets survive a coordinator
failover on three nodes with no record read twice but those read and not yet committed;
a regular expression subscription picks up a topic created later; `rill group describe`
shows the group's protocol, epochs and assignments; a rolling switch of a group from the
classic protocol to the consumer protocol and back (KIP-848's online migration) loses
nothing.

The broker's consumer group session and heartbeat interval are shortened
(`group.consumer.*`) so that each test takes seconds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
import kafka_wire
from kafka_helpers import create_topic, unique_topic, wait_for
from kafka_wire import find_on_any
from rill_harness import rill_binary

SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 500
CONSUMER_OVERRIDES = {
    "group.consumer.min.session.timeout.ms": "3000",
    "group.consumer.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "group.consumer.min.heartbeat.interval.ms": "100",
    "group.consumer.heartbeat.interval.ms": str(HEARTBEAT_INTERVAL_MS),
}


class Member:
    """A `group.protocol=consumer` member polling on its own thread, with the times of its
    deliveries and every partition its rebalance callbacks took away."""

    def __init__(self, bootstrap: str, group: str, subscription: list[str], **extra):
        config = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 200,
        }
        config.update(extra)
        self.consumer = Consumer(config)
        self.lock = threading.Lock()
        self.assigned: set[tuple[str, int]] = set()
        self.revoked: list[tuple[float, tuple[str, int]]] = []
        self.deliveries: list[tuple[float, str, int, int]] = []
        self.errors: list = []
        self.consumer.subscribe(subscription, on_revoke=self._on_revoke)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_revoke(self, consumer, partitions):
        now = time.monotonic()
        with self.lock:
            self.revoked.extend((now, (p.topic, p.partition)) for p in partitions)

    def _run(self):
        while not self._stop.is_set():
            message = self.consumer.poll(0.05)
            with self.lock:
                self.assigned = {(tp.topic, tp.partition) for tp in self.consumer.assignment()}
            if message is None:
                continue
            if message.error():
                self.errors.append(message.error())
                continue
            with self.lock:
                self.deliveries.append(
                    (time.monotonic(), message.topic(), message.partition(), message.offset())
                )
        self.consumer.close()

    def assignment(self) -> set[tuple[str, int]]:
        with self.lock:
            return set(self.assigned)

    def seen(self) -> set[tuple[str, int, int]]:
        with self.lock:
            return {(t, p, o) for _, t, p, o in self.deliveries}

    def close(self):
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "consumer did not close"


class SteadyProducer:
    """Writes to every partition of a topic in turn, a record every few milliseconds,
    until stopped; returns every (partition, offset) it was told."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, interval_s: float = 0.004):
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
        self.topic = topic
        self.partitions = partitions
        self.interval_s = interval_s
        self.delivered: set[tuple[int, int]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _report(self, error, message):
        if error is None:
            self.delivered.add((message.partition(), message.offset()))

    def _run(self):
        i = 0
        while not self._stop.is_set():
            self.producer.produce(self.topic, value=b"v%d" % i, partition=i % self.partitions,
                                  on_delivery=self._report)
            self.producer.poll(0)
            i += 1
            time.sleep(self.interval_s)
        self.producer.flush(30)

    def stop(self) -> set[tuple[int, int]]:
        self._stop.set()
        self._thread.join(timeout=60)
        return set(self.delivered)


def settled(members, topic: str, partitions: int, sizes: list[int]) -> bool:
    assignments = [{p for t, p in m.assignment() if t == topic} for m in members]
    union = set().union(*assignments)
    return (
        sum(len(a) for a in assignments) == len(union)
        and union == set(range(partitions))
        and sorted(map(len, assignments)) == sizes
    )


def longest_gap(deliveries, topic: str, partition: int, start: float, end: float) -> float:
    """The longest time between deliveries of the partition within [start, end]."""
    times = sorted(t for t, tp, p, _ in deliveries if tp == topic and p == partition and start <= t <= end)
    if not times:
        return end - start
    edges = [start] + times + [end]
    return max(b - a for a, b in zip(edges, edges[1:]))


def test_three_members_balance_and_a_fourth_moves_only_its_partitions(rill_factory):
    rill = rill_factory(overrides=CONSUMER_OVERRIDES)
    partitions = 12
    topic = unique_topic("kip848")
    create_topic(rill.bootstrap, topic, partitions)
    producer = SteadyProducer(rill.bootstrap, topic, partitions)
    group = f"g848-{uuid.uuid4().hex[:8]}"
    members = []
    try:
        joined = time.monotonic()
        members = [Member(rill.bootstrap, group, [topic]) for _ in range(3)]
        wait_for(lambda: settled(members, topic, partitions, [4, 4, 4]), 60, "a 4/4/4 assignment")
        print(f"\nthree members from subscribe to a balanced 4/4/4: {time.monotonic() - joined:.2f} s")
        time.sleep(1.0)  # every member reading
        before = [m.assignment() for m in members]
        revoked_before = [len(m.revoked) for m in members]
        fourth_started = time.monotonic()
        members.append(Member(rill.bootstrap, group, [topic]))
        wait_for(lambda: settled(members, topic, partitions, [3, 3, 3, 3]), 60, "a 3/3/3/3 assignment")
        stable_at = time.monotonic()
        print(f"a fourth member from subscribe to a balanced 3/3/3/3: {stable_at - fourth_started:.2f} s")
        time.sleep(1.0)
        after = [m.assignment() for m in members[:3]]
        moved = set()
        for i, m in enumerate(members[:3]):
            # Each old member gave up exactly one partition and kept three: the only
            # partitions its callbacks revoked are the ones it no longer holds.
            kept = before[i] & after[i]
            assert len(kept) == 3 and after[i] <= before[i], (before[i], after[i])
            with m.lock:
                revoked = {tp for _, tp in m.revoked[revoked_before[i]:]}
            assert revoked == before[i] - after[i], (revoked, before[i], after[i])
            moved |= before[i] - after[i]
        assert {tp for tp in members[3].assignment()} == moved
        # The partitions that stayed kept being read while the group rebalanced.
        gaps = []
        for i, m in enumerate(members[:3]):
            with m.lock:
                deliveries = list(m.deliveries)
            for _, p in before[i] & after[i]:
                gaps.append(longest_gap(deliveries, topic, p, fourth_started, stable_at + 1.0))
        moved_gaps = []
        for _, p in moved:
            allds = [d for m in members for d in m.deliveries]
            moved_gaps.append(longest_gap(allds, topic, p, fourth_started, stable_at + 1.0))
        print(
            f"longest pause of a partition that stayed: {max(gaps) * 1000:.0f} ms; "
            f"of a partition that moved: {max(moved_gaps) * 1000:.0f} ms"
        )
        delivered = producer.stop()
        wanted = {(p, o) for p, o in delivered}

        def all_read():
            seen = set()
            for m in members:
                seen |= {(p, o) for t, p, o in m.seen() if t == topic}
            return seen >= wanted

        wait_for(all_read, 60, "every record to be read by the group")
        for m in members:
            assert m.errors == [], m.errors
    finally:
        producer.stop()
        for m in members:
            m.close()


KILLABLE_MEMBER = r"""
import sys
from confluent_kafka import Consumer
c = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[2],
              "group.protocol": "consumer", "auto.offset.reset": "earliest"})
c.subscribe([sys.argv[3]])
while True:
    m = c.poll(0.2)
    if c.assignment():
        print("assigned", flush=True)
"""


def test_a_killed_member_loses_its_partitions_after_the_session_timeout(rill_factory):
    rill = rill_factory(overrides=CONSUMER_OVERRIDES)
    partitions = 6
    topic = unique_topic("kip848-kill")
    create_topic(rill.bootstrap, topic, partitions)
    group = f"g848-{uuid.uuid4().hex[:8]}"
    members = [Member(rill.bootstrap, group, [topic]) for _ in range(2)]
    victim = subprocess.Popen(
        [sys.executable, "-c", KILLABLE_MEMBER, rill.bootstrap, group, topic],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        def victim_holds_two():
            a, b = (m.assignment() for m in members)
            return len(a) == 2 and len(b) == 2 and not a & b

        wait_for(victim_holds_two, 60, "the victim to hold two partitions")
        os.killpg(victim.pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: settled(members, topic, partitions, [3, 3]), 60, "the survivors to take every partition")
        elapsed = time.monotonic() - killed
        print(f"\nkill -9 to 3/3 in {elapsed:.2f} s (group.consumer.session.timeout.ms={SESSION_TIMEOUT_MS})")
        # The broker decides the session: not before it could have ended, not long after.
        assert elapsed >= SESSION_TIMEOUT_MS / 1000 - 1
        assert elapsed < SESSION_TIMEOUT_MS / 1000 + 20
    finally:
        if victim.poll() is None:
            os.killpg(victim.pid, signal.SIGKILL)
        victim.wait()
        for m in members:
            m.close()


def test_regular_expression_subscription_picks_up_a_new_topic(rill_factory):
    rill = rill_factory(overrides=CONSUMER_OVERRIDES)
    prefix = f"re848-{uuid.uuid4().hex[:6]}"
    first, second, other = f"{prefix}-a", f"{prefix}-b", f"x{prefix}-c"
    create_topic(rill.bootstrap, first, 2)
    producer = Producer({"bootstrap.servers": rill.bootstrap})
    for i in range(10):
        producer.produce(first, value=b"a%d" % i, partition=i % 2)
    producer.flush(30)
    group = f"g848-{uuid.uuid4().hex[:8]}"
    member = Member(rill.bootstrap, group, [f"^{prefix}-.*"])
    try:
        wait_for(lambda: len({(p, o) for t, p, o in member.seen() if t == first}) >= 10, 60,
                 "the first topic's records")
        create_topic(rill.bootstrap, second, 3)
        create_topic(rill.bootstrap, other, 1)
        created = time.monotonic()
        for i in range(9):
            producer.produce(second, value=b"b%d" % i, partition=i % 3)
            producer.produce(other, value=b"c%d" % i, partition=0)
        producer.flush(30)
        wait_for(lambda: len({(p, o) for t, p, o in member.seen() if t == second}) >= 9, 60,
                 "the new topic's records")
        print(f"\na topic created after the subscription read within {time.monotonic() - created:.2f} s")
        assert {t for t, _ in member.assignment()} == {first, second}
        assert not any(t == other for t, _, _ in member.seen()), "a whole-name match only"
    finally:
        member.close()


def test_describe_shows_the_protocol_epochs_and_assignments(rill_factory):
    rill = rill_factory(overrides=CONSUMER_OVERRIDES)
    topic = unique_topic("kip848-describe")
    create_topic(rill.bootstrap, topic, 4)
    group = f"g848-{uuid.uuid4().hex[:8]}"
    members = [Member(rill.bootstrap, group, [topic], **{"group.remote.assignor": "range"})
               for _ in range(2)]
    try:
        wait_for(lambda: settled(members, topic, 4, [2, 2]), 60, "a 2/2 assignment")

        def described():
            out = subprocess.run(
                [str(rill_binary()), "group", "describe", group, "-b", rill.bootstrap,
                 "--output", "json"],
                capture_output=True, text=True, timeout=30,
            )
            assert out.returncode == 0, out.stderr
            [d] = json.loads(out.stdout)
            return d if d.get("state") == "Stable" else None

        d = wait_for(described, 30, "a Stable consumer group")
        assert d["type"] == "consumer" and d["protocol_type"] == "consumer"
        assert d["assignor"] == "range"
        assert d["group_epoch"] == d["assignment_epoch"] >= 2
        assert len(d["members"]) == 2
        owned = sorted(p for m in d["members"] for a in m["assignment"] for p in a["partitions"])
        assert owned == [0, 1, 2, 3]
        for m in d["members"]:
            assert m["member_epoch"] == d["assignment_epoch"]
            assert m["assignment"] == m["target_assignment"]
        # The table shows the same, and ListGroups the group's type (KIP-1043).
        table = subprocess.run([str(rill_binary()), "group", "describe", group, "-b", rill.bootstrap],
                               capture_output=True, text=True, timeout=30).stdout
        assert "Type: consumer" in table and "Assignor: range" in table, table
        listed = subprocess.run([str(rill_binary()), "group", "list", "-b", rill.bootstrap,
                                 "--output", "json"], capture_output=True, text=True, timeout=30)
        [row] = [g for g in json.loads(listed.stdout) if g["group"] == group]
        assert (row["type"], row["protocol_type"], row["state"]) == ("consumer", "consumer", "Stable")
    finally:
        for m in members:
            m.close()


CLASSIC = {
    "group.protocol": "classic",
    "partition.assignment.strategy": "cooperative-sticky",
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 500,
}


def group_type(rill, group: str) -> str:
    listed = subprocess.run([str(rill_binary()), "group", "list", "-b", rill.bootstrap, "--output", "json"],
                            capture_output=True, text=True, timeout=30)
    return next((g["type"] for g in json.loads(listed.stdout) if g["group"] == group), "")


@pytest.mark.parametrize(
    "direction,assignor",
    [("upgrade", "cooperative-sticky"), ("upgrade", "range"), ("downgrade", "cooperative-sticky")],
)
def test_a_rolling_switch_between_the_protocols_loses_nothing(rill_factory, direction, assignor):
    """KIP-848's online migration: three members are replaced one at a time by members of
    the other protocol while a producer writes. Upgrading, the first consumer member
    turns the classic group into a consumer group that serves the remaining classic
    members; downgrading, the last consumer member's leave turns it back into a classic
    group. Every record is read and committed either way."""
    rill = rill_factory(overrides=CONSUMER_OVERRIDES)
    classic = {**CLASSIC, "partition.assignment.strategy": assignor}
    old, new = ({**classic}, {}) if direction == "upgrade" else ({}, {**classic})
    old_type, new_type = ("classic", "consumer") if direction == "upgrade" else ("consumer", "classic")
    partitions = 6
    topic = unique_topic("kip848-switch")
    create_topic(rill.bootstrap, topic, partitions)
    producer = SteadyProducer(rill.bootstrap, topic, partitions)
    group = f"g848-{uuid.uuid4().hex[:8]}"
    members = [Member(rill.bootstrap, group, [topic], **old) for _ in range(3)]
    gone = []
    try:
        wait_for(lambda: settled(members, topic, partitions, [2, 2, 2]), 60, f"a {old_type} 2/2/2")
        assert group_type(rill, group) == old_type
        for step in range(3):
            started = time.monotonic()
            leaving = members.pop(0)
            leaving.close()
            gone.append(leaving)
            closed = time.monotonic()
            wait_for(lambda: settled(members, topic, partitions, [3, 3]), 60, f"step {step}: 3/3 after a leave")
            left = time.monotonic()
            members.append(Member(rill.bootstrap, group, [topic], **new))
            wait_for(lambda: settled(members, topic, partitions, [2, 2, 2]), 60, f"step {step}: 2/2/2 again")
            expected = "consumer" if direction == "upgrade" or step < 2 else "classic"
            assert group_type(rill, group) == expected, f"step {step}"
            print(f"\nstep {step}: {2 - step} {old_type} and {step + 1} {new_type} members, "
                  f"2/2/2, a {expected} group (close {closed - started:.1f} s, 3/3 "
                  f"{left - closed:.1f} s, 2/2/2 {time.monotonic() - left:.1f} s)")
        delivered = producer.stop()

        def all_read():
            seen = set()
            for m in members + gone:
                seen |= {(p, o) for t, p, o in m.seen() if t == topic}
            return seen >= delivered

        wait_for(all_read, 60, "every record read by the group")
        ends: dict[int, int] = {}
        for p, o in delivered:
            ends[p] = max(ends.get(p, 0), o + 1)

        def committed_to_the_end():
            # OffsetFetch by hand, from outside the group: confluent-kafka 2.16's
            # Consumer.committed(), called beside the thread that polls, can block far
            # past its timeout (classic groups too).
            offsets, errors = kafka_wire.offset_fetch(rill.bootstrap, group, topic, partitions, 10)
            return not errors and all(offsets.get(p) == ends.get(p, 0) for p in range(partitions))

        wait_for(committed_to_the_end, 30, "commits at the end of every partition")
        for m in members + gone:
            assert m.errors == [], m.errors
    finally:
        producer.stop()
        for m in members:
            m.close()


class CommittingMember:
    """A member that commits synchronously after every few records, logging when each
    record was delivered and when each commit was acknowledged, for the failover check."""

    def __init__(self, bootstrap: str, group: str, topic: str, log: list, lock: threading.Lock):
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": "consumer",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        })
        self.consumer.subscribe([topic])
        self.log = log
        self.lock = lock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        since_commit = 0
        while not self._stop.is_set():
            message = self.consumer.poll(0.05)
            if message is not None and message.error() is None:
                with self.lock:
                    self.log.append((time.monotonic(), "read", message.partition(), message.offset()))
                since_commit += 1
            if since_commit >= 5 or (message is None and since_commit):
                try:
                    offsets = self.consumer.commit(asynchronous=False)
                except Exception:
                    continue  # failed commits (coordinator moving) are not acknowledged
                with self.lock:
                    for tp in offsets or []:
                        if tp.error is None and tp.offset >= 0:
                            self.log.append((time.monotonic(), "acked", tp.partition, tp.offset))
                since_commit = 0
        self.consumer.close()

    def close(self):
        self._stop.set()
        self._thread.join(timeout=60)


def test_committed_offsets_survive_a_coordinator_failover(rill_cluster_factory):
    from test_cluster import create_replicated_topic

    cluster = rill_cluster_factory(overrides=CONSUMER_OVERRIDES)
    partitions = 4
    topic = unique_topic("kip848-failover")
    create_replicated_topic(cluster.bootstrap, topic, partitions, 3)
    # Records keep coming through the failover, so that the group reads and commits on
    # both sides of it.
    producer = SteadyProducer(cluster.bootstrap, topic, partitions, interval_s=0.005)
    group = f"g848-{uuid.uuid4().hex[:8]}"
    log: list = []
    lock = threading.Lock()
    members = [CommittingMember(cluster.bootstrap, group, topic, log, lock) for _ in range(2)]
    hosts = {i: n.bootstrap for i, n in cluster.brokers().items()}
    try:
        wait_for(lambda: sum(1 for e in list(log) if e[1] == "acked") >= 20, 60, "commits before the failover")
        coordinator = wait_for(lambda: find_on_any(hosts, group), 30, "the group's coordinator")
        cluster.node(coordinator).kill9()
        killed = time.monotonic()
        time.sleep(3.0)
        delivered = producer.stop()
        survivors = {i: h for i, h in hosts.items() if i != coordinator}
        successor = wait_for(lambda: find_on_any(survivors, group), 30, "a new coordinator")
        assert successor != coordinator

        def caught_up():
            with lock:
                entries = list(log)
            read = {(p, o) for _, k, p, o in entries if k == "read"}
            ends: dict[int, int] = {}
            for p, o in delivered:
                ends[p] = max(ends.get(p, 0), o + 1)
            acked = {p: max([o for _, k, q, o in entries if k == "acked" and q == p], default=0)
                     for p in range(partitions)}
            return read >= delivered and acked == ends

        wait_for(caught_up, 120, "every record read and committed after the failover")
        print(f"\ncoordinator {coordinator} killed; {successor} took over; every record read and "
              f"committed {time.monotonic() - killed:.2f} s after the kill")
    finally:
        producer.stop()
        for m in members:
            m.close()
    with lock:
        entries = list(log)
    assert any(k == "acked" and t > killed for t, k, _, _ in entries), "commits after the failover"
    # A record read twice must be one no acknowledged commit had passed when it was read
    # again: the new coordinator replayed every acknowledged commit.
    acked = {p: 0 for p in range(partitions)}
    first_read: set[tuple[int, int]] = set()
    redelivered = []
    for _, kind, p, o in entries:
        if kind == "acked":
            acked[p] = max(acked[p], o)
        elif (p, o) in first_read:
            redelivered.append((p, o))
            assert o >= acked[p], f"record {p}/{o} read again though offset {acked[p]} was committed"
        else:
            first_read.add((p, o))
    print(f"records read twice (read, not yet committed): {len(redelivered)} of {len(first_read)}")
