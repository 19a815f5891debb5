"""KIP-890 part 2, transaction version 2 (issue #16), on the wire: what the Java client 4.x
does once the cluster finalizes `transaction.version` 2, driven with raw frames at the
versions it uses (Produce v12, TxnOffsetCommit v5, EndTxn v5), so that each step is one
answer from the one node:

- a new cluster finalizes `transaction.version` 2 and offers the versions;
- the producer never sends AddPartitionsToTxn or AddOffsetsToTxn: the partition leader
  adds the partition on the first transactional batch, and the group coordinator adds the
  offsets partition on TxnOffsetCommit;
- every EndTxn bumps the epoch and answers with the one to go on with; the markers carry
  it, so that a late write of the ended transaction (a "zombie" at the old epoch) is
  fenced INVALID_PRODUCER_EPOCH and stores nothing;
- a retried EndTxn (the answer lost) is recognised by its epoch one behind and answered
  with the same epoch; an abort needs no partitions; a version-1 EndTxn after that bumps
  nothing.

The Java client itself runs these paths in the compat families (`java-client`,
`kafka-streams` under exactly_once_v2).
"""

from __future__ import annotations

import struct
import time
import uuid

from kafka_helpers import create_topic, unique_topic, wait_for
from kafka_wire import find_coordinator_raw, offset_fetch
from test_txn_markers import Reader, Wire, compact_string, confluent_read, uvarint
from test_txn_verification import coordinator_of, init_producer_id, stable_and_high, txn_batch

PRODUCE, END_TXN, TXN_OFFSET_COMMIT, API_VERSIONS = 0, 26, 28, 18
NONE, NOT_ENOUGH_REPLICAS, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE = 0, 19, 47, 48
CONCURRENT_TRANSACTIONS = 51


def compact_bytes(b: bytes) -> bytes:
    return uvarint(len(b) + 1) + b


def produce_v12(wire: Wire, transactional_id: str, topic: str, records: bytes) -> int:
    """Produce v12, acks=all, partition 0: its error code, retried while the leader
    answers that the coordinator is still busy with the producer's last transaction."""
    body = (
        compact_string(transactional_id) + struct.pack(">hi", -1, 30_000)
        + uvarint(2) + compact_string(topic)
        + uvarint(2) + struct.pack(">i", 0) + compact_bytes(records) + b"\x00"
        + b"\x00" + b"\x00"
    )
    deadline = time.monotonic() + 15
    while True:
        r = wire.call(PRODUCE, 12, body, flexible=True)
        assert r.uvarint() == 2 and r.compact_string() == topic and r.uvarint() == 2
        assert r.take(">i") == 0
        error = r.take(">h")
        if error not in (CONCURRENT_TRANSACTIONS, NOT_ENOUGH_REPLICAS) or time.monotonic() > deadline:
            return error
        time.sleep(0.05)


def end_txn_v5(wire: Wire, transactional_id: str, producer: tuple[int, int],
               commit: bool) -> tuple[int, tuple[int, int]]:
    """EndTxn v5: (error, (producer id, epoch) to go on with); retried while the
    coordinator is still completing the previous transaction."""
    body = compact_string(transactional_id) + struct.pack(">qh?", *producer, commit) + b"\x00"
    deadline = time.monotonic() + 15
    while True:
        r = wire.call(END_TXN, 5, body, flexible=True)
        r.take(">i")
        error, producer_id, epoch = r.take(">h"), r.take(">q"), r.take(">h")
        if error != CONCURRENT_TRANSACTIONS or time.monotonic() > deadline:
            return error, (producer_id, epoch)
        time.sleep(0.05)


def end_txn_v4(wire: Wire, transactional_id: str, producer: tuple[int, int], commit: bool) -> int:
    body = compact_string(transactional_id) + struct.pack(">qh?", *producer, commit) + b"\x00"
    r = wire.call(END_TXN, 4, body, flexible=True)
    r.take(">i")
    return r.take(">h")


def txn_offset_commit_v5(wire: Wire, transactional_id: str, group: str,
                         producer: tuple[int, int], topic: str, offset: int) -> int:
    """TxnOffsetCommit v5 of partition 0 without a member (a producer outside the group,
    as `sendOffsetsToTransaction` with a plain group id): its error code."""
    body = (
        compact_string(transactional_id) + compact_string(group) + struct.pack(">qh", *producer)
        + struct.pack(">i", -1) + compact_string("") + uvarint(0)
        + uvarint(2) + compact_string(topic)
        + uvarint(2) + struct.pack(">iqi", 0, offset, -1) + uvarint(0) + b"\x00"
        + b"\x00" + b"\x00"
    )
    deadline = time.monotonic() + 15
    while True:
        r = wire.call(TXN_OFFSET_COMMIT, 5, body, flexible=True)
        r.take(">i")
        assert r.uvarint() == 2 and r.compact_string() == topic and r.uvarint() == 2
        assert r.take(">i") == 0
        error = r.take(">h")
        # Retriable for the client: the group's coordinator loading, or the producer's
        # coordinator still completing something.
        if error not in (14, 15, CONCURRENT_TRANSACTIONS) or time.monotonic() > deadline:
            return error
        time.sleep(0.1)


def api_versions(wire: Wire) -> tuple[dict[int, tuple[int, int]], dict[str, int]]:
    """ApiVersions v3: {api key: (min, max)} and the finalized features {name: level}."""
    # Sent by hand: ApiVersions answers with a version 0 header whatever the request's.
    body = compact_string("txn-v2-e2e") + compact_string("1") + b"\x00"
    wire.correlation_id += 1
    header = struct.pack(">hhih", API_VERSIONS, 3, wire.correlation_id, 4) + b"test\x00"
    frame = header + body
    wire.sock.sendall(struct.pack(">i", len(frame)) + frame)
    (size,) = struct.unpack(">i", wire._exact(4))
    r = Reader(wire._exact(size))
    assert r.take(">i") == wire.correlation_id
    assert r.take(">h") == NONE
    apis = {}
    for _ in range(r.uvarint() - 1):
        key, lo, hi = r.take(">h"), r.take(">h"), r.take(">h")
        r.tagged_fields()
        apis[key] = (lo, hi)
    r.take(">i")
    finalized: dict[str, int] = {}
    # The features are tagged fields: 0 supported, 1 the epoch, 2 finalized.
    for _ in range(r.uvarint()):
        tag, size = r.uvarint(), r.uvarint()
        end = r.pos + size
        if tag == 2:
            for _ in range(r.uvarint() - 1):
                name = r.compact_string()
                level, _min = r.take(">h"), r.take(">h")
                r.tagged_fields()
                finalized[name] = level
        r.pos = end
    return apis, finalized


def committed_offset(bootstrap: str, group: str, topic: str) -> int | None:
    offsets, _errors = offset_fetch(bootstrap, group, topic, 1, 10)
    return offsets.get(0)


def test_transaction_version_2_bumps_the_epoch_at_every_end_and_fences_zombies(rill):
    bootstrap = rill.bootstrap
    topic = unique_topic("tv2")
    create_topic(bootstrap, topic, partitions=1)
    tid = f"tv2-{uuid.uuid4().hex[:8]}"
    group = f"tv2-g-{uuid.uuid4().hex[:6]}"
    coordinator_of(bootstrap, tid)
    # As a client does before TxnOffsetCommit (the first creates `__consumer_offsets`).
    wait_for(lambda: find_coordinator_raw(bootstrap, group, 10)[0] == NONE, 60,
             f"a coordinator for {group}")
    wire = Wire(bootstrap)
    try:
        apis, finalized = api_versions(wire)
        assert finalized.get("transaction.version") == 2, finalized
        assert apis[PRODUCE][1] >= 12 and apis[END_TXN][1] >= 5 and apis[TXN_OFFSET_COMMIT][1] >= 5

        producer_id, epoch = init_producer_id(wire, tid)
        # First transaction: no AddPartitionsToTxn, no AddOffsetsToTxn.
        assert produce_v12(wire, tid, topic, txn_batch(["a0", "a1"], producer_id, epoch, 0)) == NONE
        stable, high = stable_and_high(bootstrap, topic, 1, 0)
        assert (stable, high) == (0, 2), "the open transaction holds the last stable offset"
        assert txn_offset_commit_v5(wire, tid, group, (producer_id, epoch), topic, 42) == NONE
        assert committed_offset(bootstrap, group, topic) is None, "visible before the commit"
        error, after_commit = end_txn_v5(wire, tid, (producer_id, epoch), commit=True)
        assert (error, after_commit) == (NONE, (producer_id, epoch + 1))

        wait_for(lambda: stable_and_high(bootstrap, topic, 1, 0)[0] == 3, 30, "the commit marker")
        wait_for(lambda: committed_offset(bootstrap, group, topic) == 42, 30,
                 "the transaction's offset commit")
        assert confluent_read(bootstrap, topic, "read_committed")[0] == ["a0", "a1"]

        # The zombie: a late batch of the committed transaction, at its epoch.
        zombie = txn_batch(["late"], producer_id, epoch, 2)
        assert produce_v12(wire, tid, topic, zombie) == INVALID_PRODUCER_EPOCH
        assert stable_and_high(bootstrap, topic, 1, 0) == (3, 3), "the zombie stored something"

        # A retry of the commit, its answer lost: the same epoch to go on with.
        assert end_txn_v5(wire, tid, (producer_id, epoch), commit=True) == (NONE, after_commit)

        # Second transaction at the bumped epoch, from sequence 0; aborted.
        epoch = after_commit[1]
        assert produce_v12(wire, tid, topic, txn_batch(["b0"], producer_id, epoch, 0)) == NONE
        error, after_abort = end_txn_v5(wire, tid, (producer_id, epoch), commit=False)
        assert (error, after_abort) == (NONE, (producer_id, epoch + 1))
        wait_for(lambda: stable_and_high(bootstrap, topic, 1, 0)[0] == 5, 30, "the abort marker")
        assert confluent_read(bootstrap, topic, "read_committed")[0] == ["a0", "a1"]
        assert confluent_read(bootstrap, topic, "read_uncommitted")[0] == ["a0", "a1", "b0"]
        # An old-epoch batch of the aborted transaction is fenced too.
        assert produce_v12(wire, tid, topic, txn_batch(["b1"], producer_id, epoch, 1)) == INVALID_PRODUCER_EPOCH

        # An abort with nothing in the transaction still bumps, and writes no marker.
        epoch = after_abort[1]
        error, after_empty = end_txn_v5(wire, tid, (producer_id, epoch), commit=False)
        assert (error, after_empty) == (NONE, (producer_id, epoch + 1))
        # A commit with nothing in it is refused; a version-1 EndTxn bumps nothing.
        epoch = after_empty[1]
        assert end_txn_v5(wire, tid, (producer_id, epoch), commit=True)[0] == INVALID_TXN_STATE
        assert end_txn_v4(wire, tid, (producer_id, epoch), commit=True) == INVALID_TXN_STATE
        assert stable_and_high(bootstrap, topic, 1, 0) == (5, 5)
    finally:
        wire.close()
