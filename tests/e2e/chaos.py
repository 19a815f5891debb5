"""The fault-injection suite (issue #14, item 5): a three-node cluster of real `rill server`
processes, a workload of real clients, seeded faults, and a checker of what the workload
was promised.

    python tests/e2e/chaos.py --scenario coordinator-partition --seed 7
    python tests/e2e/chaos.py --scenario random --seconds 1800 --seed 42
    cargo xtask chaos --minutes 30 --seed 42          # the same, with the venv and binary

# Topology

Each node runs in a network namespace of its own (`rc<tag>n<i>`, address 10.213.0.<i>,
every port fixed: 9092 for clients, 9093 for the controller quorum), with a veth into a
bridge that lives in a fourth namespace (`rc<tag>c`, 10.213.0.254). This process moves
itself into that fourth namespace before it opens a socket or starts a thread, so the
clients reach every node through the bridge and nothing of it is in the machine's own
namespace. A partition of node X resolves the peers' addresses in X's namespace, and X's
address in each peer's, to a MAC address nobody has (a permanent neighbour entry): every
packet between X and its peers is dropped silently, while the clients still reach
everyone. (No qdisc but the default is available here, and nftables is not needed.)
Where namespaces cannot be made (not root, no `ip`), the nodes run on 127.0.0.1 and the
partition faults are skipped, and the output says so. The network code is `netns.py`,
shared with `bench/cluster_failover.py --fault partition`.

# Workload

- `--producers` idempotent acks=all confluent-kafka producers write the values
  `p<id>-<seq>` round-robin over the partitions of an RF=3, `min.insync.replicas=2` topic,
  recording every acknowledged (partition, offset, value);
- a consumer group of two members (confluent-kafka) reads that topic and commits
  synchronously. Commits only ever move forward: an attempt is made only above the
  highest offset any member has attempted for that partition, under one lock, so that the
  commits the coordinator receives are increasing whatever the rebalances do;
- a session that follows the protocol as a client does (FindCoordinator, keep that
  coordinator until it answers "not the coordinator" or cannot be reached) reads both
  groups' offsets from its coordinator, and commits to a group of its own the values
  1, 2, 3, ..., each once and only to the coordinator it has (a commit that times out is
  not sent again elsewhere; librdkafka's members do resend theirs to a new coordinator);
  the two groups share a coordinator;
- an every-node checker sends OffsetFetch (v2, raw) to each node in turn and records
  every answer a node gave as the coordinator (no error): each is a claim that the
  offsets in it were committed.

Transactional producers and read_committed consumers are not part of the workload yet
(transactions are not built; the broker answers their APIs with Kafka's error codes):
`--transactional` asks for them and is refused with that message; the checker's
`check_read_committed` takes what such a workload records (aborted values, what a
read_committed reader saw) and runs when it is given them.

# Faults

Chosen by a seeded RNG (the seed is printed; `--seed` replays the schedule) and printed as
a schedule before the run: `kill` (SIGKILL, restart after the window), `pause` (SIGSTOP,
SIGCONT after it), `partition` (cut from its peers, healed after it), `disk-full` (SIGKILL,
restart with RLIMIT_FSIZE just above its largest segment, so that a write fails with EFBIG
and the node stops itself as for a full disk; restarted without the limit after the
window), `slow-disk` (strace attached to the running node holds each pwritev, pwrite64,
fsync and fdatasync for 20-400 ms, drawn per fault; detached after the window; see
`SlowDisk` for what else it slows) and `clock-jump` (the node's wall clock steps by
30-3600 s, forward or back, drawn per fault, and steps back to true time after the
window: every node then runs under libfaketime, whose offset file it re-reads each
second; only CLOCK_REALTIME moves, the monotonic clocks do not). strace and libfaketime
come from Debian and are installed when missing (as root); a kind whose tool cannot be
had is skipped, and said so. The target is a node id or `coordinator`: the coordinator
of the workload's group at the moment the fault starts (FindCoordinator). One fault at a
time, so a majority is always up.

# Checks

After the schedule, everything is healed, the cluster settles (every partition led, its
ISR full) and the workload stops. Then:
- `no_lost_ack`: every acknowledged record is in the log at its acknowledged offset;
- `no_duplicate`: no value is stored twice;
- `no_offset_two_records`: no offset was acknowledged for two values;
- `producer_order`: in each partition, each producer's sequence numbers increase with
  the offset;
- `replicas_identical`: with all three nodes paused together, each partition's segment
  bytes are the same on every replica (the workload topic and `__consumer_offsets`);
- `offsets_never_backwards`: per group and partition, the answers the session got, in
  order, and then the group's offsets after heal, never decrease;
- `offsets_fetched_were_committed`: every offset any node answered is one whose commit
  record is in `__consumer_offsets` after heal, i.e. it was replicated (read back with a
  consumer; the check refuses to pass if that log has been compacted);
- `acked_commit_visible`: no answer to the session after its own acknowledged commit is
  below it, and after heal each group's offsets are at least its acknowledged commits;
  (What is not checked: the order of answers across nodes. A deposed coordinator cut off
  from the controller goes on answering OffsetFetch with the offsets it had committed
  until it hears of its successor, as Kafka's does: stale, but replicated, which
  `offsets_fetched_were_committed` holds it to; a client keeps one coordinator.)
- `read_committed` (when a transactional workload ran): no aborted value was read.
A failure prints the seed, the schedule as it ran and the evidence; the report is also
written as JSON (`--report`). The exit status is 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from netns import HUB_ADDRESS, NODES, Network, ensure_program, namespaced_cluster  # noqa: E402
from rill_harness import RillCluster, RillServer, rill_binary  # noqa: E402


# Failure detection shortened so that a fault is noticed within seconds (the same values
# as the cluster tests' conftest.CLUSTER_OVERRIDES), and min.insync.replicas=2 everywhere.
OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "broker.heartbeat.interval.ms": "300",
    "broker.session.timeout.ms": "2000",
    "replica.lag.time.max.ms": "3000",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "3",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
}

# Every wait of the run is bounded by one of these.
SETTLE_TIMEOUT_S = 60.0
FAULT_WINDOW_S = (3.0, 9.0)
FAULT_GAP_S = (2.0, 5.0)
OFFSET_FETCH_TIMEOUT_S = 2.0
COMMIT_INTERVAL_S = 0.3
REPLICA_COMPARE_TRIES = 10
DISK_FULL_HEADROOM_BYTES = 16 * 1024


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


# ---------------------------------------------------------------------------------------
# The network (namespaces, a bridge, dead neighbour entries for partitions): netns.py.


def make_cluster(workdir: Path, net: Network | None) -> RillCluster:
    if net is None:
        return RillCluster(workdir, 3, OVERRIDES)
    return namespaced_cluster(workdir, net, OVERRIDES)


# ---------------------------------------------------------------------------------------
# The workload.


class Clock:
    def __init__(self):
        self.t0 = time.monotonic()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)


@dataclass
class Ack:
    producer: int
    seq: int
    partition: int
    offset: int | None  # None: acknowledged without an offset (librdkafka's -1)
    at: float = 0.0


class Producers:
    """Idempotent acks=all producers, each writing p<id>-<seq> round-robin over partitions."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, count: int, rate_per_s: float, clock: "Clock"):
        from confluent_kafka import Producer

        self.topic, self.partitions, self.clock = topic, partitions, clock
        self.interval = 1.0 / rate_per_s
        self.producers = [
            Producer(
                {
                    "bootstrap.servers": bootstrap,
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 5,
                    "message.timeout.ms": 60000,
                    "topic.metadata.refresh.interval.ms": 1000,
                }
            )
            for _ in range(count)
        ]
        self.acks: list[Ack] = []
        self.errors: list[str] = []
        self.sent = 0
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(count)]

    def start(self):
        for t in self.threads:
            t.start()

    def _run(self, index: int):
        producer = self.producers[index]

        def on_delivery(err, msg):
            with self._lock:
                if err is not None:
                    self.errors.append(f"p{index}: {err}")
                    return
                pid, seq = parse_value(msg.value())
                self.acks.append(Ack(pid, seq, msg.partition(), msg.offset(), self.clock.now()))

        seq = 0
        while not self._halt.is_set():
            try:
                producer.produce(
                    self.topic,
                    value=f"p{index}-{seq}".encode(),
                    partition=seq % self.partitions,
                    on_delivery=on_delivery,
                )
                seq += 1
                with self._lock:
                    self.sent += 1
            except BufferError:
                pass
            producer.poll(0)
            time.sleep(self.interval)
        remaining = producer.flush(90)
        if remaining:
            with self._lock:
                self.errors.append(f"p{index}: {remaining} records undelivered after flush")

    def stop(self):
        self._halt.set()
        for t in self.threads:
            t.join(timeout=120)


def parse_value(value: bytes) -> tuple[int, int]:
    pid, seq = value.decode().removeprefix("p").split("-")
    return int(pid), int(seq)


@dataclass
class CommitAttempt:
    member: int
    partition: int
    offset: int
    start: float
    end: float
    acked: bool
    error: str = ""


class Group:
    """Two members of one group, committing synchronously and only ever forward."""

    def __init__(self, bootstrap: str, topic: str, group: str, clock: Clock, members: int = 2):
        self.bootstrap, self.topic, self.group, self.clock = bootstrap, topic, group, clock
        self.attempts: list[CommitAttempt] = []
        self.consumed = 0
        self.highest_attempted: dict[int, int] = {}
        self._commit_lock = threading.Lock()
        self._halt = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(m,), daemon=True) for m in range(members)]

    def start(self):
        for t in self.threads:
            t.start()

    def _run(self, member: int):
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "client.id": f"chaos-member-{member}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 1000,
                "socket.timeout.ms": 6000,
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        consumer.subscribe([self.topic])
        positions: dict[int, int] = {}
        last_commit = 0.0
        try:
            while not self._halt.is_set():
                msg = consumer.poll(0.2)
                if msg is not None and msg.error() is None:
                    positions[msg.partition()] = msg.offset() + 1
                    self.consumed += 1
                if time.monotonic() - last_commit < COMMIT_INTERVAL_S:
                    continue
                last_commit = time.monotonic()
                try:
                    owned = {tp.partition for tp in consumer.assignment()}
                except KafkaException:
                    continue
                for p in sorted(owned):
                    pos = positions.get(p)
                    if pos is None:
                        continue
                    with self._commit_lock:
                        if pos <= self.highest_attempted.get(p, -1):
                            continue
                        self.highest_attempted[p] = pos
                        start = self.clock.now()
                        try:
                            result = consumer.commit(
                                offsets=[TopicPartition(self.topic, p, pos)], asynchronous=False
                            )
                            failed = [str(tp.error) for tp in result or [] if tp.error is not None]
                        except KafkaException as error:
                            failed = [str(error)]
                        self.attempts.append(
                            CommitAttempt(member, p, pos, start, self.clock.now(), not failed, "; ".join(failed))
                        )
        finally:
            consumer.close()

    def stop(self):
        self._halt.set()
        for t in self.threads:
            t.join(timeout=60)


@dataclass
class Observation:
    node: int
    start: float
    end: float
    offsets: dict[int, int]
    group: str = ""


def _s(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def _call(host: str, api_key: int, version: int, body: bytes, timeout_s: float) -> tuple[bytes, int]:
    """One request on a fresh connection; the response body and where it starts."""
    header = struct.pack(">hhi", api_key, version, 1) + _s("chaos-checker")
    frame = struct.pack(">i", len(header) + len(body)) + header + body
    address, port = host.rsplit(":", 1)
    with socket.create_connection((address, int(port)), timeout=timeout_s) as sock:
        sock.settimeout(timeout_s)
        sock.sendall(frame)
        size = struct.unpack(">i", _read_exact(sock, 4))[0]
        return _read_exact(sock, size), 4  # after the correlation id


def offset_fetch(host: str, group: str, topic: str, partitions: int, timeout_s: float):
    """OffsetFetch v2 sent to one node; {partition: offset} for the partitions it answered
    without error (as the coordinator), plus the error codes it gave for the rest. (v2 has
    the top-level error; a v1 answer carries a failed request's error on each partition,
    see test_failover.py.)"""
    body = _s(group) + struct.pack(">i", 1) + _s(topic) + struct.pack(">i", partitions)
    body += b"".join(struct.pack(">i", p) for p in range(partitions))
    payload, pos = _call(host, 9, 2, body, timeout_s)
    offsets, errors = {}, {}
    answered, pos = offset_fetch_partitions(payload, pos)
    for p, (offset, error) in answered.items():
        if error == 0:
            if offset >= 0:
                offsets[p] = offset
        else:
            errors[p] = error
    (top_error,) = struct.unpack_from(">h", payload, pos)
    if top_error != 0:
        return {}, {p: top_error for p in range(partitions)}
    return offsets, errors


def offset_fetch_partitions(payload: bytes, pos: int) -> tuple[dict[int, tuple[int, int]], int]:
    """The topics array of an OffsetFetch v1-v5 response (one topic asked for):
    {partition: (committed offset, error code)}, and where the array ends."""
    answered = {}
    (topics,) = struct.unpack_from(">i", payload, pos)
    pos += 4
    for _ in range(topics):
        (n,) = struct.unpack_from(">h", payload, pos)
        pos += 2 + n
        (count,) = struct.unpack_from(">i", payload, pos)
        pos += 4
        for _ in range(count):
            p, offset, meta_len = struct.unpack_from(">iqh", payload, pos)
            pos += 14 + max(meta_len, 0)
            (error,) = struct.unpack_from(">h", payload, pos)
            pos += 2
            answered[p] = (offset, error)
    return answered, pos


def find_coordinator_raw(host: str, group: str, timeout_s: float) -> tuple[int, int]:
    """FindCoordinator v1 (a group) sent to one node: (error code, coordinator node id)."""
    payload, pos = _call(host, 10, 1, _s(group) + struct.pack(">b", 0), timeout_s)
    _throttle, error = struct.unpack_from(">ih", payload, pos)
    pos += 6
    (n,) = struct.unpack_from(">h", payload, pos)
    pos += 2 + max(n, 0)
    (node_id,) = struct.unpack_from(">i", payload, pos)
    return error, node_id


def offset_commit(host: str, group: str, topic: str, partition: int, offset: int, timeout_s: float) -> int:
    """OffsetCommit v2 of one offset, as a consumer outside any generation (Kafka's
    "simple" group, generation -1) does it; returns the partition's error code."""
    body = _s(group) + struct.pack(">i", -1) + _s("") + struct.pack(">q", -1)
    body += struct.pack(">i", 1) + _s(topic) + struct.pack(">i", 1)
    body += struct.pack(">iqh", partition, offset, -1)
    payload, pos = _call(host, 8, 2, body, timeout_s)
    pos += 4  # one topic
    (n,) = struct.unpack_from(">h", payload, pos)
    pos += 2 + n + 4  # its name, one partition
    _p, error = struct.unpack_from(">ih", payload, pos)
    return error


def _read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data


class OffsetChecker(threading.Thread):
    """Asks every node in turn, whether or not it is the coordinator, what the groups'
    committed offsets are: every answer given without an error is a claim that the
    offsets were committed, and the checker holds it to that."""

    def __init__(self, hosts: dict[int, str], groups: list[str], topic: str, partitions: int, clock: Clock):
        super().__init__(daemon=True)
        self.hosts, self.groups, self.topic, self.partitions, self.clock = hosts, groups, topic, partitions, clock
        self.observations: list[Observation] = []
        self.errors: dict[int, int] = {}
        self.unreachable = 0
        self._halt = threading.Event()

    def ask(self, node: int, group: str) -> Observation | None:
        start = self.clock.now()
        try:
            offsets, errors = offset_fetch(self.hosts[node], group, self.topic, self.partitions,
                                           OFFSET_FETCH_TIMEOUT_S)
        except (OSError, struct.error):
            self.unreachable += 1
            return None
        for code in errors.values():
            self.errors[code] = self.errors.get(code, 0) + 1
        if not offsets:
            return None
        observation = Observation(node, start, self.clock.now(), offsets, group)
        self.observations.append(observation)
        return observation

    def run(self):
        while not self._halt.is_set():
            for node in self.hosts:
                for group in self.groups:
                    self.ask(node, group)
            time.sleep(0.1)

    def stop(self):
        self._halt.set()
        self.join(timeout=30)


# Error codes on which a client looks for the coordinator again.
COORDINATOR_MOVED = {14, 15, 16}  # COORDINATOR_LOAD_IN_PROGRESS, _NOT_AVAILABLE, NOT_COORDINATOR
PROBE_COMMIT_TIMEOUT_S = 8.0  # above offsets.commit.timeout.ms: the broker answers first


class ProbeSession(threading.Thread):
    """A client that follows the protocol, as librdkafka's committed() does: it finds the
    coordinator with FindCoordinator, keeps it until it answers an error that says it moved
    (or cannot be reached), and reads both groups' offsets from it, in order. It also
    commits to a group of its own ("simple", generation -1) the values 1, 2, 3, ... one at
    a time, each sent once and to the coordinator it has: a commit that times out is not
    sent again elsewhere, so a value the coordinator never replicated can only be seen by
    reading it back from a coordinator that served it too early."""

    def __init__(self, hosts: dict[int, str], probe_group: str, group: str, topic: str,
                 partitions: int, clock: Clock, rng: random.Random):
        super().__init__(daemon=True)
        self.hosts, self.probe_group, self.group = hosts, probe_group, group
        self.topic, self.partitions, self.clock, self.rng = topic, partitions, clock, rng
        self.coordinator: int | None = None
        self.observations: list[Observation] = []
        self.attempts: list[CommitAttempt] = []
        self.finds: list[tuple[float, int]] = []
        self.next_value = 1
        self._halt = threading.Event()

    def find(self) -> int | None:
        order = list(self.hosts)
        self.rng.shuffle(order)
        for node in order:
            try:
                error, coordinator = find_coordinator_raw(self.hosts[node], self.probe_group,
                                                          OFFSET_FETCH_TIMEOUT_S)
            except (OSError, struct.error):
                continue
            if error == 0 and coordinator in self.hosts:
                self.finds.append((self.clock.now(), coordinator))
                return coordinator
        return None

    def step(self) -> None:
        if self.coordinator is None:
            self.coordinator = self.find()
            if self.coordinator is None:
                return
        host = self.hosts[self.coordinator]
        for group in (self.probe_group, self.group):
            start = self.clock.now()
            try:
                offsets, errors = offset_fetch(host, group, self.topic, self.partitions, OFFSET_FETCH_TIMEOUT_S)
            except (OSError, struct.error):
                self.coordinator = None
                return
            if COORDINATOR_MOVED & set(errors.values()):
                self.coordinator = None
                return
            if offsets:
                self.observations.append(Observation(self.coordinator, start, self.clock.now(), offsets, group))
        value, start = self.next_value, self.clock.now()
        self.next_value += 1
        try:
            error = offset_commit(host, self.probe_group, self.topic, 0, value, PROBE_COMMIT_TIMEOUT_S)
            failure = "" if error == 0 else f"error code {error}"
        except (OSError, struct.error) as exc:
            error, failure = -1, f"no answer ({exc.__class__.__name__})"
        self.attempts.append(CommitAttempt(-1, 0, value, start, self.clock.now(), error == 0, failure))
        if error == -1 or error in COORDINATOR_MOVED:
            self.coordinator = None

    def run(self):
        while not self._halt.is_set():
            self.step()
            time.sleep(0.1)

    def stop(self):
        self._halt.set()
        self.join(timeout=30)


# ---------------------------------------------------------------------------------------
# Faults.


@dataclass
class Fault:
    at_s: float
    kind: str  # one of FAULT_KINDS
    target: str  # a node id, or "coordinator"
    window_s: float
    # How hard, drawn with the fault: slow-disk, the delay (ms) added to each disk
    # syscall; clock-jump, the seconds the wall clock moves (negative: backwards).
    amount: int = 0
    # Filled in as it runs:
    node: int = 0
    started: float = 0.0
    ended: float = 0.0
    note: str = ""

    def describe(self) -> str:
        text = f"t={self.at_s:5.1f}s {self.kind:<10} {self.target:<11} for {self.window_s:4.1f}s"
        if self.kind == "slow-disk":
            text += f", +{self.amount} ms on each {'/'.join(SLOW_DISK_SYSCALLS)}"
        elif self.kind == "clock-jump":
            text += f", wall clock {self.amount:+d} s"
        if self.node:
            text += f"  (ran on node {self.node} from t={self.started:.1f}s to t={self.ended:.1f}s)"
        return text + (f" [{self.note}]" if self.note else "")


FAULT_KINDS = ("kill", "pause", "partition", "disk-full", "slow-disk", "clock-jump")
# The syscalls a slow disk delays: those that only ever reach a file (segment appends
# are one pwritev, index entries pwrite, the metadata log's and every roll's durability
# fsync/fdatasync). `write` and `writev` are left alone: sockets, eventfd wake-ups and
# the log use them too, and a slow disk must not also be a slow network.
SLOW_DISK_SYSCALLS = ("pwritev", "pwrite64", "fsync", "fdatasync")
SLOW_DISK_DELAY_MS = (20, 400)
# Far enough to cross a segment.ms of a test or a session's length in wall-clock terms,
# short of retention.ms (7 days), whose lapse would delete acknowledged records by design.
CLOCK_JUMP_S = (30, 3600)


def coordinator_partition_schedule(rng: random.Random, start_s: float) -> list[Fault]:
    """The scenario of issue #14's bug 1: the group's coordinator cut off from its peers
    (clients still reach it) while the members commit, long enough for the controller to
    move its partitions."""
    return [Fault(start_s, "partition", "coordinator", round(rng.uniform(12.0, 16.0), 1))]


def random_schedule(rng: random.Random, start_s: float, seconds: float, kinds: tuple[str, ...]) -> list[Fault]:
    faults, t = [], start_s
    for _ in range(10_000):
        window = round(rng.uniform(*FAULT_WINDOW_S), 1)
        if t + window > start_s + seconds:
            break
        target = rng.choice(["coordinator", "1", "2", "3"])
        kind = rng.choice(kinds)
        # Drawn only for the kinds that have one, so that the schedules of the other
        # kinds (and their seeds) stay what they were before these kinds existed.
        amount = 0
        if kind == "slow-disk":
            amount = rng.randint(*SLOW_DISK_DELAY_MS)
        elif kind == "clock-jump":
            amount = rng.randint(*CLOCK_JUMP_S) * rng.choice((-1, 1))
        faults.append(Fault(round(t, 1), kind, target, window, amount))
        t += window + rng.uniform(*FAULT_GAP_S)
    return faults


def clock_file(node: RillServer) -> Path:
    """The node's libfaketime timestamp file: the offset of its wall clock."""
    return node.data_dir.parent / "faketime.rc"


def set_clock_offset(node: RillServer, seconds: int) -> None:
    # Replaced whole, so that libfaketime never reads half a line.
    path = clock_file(node)
    scratch = path.with_suffix(".tmp")
    scratch.write_text(f"{seconds:+d}\n")
    scratch.replace(path)


def find_libfaketime() -> str | None:
    """Debian's libfaketime (the `faketime` package brings it), installed when missing."""
    if ensure_program("faketime", "faketime") is None:
        return None
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


def preload_faketime(cluster: RillCluster, library: str) -> None:
    """Every node (from its next start on) reads the wall clock through libfaketime, at
    the offset in its timestamp file, re-read each second. CLOCK_REALTIME and what is
    derived from it (time(), gettimeofday) move; CLOCK_MONOTONIC and CLOCK_BOOTTIME do
    not (FAKETIME_DONT_FAKE_MONOTONIC): a real clock step moves the one and not the
    others, and timers, leases and Raft's timeouts run on the monotonic clock."""
    for node in cluster.nodes.values():
        set_clock_offset(node, 0)
        node.extra_env = {
            "LD_PRELOAD": library,
            "FAKETIME_TIMESTAMP_FILE": str(clock_file(node)),
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }


def preloaded(node: RillServer, library: str) -> bool:
    try:
        return library in Path(f"/proc/{node.pid}/maps").read_text()
    except OSError:
        return False


def tracer_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class SlowDisk:
    """strace attached to a running node (every thread, and threads it starts), holding
    each of SLOW_DISK_SYSCALLS for the fault's delay before it runs; detached (SIGINT)
    at the window's end, which leaves the process running untraced. Attached with -p,
    strace cannot use a seccomp filter, so every syscall of the node stops at the tracer
    on its way in and out: the node is slower everywhere, and its disk path much slower.
    Measured on the 2-core machine: an idle node answered a single produce in 0.6-1.6 ms
    so traced (no delay on its appends); under a loaded machine (load average ~15) and a
    steady producer, the median produce latency went from 6-15 ms to about 300 ms with
    the delays set to zero, so on a busy machine this is a slow node as much as a slow
    disk."""

    ATTACH_TIMEOUT_S = 5.0

    def __init__(self, strace: str, node: RillServer, delay_ms: int):
        self.node = node
        calls = ",".join(SLOW_DISK_SYSCALLS)
        self.log_path = node.data_dir.parent / "strace.log"
        with open(self.log_path, "ab") as err:
            self.process = subprocess.Popen(
                [strace, "-f", "-qq", "-o", "/dev/null", "-e", f"trace={calls}",
                 "-e", f"inject={calls}:delay_enter={delay_ms * 1000}", "-p", str(node.pid)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            )

    def wait_attached(self) -> str:
        """An empty note once the kernel names strace as the node's tracer, else why not."""
        deadline = time.monotonic() + self.ATTACH_TIMEOUT_S
        while time.monotonic() < deadline:
            if tracer_of(self.node.pid) == self.process.pid:
                return ""
            if self.process.poll() is not None:
                return f"strace exited with {self.process.returncode} before attaching ({self.log_path})"
            time.sleep(0.05)
        return f"strace had not attached within {self.ATTACH_TIMEOUT_S:.0f}s"

    def detach(self) -> str:
        """Detaches; returns what was seen of the node's health."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                # A dying tracer detaches its tracees too (strace attached with -p does
                # not ask for them to be killed with it).
                self.process.kill()
                self.process.wait(timeout=10)
                return "strace ignored SIGINT for 10s, killed"
        if not self.node.is_running():
            return f"node exited ({self.node.process.returncode}) while traced"
        if tracer_of(self.node.pid):
            return "node still traced after strace exited"
        return "detached, node running"


class Nemesis:
    def __init__(self, cluster: RillCluster, net: Network | None, group: str, clock: Clock,
                 strace: str | None = None, faketime: bool = False):
        self.cluster, self.net, self.group, self.clock = cluster, net, group, clock
        self.strace, self.faketime = strace, faketime
        self.paused: set[int] = set()
        self.slow_disk: SlowDisk | None = None

    def resolve(self, fault: Fault) -> int:
        if fault.target != "coordinator":
            return int(fault.target)
        hosts = {i: n.bootstrap for i, n in self.cluster.nodes.items() if n.is_running()}
        found = find_on_any(hosts, self.group)
        if found is None:
            fault.note = "no node named a coordinator; node 1 instead"
            return 1
        return found

    def run(self, fault: Fault) -> None:
        delay = fault.at_s - self.clock.now()
        if delay > 0:
            time.sleep(delay)
        if fault.kind == "partition" and self.net is None:
            fault.note = "skipped: no network namespaces on this machine"
            log(f"fault {fault.describe()}")
            return
        fault.node = self.resolve(fault)
        node = self.cluster.node(fault.node)
        fault.started = self.clock.now()
        log(f"fault start: {fault.kind} node {fault.node} for {fault.window_s}s")
        if fault.kind == "kill":
            node.kill9()
        elif fault.kind == "pause":
            os.killpg(node.pid, signal.SIGSTOP)
            self.paused.add(fault.node)
        elif fault.kind == "partition":
            self.net.partition(fault.node)
        elif fault.kind == "disk-full":
            node.kill9()
            # Just above its largest segment: the next few appends to it (or a new
            # index preallocated past it) fail with EFBIG, as on a full disk.
            largest = max((f.stat().st_size for f in node.data_dir.rglob("*.log")), default=0)
            node.file_size_limit_bytes = largest + DISK_FULL_HEADROOM_BYTES
            try:
                node.start()
            except Exception as error:  # noqa: BLE001 - dying of it early is the point
                fault.note = f"died at start under the limit: {str(error).splitlines()[0]}"
        elif fault.kind == "slow-disk":
            self.slow_disk = SlowDisk(self.strace, node, fault.amount)
            fault.note = self.slow_disk.wait_attached()
        elif fault.kind == "clock-jump":
            set_clock_offset(node, fault.amount)
            if not preloaded(node, "libfaketime"):
                fault.note = "libfaketime is not loaded in the node: its clock did not move"
        time.sleep(fault.window_s)
        self.undo(fault)
        fault.ended = self.clock.now()
        log(f"fault end:   {fault.describe()}")

    def undo(self, fault: Fault) -> None:
        node = self.cluster.node(fault.node)
        if fault.kind == "pause":
            os.killpg(node.pid, signal.SIGCONT)
            self.paused.discard(fault.node)
        elif fault.kind == "partition":
            self.net.heal()
        elif fault.kind == "slow-disk":
            note = self.slow_disk.detach()
            self.slow_disk = None
            fault.note = (fault.note + "; " if fault.note else "") + note
        elif fault.kind == "clock-jump":
            set_clock_offset(node, 0)
        elif fault.kind in ("kill", "disk-full"):
            if fault.kind == "disk-full":
                if node.is_running():
                    note = "still running at the window's end"
                else:
                    note = f"stopped itself with exit {node.process.returncode}"
                fault.note = (fault.note + "; " if fault.note else "") + note
                node.kill9()
                node.file_size_limit_bytes = None
            self.cluster.start_node(fault.node)

    def heal_all(self) -> None:
        if self.net is not None:
            self.net.heal()
        if self.slow_disk is not None:
            self.slow_disk.detach()
            self.slow_disk = None
        for node_id, node in self.cluster.nodes.items():
            if self.faketime:
                set_clock_offset(node, 0)
            if node_id in self.paused and node.is_running():
                os.killpg(node.pid, signal.SIGCONT)
            if not node.is_running():
                node.file_size_limit_bytes = None
                self.cluster.start_node(node_id)
        self.paused.clear()


# ---------------------------------------------------------------------------------------
# The checker.


@dataclass
class Check:
    name: str
    ok: bool
    checked: int
    evidence: list[str] = field(default_factory=list)


def check_records(acks: list[Ack], log_by_partition: dict[int, dict[int, bytes]]) -> list[Check]:
    stored: dict[tuple[int, int], tuple[int, int]] = {}  # (pid, seq) -> (partition, offset)
    duplicates = []
    for p, records in log_by_partition.items():
        for offset, value in records.items():
            key = parse_value(value)
            if key in stored:
                duplicates.append(f"p{key[0]}-{key[1]} at {stored[key]} and at {(p, offset)}")
            else:
                stored[key] = (p, offset)
    lost, moved = [], []
    by_offset: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for ack in acks:
        key = (ack.producer, ack.seq)
        where = stored.get(key)
        if ack.offset is None:
            # Acknowledged without an offset: it must be stored, wherever it is.
            if where is None or where[0] != ack.partition:
                lost.append(f"p{ack.producer}-{ack.seq} acknowledged (no offset) in partition "
                            f"{ack.partition} at t={ack.at:.2f}s, not there ({where})")
            continue
        by_offset.setdefault((ack.partition, ack.offset), set()).add(key)
        if where is None:
            lost.append(f"p{ack.producer}-{ack.seq} acknowledged at {(ack.partition, ack.offset)}, not in the log")
        elif where != (ack.partition, ack.offset):
            moved.append(f"p{ack.producer}-{ack.seq} acknowledged at {(ack.partition, ack.offset)}, stored at {where}")
    two = [f"{at}: acknowledged for {sorted(keys)}" for at, keys in by_offset.items() if len(keys) > 1]
    order = []
    for p, records in log_by_partition.items():
        last: dict[int, tuple[int, int]] = {}
        for offset in sorted(records):
            pid, seq = parse_value(records[offset])
            if pid in last and seq <= last[pid][0]:
                order.append(f"partition {p}: p{pid}-{seq} at {offset} after p{pid}-{last[pid][0]} at {last[pid][1]}")
            last[pid] = (seq, offset)
    total = sum(len(r) for r in log_by_partition.values())
    return [
        Check("no_lost_ack", not lost and not moved, len(acks), (lost + moved)[:20]),
        Check("no_duplicate", not duplicates, total, duplicates[:20]),
        Check("no_offset_two_records", not two, len(by_offset), two[:20]),
        Check("producer_order", not order, total, order[:20]),
    ]


def committed_history(records: dict[int, dict[int, tuple[bytes | None, bytes | None]]], topic: str):
    """{(group, partition): set of committed offsets} from `__consumer_offsets` as it is
    after heal, or None when that log no longer holds every record (compacted)."""
    history: dict[tuple[str, int], set[int]] = {}
    for records in records.values():
        offsets = sorted(records)
        if offsets and offsets != list(range(offsets[0], offsets[0] + len(offsets))) or offsets and offsets[0] != 0:
            return None
        for key, value in records.values():
            if key is None or value is None or len(key) < 2:
                continue
            (version,) = struct.unpack_from(">h", key, 0)
            if version not in (0, 1):
                continue  # group metadata, not an offset commit
            pos = 2
            fields = []
            for _ in range(2):
                (n,) = struct.unpack_from(">h", key, pos)
                fields.append(key[pos + 2: pos + 2 + n].decode())
                pos += 2 + n
            (partition,) = struct.unpack_from(">i", key, pos)
            if fields[1] != topic:
                continue
            (_vversion, offset) = struct.unpack_from(">hq", value, 0)
            history.setdefault((fields[0], partition), set()).add(offset)
    return history


def check_offsets(session: list[Observation], everyone: list[Observation],
                  attempts: dict[str, list[CommitAttempt]], final: dict[str, dict[int, int]],
                  history: dict[tuple[str, int], set[int]] | None, faults: list[Fault]) -> list[Check]:
    """What OffsetFetch answered, against what was committed.

    - offsets_never_backwards: per group, the answers the protocol-following session got,
      in order, then the group's offsets after heal, never decrease;
    - offsets_fetched_were_committed: every answer any node gave without an error is an
      offset whose commit is in `__consumer_offsets` after heal (it was replicated);
    - acked_commit_visible: no answer to the session after an acknowledged commit of its
      own is below it, and after heal every group's offsets are at least its acknowledged
      commits."""

    def during(t: float) -> str:
        active = [f"{f.kind} node {f.node}" for f in faults if f.node and f.started <= t <= f.ended]
        return ", ".join(active) or "no fault"

    def commit_of(group: str, p: int, offset: int) -> str:
        for a in attempts.get(group, []):
            if a.partition == p and a.offset == offset:
                outcome = "acknowledged" if a.acked else f"NOT acknowledged ({a.error or 'no answer'})"
                who = "the session" if a.member < 0 else f"member {a.member}"
                return f"; {who} committed {offset} at t={a.start:.2f}-{a.end:.2f}s: {outcome}"
        return ""

    backwards, unreplicated, unseen = [], [], []
    for group in sorted({o.group for o in session} | set(final)):
        best: dict[int, Observation] = {}
        shown: set[tuple[int, int, int]] = set()
        for obs in sorted((o for o in session if o.group == group), key=lambda o: o.start):
            for p, offset in obs.offsets.items():
                seen = best.get(p)
                if seen is not None and offset < seen.offsets[p] and (p, seen.offsets[p], offset) not in shown:
                    shown.add((p, seen.offsets[p], offset))
                    backwards.append(
                        f"{group} partition {p}: node {seen.node} answered {seen.offsets[p]} at "
                        f"t={seen.end:.2f}s ({during(seen.end)}), then node {obs.node} answered "
                        f"{offset} at t={obs.start:.2f}s ({during(obs.start)})"
                        + commit_of(group, p, seen.offsets[p])
                    )
                if seen is None or offset >= seen.offsets[p]:
                    best[p] = obs
        for p, offset in final.get(group, {}).items():
            seen = best.get(p)
            if seen is not None and offset < seen.offsets[p]:
                backwards.append(
                    f"{group} partition {p}: node {seen.node} answered {seen.offsets[p]} at "
                    f"t={seen.end:.2f}s ({during(seen.end)}); after heal the offset is {offset}"
                    + commit_of(group, p, seen.offsets[p])
                )
        for a in attempts.get(group, []):
            after_heal = final.get(group, {}).get(a.partition)
            if a.acked and after_heal is not None and after_heal < a.offset:
                unseen.append(f"{group} partition {a.partition}: commit of {a.offset} acknowledged at "
                              f"t={a.end:.2f}s; after heal the offset is {after_heal}")
    own = sorted((a for a in attempts.get(session[0].group if session else "", []) if a.acked and a.member < 0),
                 key=lambda a: a.end)
    for obs in session:
        for a in own:
            if a.end >= obs.start:
                break
            if obs.group == session[0].group:
                got = obs.offsets.get(a.partition)
                if got is not None and got < a.offset:
                    unseen.append(f"{obs.group} partition {a.partition}: commit of {a.offset} acknowledged "
                                  f"at t={a.end:.2f}s, node {obs.node} answered {got} at t={obs.start:.2f}s "
                                  f"({during(obs.start)})")
    if history is None:
        unreplicated.append("__consumer_offsets no longer holds every record (compacted): cannot check")
    else:
        reported: set[tuple[str, int, int, int]] = set()
        for obs in sorted(everyone + session, key=lambda o: o.start):
            for p, offset in obs.offsets.items():
                if offset not in history.get((obs.group, p), set()) and (obs.group, p, offset, obs.node) not in reported:
                    reported.add((obs.group, p, offset, obs.node))
                    unreplicated.append(
                        f"{obs.group} partition {p}: node {obs.node} answered {offset} at t={obs.start:.2f}s "
                        f"({during(obs.start)}), a commit not in __consumer_offsets after heal"
                        + commit_of(obs.group, p, offset)
                    )
    answers = sum(len(o.offsets) for o in everyone + session)
    acked = sum(a.acked for group_attempts in attempts.values() for a in group_attempts)
    return [
        Check("offsets_never_backwards", not backwards, sum(len(o.offsets) for o in session), _spread(backwards)),
        Check("offsets_fetched_were_committed", not unreplicated, answers, _spread(unreplicated)),
        Check("acked_commit_visible", not unseen, acked, _spread(unseen)),
    ]


def check_read_committed(aborted_values: set[bytes], read_committed_log: dict[int, dict[int, bytes]]) -> Check:
    """The transactional workload's check: a read_committed reader saw no aborted value."""
    seen = [
        f"partition {p} offset {o}: {v!r} was aborted"
        for p, records in read_committed_log.items()
        for o, v in records.items()
        if v in aborted_values
    ]
    return Check("read_committed", not seen, sum(len(r) for r in read_committed_log.values()), seen[:20])


def _spread(lines: list[str], keep: int = 12) -> list[str]:
    if len(lines) <= keep:
        return lines
    return lines[: keep // 2] + [f"... {len(lines) - keep} more ..."] + lines[-keep // 2:]


def batch_headers(partition_dir: Path, offsets: set[int]) -> dict[int, str]:
    """For the evidence of a duplicate: the record batch header (leader epoch, producer id,
    producer epoch, sequence) each of `offsets` was written with, from the segment files."""
    found: dict[int, str] = {}
    for segment in sorted(partition_dir.glob("*.log")):
        data, pos = segment.read_bytes(), 0
        while pos + 61 <= len(data) and len(found) < len(offsets):
            base, length, leader_epoch = struct.unpack_from(">qii", data, pos)
            last_delta = struct.unpack_from(">i", data, pos + 23)[0]
            pid, pepoch, base_seq = struct.unpack_from(">qhi", data, pos + 43)
            for o in offsets:
                if base <= o <= base + last_delta:
                    found[o] = (f"leader epoch {leader_epoch}, producer id {pid} epoch {pepoch} "
                                f"sequence {base_seq + (o - base)}")
            pos += 12 + length
    return found


def explain_duplicates(check: Check, cluster: RillCluster, topic: str) -> None:
    """Adds each copy's batch header to a failed no_duplicate's evidence."""
    node = next(iter(cluster.nodes.values()))
    explained = []
    for line in check.evidence:
        copies = [tuple(int(x) for x in m) for m in re.findall(r"\((\d+), (\d+)\)", line)]
        parts = {p for p, _ in copies}
        if len(parts) != 1:
            explained.append(line)
            continue
        headers = batch_headers(node.data_dir / f"{topic}-{parts.pop()}", {o for _, o in copies})
        explained.append(line + "; " + "; ".join(f"offset {o}: {headers.get(o, '?')}" for _, o in copies))
    check.evidence = explained


def segment_digest(partition_dir: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    for segment in sorted(partition_dir.glob("*.log")):
        data = segment.read_bytes()
        digest.update(data)
        size += len(data)
    return size, digest.hexdigest()[:16]


def compare_replicas(cluster: RillCluster, topics: list[str]) -> Check:
    """Pauses all nodes together and compares each partition's segment bytes across them;
    tries again (after a second's running) while they differ, since a follower may be one
    fetch behind, and reports the last difference."""
    differing: list[str] = []
    compared = 0
    for _ in range(REPLICA_COMPARE_TRIES):
        for node in cluster.nodes.values():
            if node.is_running():
                os.killpg(node.pid, signal.SIGSTOP)
        try:
            views: dict[str, dict[int, tuple[int, str]]] = {}
            for node_id, node in cluster.nodes.items():
                for d in node.data_dir.iterdir():
                    if d.is_dir() and any(d.name.startswith(t + "-") for t in topics):
                        views.setdefault(d.name, {})[node_id] = segment_digest(d)
        finally:
            for node in cluster.nodes.values():
                if node.is_running():
                    os.killpg(node.pid, signal.SIGCONT)
        differing = [
            f"{name}: " + ", ".join(f"node {n} {size} bytes sha256 {h}" for n, (size, h) in sorted(v.items()))
            for name, v in sorted(views.items())
            if len(set(v.values())) > 1 or len(v) != len(cluster.nodes)
        ]
        compared = len(views)
        if not differing:
            break
        time.sleep(1.0)
    return Check("replicas_identical", not differing, compared, differing[:20])


# ---------------------------------------------------------------------------------------
# A run.


def wait_settled(bootstrap: str, topics: dict[str, int], timeout_s: float) -> None:
    from confluent_kafka.admin import AdminClient

    client = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            md = client.list_topics(timeout=5)
            ok = True
            for topic, count in topics.items():
                t = md.topics.get(topic)
                if t is None or t.error is not None or len(t.partitions) != count:
                    ok, last = False, f"{topic} not described"
                    break
                for p in t.partitions.values():
                    if p.leader < 0 or len(p.isrs) != len(NODES):
                        ok, last = False, f"{topic}[{p.id}] leader {p.leader} isr {p.isrs}"
                        break
                if not ok:
                    break
            if ok:
                return
        except Exception as error:  # noqa: BLE001 - settling
            last = repr(error)
        time.sleep(0.3)
    raise RuntimeError(f"cluster did not settle within {timeout_s:.0f}s: {last}")


def probe_group_beside(hosts: dict[int, str], group: str, rng: random.Random, tries: int = 64) -> str:
    """A name for the session's own group with the same coordinator as `group`, so that a
    fault aimed at the coordinator hits both."""
    want = find_on_any(hosts, group)
    for _ in range(tries):
        name = f"{group}-probe-{rng.randrange(16**6):06x}"
        if find_on_any(hosts, name) == want:
            return name
    raise RuntimeError(f"no probe group name shares node {want}'s coordination in {tries} tries")


def find_on_any(hosts: dict[int, str], group: str) -> int | None:
    for host in hosts.values():
        try:
            error, node = find_coordinator_raw(host, group, OFFSET_FETCH_TIMEOUT_S)
        except (OSError, struct.error):
            continue
        if error == 0:
            return node
    return None


def final_offsets(hosts: dict[int, str], group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's offsets after heal, from the coordinator FindCoordinator names."""
    for _ in range(50):
        node = find_on_any(hosts, group)
        if node is not None:
            try:
                offsets, errors = offset_fetch(hosts[node], group, topic, partitions, OFFSET_FETCH_TIMEOUT_S)
                if not errors:
                    return offsets
            except (OSError, struct.error):
                pass
        time.sleep(0.2)
    raise RuntimeError(f"no coordinator answered for {group} after heal")


def read_records(bootstrap: str, topic: str, partitions: int) -> dict[int, dict[int, tuple]]:
    from kafka_helpers import read_all

    return {p: {o: (r.key, r.value) for o, r in recs.items()} for p, recs in read_all(bootstrap, topic, partitions).items()}


def read_log(bootstrap: str, topic: str, partitions: int) -> dict[int, dict[int, bytes]]:
    from kafka_helpers import read_all

    return {p: {o: r.value for o, r in recs.items()} for p, recs in read_all(bootstrap, topic, partitions).items()}


def run(args: argparse.Namespace) -> dict:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    rng = random.Random(seed)
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"seed {seed} (replay with --seed {seed} --scenario {args.scenario} --seconds {args.seconds})")
    log(f"workdir {workdir}, binary {rill_binary()}")
    if args.transactional:
        raise SystemExit(
            "--transactional: transactions are not built yet (the broker answers the "
            "transactional APIs with Kafka's error codes); the read_committed check is ready "
            "for them (check_read_committed)"
        )
    skipped: list[str] = []
    requested = args.faults.split(",")
    unknown = set(requested) - set(FAULT_KINDS)
    if unknown or not requested:
        raise SystemExit(f"--faults: unknown or no fault kinds {sorted(unknown)} (known: {', '.join(FAULT_KINDS)})")
    # The tools of the slow disk and the clock jump, installed (Debian, as root) when
    # missing; a kind whose tool cannot be had is left out of the schedule, and said so.
    strace = ensure_program("strace", "strace") if "slow-disk" in requested else None
    if "slow-disk" in requested and strace is None:
        skipped.append("slow-disk: no strace, and apt-get could not install it")
        log("SLOW DISK SKIPPED: no strace")
    faketime = find_libfaketime() if "clock-jump" in requested else None
    if "clock-jump" in requested and faketime is None:
        skipped.append("clock-jump: no libfaketime, and apt-get could not install it")
        log("CLOCK JUMPS SKIPPED: no libfaketime")
    net, why = (None, "--no-netns given") if args.no_netns else Network.make()
    if net is None:
        skipped.append(f"partition: {why}; nodes on 127.0.0.1, no partitions")
        log(f"PARTITIONS SKIPPED: {why}")
    else:
        net.enter_hub()
        log(f"network namespaces {net.hub} (hub, {HUB_ADDRESS}) and {', '.join(net.ns(i) for i in NODES)}")
    unavailable = {
        "partition": net is None,
        "slow-disk": strace is None,
        "clock-jump": faketime is None,
    }
    kinds = tuple(k for k in requested if not unavailable.get(k, False))
    if not kinds:
        raise SystemExit(f"--faults {args.faults}: none of these kinds can be injected here ({'; '.join(skipped)})")

    warmup = 8.0
    if args.scenario == "coordinator-partition":
        schedule = coordinator_partition_schedule(rng, warmup)
    elif args.scenario == "random":
        schedule = random_schedule(rng, warmup, args.seconds, kinds)
    else:  # ci: the targeted fault first, then random ones
        schedule = coordinator_partition_schedule(rng, warmup)
        first_end = schedule[0].at_s + schedule[0].window_s + 4.0
        schedule += random_schedule(rng, first_end, max(args.seconds - first_end, 0), kinds)
    if net is None:
        schedule = [f for f in schedule if f.kind != "partition"] or schedule
    log("schedule:")
    for fault in schedule:
        log(f"  {fault.describe()}")

    # Every refused produce in the nodes' logs (debug in the handler), so that a duplicate
    # or a loss comes with the error codes the producers were given.
    os.environ.setdefault("RILL_LOG", "info,openraft=off,rill_broker::apis::data=debug")
    cluster = make_cluster(workdir, net)
    preloaded = faketime is not None and any(f.kind == "clock-jump" for f in schedule)
    if preloaded:
        preload_faketime(cluster, faketime)
        log(f"every node reads its wall clock through {faketime} (clock-jump faults)")
    # Names from the seed too, so that a replay has the same coordinators (a group's is
    # chosen by a hash of its name).
    topic, group, partitions = f"chaos-{seed}", f"chaos-group-{seed}", args.partitions
    report: dict = {"seed": seed, "scenario": args.scenario, "skipped": skipped}
    producers = group_members = checker = session = None
    try:
        cluster.start()
        bootstrap = cluster.bootstrap
        from confluent_kafka.admin import AdminClient, NewTopic

        client = AdminClient({"bootstrap.servers": bootstrap})
        client.create_topics(
            [NewTopic(topic, partitions, 3, config={"min.insync.replicas": "2"})], operation_timeout=30
        )[topic].result(timeout=30)
        wait_settled(bootstrap, {topic: partitions}, SETTLE_TIMEOUT_S)
        clock = Clock()
        producers = Producers(bootstrap, topic, partitions, args.producers, args.rate, clock)
        group_members = Group(bootstrap, topic, group, clock)
        hosts = {i: n.bootstrap for i, n in cluster.nodes.items()}
        probe_group = probe_group_beside(hosts, group, rng)
        checker = OffsetChecker(hosts, [group, probe_group], topic, partitions, clock)
        session = ProbeSession(hosts, probe_group, group, topic, partitions, clock, random.Random(seed + 1))
        producers.start()
        group_members.start()
        checker.start()
        session.start()
        nemesis = Nemesis(cluster, net, group, clock, strace, preloaded)
        for fault in schedule:
            nemesis.run(fault)
        rest = max(0.0, warmup + args.seconds - clock.now()) if args.scenario != "coordinator-partition" else 6.0
        time.sleep(rest)
        log("healing everything, then settling")
        nemesis.heal_all()
        offsets_partitions = int(OVERRIDES["offsets.topic.num.partitions"])
        wait_settled(cluster.bootstrap, {topic: partitions, "__consumer_offsets": offsets_partitions}, SETTLE_TIMEOUT_S)
        time.sleep(3.0)  # the workload runs on the healed cluster for a moment
        producers.stop()
        group_members.stop()
        checker.stop()
        session.stop()
        final = {g: final_offsets(hosts, g, topic, partitions) for g in (group, probe_group)}
        log(f"workload: {producers.sent} sent, {len(producers.acks)} acknowledged, "
            f"{len(producers.errors)} producer errors, {group_members.consumed} consumed, "
            f"{sum(a.acked for a in group_members.attempts)}/{len(group_members.attempts)} commits acknowledged; "
            f"session: {sum(a.acked for a in session.attempts)}/{len(session.attempts)} commits acknowledged, "
            f"{len(session.observations)} answers, coordinators found {session.finds[:12]}; "
            f"{len(checker.observations)} answers to the every-node checker ({checker.errors} error codes, "
            f"{checker.unreachable} unreachable); after heal {final}")
        stored = read_log(cluster.bootstrap, topic, partitions)
        checks = check_records(producers.acks, stored)
        for check in checks:
            if check.name == "no_duplicate" and not check.ok:
                explain_duplicates(check, cluster, topic)
        offsets_log = read_records(cluster.bootstrap, "__consumer_offsets", offsets_partitions)
        checks += check_offsets(
            session.observations,
            checker.observations,
            {group: group_members.attempts, probe_group: session.attempts},
            final,
            committed_history(offsets_log, topic),
            schedule,
        )
        checks.append(compare_replicas(cluster, [topic, "__consumer_offsets"]))
        report.update(
            acknowledged=len(producers.acks),
            # librdkafka's implicit acknowledgements: a message whose own answer was lost
            # is acknowledged, without an offset, when a later sequence is.
            acknowledged_without_offset=[asdict(a) for a in producers.acks if a.offset is None][:20],
            sent=producers.sent,
            producer_errors=producers.errors[:10],
            commits=len(group_members.attempts),
            commits_acknowledged=sum(a.acked for a in group_members.attempts),
            offset_fetch_answers=len(checker.observations) + len(session.observations),
            session_commits=len(session.attempts),
            session_commits_acknowledged=sum(a.acked for a in session.attempts),
            probe_group=probe_group,
            final_offsets=final,
            faults=[asdict(f) for f in schedule],
            faults_injected=sum(1 for f in schedule if f.node),
            checks={c.name: asdict(c) for c in checks},
        )
    except Exception:  # noqa: BLE001 - reported with the seed and the schedule
        report["error"] = traceback.format_exc()
        report.setdefault("faults", [asdict(f) for f in schedule])
    finally:
        for thing in (producers, group_members, checker, session):
            if thing is not None and hasattr(thing, "_halt"):
                thing._halt.set()
        problems = cluster.teardown()
        if problems:
            report.setdefault("problems", problems)
        if net is not None:
            net.teardown()
    return report


def print_report(report: dict) -> bool:
    checks = report.get("checks", {})
    ok = bool(checks) and all(c["ok"] for c in checks.values()) and "error" not in report
    if "error" in report:
        log(f"the run itself failed:\n{report['error']}")
    log(f"seed {report['seed']}, scenario {report['scenario']}: "
        f"{report.get('acknowledged', 0)} acknowledged writes checked, "
        f"{report.get('faults_injected', 0)} faults injected, "
        f"{report.get('offset_fetch_answers', 0)} OffsetFetch answers checked")
    log("schedule as run:")
    for f in report.get("faults", []):
        log("  " + Fault(**f).describe())
    for skipped in report.get("skipped", []):
        log(f"skipped: {skipped}")
    for ack in report.get("acknowledged_without_offset", []):
        log(f"note: p{ack['producer']}-{ack['seq']} was acknowledged without an offset "
            f"(partition {ack['partition']}, t={ack['at']:.2f}s)")
    for c in checks.values():
        log(f"  {'PASS' if c['ok'] else 'FAIL'} {c['name']} ({c['checked']} checked)")
        for line in c["evidence"]:
            log(f"      {line}")
    if not ok:
        log(f"FAILED: replay with --seed {report['seed']} --scenario {report['scenario']}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["ci", "random", "coordinator-partition"], default="random")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the fault schedule")
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--rate", type=float, default=100.0, help="records per second per producer")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--transactional", action="store_true",
                        help="add transactional producers and read_committed readers (not built yet)")
    parser.add_argument("--faults", default=",".join(FAULT_KINDS),
                        help=f"the fault kinds the random schedule picks from (default: all of {', '.join(FAULT_KINDS)})")
    parser.add_argument("--no-netns", action="store_true",
                        help="run the nodes on 127.0.0.1 without namespaces (no partitions), "
                             "as on a machine that cannot make them")
    parser.add_argument("--workdir", default=f"/tmp/rill-chaos-{os.getpid()}")
    parser.add_argument("--report", help="write the report here as JSON")
    args = parser.parse_args(argv)
    report = run(args)
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=2))
    return 0 if print_report(report) else 1


if __name__ == "__main__":
    sys.exit(main())
