"""KIP-890 part 1 (issue #16): the partition leader verifies a producer's first
transactional batch on a partition with the transaction coordinator (AddPartitionsToTxn
v5, verifyOnly) before it appends it.

Driven with raw frames at the versions a transaction version 1 client uses
(InitProducerId v1, AddPartitionsToTxn v1, EndTxn v1, Produce v3), so that each request
is one answer from one node:

- a transactional batch for a partition never added to the transaction is refused
  INVALID_TXN_STATE, and so is a late batch after the transaction was aborted; the last
  stable offset moves on with the plain records behind it;
- with `transaction.partition.verification.enable=false` (set at run time) the same late
  batch is appended and opens a transaction no coordinator knows: the last stable offset
  sticks at it (the hanging transaction verification closes);
- a producer whose epoch was bumped by a newer InitProducerId is refused
  INVALID_PRODUCER_EPOCH on a new partition, an unknown producer id
  INVALID_PRODUCER_ID_MAPPING;
- on three nodes the leader asks a coordinator on another node, over the inter-broker
  listener, with the same answers.
"""

from __future__ import annotations

import struct
import time
import uuid

from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from kafka.record.default_records import DefaultRecordBatchBuilder

from kafka_helpers import admin, create_topic, unique_topic, wait_for
from kafka_wire import READ_COMMITTED, READ_UNCOMMITTED, TRANSACTION, find_coordinator_raw, list_offsets
from test_cluster import SETTLE_TIMEOUT_S, create_replicated_topic, leader_of
from test_txn_markers import Wire, string

PRODUCE, INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, END_TXN = 0, 22, 24, 26
NONE, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING = 0, 47, 48, 49
NOT_ENOUGH_REPLICAS = 19
VERIFICATION = "transaction.partition.verification.enable"


def txn_batch(values: list[str], producer_id: int, epoch: int, sequence: int) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=True, producer_id=producer_id,
        producer_epoch=epoch, base_sequence=sequence, batch_size=1 << 20,
    )
    now = int(time.time() * 1000)
    for i, value in enumerate(values):
        builder.append(i, timestamp=now, key=None, value=value.encode(), headers=[])
    return bytes(builder.build())


def plain_batch(values: list[str]) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=0, is_transactional=False, producer_id=-1,
        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20,
    )
    now = int(time.time() * 1000)
    for i, value in enumerate(values):
        builder.append(i, timestamp=now, key=None, value=value.encode(), headers=[])
    return bytes(builder.build())


def produce(wire: Wire, topic: str, partition: int, records: bytes,
            transactional_id: str | None) -> tuple[int, int]:
    """Produce v3, acks=all: (error code, base offset), retried as a client retries
    NOT_ENOUGH_REPLICAS: what the leader answers while the coordinator is still writing a
    transaction's markers (Kafka maps CONCURRENT_TRANSACTIONS so); the abort's marker can
    be on the partition before the coordinator has completed the abort."""
    deadline = time.monotonic() + 15
    while True:
        error, offset = _produce_once(wire, topic, partition, records, transactional_id)
        if error != NOT_ENOUGH_REPLICAS or time.monotonic() > deadline:
            return error, offset
        time.sleep(0.1)


def _produce_once(wire: Wire, topic: str, partition: int, records: bytes,
                  transactional_id: str | None) -> tuple[int, int]:
    body = (
        string(transactional_id) + struct.pack(">hi", -1, 30_000) + struct.pack(">i", 1)
        + string(topic) + struct.pack(">i", 1) + struct.pack(">ii", partition, len(records))
        + records
    )
    r = wire.call(PRODUCE, 3, body, flexible=False)
    assert r.take(">i") == 1 and r.string() == topic and r.take(">i") == 1
    assert r.take(">i") == partition
    return r.take(">h"), r.take(">q")


def coordinator_of(bootstrap: str, transactional_id: str) -> int:
    """FindCoordinator, as a client asks first (the first one creates
    `__transaction_state`): the coordinator's node id once one is named."""
    found: list[int] = []

    def ask() -> bool:
        error, node = find_coordinator_raw(bootstrap, transactional_id, 10, TRANSACTION)
        found[:] = [node]
        return error == NONE

    wait_for(ask, SETTLE_TIMEOUT_S, f"a coordinator for {transactional_id}")
    return found[0]


def init_producer_id(wire: Wire, transactional_id: str) -> tuple[int, int]:
    """InitProducerId v1: (producer id, epoch), retried while the coordinator loads."""
    deadline = time.monotonic() + 60
    while True:
        r = wire.call(INIT_PRODUCER_ID, 1, string(transactional_id) + struct.pack(">i", 60_000),
                      flexible=False)
        r.take(">i")
        error, producer_id, epoch = r.take(">h"), r.take(">q"), r.take(">h")
        if error == NONE:
            return producer_id, epoch
        # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR (the
        # metadata of a new `__transaction_state` on its way), CONCURRENT_TRANSACTIONS
        assert error in (14, 15, 16, 51), f"InitProducerId error {error}"
        assert time.monotonic() < deadline, f"InitProducerId kept answering {error}"
        time.sleep(0.2)


def add_partitions(wire: Wire, transactional_id: str, producer: tuple[int, int], topic: str,
                   partitions: list[int]) -> dict[int, int]:
    """AddPartitionsToTxn v1: {partition: error code}."""
    body = (
        string(transactional_id) + struct.pack(">qh", *producer) + struct.pack(">i", 1)
        + string(topic) + struct.pack(">i", len(partitions))
        + b"".join(struct.pack(">i", p) for p in partitions)
    )
    r = wire.call(ADD_PARTITIONS_TO_TXN, 1, body, flexible=False)
    r.take(">i")
    results = {}
    for _ in range(r.take(">i")):
        r.string()
        for _ in range(r.take(">i")):
            p = r.take(">i")
            results[p] = r.take(">h")
    return results


def end_txn(wire: Wire, transactional_id: str, producer: tuple[int, int], commit: bool) -> int:
    body = string(transactional_id) + struct.pack(">qh?", *producer, commit)
    r = wire.call(END_TXN, 1, body, flexible=False)
    r.take(">i")
    return r.take(">h")


def stable_and_high(bootstrap: str, topic: str, partitions: int, p: int) -> tuple[int, int]:
    committed = list_offsets(bootstrap, READ_COMMITTED, {topic: partitions}, 10)[(topic, p)]
    uncommitted = list_offsets(bootstrap, READ_UNCOMMITTED, {topic: partitions}, 10)[(topic, p)]
    assert committed[0] == NONE and uncommitted[0] == NONE, (committed, uncommitted)
    return committed[1], uncommitted[1]


def set_verification(bootstrap: str, enabled: bool) -> None:
    """Per broker, on the one broker of `bootstrap`."""
    client = admin(bootstrap)
    (node,) = client.list_topics(timeout=30).brokers
    entry = ConfigEntry(VERIFICATION, "true" if enabled else "false",
                        incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.BROKER, str(node), incremental_configs=[entry])
    for future in client.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def test_a_batch_outside_the_transaction_is_refused_and_the_lso_moves_on(rill):
    topic = unique_topic("txn-verify")
    create_topic(rill.bootstrap, topic, 2)
    tid = f"verify-{uuid.uuid4().hex[:8]}"
    wire = Wire(rill.bootstrap)
    try:
        wait_for(lambda: produce(wire, topic, 0, plain_batch(["p-0"]), None)[0] == NONE, 30,
                 f"{topic} to be led")
        coordinator_of(rill.bootstrap, tid)
        producer = init_producer_id(wire, tid)
        # Partition 1 is added to the transaction, partition 0 never is.
        assert add_partitions(wire, tid, producer, topic, [1]) == {1: NONE}
        error, _ = produce(wire, topic, 0, txn_batch(["stray"], *producer, 0), tid)
        assert error == INVALID_TXN_STATE
        # The added partition takes the producer's batch.
        assert produce(wire, topic, 1, txn_batch(["in-0"], *producer, 0), tid) == (NONE, 0)
        # The stray batch opened nothing: what follows it on partition 0 is stable.
        assert produce(wire, topic, 0, plain_batch(["p-1"]), None) == (NONE, 1)
        assert stable_and_high(rill.bootstrap, topic, 2, 0) == (2, 2)
        assert stable_and_high(rill.bootstrap, topic, 2, 1) == (0, 1)
        assert end_txn(wire, tid, producer, commit=False) == NONE
        wait_for(lambda: stable_and_high(rill.bootstrap, topic, 2, 1) == (2, 2), 30,
                 "the abort marker on partition 1")

        # A late batch of the aborted transaction (a retry that arrives after the abort):
        # the coordinator no longer lists partition 1, so the leader refuses it.
        error, _ = produce(wire, topic, 1, txn_batch(["late"], *producer, 1), tid)
        assert error == INVALID_TXN_STATE
        assert produce(wire, topic, 1, plain_batch(["p-2"]), None) == (NONE, 2)
        assert stable_and_high(rill.bootstrap, topic, 2, 1) == (3, 3)

        # Without verification the same late batch is appended and opens a transaction
        # no coordinator will end: the LSO sticks there, whatever follows.
        set_verification(rill.bootstrap, False)
        wait_for(lambda: produce(wire, topic, 1, txn_batch(["late"], *producer, 1), tid)[0] == NONE,
                 30, "the dynamic config to turn verification off")
        assert produce(wire, topic, 1, plain_batch(["p-3"]), None) == (NONE, 4)
        assert stable_and_high(rill.bootstrap, topic, 2, 1) == (3, 5)
        time.sleep(1)
        assert stable_and_high(rill.bootstrap, topic, 2, 1) == (3, 5)
    finally:
        wire.close()


def test_a_fenced_producer_is_refused_on_a_new_partition(rill):
    topic = unique_topic("txn-verify-fenced")
    create_topic(rill.bootstrap, topic, 1)
    tid = f"verify-fenced-{uuid.uuid4().hex[:8]}"
    wire = Wire(rill.bootstrap)
    try:
        wait_for(lambda: produce(wire, topic, 0, plain_batch(["p-0"]), None)[0] == NONE, 30,
                 f"{topic} to be led")
        coordinator_of(rill.bootstrap, tid)
        old = init_producer_id(wire, tid)
        new = init_producer_id(wire, tid)
        assert new == (old[0], old[1] + 1)
        error, _ = produce(wire, topic, 0, txn_batch(["old"], *old, 0), tid)
        assert error == INVALID_PRODUCER_EPOCH
        # A producer id the coordinator never gave this transactional id: its answer is
        # passed on, as Kafka's leader does.
        error, _ = produce(wire, topic, 0, txn_batch(["who"], old[0] + 1_000_000, 0, 0), tid)
        assert error == INVALID_PRODUCER_ID_MAPPING
        # The current producer, once it added the partition, is taken and commits.
        assert add_partitions(wire, tid, new, topic, [0]) == {0: NONE}
        assert produce(wire, topic, 0, txn_batch(["new"], *new, 0), tid) == (NONE, 1)
        assert end_txn(wire, tid, new, commit=True) == NONE
        wait_for(lambda: stable_and_high(rill.bootstrap, topic, 1, 0) == (3, 3), 30,
                 "the commit marker")
    finally:
        wire.close()


def test_a_leader_verifies_with_a_coordinator_on_another_node(rill_cluster_factory):
    cluster = rill_cluster_factory()
    topic = unique_topic("txn-verify-cluster")
    client = create_replicated_topic(cluster.bootstrap, topic, 3, 2, {"min.insync.replicas": "1"})
    tid = f"verify-remote-{uuid.uuid4().hex[:8]}"
    hosts = {i: n.bootstrap for i, n in cluster.nodes.items()}

    coord = coordinator_of(cluster.bootstrap.split(",")[0], tid)
    leaders = {p: leader_of(client, topic, p) for p in range(3)}
    remote = [p for p, leader in leaders.items() if leader not in (-1, coord)]
    assert remote, f"every partition is led by the coordinator {coord}: {leaders}"
    p = remote[0]
    coord_wire = Wire(hosts[coord])
    leader_wire = Wire(hosts[leaders[p]])
    try:
        producer = init_producer_id(coord_wire, tid)
        error, _ = produce(leader_wire, topic, p, txn_batch(["stray"], *producer, 0), tid)
        assert error == INVALID_TXN_STATE
        assert add_partitions(coord_wire, tid, producer, topic, [p]) == {p: NONE}
        error, offset = produce(leader_wire, topic, p, txn_batch(["in"], *producer, 0), tid)
        assert (error, offset) == (NONE, 0)
        assert end_txn(coord_wire, tid, producer, commit=True) == NONE
        wait_for(lambda: stable_and_high(hosts[leaders[p]], topic, 3, p) == (2, 2), 30,
                 "the commit marker")
    finally:
        coord_wire.close()
        leader_wire.close()
