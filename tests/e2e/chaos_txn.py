"""The fault-injection suite's transactional workload (`chaos.py --transactional`): what
it runs and what it records, for `chaos_checker.check_transactions`.

- `TxnProducers`: confluent-kafka producers with a `transactional.id` each (acks=all and
  idempotence come with it), each transaction spanning several partitions of their
  topic, committed or aborted in a pattern drawn from the seed. Every so many
  transactions one is fenced: a second producer of the same `transactional.id` calls
  `init_transactions` in the middle of it, and the first, now a zombie, goes on producing
  and tries to commit.
- `CopyMember`: a consume-transform-produce member: it reads the idempotent producers'
  topic in a group, writes one record per input record to a copy topic, and sends the
  group's offsets with `send_offsets_to_transaction`, so that the copy holds each input
  record exactly once up to the group's committed offset.
- `LiveReader`: a read_committed consumer of both topics during the run, which notes
  when it first saw each record.
- `LsoWatcher`: ListOffsets at READ_COMMITTED then at READ_UNCOMMITTED, to every node,
  every half second: the last stable offset and the high watermark each leader answered.

# What a transaction's outcome is

Only what the client was told counts: `committed` when `commit_transaction` returned,
`aborted` when `abort_transaction` returned or when the commit was never asked for (a
transaction whose EndTxn(commit) was never sent can only end aborted: by the abort, the
coordinator's timeout or the next `init_transactions`), `unknown` when a commit was asked
for and then the producer failed (fatal error, deadline): then it ended one way or the
other, as a whole. A record's value names its transaction: `t<producer>-<n>-<k>` (record
k of transaction n), `z<producer>-<n>-<k>` for what a zombie wrote after it was fenced,
`c<partition>:<offset>:<n>` for the copy of an input record in copy transaction n.
"""

from __future__ import annotations

import logging
import queue
import random
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from chaos_workload import Clock, Workers
from kafka_wire import READ_COMMITTED, READ_UNCOMMITTED, REQUEST_TIMEOUT_S, list_offsets

# Below the broker's transaction.max.timeout.ms and above any fault window, so that a
# transaction is not timed out by the coordinator only because a fault held it.
TXN_TIMEOUT_MS = 30_000
# The timeout of each init/commit/abort call, and how long a retriable error is retried.
TXN_CALL_TIMEOUT_S = 30.0
TXN_RETRY_DEADLINE_S = 90.0
# How long a transactional call may block past its own timeout before the producer is
# taken as wedged and abandoned. librdkafka's send_offsets_to_transaction waits for its
# result without a bound of its own, and the group coordinator lookup under it can wait
# forever on a coordinator whose broker it has decommissioned (a node that was killed
# leaves the Metadata answers while it is fenced): librdkafka issues #5456 and #5511,
# open against 2.14, the same against Apache Kafka. Seen in CI with seed 1355595751:
# the copy member's call sat four minutes after every fault had healed, the brokers
# idle, until the run's own timeout killed it.
TXN_CALL_WEDGED_S = TXN_CALL_TIMEOUT_S + 15.0
RECORDS_PER_TXN = (3, 8)
ABORT_SHARE = 0.3
# Every FENCE_EVERY-th transaction of each producer is fenced by a successor.
FENCE_EVERY = 12
TXN_PAUSE_S = 0.05
COPY_BATCH = 200
COPY_ABORT_SHARE = 0.2
WATCH_INTERVAL_S = 0.5


@dataclass
class Txn:
    """One transaction as its producer saw it."""

    producer: str  # "t0", "t1", ... or "copy"
    number: int
    topic: str
    values: list[bytes] = field(default_factory=list)  # in produce order
    partitions: list[int] = field(default_factory=list)  # each value's partition
    outcome: str = "open"  # committed, aborted or unknown
    commit_started: float | None = None  # when commit_transaction was first called
    ended: float = 0.0
    # value -> (partition, offset) for each record whose delivery was acknowledged.
    acks: dict[bytes, tuple[int, int | None]] = field(default_factory=dict)
    fenced: bool = False
    # What the zombie produced after its successor's init_transactions returned.
    zombie_values: list[bytes] = field(default_factory=list)
    zombie_acks: dict[bytes, tuple[int, int | None]] = field(default_factory=dict)
    zombie_commit_acknowledged: bool = False
    # For a copy transaction, the input offsets it sent ({partition: next offset}).
    offsets: dict[int, int] = field(default_factory=dict)
    note: str = ""


def parse_txn_value(value: bytes) -> tuple[str, int, int] | None:
    """(producer, transaction number, index) of a value this workload wrote, or None."""
    try:
        text = value.decode()
        if text[0] in "tz":
            pid, n, k = text[1:].split("-")
            return f"t{pid}", int(n), int(k)
        if text[0] == "c":
            p, o, n = text[1:].split(":")
            return "copy", int(n), int(o)
    except (UnicodeDecodeError, ValueError, IndexError):
        pass
    return None


class Outcome:
    OK, ABORT, FATAL = "ok", "abort", "fatal"


class Wedged(Exception):
    """A transactional call that did not return `TXN_CALL_WEDGED_S` after it began."""


def bounded(call, timeout_s: float) -> None:
    """`call(timeout_s)` on a thread of its own, waited for up to `TXN_CALL_WEDGED_S`;
    raises what it raised, or `Wedged`. A wedged call's thread is left blocked (it holds
    the producer, which is then never destroyed: destroying it under a blocked call
    could hang too)."""
    outcome: dict = {}

    def run():
        try:
            call(timeout_s)
        except BaseException as exc:  # noqa: BLE001 - raised again on the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name="chaos-txn-call")
    thread.start()
    thread.join(TXN_CALL_WEDGED_S)
    if thread.is_alive():
        raise Wedged()
    if "error" in outcome:
        raise outcome["error"]


def attempt(call, what: str, errors: list[str], retry_deadline_s: float = TXN_RETRY_DEADLINE_S) -> str:
    """Calls a transactional API as librdkafka asks: again on a retriable error (until
    the deadline), `ABORT` when the transaction must be aborted, `FATAL` when the
    producer is done for (a fatal error, a call that never returned, or anything
    else)."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + retry_deadline_s
    while True:
        try:
            bounded(call, TXN_CALL_TIMEOUT_S)
            return Outcome.OK
        except Wedged:
            errors.append(f"{what}: did not return {TXN_CALL_WEDGED_S:.0f}s after it began "
                          f"(timeout {TXN_CALL_TIMEOUT_S:.0f}s; librdkafka #5511): producer abandoned")
            return Outcome.FATAL
        except KafkaException as exc:
            error = exc.args[0]
            if error.fatal():
                errors.append(f"{what}: fatal {error}")
                return Outcome.FATAL
            if error.txn_requires_abort():
                errors.append(f"{what}: abortable {error}")
                return Outcome.ABORT
            if error.retriable() and time.monotonic() < deadline:
                continue
            errors.append(f"{what}: {error}")
            return Outcome.FATAL
        except SystemError as exc:  # see `flush`
            errors.append(f"{what}: {exc}")
            return Outcome.FATAL


# librdkafka's log lines of the transactional clients: a fenced zombie logs a few fatal
# errors each time, by design, so they go to a file in the run's directory
# (`TxnWorkload`), not to the run's output.
CLIENT_LOG = logging.getLogger("chaos.txn.clients")
CLIENT_LOG.propagate = False


def flush(producer, timeout_s: float = 0.0) -> None:
    """Waits for the producer's deliveries (or, with no timeout, serves the callbacks due).
    A producer in a fatal state (fenced) raises its error from here, which the
    transactional call after it reports anyway; and confluent-kafka can raise
    SystemError from a log line handed to `CLIENT_LOG` while that error is pending
    (seen in a long run: "LogRecord returned a result with an exception set")."""
    from confluent_kafka import KafkaException

    try:
        if timeout_s > 0:
            producer.flush(timeout_s)
        else:
            producer.poll(0)
    except (KafkaException, SystemError):
        pass


class Reaper:
    """Destroys the producers the workload is done with (fenced, failed) on a thread of
    its own, once the workload holds no reference to them: librdkafka's destroy waits for
    the producer's broker threads, which a broker that is down can hold, and a workload
    thread must not wait on that (one transactional producer thread sat past its 180 s
    join in a long run, seed 104, its transaction open). A destroy that hangs here holds
    only this thread."""

    DELAY_S = 1.0
    # How long a handed-over producer may still be referenced elsewhere before it is let
    # go regardless (its destroy then runs where the last reference goes).
    HOLD_MAX_S = 600.0

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def discard(self, producer) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="chaos-reaper")
                self._thread.start()
        self._queue.put((time.monotonic() + self.DELAY_S, producer))

    def _run(self) -> None:
        while True:
            due, producer = self._queue.get()
            time.sleep(max(0.0, due - time.monotonic()))
            # Two references are this frame's and getrefcount's own argument.
            while sys.getrefcount(producer) > 2 and time.monotonic() < due + self.HOLD_MAX_S:
                time.sleep(0.1)
            del producer  # the last reference: librdkafka's destroy runs here


REAPER = Reaper()


def txn_producer(bootstrap: str, transactional_id: str):
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": transactional_id,
            "transaction.timeout.ms": TXN_TIMEOUT_MS,
            "linger.ms": 5,
            "topic.metadata.refresh.interval.ms": 1000,
            "logger": CLIENT_LOG,
        }
    )


class TxnProducers(Workers):
    """Transactional producers, each committing and aborting multi-partition transactions
    in a seeded pattern, one in FENCE_EVERY of them fenced by a successor."""

    JOIN_TIMEOUT_S = 2 * TXN_RETRY_DEADLINE_S

    def __init__(self, bootstrap: str, topic: str, partitions: int, count: int, seed: int,
                 clock: Clock, transactional_ids: list[str]):
        self.bootstrap, self.topic, self.partitions, self.clock = bootstrap, topic, partitions, clock
        self.seed, self.transactional_ids = seed, transactional_ids
        self.txns: list[Txn] = []
        self.errors: list[str] = []
        self.restarts = 0
        self._lock = threading.Lock()
        super().__init__(count)

    def _init(self, index: int):
        """A new producer of `index`'s transactional.id, initialised (which fences and
        ends its predecessor's transaction), or None when none could be within the
        deadline. Not cut short by `stop`, which lets the transaction under way end."""
        deadline = time.monotonic() + 2 * TXN_RETRY_DEADLINE_S
        while time.monotonic() < deadline:
            producer = txn_producer(self.bootstrap, self.transactional_ids[index])
            if attempt(producer.init_transactions, f"t{index} init", self.errors) == Outcome.OK:
                return producer
            REAPER.discard(producer)
            with self._lock:
                self.restarts += 1
            time.sleep(0.5)
        return None

    def _on_delivery(self, acks: dict):
        def on_delivery(err, msg):
            if err is None:
                offset = msg.offset()
                acks[msg.value()] = (msg.partition(), offset if offset >= 0 else None)

        return on_delivery

    def _produce(self, producer, txn: Txn, value: bytes, partition: int, acks: dict) -> bool:
        from confluent_kafka import KafkaException

        deadline = time.monotonic() + TXN_CALL_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                producer.produce(self.topic, value=value, partition=partition,
                                 on_delivery=self._on_delivery(acks))
                return True
            except BufferError:
                flush(producer)
                time.sleep(0.1)
            except (KafkaException, SystemError) as exc:  # SystemError: see `flush`
                txn.note += f"produce refused: {exc}; "
                return False
        return False

    def _run(self, index: int):
        rng = random.Random(f"{self.seed}-txn-{index}")
        producer = self._init(index)
        n = 0
        while producer is not None and not self._halt.is_set():
            txn = Txn(f"t{index}", n, self.topic)
            with self._lock:
                self.txns.append(txn)
            count = rng.randint(*RECORDS_PER_TXN)
            start = rng.randrange(self.partitions)
            abort = rng.random() < ABORT_SHARE
            fence = n % FENCE_EVERY == FENCE_EVERY - 1
            producer = self._transaction(index, producer, txn, count, start, abort, fence)
            txn.ended = self.clock.now()
            n += 1
            time.sleep(TXN_PAUSE_S)

    def _transaction(self, index: int, producer, txn: Txn, count: int, start: int, abort: bool, fence: bool):
        """Runs one transaction; returns the producer to go on with (a new one when this
        one failed or was fenced)."""
        from confluent_kafka import KafkaException

        try:
            producer.begin_transaction()
        except KafkaException as exc:
            txn.outcome, txn.note = "aborted", f"begin refused: {exc.args[0]}"
            return self._replace(index, producer)
        produced = count // 2 if fence else count
        for k in range(produced):
            value = f"t{index}-{txn.number}-{k}".encode()
            partition = (start + k) % self.partitions
            txn.values.append(value)
            txn.partitions.append(partition)
            if not self._produce(producer, txn, value, partition, txn.acks):
                abort = True
                break
        if fence:
            return self._fence(index, producer, txn, count, start)
        if abort:
            # Flushed first: librdkafka purges what it has not sent at an abort, and the
            # read_uncommitted control must find aborted records in the log.
            flush(producer, TXN_CALL_TIMEOUT_S)
            done = attempt(producer.abort_transaction, f"t{index} abort", self.errors)
            flush(producer)
            txn.outcome = "aborted"  # the commit was never asked for
            return producer if done == Outcome.OK else self._replace(index, producer)
        txn.commit_started = self.clock.now()
        done = attempt(producer.commit_transaction, f"t{index} commit", self.errors)
        flush(producer)
        if done == Outcome.OK:
            txn.outcome = "committed"
            return producer
        if done == Outcome.ABORT:
            if attempt(producer.abort_transaction, f"t{index} abort", self.errors) == Outcome.OK:
                flush(producer)
                txn.outcome = "aborted"
                return producer
        txn.outcome = "unknown"
        return self._replace(index, producer)

    def _replace(self, index: int, old):
        with self._lock:
            self.restarts += 1
        REAPER.discard(old)
        return self._init(index)

    def _fence(self, index: int, zombie, txn: Txn, count: int, start: int):
        """The first half of the transaction is in the log; a successor fences the
        producer, which then writes the rest and asks to commit, as a zombie would."""
        from confluent_kafka import KafkaException

        flush(zombie, TXN_CALL_TIMEOUT_S)
        successor = self._init(index)
        if successor is None:
            txn.outcome = "aborted"
            return None
        txn.fenced, txn.outcome = True, "aborted"  # the successor's init aborted it
        for k in range(count // 2, count):
            value = f"z{index}-{txn.number}-{k}".encode()
            txn.zombie_values.append(value)
            try:
                zombie.produce(self.topic, value=value, partition=(start + k) % self.partitions,
                               on_delivery=self._on_delivery(txn.zombie_acks))
            except (BufferError, KafkaException, SystemError) as exc:
                txn.note += f"zombie produce refused: {exc}; "
        try:
            zombie.commit_transaction(TXN_CALL_TIMEOUT_S)
            txn.zombie_commit_acknowledged = True
        except (KafkaException, SystemError) as exc:
            txn.note += f"zombie commit refused: {exc}"
        flush(zombie, 5)
        REAPER.discard(zombie)
        return successor


class CopyMember(Workers):
    """A consume-transform-produce member of one group: each batch it consumes from the
    input topic goes to the copy topic (same partition) in one transaction, with the
    group's offsets for it (`send_offsets_to_transaction`); some are aborted on purpose,
    after which the consumer is rewound to the group's committed offsets."""

    JOIN_TIMEOUT_S = 3 * TXN_RETRY_DEADLINE_S

    def __init__(self, bootstrap: str, input_topic: str, topic: str, group: str,
                 transactional_id: str, seed: int, clock: Clock):
        self.bootstrap, self.input_topic, self.topic = bootstrap, input_topic, topic
        self.group, self.transactional_id, self.clock = group, transactional_id, clock
        self.rng = random.Random(f"{seed}-copy")
        self.txns: list[Txn] = []
        self.errors: list[str] = []
        self.restarts = 0
        self.rebalances = 0
        super().__init__()

    def _consumer(self):
        from confluent_kafka import Consumer

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "client.id": "chaos-copy",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "isolation.level": "read_committed",
                "session.timeout.ms": 10000,
                "heartbeat.interval.ms": 1000,
                "topic.metadata.refresh.interval.ms": 1000,
                "logger": CLIENT_LOG,
            }
        )

        def rebalanced(_consumer, _partitions):
            self.rebalances += 1

        consumer.subscribe([self.input_topic], on_assign=rebalanced, on_revoke=rebalanced, on_lost=rebalanced)
        return consumer

    def _producer(self):
        deadline = time.monotonic() + 2 * TXN_RETRY_DEADLINE_S
        while time.monotonic() < deadline:
            producer = txn_producer(self.bootstrap, self.transactional_id)
            if attempt(producer.init_transactions, "copy init", self.errors) == Outcome.OK:
                return producer
            REAPER.discard(producer)
            self.restarts += 1
            time.sleep(0.5)
        return None

    def _rewind(self, consumer, partitions: set[int]) -> bool:
        """Seeks each partition back to the group's committed offset (read with
        require_stable, so after the abort's markers); False when it could not."""
        from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

        try:
            committed = consumer.committed([TopicPartition(self.input_topic, p) for p in sorted(partitions)],
                                           timeout=TXN_CALL_TIMEOUT_S)
            for tp in committed:
                if tp.error is not None:
                    return False
                consumer.seek(TopicPartition(self.input_topic, tp.partition,
                                             tp.offset if tp.offset >= 0 else OFFSET_BEGINNING))
            return True
        except KafkaException as exc:
            self.errors.append(f"copy rewind: {exc.args[0]}")
            return False

    def _run(self, _index: int):
        producer = self._producer()
        consumer = self._consumer()
        n = 0
        while producer is not None and not self._halt.is_set():
            before = self.rebalances
            messages = [m for m in consumer.consume(num_messages=COPY_BATCH, timeout=0.5) if m.error() is None]
            if not messages:
                continue
            if self.rebalances != before:
                # Some of the batch may be from before the assignment moved the position:
                # start again from the committed offsets.
                if not self._rewind(consumer, {m.partition() for m in messages}):
                    consumer.close()
                    consumer = self._consumer()
                continue
            txn = Txn("copy", n, self.topic)
            self.txns.append(txn)
            n += 1
            producer, consumer = self._copy(producer, consumer, txn, messages)
            txn.ended = self.clock.now()
        if consumer is not None:
            consumer.close()

    def _copy(self, producer, consumer, txn: Txn, messages):
        from confluent_kafka import KafkaException, TopicPartition

        def on_delivery(err, msg):
            if err is None:
                offset = msg.offset()
                txn.acks[msg.value()] = (msg.partition(), offset if offset >= 0 else None)

        abort = self.rng.random() < COPY_ABORT_SHARE
        try:
            producer.begin_transaction()
            for m in messages:
                value = f"c{m.partition()}:{m.offset()}:{txn.number}".encode()
                txn.values.append(value)
                txn.partitions.append(m.partition())
                while True:
                    try:
                        producer.produce(self.topic, value=value, partition=m.partition(), on_delivery=on_delivery)
                        break
                    except BufferError:
                        flush(producer)
                        time.sleep(0.1)
                txn.offsets[m.partition()] = max(txn.offsets.get(m.partition(), 0), m.offset() + 1)
        except (KafkaException, SystemError) as exc:  # SystemError: see `flush`
            txn.outcome, txn.note = "aborted", f"refused: {exc}"
            return self._restart(consumer, producer)
        offsets = [TopicPartition(self.input_topic, p, o) for p, o in sorted(txn.offsets.items())]
        sent = attempt(lambda t: producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), t),
                       "copy send_offsets", self.errors)
        if sent == Outcome.FATAL:
            txn.outcome = "aborted"
            return self._restart(consumer, producer)
        if sent == Outcome.OK and not abort:
            txn.commit_started = self.clock.now()
            done = attempt(producer.commit_transaction, "copy commit", self.errors)
            flush(producer)
            if done == Outcome.OK:
                txn.outcome = "committed"
                return producer, consumer
            if done == Outcome.FATAL or attempt(producer.abort_transaction, "copy abort", self.errors) != Outcome.OK:
                txn.outcome = "unknown"
                return self._restart(consumer, producer)
        else:
            flush(producer, TXN_CALL_TIMEOUT_S)
            if attempt(producer.abort_transaction, "copy abort", self.errors) != Outcome.OK:
                txn.outcome = "aborted"  # the commit was never asked for
                return self._restart(consumer, producer)
            flush(producer)
        txn.outcome = "aborted"
        if not self._rewind(consumer, set(txn.offsets)):
            consumer.close()
            consumer = self._consumer()
        return producer, consumer

    def _restart(self, consumer, old):
        """A new producer first (its init_transactions ends the old one's transaction),
        then a new consumer, which starts from the committed offsets."""
        self.restarts += 1
        REAPER.discard(old)
        consumer.close()
        producer = self._producer()
        return producer, (self._consumer() if producer is not None else None)


@dataclass
class Seen:
    topic: str
    partition: int
    offset: int
    value: bytes
    at: float


class LiveReader(Workers):
    """A read_committed consumer of the transactional topics during the run, from their
    beginning: the first time it was handed each value."""

    def __init__(self, bootstrap: str, topics: dict[str, int], clock: Clock):
        super().__init__()
        self.bootstrap, self.topics, self.clock = bootstrap, topics, clock
        self.seen: list[Seen] = []
        self._values: set[bytes] = set()

    def _run(self, _index: int):
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "chaos-live-reader",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "topic.metadata.refresh.interval.ms": 1000,
            }
        )
        consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, n in self.topics.items() for p in range(n)])
        try:
            while not self._halt.is_set():
                for m in consumer.consume(num_messages=500, timeout=0.2):
                    if m.error() is None and m.value() not in self._values:
                        self._values.add(m.value())
                        self.seen.append(Seen(m.topic(), m.partition(), m.offset(), m.value(), self.clock.now()))
        finally:
            consumer.close()


@dataclass
class StableOffsets:
    """One node's answers for one partition: the last stable offset, then the high
    watermark, asked for in that order."""

    node: int
    topic: str
    partition: int
    leader_epoch: int
    lso: int
    high_watermark: int
    at: float


class LsoWatcher(Workers):
    """ListOffsets at READ_COMMITTED and then READ_UNCOMMITTED to every node in turn;
    keeps the pairs a leader answered both of under one leader epoch."""

    def __init__(self, hosts: dict[int, str], topics: dict[str, int], clock: Clock):
        super().__init__()
        self.hosts, self.topics, self.clock = hosts, topics, clock
        self.observations: list[StableOffsets] = []

    def ask(self, node: int) -> list[StableOffsets]:
        try:
            stable = list_offsets(self.hosts[node], READ_COMMITTED, self.topics, REQUEST_TIMEOUT_S)
            high = list_offsets(self.hosts[node], READ_UNCOMMITTED, self.topics, REQUEST_TIMEOUT_S)
        except (OSError, struct.error, UnicodeDecodeError):
            return []
        now = self.clock.now()
        found = []
        for key, (error, lso, epoch) in stable.items():
            h_error, hw, h_epoch = high.get(key, (-1, -1, -1))
            if error == 0 and h_error == 0 and epoch == h_epoch:
                found.append(StableOffsets(node, key[0], key[1], epoch, lso, hw, now))
        return found

    def _run(self, _index: int):
        while not self._halt.is_set():
            for node in self.hosts:
                self.observations.extend(self.ask(node))
            time.sleep(WATCH_INTERVAL_S)

    def settled(self, timeout_s: float) -> tuple[bool, list[StableOffsets]]:
        """After the workload: waits until every partition's leader answers an LSO equal
        to its high watermark (no transaction left open); the last answers either way."""
        deadline = time.monotonic() + timeout_s
        last: list[StableOffsets] = []
        wanted = sum(self.topics.values())
        while time.monotonic() < deadline:
            last = [o for node in self.hosts for o in self.ask(node)]
            if len({(o.topic, o.partition) for o in last}) == wanted and all(o.lso == o.high_watermark for o in last):
                return True, last
            time.sleep(WATCH_INTERVAL_S)
        return False, last


def read_isolated(bootstrap: str, topic: str, partitions: int, isolation: str,
                  timeout_s: float = 120.0) -> dict[int, list[tuple[int, bytes | None, bytes | None]]]:
    """Every record of `topic` a consumer at `isolation` is handed, from the beginning to
    the end of each partition: {partition: [(offset, key, value), ...]} in the order handed.
    The end is where the consumer reports end-of-partition at or past the high watermark
    taken first (markers and aborted records are not handed over, so the last record
    handed says nothing of where the partition ends)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-read-{isolation}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
                for p in range(partitions)}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got: dict[int, list[tuple[int, bytes | None, bytes | None]]] = {p: [] for p in range(partitions)}
        done: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while len(done) < partitions:
            if time.monotonic() > deadline:
                raise AssertionError(f"read_isolated({topic}, {isolation}) timed out: ends {ends}, done {sorted(done)}")
            for m in consumer.consume(num_messages=1000, timeout=1.0):
                error = m.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if m.offset() >= ends[m.partition()]:
                            done.add(m.partition())
                        continue
                    raise AssertionError(f"consumer error: {error}")
                got[m.partition()].append((m.offset(), m.key(), m.value()))
                done.discard(m.partition())
        return got
    finally:
        consumer.close()


@dataclass
class TxnHistory:
    """What the transactional workload recorded and what its topics hold after heal."""

    txns: list[Txn]
    committed: dict[str, dict[int, list[tuple[int, bytes]]]]
    uncommitted: dict[str, dict[int, list[tuple[int, bytes]]]]
    live: list[Seen]
    stable_offsets: list[StableOffsets]
    settled: bool
    last_stable_offsets: list[StableOffsets]


class TxnWorkload:
    """The transactional producers, the copy member, the run's read_committed reader and
    the ListOffsets watcher, on two topics of their own beside the idempotent workload's
    (`input_topic`, which the copy member reads)."""

    # After the workload has ended every transaction, how long the markers may take to
    # bring every LSO to its high watermark: a producer that could not end its last
    # transaction leaves it to the coordinator's timeout.
    SETTLE_S = TXN_TIMEOUT_MS / 1000 + 30

    def __init__(self, bootstrap: str, hosts: dict[int, str], seed: int, input_topic: str,
                 partitions: int, producers: int, clock: Clock, workdir: Path):
        self.bootstrap, self.partitions = bootstrap, partitions
        self.client_log = workdir / "txn-clients.log"
        handler = logging.FileHandler(self.client_log)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        CLIENT_LOG.addHandler(handler)
        CLIENT_LOG.setLevel(logging.DEBUG)
        self.topic, self.copy_topic = f"chaos-{seed}-txn", f"chaos-{seed}-copy"
        self.copy_group = f"chaos-copy-{seed}"
        self.transactional_ids = [f"chaos-{seed}-t{i}" for i in range(producers)]
        self.topics = {self.topic: partitions, self.copy_topic: partitions}
        self.producers = TxnProducers(bootstrap, self.topic, partitions, producers, seed, clock,
                                      self.transactional_ids)
        self.copy = CopyMember(bootstrap, input_topic, self.copy_topic, self.copy_group,
                               f"chaos-{seed}-copy", seed, clock)
        self.live = LiveReader(bootstrap, self.topics, clock)
        self.watcher = LsoWatcher(hosts, self.topics, clock)

    def start(self):
        for part in (self.producers, self.copy, self.live, self.watcher):
            part.start()

    def halt(self):
        """Stops everything at once, without waiting (a run that failed)."""
        for part in (self.producers, self.copy, self.live, self.watcher):
            part.halt()

    def finish(self) -> TxnHistory:
        """Lets each producer end the transaction under way, waits for the last stable
        offsets to settle, and reads both topics back at both isolation levels."""
        self.producers.stop()
        self.copy.stop()
        settled, last = self.watcher.settled(self.SETTLE_S)
        self.watcher.stop()
        self.live.stop()
        def values(isolation: str):
            return {t: {p: [(o, v) for o, _k, v in records] for p, records in
                        read_isolated(self.bootstrap, t, n, isolation).items()}
                    for t, n in self.topics.items()}

        committed, uncommitted = values("read_committed"), values("read_uncommitted")
        return TxnHistory(self.producers.txns + self.copy.txns, committed, uncommitted, self.live.seen,
                          self.watcher.observations, settled, last)

    def failures(self) -> list[str]:
        return [f for part in (self.producers, self.copy, self.live, self.watcher) for f in part.failures]

    def summary(self) -> dict:
        txns = self.producers.txns + self.copy.txns
        count = {o: sum(t.outcome == o for t in txns) for o in ("committed", "aborted", "unknown", "open")}
        return {
            "transactions": count,
            "fenced": sum(t.fenced for t in txns),
            "copy_transactions": len(self.copy.txns),
            "copy_committed": sum(t.outcome == "committed" for t in self.copy.txns),
            "records": sum(len(t.values) for t in txns),
            "producer_restarts": self.producers.restarts + self.copy.restarts,
            "copy_rebalances": self.copy.rebalances,
            "errors": (self.producers.errors + self.copy.errors)[:20],
            "stable_offset_answers": len(self.watcher.observations),
            "read_committed_live": len(self.live.seen),
        }
