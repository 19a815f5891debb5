"""The fault-injection suite's non-transactional workload (see `chaos.py`'s "Workload"):
idempotent producers, a committing two-member group, the every-node OffsetFetch checker
and the protocol-following session. Each records what it was promised, for
`chaos_checker.py`."""

from __future__ import annotations

import logging
import random
import re
import struct
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from kafka_wire import REQUEST_TIMEOUT_S
from kafka_wire import find_coordinator_raw, offset_commit, offset_fetch

COMMIT_INTERVAL_S = 0.3


class Clock:
    def __init__(self):
        self.t0 = time.monotonic()

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 3)


class Workers:
    """Each part of the workload: `count` threads, each running `self._run(index)` until
    halted; `stop` halts them and waits for each (up to JOIN_TIMEOUT_S). A thread that
    dies of an exception, or is still running after that, is noted in `failures` (with
    where it is): the run then did less than it says, and fails."""

    JOIN_TIMEOUT_S = 30.0

    def __init__(self, count: int = 1):
        self._halt = threading.Event()
        self.failures: list[str] = []
        self.threads = [threading.Thread(target=self._guarded, args=(i,), daemon=True) for i in range(count)]

    def _run(self, index: int) -> None:
        raise NotImplementedError

    def _guarded(self, index: int) -> None:
        try:
            self._run(index)
        except Exception:  # noqa: BLE001 - reported as the run's failure
            self.failures.append(f"{type(self).__name__} thread {index} died:\n{traceback.format_exc()}")

    def start(self):
        for t in self.threads:
            t.start()

    def halt(self):
        self._halt.set()

    def stop(self):
        self.halt()
        for t in self.threads:
            t.join(timeout=self.JOIN_TIMEOUT_S)
        frames = sys._current_frames()
        for index, t in enumerate(self.threads):
            if t.is_alive() and t.ident in frames:
                stack = "".join(traceback.format_stack(frames[t.ident]))
                self.failures.append(f"{type(self).__name__} thread {index} still running "
                                     f"{self.JOIN_TIMEOUT_S:.0f}s after it was stopped, at:\n{stack}")


@dataclass
class Ack:
    producer: int
    seq: int
    partition: int
    offset: int | None  # None: acknowledged without an offset (librdkafka's -1)
    at: float = 0.0


class EosLog(logging.Handler):
    """librdkafka's `debug=eos` lines of the idempotent producers, which it logs only on
    a produce error or an implicit acknowledgement: the messages it acknowledged
    without an offset because a later request of theirs succeeded after an earlier one's
    answer was lost (IMPLICITACK, librdkafka's `rd_kafka_dr_implicit_ack`), and the
    error lines (ERRSEQ, UNKPID, DUPSEQ, ...), kept for the evidence."""

    KEEP = 200
    STARTUP = {"INIT", "TXN", "PIDBROKER"}  # what every producer logs as it starts

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.implicitly_acked = 0
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        with self._lock:
            found = re.search(r"IMPLICITACK.* (\d+) message\(s\) implicitly acked", line)
            if found:
                self.implicitly_acked += int(found.group(1))
            if len(self.lines) < self.KEEP and line.split(" ", 1)[0] not in self.STARTUP:
                self.lines.append(line)


class Producers(Workers):
    """Idempotent acks=all producers, each writing p<id>-<seq> round-robin over partitions."""

    JOIN_TIMEOUT_S = 120.0

    def __init__(self, bootstrap: str, topic: str, partitions: int, count: int, rate_per_s: float, clock: "Clock",
                 log_path: Path | None = None):
        from confluent_kafka import Producer

        self.topic, self.partitions, self.clock = topic, partitions, clock
        self.interval = 1.0 / rate_per_s
        self.eos_log = EosLog()
        logger = logging.getLogger("chaos.idempotent.producers")
        logger.propagate = False
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self.eos_log)
        if log_path is not None:
            # Every line librdkafka logs for them, with the time, for the evidence.
            handler = logging.FileHandler(log_path)
            handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
            logger.addHandler(handler)
        self.producers = [
            Producer(
                {
                    "bootstrap.servers": bootstrap,
                    "enable.idempotence": True,
                    "acks": "all",
                    "linger.ms": 5,
                    "message.timeout.ms": 60000,
                    "topic.metadata.refresh.interval.ms": 1000,
                    "debug": "eos",
                    "logger": logger,
                }
            )
            for _ in range(count)
        ]
        self.acks: list[Ack] = []
        self.errors: list[str] = []
        self.sent = 0
        self._lock = threading.Lock()
        super().__init__(count)

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


class Group(Workers):
    """Two members of one group, committing synchronously and only ever forward."""

    JOIN_TIMEOUT_S = 60.0

    def __init__(self, bootstrap: str, topic: str, group: str, clock: Clock, members: int = 2):
        self.bootstrap, self.topic, self.group, self.clock = bootstrap, topic, group, clock
        self.attempts: list[CommitAttempt] = []
        self.consumed = 0
        self.highest_attempted: dict[int, int] = {}
        self._commit_lock = threading.Lock()
        super().__init__(members)

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


@dataclass
class Observation:
    node: int
    start: float
    end: float
    offsets: dict[int, int]
    group: str = ""


class OffsetChecker(Workers):
    """Asks every node in turn, whether or not it is the coordinator, what the groups'
    committed offsets are: every answer given without an error is a claim that the
    offsets were committed, and the checker holds it to that."""

    def __init__(self, hosts: dict[int, str], groups: list[str], topic: str, partitions: int, clock: Clock):
        super().__init__()
        self.hosts, self.groups, self.topic, self.partitions, self.clock = hosts, groups, topic, partitions, clock
        self.observations: list[Observation] = []
        self.errors: dict[int, int] = {}
        self.unreachable = 0

    def ask(self, node: int, group: str) -> Observation | None:
        start = self.clock.now()
        try:
            offsets, errors = offset_fetch(self.hosts[node], group, self.topic, self.partitions,
                                           REQUEST_TIMEOUT_S)
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

    def _run(self, _index: int):
        while not self._halt.is_set():
            for node in self.hosts:
                for group in self.groups:
                    self.ask(node, group)
            time.sleep(0.1)


# Error codes on which a client looks for the coordinator again.
COORDINATOR_MOVED = {14, 15, 16}  # COORDINATOR_LOAD_IN_PROGRESS, _NOT_AVAILABLE, NOT_COORDINATOR
PROBE_COMMIT_TIMEOUT_S = 8.0  # above offsets.commit.timeout.ms: the broker answers first


class ProbeSession(Workers):
    """A client that follows the protocol, as librdkafka's committed() does: it finds the
    coordinator with FindCoordinator, keeps it until it answers an error that says it moved
    (or cannot be reached), and reads both groups' offsets from it, in order. It also
    commits to a group of its own ("simple", generation -1) the values 1, 2, 3, ... one at
    a time, each sent once and to the coordinator it has: a commit that times out is not
    sent again elsewhere, so a value the coordinator never replicated can only be seen by
    reading it back from a coordinator that served it too early."""

    def __init__(self, hosts: dict[int, str], probe_group: str, group: str, topic: str,
                 partitions: int, clock: Clock, rng: random.Random):
        super().__init__()
        self.hosts, self.probe_group, self.group = hosts, probe_group, group
        self.topic, self.partitions, self.clock, self.rng = topic, partitions, clock, rng
        self.coordinator: int | None = None
        self.observations: list[Observation] = []
        self.attempts: list[CommitAttempt] = []
        self.finds: list[tuple[float, int]] = []
        self.next_value = 1

    def find(self) -> int | None:
        order = list(self.hosts)
        self.rng.shuffle(order)
        for node in order:
            try:
                error, coordinator = find_coordinator_raw(self.hosts[node], self.probe_group,
                                                          REQUEST_TIMEOUT_S)
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
                offsets, errors = offset_fetch(host, group, self.topic, self.partitions, REQUEST_TIMEOUT_S)
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

    def _run(self, _index: int):
        while not self._halt.is_set():
            self.step()
            time.sleep(0.1)
