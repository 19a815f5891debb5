"""Tiered storage (issue #22, KIP-405) against a real S3-compatible server (moto's server
mode, `s3_server.py`): closed segments go to the bucket and leave the local disk, a
consumer from offset 0 reads them back through the remote tier byte for byte, the store
going away blocks no produce and the uploads resume, a leader killed mid-upload leaves
nothing half-listed and its successor goes on, retention and topic deletion clean the
bucket, and an empty new replica starts from the remote tier's tail.

`RILL_TIERED_OUTAGE_S` sets how long the store is cut in the outage test (default 8 s;
the issue's minute is `RILL_TIERED_OUTAGE_S=60`).
"""

from __future__ import annotations

import os
import time
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

import kafka_wire
from kafka_helpers import admin, create_topic, read_all, unique_topic, wait_for
from s3_server import S3Server

SEGMENT_BYTES = 64 * 1024
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
WAIT_S = 60.0


@pytest.fixture
def s3(tmp_path):
    server = S3Server(tmp_path)
    yield server
    server.close()


def tiered_config(local_segments: int = 2, **extra) -> dict[str, str]:
    config = {
        "remote.storage.enable": "true",
        "segment.bytes": str(SEGMENT_BYTES),
        "local.retention.bytes": str(local_segments * SEGMENT_BYTES),
    }
    config.update(extra)
    return config


def produce(bootstrap: str, topic: str, count: int, start: int = 0, size: int = 1000,
            partition: int = 0) -> dict[int, tuple[bytes, bytes, tuple]]:
    """Produces `count` records with distinct keys, random-looking values and a header;
    returns what each acknowledged offset holds."""
    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5,
        "enable.idempotence": True, "compression.type": "lz4", "batch.size": 16384,
    })
    acked: dict[int, tuple[bytes, bytes, tuple]] = {}
    failures = []

    def on_delivery(error, message):
        if error is not None:
            failures.append(error)
        else:
            # (Delivery reports carry no headers: they are the key's number.)
            n = message.key()[1:]
            acked[message.offset()] = (message.key(), message.value(), (("n", n),))

    for i in range(start, start + count):
        key = f"k{i}".encode()
        value = os.urandom(size // 2).hex().encode()[:size]
        producer.produce(topic, key=key, value=value, headers=[("n", str(i).encode())],
                         partition=partition, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0, "records left unacknowledged"
    assert not failures, failures[:3]
    return acked


def partition_dir(data_dir: Path, topic: str, partition: int = 0) -> Path:
    return data_dir / f"{topic}-{partition}"


def local_segments(data_dir: Path, topic: str, partition: int = 0) -> list[int]:
    d = partition_dir(data_dir, topic, partition)
    return sorted(int(p.stem) for p in d.glob("*.log")) if d.exists() else []


def finished_copies(s3: S3Server, topic: str) -> dict[int, set[str]]:
    """The whole copies in the bucket ({start offset: suffixes}), by their `.log`."""
    out = {}
    for stem, suffixes in s3.copies(topic).items():
        start = int(stem.split("-", 1)[0])
        if "log" in suffixes:
            out[start] = suffixes
    return out


def check_intact(bootstrap: str, topic: str, acked: dict, low: int | None = 0) -> None:
    """A consumer from the beginning gets every acknowledged record from `low` on (from
    wherever the log starts when `low` is None: retention may still be moving it), each
    byte for byte."""
    try:
        got = read_all(bootstrap, topic, 1, timeout_s=120)[0]
    except AssertionError as e:
        # Say where the log refused: the offsets the broker reports now.
        where = {t: list_offset(bootstrap, topic, t) for t in (-2, EARLIEST_LOCAL, LATEST_TIERED, -1)}
        raise AssertionError(f"{e}; ListOffsets now (earliest, earliest-local, "
                             f"latest-tiered, latest): {where}") from e
    if low is None:
        low = min(got)
    expected = {o: v for o, v in acked.items() if o >= low}
    assert sorted(got) == sorted(expected), (
        f"offsets differ: missing {sorted(set(expected) - set(got))[:10]}, "
        f"extra {sorted(set(got) - set(expected))[:10]}"
    )
    for offset, (key, value, headers) in expected.items():
        record = got[offset]
        assert (record.key, record.value, record.headers) == (key, value, headers), offset


def list_offset(bootstrap: str, topic: str, timestamp: int) -> int:
    """ListOffsets of partition 0, asked of each broker of `bootstrap` until the leader
    answers."""
    errors = []
    for host in bootstrap.split(","):
        try:
            answered = kafka_wire.list_offsets(host, 0, {topic: 1}, 10.0, timestamp=timestamp)
        except OSError as e:
            errors.append(repr(e))
            continue
        error, offset, _epoch = answered[(topic, 0)]
        if error == 0:
            return offset
        errors.append(error)
    raise AssertionError(f"ListOffsets({timestamp}): {errors}")


def metric(rill, name: str) -> float:
    text = urllib.request.urlopen(f"http://{rill.http_address()}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "_total "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not on /metrics")


def test_segments_move_to_the_bucket_and_read_back_from_offset_zero(rill_factory, s3):
    rill = rill_factory(overrides={**s3.broker_overrides(), "http.listeners": "127.0.0.1:0"})
    topic = unique_topic("tiered")
    create_topic(rill.bootstrap, topic, 1, tiered_config())
    acked = produce(rill.bootstrap, topic, 3000)
    end = max(acked) + 1
    # Closed segments reach the bucket whole, and leave the local disk down to
    # local.retention.bytes (about two segments, and the active one).
    wait_for(lambda: len(finished_copies(s3, topic)) >= 10, WAIT_S, "copies in the bucket")
    wait_for(lambda: len(local_segments(rill.data_dir, topic)) <= 4, WAIT_S,
             "local segments to be deleted down to local.retention.bytes")
    copies = finished_copies(s3, topic)
    for start, suffixes in copies.items():
        assert {"log", "index", "timeindex", "leader-epoch-checkpoint", "snapshot"} <= suffixes, (start, suffixes)
    # The first copy starts the log (the consumer below finds no hole after it).
    assert min(copies) == 0
    # ListOffsets: the whole log starts at 0; the local log later (KIP-1005), at the first
    # local segment; the remote tier ends at or after the local start minus one. Copies
    # and the local retention behind them may still be going on, so the local start is
    # compared only when no segment was deleted between reading the disk and asking.

    def settled_answer() -> bool:
        before = local_segments(rill.data_dir, topic)[0]
        answered = list_offset(rill.bootstrap, topic, EARLIEST_LOCAL)
        return local_segments(rill.data_dir, topic)[0] == before == answered

    wait_for(settled_answer, WAIT_S, "ListOffsets' local start to be the first local segment")
    local_start = local_segments(rill.data_dir, topic)[0]
    assert local_start > 0
    assert list_offset(rill.bootstrap, topic, -2) == 0
    assert list_offset(rill.bootstrap, topic, LATEST_TIERED) >= local_start - 1
    assert list_offset(rill.bootstrap, topic, -1) == end
    # A consumer from offset 0 reads everything through both tiers, byte for byte.
    check_intact(rill.bootstrap, topic, acked)
    # A timestamp in the remote part is found there.
    assert 0 <= list_offset(rill.bootstrap, topic, 1) < local_start
    # The remote tier's metrics: what was copied and read back, and no lag left.
    assert metric(rill, "kafka_server_brokertopicmetrics_remote_copy_requests") >= len(copies)
    assert metric(rill, "kafka_server_brokertopicmetrics_remote_copy_bytes") > 10 * SEGMENT_BYTES
    assert metric(rill, "kafka_server_brokertopicmetrics_remote_fetch_bytes") > 0
    wait_for(lambda: metric(rill, "kafka_server_brokertopicmetrics_remote_copy_lag_segments") == 0,
             WAIT_S, "the remote copy lag to reach 0")


def test_a_restarted_broker_serves_the_remote_part_and_copies_on_without_repeats(rill_factory, s3):
    rill = rill_factory(overrides=s3.broker_overrides())
    topic = unique_topic("restart")
    create_topic(rill.bootstrap, topic, 1, tiered_config())
    acked = produce(rill.bootstrap, topic, 1500)
    wait_for(lambda: len(local_segments(rill.data_dir, topic)) <= 4, WAIT_S, "tiering")
    # kill -9: the remote metadata is in the metadata log, the cache is rebuilt.
    rill.kill9()
    rill.restart()
    check_intact(rill.bootstrap, topic, acked)
    before = finished_copies(s3, topic)
    acked.update(produce(rill.bootstrap, topic, 1500, start=len(acked)))
    wait_for(lambda: len(local_segments(rill.data_dir, topic)) <= 4
             and max(finished_copies(s3, topic)) > max(before), WAIT_S, "tiering after the restart")
    after = finished_copies(s3, topic)
    assert [start for start in after if start <= max(before)] == sorted(before), \
        "a segment was copied again after the restart"
    # And a clean stop and start.
    rill.stop()
    rill.restart()
    check_intact(rill.bootstrap, topic, acked)


def test_a_store_outage_blocks_no_produce_and_uploads_resume(rill_factory, s3):
    outage_s = float(os.environ.get("RILL_TIERED_OUTAGE_S", "8"))
    rill = rill_factory(overrides=s3.broker_overrides())
    topic = unique_topic("outage")
    create_topic(rill.bootstrap, topic, 1, tiered_config())
    acked = produce(rill.bootstrap, topic, 600)
    wait_for(lambda: len(finished_copies(s3, topic)) >= 2, WAIT_S, "first copies")
    s3.proxy.cut()
    before = set(finished_copies(s3, topic))
    started = time.monotonic()
    rounds = 0
    while time.monotonic() - started < outage_s:
        t0 = time.monotonic()
        acked.update(produce(rill.bootstrap, topic, 300, start=len(acked)))
        # Produce does not wait for the store.
        assert time.monotonic() - t0 < 20, "produce slowed down by the store outage"
        rounds += 1
    assert rounds >= 1
    # Nothing was copied meanwhile, nothing uncopied was deleted locally, and local
    # reads go on.
    assert set(finished_copies(s3, topic)) == before
    local = local_segments(rill.data_dir, topic)
    assert len(local) > 4, local
    s3.proxy.restore()
    # The uploads resume, and the local tier shrinks again.
    wait_for(lambda: len(local_segments(rill.data_dir, topic)) <= 4, WAIT_S,
             "uploads to resume and the local tier to shrink")
    assert len(finished_copies(s3, topic)) > len(before)
    check_intact(rill.bootstrap, topic, acked)


def test_retention_and_topic_deletion_clean_the_bucket(rill_factory, s3):
    rill = rill_factory(overrides=s3.broker_overrides())
    topic = unique_topic("retention")
    create_topic(rill.bootstrap, topic, 1,
                 tiered_config(**{"retention.bytes": str(6 * SEGMENT_BYTES)}))
    acked = produce(rill.bootstrap, topic, 3000)
    # The whole log is held to about retention.bytes: the oldest copies are deleted.
    def trimmed():
        copies = finished_copies(s3, topic)
        return copies and min(copies) > 0 and len(copies) <= 8
    wait_for(trimmed, WAIT_S, "remote retention to delete the oldest copies")
    # ... and to settle: the same copies over a few of the task's passes.
    seen = []
    wait_for(lambda: seen.append(sorted(finished_copies(s3, topic))) or
             (len(seen) >= 5 and all(x == seen[-1] for x in seen[-5:])), WAIT_S,
             "remote retention to settle")
    low = list_offset(rill.bootstrap, topic, -2)
    assert low > 0
    check_intact(rill.bootstrap, topic, acked, low=None)
    # Deleting the topic deletes its objects.
    client = admin(rill.bootstrap)
    client.delete_topics([topic])[topic].result(30)
    wait_for(lambda: not s3.objects(topic), WAIT_S, "the deleted topic's objects to go")


def test_delete_records_cleans_both_tiers(rill_factory, s3):
    rill = rill_factory(overrides=s3.broker_overrides())
    topic = unique_topic("delrec")
    create_topic(rill.bootstrap, topic, 1, tiered_config())
    acked = produce(rill.bootstrap, topic, 3000)
    wait_for(lambda: len(local_segments(rill.data_dir, topic)) <= 4, WAIT_S, "tiering")
    local_start = list_offset(rill.bootstrap, topic, EARLIEST_LOCAL)
    target = local_start // 2
    client = admin(rill.bootstrap)
    from confluent_kafka import TopicPartition as TP
    result = client.delete_records([TP(topic, 0, target)])
    low = list(result.values())[0].result(30).low_watermark
    # The copy holding the offset stays whole (its start is the low watermark); every
    # copy below it is gone from the bucket, and reads start there.
    assert 0 < low <= target, (low, target)
    assert min(finished_copies(s3, topic)) == low
    assert list_offset(rill.bootstrap, topic, -2) == low
    check_intact(rill.bootstrap, topic, acked, low=low)
    # Past the local log start: the local tier moves up to it; no copy wholly below it
    # remains, and one that holds it stays whole (Rill's low watermark is then that
    # copy's start, at most a segment below the offset; Kafka's is the offset).
    target = local_start + 5
    low = list(client.delete_records([TP(topic, 0, target)]).values())[0].result(30).low_watermark
    assert target - 100 < low <= target, (low, target)
    assert all(start >= low for start in finished_copies(s3, topic))
    # (Local retention may have moved the local start further since.)
    assert list_offset(rill.bootstrap, topic, EARLIEST_LOCAL) >= target
    assert list_offset(rill.bootstrap, topic, -2) == low
    check_intact(rill.bootstrap, topic, acked, low=low)


def test_turning_tiering_off_with_delete_on_disable_empties_the_bucket(rill_factory, s3):
    rill = rill_factory(overrides=s3.broker_overrides())
    topic = unique_topic("off-delete")
    create_topic(rill.bootstrap, topic, 1, tiered_config(local_segments=20))
    acked = produce(rill.bootstrap, topic, 600)
    wait_for(lambda: len(finished_copies(s3, topic)) >= 3, WAIT_S, "copies")
    client = admin(rill.bootstrap)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("remote.storage.enable", "false", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("remote.log.delete.on.disable", "true", incremental_operation=AlterConfigOpType.SET)])
    client.incremental_alter_configs([resource])[resource].result(30)
    wait_for(lambda: not s3.objects(topic), WAIT_S, "the remote part to be deleted")
    # Everything was still local (local.retention.bytes of 20 segments): nothing lost.
    check_intact(rill.bootstrap, topic, acked)


def test_configs_are_validated_as_kafka_does(rill_factory, s3):
    rill = rill_factory(overrides=s3.broker_overrides())
    client = admin(rill.bootstrap)
    from confluent_kafka.admin import NewTopic

    def create(config):
        name = unique_topic("cfg")
        try:
            client.create_topics([NewTopic(name, 1, 1, config=config)])[name].result(30)
            return None
        except Exception as e:  # the KafkaException's error
            return e.args[0].code()

    from confluent_kafka import KafkaError
    invalid = KafkaError.INVALID_CONFIG
    assert create({"remote.storage.enable": "true", "cleanup.policy": "compact"}) == invalid
    assert create({"remote.storage.enable": "true", "retention.bytes": "100",
                   "local.retention.bytes": "200"}) == invalid
    assert create({"remote.storage.enable": "true", "retention.ms": "100",
                   "local.retention.ms": "-1"}) == invalid
    assert create({"local.retention.ms": "-3"}) == invalid
    assert create({"remote.storage.enable": "true", "remote.log.copy.disable": "true",
                   "local.retention.ms": "1000"}) == invalid
    assert create({"remote.storage.enable": "true", "local.retention.ms": "1000"}) is None
    # Turning it off without deleting the remote data is refused, as in Kafka 3.9+.
    topic = unique_topic("cfg-off")
    create_topic(rill.bootstrap, topic, 1, {"remote.storage.enable": "true"})
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("remote.storage.enable", "false", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(Exception) as refused:
        client.incremental_alter_configs([resource])[resource].result(30)
    assert refused.value.args[0].code() == invalid


def test_tiered_storage_off_in_the_broker_refuses_tiered_topics(rill_factory):
    rill = rill_factory()
    from confluent_kafka.admin import NewTopic
    name = unique_topic("off")
    client = admin(rill.bootstrap)
    with pytest.raises(Exception) as refused:
        client.create_topics(
            [NewTopic(name, 1, 1, config={"remote.storage.enable": "true"})])[name].result(30)
    assert "Tiered Storage functionality is disabled" in str(refused.value)


CLUSTER_TIER = {"replica.lag.time.max.ms": "5000", "auto.leader.rebalance.enable": "false"}


def leader_of(cluster, topic: str) -> int:
    def find():
        md = admin(cluster.running_bootstrap()).list_topics(topic=topic, timeout=5)
        t = md.topics.get(topic)
        if t is None or t.error is not None or 0 not in t.partitions:
            return None
        leader = t.partitions[0].leader
        return leader if leader > 0 else None
    return wait_for(find, WAIT_S, f"a leader of {topic}-0")


def test_a_leader_killed_mid_upload_leaves_no_half_copy_and_its_successor_goes_on(
        rill_cluster_factory, s3):
    cluster = rill_cluster_factory(3, overrides={**s3.broker_overrides(), **CLUSTER_TIER})
    topic = unique_topic("kill")
    client = admin(cluster.bootstrap)
    from confluent_kafka.admin import NewTopic
    client.create_topics([NewTopic(topic, 1, 3, config={
        **tiered_config(), "min.insync.replicas": "2"})])[topic].result(30)
    leader = leader_of(cluster, topic)
    acked = produce(cluster.bootstrap, topic, 1500)
    wait_for(lambda: len(finished_copies(s3, topic)) >= 2, WAIT_S, "first copies")
    # Slow the store so that an upload takes a while, then kill the leader while one
    # is sending.
    s3.proxy.bytes_per_s = 64 * 1024
    acked.update(produce(cluster.bootstrap, topic, 1500, start=len(acked)))
    wait_for(lambda: time.monotonic() - s3.proxy.last_upstream < 0.1, WAIT_S, "an upload in flight")
    cluster.node(leader).kill9()
    s3.proxy.bytes_per_s = None
    new_leader = wait_for(lambda: (l := leader_of(cluster, topic)) != leader and l, WAIT_S,
                          "a new leader")
    assert new_leader != leader
    acked.update(produce(cluster.running_bootstrap(), topic, 1500, start=len(acked)))
    # The new leader goes on: copies are made past what the old one finished, and the
    # half copy the killed one left is deleted (once older than
    # remote.log.manager.copy.cleanup.delay.ms, so that the PUTs it had sent land
    # first): every copy left in the bucket is whole.
    def settled():
        copies = s3.copies(topic)
        whole = all({"log", "index", "timeindex", "leader-epoch-checkpoint"} <= sfx
                    for sfx in copies.values())
        return whole and len(copies) >= 15 and copies
    wait_for(settled, WAIT_S, "whole copies only, past the kill")
    # Every acknowledged record once, from offset 0: no hole, no duplicate.
    assert min(finished_copies(s3, topic)) == 0
    check_intact(cluster.running_bootstrap(), topic, acked)
    cluster.start_node(leader)


def test_an_empty_new_replica_starts_from_the_remote_tail(rill_cluster_factory, s3):
    cluster = rill_cluster_factory(3, overrides={**s3.broker_overrides(), **CLUSTER_TIER})
    topic = unique_topic("tail")
    client = admin(cluster.bootstrap)
    from confluent_kafka.admin import NewTopic
    client.create_topics([NewTopic(topic, num_partitions=1, replica_assignment=[[1, 2]],
                                   config=tiered_config())])[topic].result(30)
    leader_of(cluster, topic)
    acked = produce(cluster.bootstrap, topic, 3000)
    wait_for(lambda: len(local_segments(cluster.node(1).data_dir, topic)) <= 4, WAIT_S,
             "the leader's local tier to shrink")
    # Node 3 joins the replica set with nothing on disk.
    from test_replicated_lifecycle import rill_json, describe_partition
    rill_json(cluster, "topic", "reassign", topic, "--partition", "0", "--replicas", "1,2,3")
    wait_for(lambda: sorted(describe_partition(cluster, topic)["isr"]) == [1, 2, 3], WAIT_S,
             "node 3 in the ISR")
    # It fetched the tail only: its log starts where the leader's local log does, far
    # above 0, and holds a few segments.
    segments = local_segments(cluster.node(3).data_dir, topic)
    assert segments and segments[0] > 0, segments
    assert len(segments) <= 6, segments
    # ... with the leader's epochs from the remote copy below its start (KIP-405's
    # auxiliary state): its epoch cache begins at offset 0, not at its own log start.
    checkpoint = (partition_dir(cluster.node(3).data_dir, topic) / "leader-epoch-checkpoint").read_text()
    first_epoch_start = int(checkpoint.split("\n")[2].split()[1])
    assert first_epoch_start < segments[0], checkpoint
    # Leading, it serves the whole log, the old part from the remote tier, and goes on
    # copying where the copies end (its epochs place them in its lineage): no copy of
    # the old part is made again.
    from test_replicated_lifecycle import lead_by
    lead_by(cluster, topic, 3)
    before = finished_copies(s3, topic)
    acked.update(produce(cluster.bootstrap, topic, 1000, start=len(acked)))
    wait_for(lambda: max(finished_copies(s3, topic)) > max(before), WAIT_S, "new copies by node 3")
    after = finished_copies(s3, topic)
    assert [start for start in after if start <= max(before)] == sorted(before), \
        "node 3 copied the old part again"
    check_intact(cluster.bootstrap, topic, acked)


def test_leaders_killed_and_the_store_flapping_lose_nothing(rill_cluster_factory, s3):
    """A few rounds of: produce, the store cut or the leader killed (and restarted), on
    three nodes; then every acknowledged record once from offset 0, and only whole copies
    in the bucket. `RILL_TIERED_CHAOS_ROUNDS` sets the rounds (default 3),
    `RILL_TIERED_CHAOS_RETENTION` a `retention.bytes` (remote retention deleting copies
    meanwhile; the log is then checked from where it starts), `RILL_TIERED_DEBUG=1`
    prints each node's leader epochs and the copies' on a failure."""
    rounds = int(os.environ.get("RILL_TIERED_CHAOS_ROUNDS", "3"))
    cluster = rill_cluster_factory(3, overrides={**s3.broker_overrides(), **CLUSTER_TIER})
    topic = unique_topic("chaos")
    client = admin(cluster.bootstrap)
    from confluent_kafka.admin import NewTopic
    retention = os.environ.get("RILL_TIERED_CHAOS_RETENTION")
    config = {**tiered_config(), "min.insync.replicas": "2"}
    if retention:
        config["retention.bytes"] = retention
    client.create_topics([NewTopic(topic, 1, 3, config=config)])[topic].result(30)
    leader_of(cluster, topic)
    acked = produce(cluster.bootstrap, topic, 600)
    for i in range(rounds):
        if i % 2 == 0:
            victim = leader_of(cluster, topic)
            cluster.node(victim).kill9()
            acked.update(produce(cluster.running_bootstrap(), topic, 600, start=len(acked)))
            cluster.start_node(victim)
        else:
            s3.proxy.cut()
            acked.update(produce(cluster.running_bootstrap(), topic, 600, start=len(acked)))
            s3.proxy.restore()
    acked.update(produce(cluster.bootstrap, topic, 600, start=len(acked)))

    def settled():
        copies = s3.copies(topic)
        whole = all({"log", "index", "timeindex", "leader-epoch-checkpoint"} <= sfx
                    for sfx in copies.values())
        leader = leader_of(cluster, topic)
        return whole and len(local_segments(cluster.node(leader).data_dir, topic)) <= 4
    wait_for(settled, WAIT_S * 2, "the remote tier to catch up with whole copies only")
    if not retention:
        assert min(finished_copies(s3, topic)) == 0
    try:
        check_intact(cluster.bootstrap, topic, acked, low=None if retention else 0)
    except AssertionError:
        if os.environ.get("RILL_TIERED_DEBUG"):
            for n in (1, 2, 3):
                f = partition_dir(cluster.node(n).data_dir, topic) / "leader-epoch-checkpoint"
                print(f"node {n} epochs:", f.read_text().split("\n")[2:] if f.exists() else None,
                      "segments:", local_segments(cluster.node(n).data_dir, topic)[:3])
            print("leader:", leader_of(cluster, topic))
            for key in sorted(s3.objects(topic)):
                if key.endswith(".leader-epoch-checkpoint"):
                    body = s3.client.get_object(Bucket=s3.bucket, Key=key)["Body"].read().decode()
                    print(key.rsplit("/", 1)[-1][:30], body.split("\n")[2:])
        raise

