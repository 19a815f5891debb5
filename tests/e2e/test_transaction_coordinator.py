"""The transaction coordinator (issue #16, coordinator side) against real clients:
FindCoordinator(TRANSACTION) and InitProducerId with a transactional id from confluent-kafka
(librdkafka) and kafka-python, fencing of an older producer of the same transactional.id,
and ListTransactions / DescribeTransactions through kafka-python's admin client (KIP-664).

A commit or an abort needs the partition side too (WriteTxnMarkers, transactional batches in
Produce): the tests that do need it are marked `needs_markers` and skip while the broker does
not list WriteTxnMarkers in ApiVersions, so that they run once both halves are merged."""

import socket
import struct
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Producer, TopicPartition
from kafka import KafkaAdminClient, KafkaProducer
from kafka.errors import KafkaError as KpError

from kafka_helpers import create_topic, reading_consumer, unique_topic, wait_for

WRITE_TXN_MARKERS = 27


def api_versions(bootstrap: str) -> dict[int, tuple[int, int]]:
    """ApiVersions v0 by hand: {api_key: (min, max)}."""
    host, port = bootstrap.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        body = struct.pack(">hhih", 18, 0, 1, 4) + b"test"
        s.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        data = s.recv(size, socket.MSG_WAITALL)
    _, error, count = struct.unpack(">ihi", data[:10])
    assert error == 0
    out = {}
    for i in range(count):
        key, lo, hi = struct.unpack(">hhh", data[10 + 6 * i: 16 + 6 * i])
        out[key] = (lo, hi)
    return out


def needs_markers(rill):
    if WRITE_TXN_MARKERS not in api_versions(rill.bootstrap):
        pytest.skip("the partition side (WriteTxnMarkers, issue #16's other half) is not in this build")


def txn_producer(rill, transactional_id: str, **extra) -> Producer:
    return Producer({
        "bootstrap.servers": rill.bootstrap,
        "transactional.id": transactional_id,
        "transaction.timeout.ms": 60_000,
        **extra,
    })


def read_values(rill, topic: str, isolation: str, expected: int) -> list[bytes]:
    """The values of partition 0 as a consumer at `isolation` reads them: the expected
    count, then two quiet seconds to catch any extra."""
    consumer = reading_consumer(rill.bootstrap, **{"isolation.level": isolation})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        values = []
        deadline = time.monotonic() + 30
        quiet_until = None
        while time.monotonic() < deadline:
            for m in consumer.consume(num_messages=100, timeout=0.5):
                assert m.error() is None, m.error()
                values.append(m.value())
            if len(values) >= expected:
                quiet_until = quiet_until or time.monotonic() + 2
                if time.monotonic() > quiet_until:
                    break
        return values
    finally:
        consumer.close()


def kp_admin(rill) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=rill.bootstrap, request_timeout_ms=30_000)


def test_transactional_apis_are_advertised(rill):
    versions = api_versions(rill.bootstrap)
    # AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, DescribeTransactions, ListTransactions.
    for key in (24, 25, 26, 65, 66):
        assert key in versions, key
    # KIP-890 part 2's versions: EndTxn v5, Produce v12 (and v13, KIP-516's topic ids),
    # TxnOffsetCommit v5 (test_txn_v2.py drives them).
    assert versions[26][1] == 5 and versions[0][1] == 13 and versions[28][1] == 5


def test_confluent_init_transactions_and_describe(rill):
    tid = f"txn-{uuid.uuid4().hex[:8]}"
    p = txn_producer(rill, tid)
    started = time.monotonic()
    p.init_transactions(30)
    assert time.monotonic() - started < 30
    client = kp_admin(rill)
    try:
        described = client.describe_transactions([tid])[tid]
        assert described.state.value == "Empty"
        assert described.producer_id >= 0
        assert described.producer_epoch == 0
        assert described.transaction_timeout_ms == 60_000
        assert not described.topic_partitions
        listed = [t for ts in client.list_transactions().values() for t in ts]
        mine = [t for t in listed if t.transactional_id == tid]
        assert len(mine) == 1 and mine[0].producer_id == described.producer_id
        empty_only = [t for ts in client.list_transactions(state_filters=["Ongoing"]).values()
                      for t in ts if t.transactional_id == tid]
        assert empty_only == []
    finally:
        client.close()


def test_a_second_init_bumps_the_epoch_and_fences_the_first(rill):
    tid = f"fence-{uuid.uuid4().hex[:8]}"
    first = txn_producer(rill, tid)
    first.init_transactions(30)
    second = txn_producer(rill, tid)
    second.init_transactions(30)
    client = kp_admin(rill)
    try:
        d = client.describe_transactions([tid])[tid]
        assert d.producer_epoch == 1, d
    finally:
        client.close()
    topic = unique_topic("fenced")
    create_topic(rill.bootstrap, topic, 1)
    # The first producer's AddPartitionsToTxn carries epoch 0: the coordinator answers
    # PRODUCER_FENCED, which librdkafka makes a fatal error.
    first.begin_transaction()
    first.produce(topic, b"zombie")
    with pytest.raises(KafkaException) as raised:
        first.commit_transaction(30)
    err = raised.value.args[0]
    assert err.fatal() or "fenced" in err.str().lower(), err


def test_kafka_python_init_transactions_and_fencing(rill):
    tid = f"kp-{uuid.uuid4().hex[:8]}"
    first = KafkaProducer(bootstrap_servers=rill.bootstrap, transactional_id=tid,
                          request_timeout_ms=30_000)
    first.init_transactions()
    second = KafkaProducer(bootstrap_servers=rill.bootstrap, transactional_id=tid,
                           request_timeout_ms=30_000)
    second.init_transactions()
    client = kp_admin(rill)
    try:
        d = client.describe_transactions([tid])[tid]
        assert d.producer_epoch == 1
    finally:
        client.close()
    topic = unique_topic("kp-fenced")
    create_topic(rill.bootstrap, topic, 1)
    first.begin_transaction()
    first.send(topic, b"zombie")
    with pytest.raises(KpError):
        first.commit_transaction()
    second.close(timeout=5)
    first.close(timeout=5)


def test_unknown_transactional_id_is_not_found(rill):
    client = kp_admin(rill)
    try:
        # Creates __transaction_state on first use, then answers for the id.
        with pytest.raises(KpError) as raised:
            client.describe_transactions([f"nobody-{uuid.uuid4().hex[:8]}"])
        assert "TransactionalIdNotFound" in type(raised.value).__name__
    finally:
        client.close()


def test_an_open_transaction_is_listed_as_ongoing_with_its_partitions(rill):
    tid = f"open-{uuid.uuid4().hex[:8]}"
    topic = unique_topic("open")
    create_topic(rill.bootstrap, topic, 2)
    p = txn_producer(rill, tid)
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, b"v", partition=1)
    client = kp_admin(rill)
    try:
        # AddPartitionsToTxn goes before the records; the produce itself may be refused
        # by a broker without the partition side, but the transaction is open.
        def ongoing():
            d = client.describe_transactions([tid])[tid]
            return d if d.state.value == "Ongoing" else None
        d = wait_for(ongoing, 30, "the transaction to be Ongoing")
        assert {(tp.topic, tp.partition) for tp in d.topic_partitions} == {(topic, 1)}
        assert d.transaction_start_time_ms > 0
        listed = [t for ts in client.list_transactions(state_filters=["Ongoing"]).values()
                  for t in ts if t.transactional_id == tid]
        assert len(listed) == 1
    finally:
        client.close()


def test_commit_and_abort_reach_read_committed_consumers(rill):
    needs_markers(rill)
    tid = f"commit-{uuid.uuid4().hex[:8]}"
    topic = unique_topic("commit")
    create_topic(rill.bootstrap, topic, 1)
    p = txn_producer(rill, tid)
    p.init_transactions(30)
    for i in range(6):
        p.begin_transaction()
        p.produce(topic, f"{i}".encode())
        # Written before the end, so that an aborted record is in the log (an abort
        # purges what librdkafka has not sent yet).
        assert p.flush(30) == 0
        if i % 2 == 0:
            p.commit_transaction(30)
        else:
            p.abort_transaction(30)
    assert read_values(rill, topic, "read_committed", 3) == [b"0", b"2", b"4"]
    assert read_values(rill, topic, "read_uncommitted", 6) == [b"0", b"1", b"2", b"3", b"4", b"5"]
    client = kp_admin(rill)
    try:
        d = client.describe_transactions([tid])[tid]
        assert d.state.value in ("CompleteAbort", "CompleteCommit")
    finally:
        client.close()


def committed_offset(rill, group: str, topic: str, isolation="read_uncommitted", timeout=20) -> int:
    """The group's committed offset of partition 0. A read_committed consumer asks with
    require_stable (KIP-447) and is refused (UNSTABLE_OFFSET_COMMIT, retried) while a
    transaction holds an offset of the partition."""
    consumer = reading_consumer(rill.bootstrap, **{"group.id": group, "isolation.level": isolation})
    try:
        (tp,) = consumer.committed([TopicPartition(topic, 0)], timeout=timeout)
        return tp.offset
    finally:
        consumer.close()


def test_offsets_sent_to_an_open_transaction_stay_invisible(rill):
    """AddOffsetsToTxn then TxnOffsetCommit: both answered, and the group's committed
    offset does not move while the transaction is open (DESIGN.md, invariant 10)."""
    tid = f"offsets-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    topic = unique_topic("offsets")
    create_topic(rill.bootstrap, topic, 1)
    p = txn_producer(rill, tid)
    p.init_transactions(30)
    p.begin_transaction()
    consumer = reading_consumer(rill.bootstrap, **{"group.id": group})
    try:
        p.send_offsets_to_transaction([TopicPartition(topic, 0, 5)],
                                      consumer.consumer_group_metadata(), 30)
    finally:
        consumer.close()
    client = kp_admin(rill)
    try:
        d = client.describe_transactions([tid])[tid]
        assert d.state.value == "Ongoing"
        assert any(tp.topic == "__consumer_offsets" for tp in d.topic_partitions), d
    finally:
        client.close()
    assert committed_offset(rill, group, topic) < 0
    # A read_committed consumer waits for the transaction instead of reading past it.
    with pytest.raises(KafkaException) as raised:
        committed_offset(rill, group, topic, "read_committed", timeout=3)
    assert raised.value.args[0].code() == KafkaError._TIMED_OUT


def test_send_offsets_to_transaction_commits_with_the_transaction(rill):
    needs_markers(rill)
    tid = f"ctp-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    topic = unique_topic("ctp")
    create_topic(rill.bootstrap, topic, 1)
    p = txn_producer(rill, tid)
    p.init_transactions(30)
    consumer = reading_consumer(rill.bootstrap, **{"group.id": group})
    try:
        for offset, commit in ((5, False), (7, True)):
            p.begin_transaction()
            p.produce(topic, b"x")
            p.send_offsets_to_transaction([TopicPartition(topic, 0, offset)],
                                          consumer.consumer_group_metadata(), 30)
            if commit:
                p.commit_transaction(30)
            else:
                p.abort_transaction(30)
                assert committed_offset(rill, group, topic) < 0
    finally:
        consumer.close()
    assert committed_offset(rill, group, topic) == 7


def test_a_new_coordinator_replays_the_transaction_after_kill9(rill_cluster_factory):
    """Three nodes, `__transaction_state` with RF 3 and min ISR 2: an open transaction's
    state (producer id, epoch, partitions) is answered only once replicated, so SIGKILL of
    its coordinator loses none of it; the node that takes the partition over replays it."""
    cluster = rill_cluster_factory(overrides={
        "transaction.state.log.replication.factor": "3",
        "transaction.state.log.min.isr": "2",
        "transaction.state.log.num.partitions": "3",
    })
    topic = unique_topic("replayed")
    create_topic(cluster.bootstrap, topic, 2)
    tid = f"replay-{uuid.uuid4().hex[:8]}"
    p = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid,
                  "transaction.timeout.ms": 120_000})
    p.init_transactions(60)
    p.begin_transaction()
    p.produce(topic, b"v", partition=0)
    p.produce(topic, b"v", partition=1)
    client = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30_000)
    try:
        def ongoing():
            d = client.describe_transactions([tid])[tid]
            return d if d.state.value == "Ongoing" and len(d.topic_partitions) == 2 else None
        before = wait_for(ongoing, 60, "the transaction to be Ongoing on two partitions")
    finally:
        client.close()
    cluster.node(before.coordinator_id).kill9()

    def replayed():
        # A fresh client each time: kafka-python keeps a dead node in its metadata.
        survivors = KafkaAdminClient(bootstrap_servers=cluster.running_bootstrap(),
                                     request_timeout_ms=10_000)
        try:
            d = survivors.describe_transactions([tid])[tid]
            return d if d.coordinator_id != before.coordinator_id else None
        finally:
            survivors.close()
    after = wait_for(replayed, 90, "another node to coordinate the transaction", interval_s=1)
    assert after.state.value == "Ongoing"
    assert (after.producer_id, after.producer_epoch) == (before.producer_id, before.producer_epoch)
    assert after.topic_partitions == before.topic_partitions
    assert after.transaction_start_time_ms == before.transaction_start_time_ms


def rill_cli_json(rill, *args):
    import json
    import subprocess

    from rill_harness import rill_binary

    result = subprocess.run([str(rill_binary()), *args, "-b", rill.bootstrap, "--output", "json"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_rill_transaction_list_and_describe(rill):
    tid = f"cli-{uuid.uuid4().hex[:8]}"
    topic = unique_topic("cli-txn")
    create_topic(rill.bootstrap, topic, 1)
    p = txn_producer(rill, tid)
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, b"v")

    def ongoing():
        (d,) = rill_cli_json(rill, "transaction", "describe", tid)
        return d if d["state"] == "Ongoing" else None
    d = wait_for(ongoing, 30, "rill transaction describe to show Ongoing")
    assert d["partitions"] == [f"{topic}-0"]
    assert d["producer_epoch"] == 0 and d["producer_id"] >= 0
    assert d["transaction_timeout_ms"] == 60_000
    listed = rill_cli_json(rill, "transaction", "list", "--state", "Ongoing")
    assert [t["producer_id"] for t in listed if t["transactional_id"] == tid] == [d["producer_id"]]
    assert not [t for t in rill_cli_json(rill, "transaction", "list", "--state", "Empty")
                if t["transactional_id"] == tid]


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced(rill_factory):
    """A producer that opens a transaction and goes quiet: after transaction.timeout.ms the
    coordinator aborts it under a bumped epoch (PrepareAbort, then CompleteAbort once the
    markers are written), so the producer that let it expire is fenced."""
    rill = rill_factory(overrides={
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "200",
    })
    tid = f"expire-{uuid.uuid4().hex[:8]}"
    topic = unique_topic("expire")
    create_topic(rill.bootstrap, topic, 1)
    p = txn_producer(rill, tid, **{"transaction.timeout.ms": 2000, "message.timeout.ms": 2000})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(topic, b"v")
    client = kp_admin(rill)
    try:
        def state():
            return client.describe_transactions([tid])[tid]
        opened = wait_for(lambda: state() if state().state.value == "Ongoing" else None, 30,
                          "the transaction to open")
        aborted = wait_for(
            lambda: (lambda d: d if d.state.value in ("PrepareAbort", "CompleteAbort") else None)(state()),
            30, "the coordinator to abort the expired transaction")
    finally:
        client.close()
    assert aborted.producer_id == opened.producer_id
    assert aborted.producer_epoch == opened.producer_epoch + 1
