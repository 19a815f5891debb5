"""Configs against the real broker: dynamic broker configs with Kafka's precedence and
sources, message.timestamp.before.max.ms refusing old CreateTime records,
message.timestamp.type=LogAppendTime stamping batches with the broker's time,
compression.type making the leader store batches with the topic's codec, and a
connection limit changed at runtime."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    ResourceType,
)
from kafka_helpers import admin, create_topic, read_all, unique_topic, wait_for

TIMEOUT_S = 30
ZSTD = 4


def alter(client, resource_type, name: str, entries: dict[str, str | None]) -> None:
    """IncrementalAlterConfigs: SET each entry, or DELETE it when its value is None."""
    ops = [
        ConfigEntry(
            k,
            v,
            incremental_operation=AlterConfigOpType.DELETE if v is None else AlterConfigOpType.SET,
        )
        for k, v in entries.items()
    ]
    resource = ConfigResource(resource_type, name, incremental_configs=ops)
    client.incremental_alter_configs([resource])[resource].result(timeout=TIMEOUT_S)


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def alter_cluster_default(bootstrap: str, entries: dict[str, str | None]) -> tuple[int, str | None]:
    """IncrementalAlterConfigs v0 on BROKER "" over a raw socket: librdkafka refuses a
    resource with an empty name, which is how Kafka names the cluster-wide default."""
    body = struct.pack(">i", 1) + struct.pack(">b", 4) + _string("")
    body += struct.pack(">i", len(entries))
    for k, v in entries.items():
        body += _string(k) + struct.pack(">b", 1 if v is None else 0)
        body += struct.pack(">h", -1) if v is None else _string(v)
    body += b"\x00"  # validate_only
    return config_request(bootstrap, 44, body)


def legacy_alter(bootstrap: str, resource_type: int, name: str, entries: dict[str, str]):
    """AlterConfigs v0 (the API before the incremental one) over a raw socket: clients
    now either send the incremental form or fill in every existing key themselves."""
    body = struct.pack(">i", 1) + struct.pack(">b", resource_type) + _string(name)
    body += struct.pack(">i", len(entries))
    for k, v in entries.items():
        body += _string(k) + _string(v)
    body += b"\x00"  # validate_only
    return config_request(bootstrap, 33, body)


def config_request(bootstrap: str, api_key: int, body: bytes) -> tuple[int, str | None]:
    """Sends a v0 config-altering request for one resource; returns its error code and
    message (both responses start alike: throttle, then per resource code and message)."""
    header = struct.pack(">hhi", api_key, 0, 7) + _string("e2e-configs")
    frame = header + body
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=TIMEOUT_S) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)

        def read(n: int) -> bytes:
            buf = b""
            while len(buf) < n:
                chunk = sock.recv(n - len(buf))
                assert chunk, "connection closed"
                buf += chunk
            return buf

        (size,) = struct.unpack(">i", read(4))
        data = read(size)
    correlation_id, _throttle, count, error_code, msg_len = struct.unpack_from(">iiihh", data, 0)
    assert (correlation_id, count) == (7, 1)
    message = None if msg_len < 0 else data[16 : 16 + msg_len].decode()
    return error_code, message


def describe(client, resource_type, name: str) -> dict[str, ConfigEntry]:
    resource = ConfigResource(resource_type, name)
    return client.describe_configs([resource])[resource].result(timeout=TIMEOUT_S)


def broker_id(client) -> str:
    brokers = client.list_topics(timeout=TIMEOUT_S).brokers
    assert len(brokers) == 1
    return str(next(iter(brokers)))


def test_cluster_wide_and_per_broker_defaults_reach_topics_without_overrides(rill):
    client = admin(rill.bootstrap)
    plain = unique_topic("inherits")
    pinned = unique_topic("overrides")
    create_topic(rill.bootstrap, plain, 1)
    create_topic(rill.bootstrap, pinned, 1, {"retention.ms": "86400000"})
    me = broker_id(client)

    assert alter_cluster_default(rill.bootstrap, {"log.retention.ms": "3600000"}) == (0, None)
    entry = describe(client, ResourceType.TOPIC, plain)["retention.ms"]
    assert entry.value == "3600000"
    assert entry.source == ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value
    pinned_entry = describe(client, ResourceType.TOPIC, pinned)["retention.ms"]
    assert pinned_entry.value == "86400000"
    assert pinned_entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    mine = describe(client, ResourceType.BROKER, me)["log.retention.ms"]
    assert (mine.value, mine.source) == (
        "3600000",
        ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG.value,
    )

    # This broker's own value beats the cluster-wide default.
    alter(client, ResourceType.BROKER, me, {"log.retention.ms": "7200000"})
    entry = describe(client, ResourceType.TOPIC, plain)["retention.ms"]
    assert (entry.value, entry.source) == ("7200000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    mine = describe(client, ResourceType.BROKER, me)
    assert mine["log.retention.ms"].value == "7200000"
    assert mine["log.retention.ms"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    assert not mine["log.retention.ms"].is_read_only
    assert mine["log.dirs"].is_read_only

    # Deleting both brings the built-in default back.
    alter(client, ResourceType.BROKER, me, {"log.retention.ms": None})
    assert alter_cluster_default(rill.bootstrap, {"log.retention.ms": None}) == (0, None)
    entry = describe(client, ResourceType.TOPIC, plain)["retention.ms"]
    assert (entry.value, entry.source) == ("604800000", ConfigSource.DEFAULT_CONFIG.value)

    # Keys that are not dynamic are refused as Kafka refuses them: INVALID_REQUEST on a
    # BROKER resource, as Kafka 4.1 answers (INVALID_CONFIG is for topics).
    code, message = alter_cluster_default(rill.bootstrap, {"log.dirs": "/elsewhere"})
    assert code == KafkaError.INVALID_REQUEST
    assert "Cannot update these configs dynamically" in message
    with pytest.raises(KafkaException) as refused:
        alter(client, ResourceType.BROKER, me, {"log.retention.ms": "soon"})
    assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST


def test_create_time_older_than_before_max_ms_is_refused(rill):
    topic = unique_topic("timestamps")
    create_topic(rill.bootstrap, topic, 1, {"message.timestamp.before.max.ms": "3600000"})
    producer = Producer({"bootstrap.servers": rill.bootstrap, "acks": "all", "retries": 0})
    results = []

    def report(error, message):
        results.append((error, message))

    now_ms = int(time.time() * 1000)
    producer.produce(
        topic, value=b"old", partition=0, timestamp=now_ms - 2 * 86_400_000, on_delivery=report
    )
    assert producer.flush(TIMEOUT_S) == 0
    producer.produce(
        topic, value=b"fresh", partition=0, timestamp=now_ms - 60_000, on_delivery=report
    )
    assert producer.flush(TIMEOUT_S) == 0
    (old_error, _), (fresh_error, _) = results
    assert old_error is not None, "a record two days old was accepted"
    assert fresh_error is None, fresh_error
    values = [r.value for _, r in sorted(read_all(rill.bootstrap, topic, 1)[0].items())]
    assert values == [b"fresh"]
    assert old_error.code() == KafkaError.INVALID_TIMESTAMP, old_error


def test_log_append_time_replaces_the_producer_timestamp(rill):
    """message.timestamp.type=LogAppendTime: the broker stamps each batch with its own
    clock and answers it (typed LOG_APPEND_TIME) in the produce response, and consumers
    see that time, whatever the producer set; changed live to CreateTime, the next batch
    keeps the producer's time."""
    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

    topic = unique_topic("append-time")
    client = create_topic(rill.bootstrap, topic, 1, {"message.timestamp.type": "LogAppendTime"})
    producer = Producer({"bootstrap.servers": rill.bootstrap, "acks": "all"})
    day_ago = int(time.time() * 1000) - 86_400_000
    delivered = []
    producer.produce(
        topic,
        value=b"stamped",
        partition=0,
        timestamp=day_ago,
        on_delivery=lambda e, m: delivered.append((e, m.timestamp())),
    )
    assert producer.flush(TIMEOUT_S) == 0
    before = int(time.time() * 1000) - 60_000
    alter(client, ResourceType.TOPIC, topic, {"message.timestamp.type": "CreateTime"})
    producer.produce(topic, value=b"kept", partition=0, timestamp=day_ago)
    assert producer.flush(TIMEOUT_S) == 0
    ((error, (ts_type, ts)),) = delivered
    assert error is None, error
    assert ts_type == TIMESTAMP_LOG_APPEND_TIME and ts >= before, (ts_type, ts)
    records = [r for _, r in sorted(read_all(rill.bootstrap, topic, 1)[0].items())]
    assert [r.value for r in records] == [b"stamped", b"kept"]
    assert records[0].timestamp >= before, "the consumer must see the broker's time"
    assert records[1].timestamp == day_ago, "CreateTime keeps the producer's time"


def batch_headers(data_dir: Path, topic: str) -> list[tuple[int, int, int]]:
    """(base offset, record count, attributes) of every batch in the partition's segments."""
    out = []
    for log in sorted((data_dir / f"{topic}-0").glob("*.log")):
        data = log.read_bytes()
        pos = 0
        while pos + 61 <= len(data):
            base_offset, batch_length = struct.unpack_from(">qi", data, pos)
            (attributes,) = struct.unpack_from(">h", data, pos + 21)
            (count,) = struct.unpack_from(">i", data, pos + 57)
            out.append((base_offset, count, attributes))
            pos += 12 + batch_length
    return out


def test_topic_compression_type_recompresses_producer_batches(rill):
    topic = unique_topic("zstd")
    create_topic(rill.bootstrap, topic, 1, {"compression.type": "zstd"})
    producer = Producer(
        {
            "bootstrap.servers": rill.bootstrap,
            "acks": "all",
            "compression.type": "none",
            "linger.ms": 20,
        }
    )
    base_ts = int(time.time() * 1000) - 5_000
    sent = [
        (
            f"key-{i}".encode(),
            f"value-{i}-".encode() * 20,
            (("n", str(i).encode()),),
            base_ts + (i * 7) % 1000,
        )
        for i in range(500)
    ]
    for key, value, headers, ts in sent:
        producer.produce(
            topic, key=key, value=value, headers=list(headers), timestamp=ts, partition=0
        )
    assert producer.flush(TIMEOUT_S) == 0

    got = read_all(rill.bootstrap, topic, 1)[0]
    assert sorted(got) == list(range(len(sent)))
    assert [(r.key, r.value, r.headers, r.timestamp) for _, r in sorted(got.items())] == sent

    headers = batch_headers(rill.data_dir, topic)
    assert headers, "no batches on disk"
    assert sum(count for _, count, _ in headers) == len(sent)
    codecs = {attributes & 0x07 for _, _, attributes in headers}
    assert codecs == {ZSTD}, f"batch codecs on disk: {codecs}"


def api_versions_answered(sock: socket.socket) -> bool:
    """Sends ApiVersions v0; True when answered, False when the server closed instead."""
    header = struct.pack(">hhi", 18, 0, 1) + _string("e2e-limits")
    try:
        sock.sendall(struct.pack(">i", len(header)) + header)
        size = sock.recv(4)
    except OSError:
        return False
    return len(size) == 4


def network_threads(pid: int) -> int:
    """How many `rill-network-<i>` threads the process runs now."""
    count = 0
    for comm in Path(f"/proc/{pid}/task").glob("*/comm"):
        try:
            count += comm.read_text().startswith("rill-network-")
        except OSError:
            pass  # the thread ended meanwhile
    return count


def test_network_threads_follow_num_network_threads_at_runtime(rill):
    """num.network.threads is dynamic, as in Kafka: raised, the broker runs more
    network threads; lowered, it stops the extra ones, and a producer whose connection
    was on one of them goes on (its connection moves, or it reconnects) without losing
    a record. A value past double the current one is refused, as Kafka refuses it."""
    assert rill.pid is not None
    wait_for(lambda: network_threads(rill.pid) == 3, TIMEOUT_S, "three network threads at start")
    topic = unique_topic("threads")
    create_topic(rill.bootstrap, topic, 3)
    producer = Producer({"bootstrap.servers": rill.bootstrap, "enable.idempotence": True})
    sent = 0

    def produce(n: int) -> None:
        nonlocal sent
        for _ in range(n):
            producer.produce(topic, value=f"r{sent}".encode(), partition=sent % 3)
            sent += 1
        assert producer.flush(TIMEOUT_S) == 0

    produce(30)
    assert alter_cluster_default(rill.bootstrap, {"num.network.threads": "6"}) == (0, None)
    wait_for(lambda: network_threads(rill.pid) == 6, TIMEOUT_S, "six network threads")
    produce(30)
    code, message = alter_cluster_default(rill.bootstrap, {"num.network.threads": "13"})
    assert code == 42, (code, message)  # INVALID_REQUEST: more than double
    assert alter_cluster_default(rill.bootstrap, {"num.network.threads": "3"}) == (0, None)
    # A removed thread stops once its connections have left (or after ten seconds).
    wait_for(lambda: network_threads(rill.pid) == 3, TIMEOUT_S, "three network threads again")
    produce(30)
    records = read_all(rill.bootstrap, topic, 3)
    values = sorted(r.value for partition in records.values() for r in partition.values())
    assert values == sorted(f"r{i}".encode() for i in range(sent))


def test_connection_limit_per_ip_changes_at_runtime(rill):
    """max.connections.per.ip is a dynamic broker config: lowering it refuses new
    connections beyond it at once, max.connections.per.ip.overrides raises it for one
    host (named, so resolved), removing them lets every connection in again, and a bad
    value is refused with INVALID_REQUEST as Kafka refuses it."""
    code, message = alter_cluster_default(rill.bootstrap, {"max.connections.per.ip": "-1"})
    assert code == 42, (code, message)  # INVALID_REQUEST
    code, message = alter_cluster_default(rill.bootstrap, {"max.connections.per.ip.overrides": "localhost"})
    assert code == 42, (code, message)
    assert alter_cluster_default(rill.bootstrap, {"max.connections.per.ip": "3"}) == (0, None)
    host, port = rill.bootstrap.rsplit(":", 1)

    def connect_many(n: int) -> list[bool]:
        socks = [socket.create_connection((host, int(port)), timeout=TIMEOUT_S) for _ in range(n)]
        try:
            return [api_versions_answered(s) for s in socks]
        finally:
            for s in socks:
                s.close()

    # The configs connection just closed holds its slot until the server has seen it go.
    wait_for(
        lambda: connect_many(6) == [True] * 3 + [False] * 3,
        TIMEOUT_S,
        "three connections answered and three refused",
    )

    def alter_when_admitted(entries: dict[str, str | None]) -> tuple[int, str | None]:
        # The slots of closed connections come back once the server has seen them close.
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            try:
                return alter_cluster_default(rill.bootstrap, entries)
            except (AssertionError, OSError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    # `localhost` is 127.0.0.1 here, where the test connects from.
    assert alter_when_admitted({"max.connections.per.ip.overrides": "localhost:5"}) == (0, None)
    wait_for(
        lambda: connect_many(6) == [True] * 5 + [False],
        TIMEOUT_S,
        "five connections answered and one refused",
    )
    result = alter_when_admitted({"max.connections.per.ip": None, "max.connections.per.ip.overrides": None})
    assert result == (0, None)
    wait_for(lambda: connect_many(6) == [True] * 6, TIMEOUT_S, "six connections answered")


def test_legacy_alter_configs_replaces_every_override(rill):
    """AlterConfigs (the API before the incremental one) replaces a topic's whole set of
    overrides: keys it does not name go back to their defaults; an invalid value is
    refused with INVALID_CONFIG and changes nothing."""
    topic = unique_topic("legacy-alter")
    client = create_topic(
        rill.bootstrap, topic, 1, {"retention.ms": "1000000", "cleanup.policy": "compact"}
    )
    assert legacy_alter(rill.bootstrap, 2, topic, {"retention.ms": "5000"}) == (0, None)
    entries = describe(client, ResourceType.TOPIC, topic)
    assert entries["retention.ms"].value == "5000"
    assert entries["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert entries["cleanup.policy"].value == "delete", "an unnamed override must go"
    assert entries["cleanup.policy"].source == ConfigSource.DEFAULT_CONFIG.value
    code, message = legacy_alter(rill.bootstrap, 2, topic, {"retention.ms": "soon"})
    assert code == 40 and message, (code, message)  # INVALID_CONFIG, saying why
    assert describe(client, ResourceType.TOPIC, topic)["retention.ms"].value == "5000"


def test_create_time_more_than_an_hour_ahead_is_refused_by_default(rill):
    """Kafka 4.0's default `message.timestamp.after.max.ms` is one hour."""
    topic = unique_topic("future")
    create_topic(rill.bootstrap, topic, 1)
    entry = describe(admin(rill.bootstrap), ResourceType.TOPIC, topic)["message.timestamp.after.max.ms"]
    assert (entry.value, entry.source) == ("3600000", ConfigSource.DEFAULT_CONFIG.value)
    producer = Producer({"bootstrap.servers": rill.bootstrap, "acks": "all", "retries": 0})
    results = []
    now_ms = int(time.time() * 1000)
    for value, ts in ((b"far", now_ms + 2 * 3_600_000), (b"near", now_ms + 60_000)):
        producer.produce(topic, value=value, partition=0, timestamp=ts,
                         on_delivery=lambda e, m: results.append(e))
        assert producer.flush(TIMEOUT_S) == 0
    far_error, near_error = results
    assert far_error is not None and far_error.code() == KafkaError.INVALID_TIMESTAMP, far_error
    assert near_error is None, near_error


def test_replication_throttle_configs_are_set_described_and_deleted(rill):
    """What `kafka-reassign-partitions.sh --execute --throttle` sets and `--verify`
    deletes: the topic's throttled replica lists and the brokers' throttle rates."""
    client = admin(rill.bootstrap)
    topic = unique_topic("throttled")
    create_topic(rill.bootstrap, topic, 2)
    me = broker_id(client)
    alter(client, ResourceType.TOPIC, topic, {
        "leader.replication.throttled.replicas": "0:1,1:1",
        "follower.replication.throttled.replicas": "*",
    })
    alter(client, ResourceType.BROKER, me, {
        "leader.replication.throttled.rate": "1048576",
        "follower.replication.throttled.rate": "1048576",
    })
    topic_configs = describe(client, ResourceType.TOPIC, topic)
    assert topic_configs["leader.replication.throttled.replicas"].value == "0:1,1:1"
    assert topic_configs["follower.replication.throttled.replicas"].value == "*"
    broker_configs = describe(client, ResourceType.BROKER, me)
    assert broker_configs["leader.replication.throttled.rate"].value == "1048576"
    with pytest.raises(KafkaException) as refused:
        alter(client, ResourceType.TOPIC, topic, {"leader.replication.throttled.replicas": "0-1"})
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG

    alter(client, ResourceType.TOPIC, topic, {
        "leader.replication.throttled.replicas": None,
        "follower.replication.throttled.replicas": None,
    })
    alter(client, ResourceType.BROKER, me, {
        "leader.replication.throttled.rate": None,
        "follower.replication.throttled.rate": None,
    })
    topic_configs = describe(client, ResourceType.TOPIC, topic)
    assert topic_configs["leader.replication.throttled.replicas"].value == ""
    assert topic_configs["leader.replication.throttled.replicas"].source == ConfigSource.DEFAULT_CONFIG.value
    rate = describe(client, ResourceType.BROKER, me)["leader.replication.throttled.rate"]
    assert (rate.value, rate.source) == ("9223372036854775807", ConfigSource.DEFAULT_CONFIG.value)


def test_describe_log_dirs_lists_hosted_partitions_and_the_volume(rill):
    """DescribeLogDirs (`kafka-log-dirs.sh --describe`), through kafka-python's admin."""
    from kafka import KafkaAdminClient

    topic = unique_topic("logdirs")
    create_topic(rill.bootstrap, topic, 2)
    producer = Producer({"bootstrap.servers": rill.bootstrap, "acks": "all"})
    for i in range(100):
        producer.produce(topic, value=b"x" * 100, partition=i % 2)
    assert producer.flush(TIMEOUT_S) == 0
    kp = KafkaAdminClient(bootstrap_servers=rill.bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        response = kp.describe_log_dirs()
    finally:
        kp.close()
    (broker,) = response
    (result,) = broker["log_dirs"]
    assert result["error_code"] == 0
    assert Path(result["log_dir"]).resolve() == Path(rill.data_dir).resolve()
    sizes = {
        (t["name"], p["partition_index"]): p["partition_size"]
        for t in result["topics"] for p in t["partitions"]
    }
    assert sizes[(topic, 0)] > 50 * 100 and sizes[(topic, 1)] > 50 * 100, sizes
    lags = [p["offset_lag"] for t in result["topics"] for p in t["partitions"]]
    assert all(lag == 0 for lag in lags), lags


def test_describe_topic_partitions_pages_with_a_cursor(rill):
    """DescribeTopicPartitions (KIP-966) through kafka-python: a page stops at the
    partition limit and names where the next starts; following the cursors yields every
    partition once; an unknown topic is UNKNOWN_TOPIC_OR_PARTITION."""
    from kafka import KafkaAdminClient

    first, second = sorted([unique_topic("dtp-a"), unique_topic("dtp-b")])
    create_topic(rill.bootstrap, first, 5)
    create_topic(rill.bootstrap, second, 3)
    kp = KafkaAdminClient(bootstrap_servers=rill.bootstrap, request_timeout_ms=TIMEOUT_S * 1000)
    try:
        pages, cursor = [], None
        while True:
            page = kp.describe_topic_partitions([second, first], response_partition_limit=3,
                                                cursor=cursor)
            pages.append([(t["name"], [p["partition_index"] for p in t["partitions"]])
                          for t in page["topics"]])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert pages == [
            [(first, [0, 1, 2])],
            [(first, [3, 4]), (second, [0])],
            [(second, [1, 2])],
        ], pages
        page = kp.describe_topic_partitions([first, "no-such-topic-dtp"])
        errors = {t["name"]: t["error_code"] for t in page["topics"]}
        assert errors == {first: 0, "no-such-topic-dtp": 3}, page
        leaders = {p["leader_id"] for t in page["topics"] for p in t["partitions"]}
        assert leaders == {int(broker_id(admin(rill.bootstrap)))}, page
    finally:
        kp.close()


def test_kafka_dynamic_broker_keys_are_taken_checked_and_described(rill):
    """The broker keys Kafka changes at run time that size what Rill does not have
    (thread pools, Kerberos login) are taken as Kafka takes them, with its checks
    against the current value, and described as dynamic: Kafka's tools and scripts that
    set them work (`kafka-configs.sh --alter --entity-type brokers`, librdkafka's 0081
    admin test, sarama's IncrementalAlterConfigs test)."""
    client = admin(rill.bootstrap)
    me = broker_id(client)
    entry = describe(client, ResourceType.BROKER, me)["num.io.threads"]
    assert (entry.value, entry.source, entry.is_read_only) == ("8", ConfigSource.DEFAULT_CONFIG.value, False)

    alter(client, ResourceType.BROKER, me, {"num.io.threads": "16", "background.threads": "5"})
    described = describe(client, ResourceType.BROKER, me)
    for key, value in [("num.io.threads", "16"), ("background.threads", "5")]:
        assert (described[key].value, described[key].source) == (value, ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    # At most double the current value (now 16), as Kafka's DynamicThreadPool allows.
    with pytest.raises(KafkaException) as refused:
        alter(client, ResourceType.BROKER, me, {"num.io.threads": "33"})
    assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST
    assert "double the current value 16" in refused.value.args[0].str()
    with pytest.raises(KafkaException) as refused:
        alter(client, ResourceType.BROKER, me, {"log.cleaner.threads": "0"})
    assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST

    # The legacy AlterConfigs replaces every dynamic config of the broker.
    assert legacy_alter(rill.bootstrap, 4, me, {"sasl.kerberos.min.time.before.relogin": "30000"}) == (0, None)
    described = describe(client, ResourceType.BROKER, me)
    relogin = described["sasl.kerberos.min.time.before.relogin"]
    assert (relogin.value, relogin.source) == ("30000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    assert described["num.io.threads"].source == ConfigSource.DEFAULT_CONFIG.value
    alter(client, ResourceType.BROKER, me, {"sasl.kerberos.min.time.before.relogin": None})
    relogin = describe(client, ResourceType.BROKER, me)["sasl.kerberos.min.time.before.relogin"]
    assert (relogin.value, relogin.source) == ("60000", ConfigSource.DEFAULT_CONFIG.value)


def test_describe_configs_with_an_empty_key_list_describes_every_config(rill):
    """DescribeConfigs v1 with an empty (not null) key list, as sarama sends for "all":
    Kafka's ConfigHelper answers every config, as for a null list."""
    import socket
    import struct

    def describe(keys: bytes) -> int:
        name = b"1"
        body = struct.pack(">i", 1) + struct.pack(">bh", 4, len(name)) + name + keys + b"\x00"
        header = struct.pack(">hhih", 32, 1, 5, 4) + b"test"
        host, port = rill.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
            size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
            resp = sock.recv(size, socket.MSG_WAITALL)
        pos = 4 + 4 + 4  # correlation id, throttle, results count
        (code,) = struct.unpack_from(">h", resp, pos)
        assert code == 0, code
        pos += 2
        (n,) = struct.unpack_from(">h", resp, pos)  # error message
        pos += 2 + max(n, 0) + 1  # resource type
        (n,) = struct.unpack_from(">h", resp, pos)  # resource name
        pos += 2 + n
        return struct.unpack_from(">i", resp, pos)[0]

    every = describe(struct.pack(">i", -1))
    assert every > 50, every
    assert describe(struct.pack(">i", 0)) == every
    assert describe(struct.pack(">i", 1) + struct.pack(">h", 8) + b"log.dirs") == 1


def test_an_update_of_an_unknown_feature_fails_the_whole_request_as_kafka_does(rill):
    """UpdateFeatures with one refused update: Kafka's controller answers the top-level
    INVALID_UPDATE_VERSION ("The update failed for all features since …") and no
    per-feature results, whatever the version; sarama and kafka-python read that error."""
    from kafka import KafkaAdminClient

    client = KafkaAdminClient(bootstrap_servers=rill.bootstrap)
    try:
        try:
            client.update_features(
                {"rill.test.unknown.feature": 1, "transaction.version": ("SAFE_DOWNGRADE", 0)}
            )
        except Exception as error:  # noqa: BLE001 - the error class is the assertion
            assert type(error).__name__ == "InvalidUpdateVersionError", repr(error)
            assert "The update failed for all features since the following feature had an error" in str(error)
        else:
            raise AssertionError("an unknown feature was accepted")
        # Nothing was applied: transaction.version is still finalized at a new cluster's 2,
        # though its downgrade alone is accepted.
        assert client.describe_features()["transaction.version"]["finalized"] == (2, 2)
        downgrade = {"transaction.version": ("SAFE_DOWNGRADE", 0)}
        assert client.update_features(downgrade, validate_only=True) == {"transaction.version": "OK"}
        assert client.describe_features()["transaction.version"]["finalized"] == (2, 2)
    finally:
        client.close()


def test_idle_producers_are_forgotten_after_producer_id_expiration_ms(rill_factory):
    """producer.id.expiration.ms (KIP-854; dynamic, as in Kafka): every
    producer.id.expiration.check.interval.ms the broker forgets the producers whose last
    write is older than that, except one with an open transaction, which is kept until the
    transaction ends: the producer state of clients that are gone does not grow without
    end. DescribeProducers shows what the partition remembers."""
    from test_txn_markers import Wire, describe_producers

    rill = rill_factory(overrides={"producer.id.expiration.check.interval.ms": "200"})
    client = admin(rill.bootstrap)
    me = broker_id(client)
    topic = unique_topic("expiry")
    create_topic(rill.bootstrap, topic, 1)
    idempotent = Producer({"bootstrap.servers": rill.bootstrap, "enable.idempotence": True})
    idempotent.produce(topic, b"idempotent", partition=0)
    assert idempotent.flush(TIMEOUT_S) == 0
    transactional = Producer({"bootstrap.servers": rill.bootstrap, "transactional.id": f"tx-{topic}"})
    transactional.init_transactions(TIMEOUT_S)
    transactional.begin_transaction()
    transactional.produce(topic, b"open", partition=0)
    assert transactional.flush(TIMEOUT_S) == 0
    wire = Wire(rill.bootstrap)
    both = describe_producers(wire, topic)
    assert len(both) == 2
    time.sleep(1.5)
    assert describe_producers(wire, topic).keys() == both.keys(), "a day by default"

    alter(client, ResourceType.BROKER, me, {"producer.id.expiration.ms": "1000"})
    entry = describe(client, ResourceType.BROKER, me)["producer.id.expiration.ms"]
    assert (entry.value, entry.source) == ("1000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
    [txn_producer] = [p for p, f in both.items() if f["txn_start"] >= 0]
    wait_for(lambda: describe_producers(wire, topic).keys() == {txn_producer}, 30,
             "the idle idempotent producer to be forgotten, the open transaction's kept")
    time.sleep(1.5)
    assert describe_producers(wire, topic).keys() == {txn_producer}, "its transaction is open"
    transactional.abort_transaction(TIMEOUT_S)
    wait_for(lambda: describe_producers(wire, topic) == {}, 30,
             "the transactional producer to be forgotten once its transaction ended")
    with pytest.raises(KafkaException) as refused:
        alter(client, ResourceType.BROKER, me, {"producer.id.expiration.ms": "0"})
    # Kafka's broker turns the ConfigException of a broker config into INVALID_REQUEST.
    assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST


GROUP_CONFIG_NAMES = {
    "consumer.session.timeout.ms", "consumer.heartbeat.interval.ms",
    "share.session.timeout.ms", "share.heartbeat.interval.ms", "share.record.lock.duration.ms",
    "share.auto.offset.reset", "share.isolation.level",
    "streams.session.timeout.ms", "streams.heartbeat.interval.ms", "streams.num.standby.replicas",
}


def test_group_configs_are_set_checked_described_and_kept(rill):
    """GROUP config resources (type 32, `kafka-configs --entity-type groups`): Kafka 4.1's
    ten group configs, defaulted from the broker's `group.*` keys; an override is checked
    against the broker's bounds, described with source GROUP_CONFIG, deleted back to the
    default, and kept across a restart. The group need not exist."""
    client = admin(rill.bootstrap)
    group = unique_topic("configured-group")
    configs = describe(client, ResourceType.GROUP, group)
    assert set(configs) == GROUP_CONFIG_NAMES
    session = configs["consumer.session.timeout.ms"]
    assert (session.value, session.source) == ("45000", ConfigSource.DEFAULT_CONFIG.value)
    assert configs["share.auto.offset.reset"].value == "latest"

    alter(client, ResourceType.GROUP, group, {
        "consumer.session.timeout.ms": "50000",
        "share.auto.offset.reset": "earliest",
    })
    configs = describe(client, ResourceType.GROUP, group)
    assert configs["consumer.session.timeout.ms"].value == "50000"
    assert configs["consumer.session.timeout.ms"].source == ConfigSource.GROUP_CONFIG.value
    assert configs["share.auto.offset.reset"].value == "earliest"
    # Another group keeps the defaults.
    other = describe(client, ResourceType.GROUP, group + "-other")
    assert other["consumer.session.timeout.ms"].value == "45000"

    refused = [
        {"consumer.session.timeout.ms": "30000"},  # under group.consumer.min.session.timeout.ms
        {"consumer.heartbeat.interval.ms": "20000"},  # over its max
        {"share.record.lock.duration.ms": "not-a-number"},
        {"share.isolation.level": "read_sometimes"},
        {"no.such.group.config": "1"},
    ]
    for entries in refused:
        with pytest.raises(KafkaException) as error:
            alter(client, ResourceType.GROUP, group, entries)
        assert error.value.args[0].code() == KafkaError.INVALID_CONFIG, entries
    assert describe(client, ResourceType.GROUP, group)["consumer.session.timeout.ms"].value == "50000"

    rill.restart()
    client = admin(rill.bootstrap)
    assert describe(client, ResourceType.GROUP, group)["consumer.session.timeout.ms"].value == "50000"
    alter(client, ResourceType.GROUP, group, {"consumer.session.timeout.ms": None})
    session = describe(client, ResourceType.GROUP, group)["consumer.session.timeout.ms"]
    assert (session.value, session.source) == ("45000", ConfigSource.DEFAULT_CONFIG.value)


def test_secrets_in_broker_configs_are_described_without_their_values(rill_factory):
    """DescribeConfigs of a broker shows a secret (a JAAS config with users' passwords, a
    key password, any key naming a password or a secret, at any listener prefix) as
    Kafka shows a PASSWORD config: `is_sensitive`, no value, in every synonym too."""
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    jaas = 'org.apache.kafka.common.security.plain.PlainLoginModule required user_alice="topsecret";'
    rill = rill_factory(overrides={
        "plain.sasl.jaas.config": jaas,
        "listener.name.plaintext.plain.sasl.jaas.config": jaas,
        "ssl.key.password": "keypw",
        "http.ssl.key.password": "httppw",
    })
    client = AdminClient({"bootstrap.servers": rill.bootstrap})
    (node,) = client.list_topics(timeout=30).brokers
    resource = ConfigResource(ResourceType.BROKER, str(node))
    described = client.describe_configs([resource])[resource].result()
    for key in ("plain.sasl.jaas.config", "listener.name.plaintext.plain.sasl.jaas.config",
                "ssl.key.password", "http.ssl.key.password"):
        entry = described[key]
        assert entry.is_sensitive and entry.value is None, (key, entry.value)
        assert all(s.value is None for s in entry.synonyms.values()), key
    assert "topsecret" not in repr({k: (e.value, [s.value for s in e.synonyms.values()])
                                    for k, e in described.items()})
    # What is not secret is shown as before.
    assert described["num.partitions"].value is not None
    assert not described["num.partitions"].is_sensitive
