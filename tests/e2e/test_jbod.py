"""Several log directories per broker (JBOD, `log.dirs` with several paths; KIP-858), and
moving a replica between them (AlterReplicaLogDirs).

A broker with three log directories spreads new partitions over them (the one with the
fewest partitions first, Kafka's policy), writes a `meta.properties` in each with the same
cluster id and node id and a directory id of its own, reports every directory through
DescribeLogDirs, and after kill -9 finds every log where it left it with every acknowledged
record. On a three-node cluster, one directory of one broker filling up (a small tmpfs
mounted as that directory, then filled) takes only the partitions in it offline on that
broker: the broker reports the directory to the controller, which moves their leaderships
away and takes the broker out of their ISRs, while the broker keeps leading and following
the partitions of its other directories, and nothing acknowledged is lost. A partition
moved to another directory while a producer and a consumer run (throttled by
`replica.alter.log.dirs.io.max.bytes.per.second`, so that DescribeLogDirs shows the future
replica catching up) loses no record, its consumer sees every offset once, and a kill -9
in the middle of the move leaves it whole in its old directory.
"""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from kafka_helpers import (
    ADMIN_TIMEOUT_S,
    admin,
    create_topic,
    read_all,
    unique_topic,
    wait_for,
    wait_for_leaders,
)
from test_cluster import all_in_sync, partition_metadata

KAFKA_STORAGE_ERROR = 56
SETTLE_TIMEOUT_S = 30.0


def describe_log_dirs(bootstrap: str, broker_id: int | None = None) -> dict[str, dict]:
    """DescribeLogDirs through kafka-python's admin (`kafka-log-dirs.sh --describe`):
    {log dir path: {"error_code", "total_bytes", "usable_bytes", "partitions":
    {(topic, partition): size}}} of one broker (the only one, or `broker_id`)."""
    from kafka import KafkaAdminClient

    client = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        brokers = [broker_id] if broker_id is not None else None
        response = client.describe_log_dirs(brokers=brokers)
    finally:
        client.close()
    (broker,) = response
    dirs = {}
    for result in broker["log_dirs"]:
        dirs[str(Path(result["log_dir"]).resolve())] = {
            "error_code": result["error_code"],
            "total_bytes": result["total_bytes"],
            "usable_bytes": result["usable_bytes"],
            "partitions": {
                (t["name"], p["partition_index"]): p["partition_size"]
                for t in result["topics"]
                for p in t["partitions"]
                if not p["is_future_key"]
            },
            # (topic, partition) -> offset lag of a replica being moved here.
            "future": {
                (t["name"], p["partition_index"]): p["offset_lag"]
                for t in result["topics"]
                for p in t["partitions"]
                if p["is_future_key"]
            },
        }
    return dirs


def meta_properties(directory: Path) -> dict[str, str]:
    lines = (directory / "meta.properties").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def produce_acked(bootstrap: str, topic: str, partitions: int, count: int) -> list[tuple]:
    """Produces `count` records idempotently with acks=all; (partition, offset, value) of
    each acknowledged one."""
    acked = []

    def on_delivery(error, message):
        assert error is None, f"delivery failed: {error}"
        acked.append((message.partition(), message.offset(), message.value()))

    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
         "linger.ms": 5}
    )
    for i in range(count):
        producer.produce(topic, value=f"v{i:06d}".encode() + b"x" * 200,
                         partition=i % partitions, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(60) == 0
    return acked


def test_three_log_dirs_spread_new_partitions_and_survive_kill9(rill_factory, tmp_path):
    workdir = tmp_path / "rill0"
    dirs = [workdir / "data", workdir / "data-b", workdir / "data-c"]
    rill = rill_factory({"log.dirs": ",".join(map(str, dirs))})
    assert rill.data_dir == dirs[0]

    # Every directory is the node's: one cluster, one node, a directory id each.
    props = [meta_properties(d) for d in dirs]
    assert len({p["cluster.id"] for p in props}) == 1, props
    assert {p["node.id"] for p in props} == {"1"}, props
    ids = [p["directory.id"] for p in props]
    assert len(set(ids)) == 3 and all(len(i) == 22 for i in ids), ids
    assert (dirs[0] / "__cluster_metadata-0").is_dir(), "the metadata log is in the first"
    assert not (dirs[1] / "__cluster_metadata-0").exists()

    # Six partitions, then three more: each lands where the fewest are.
    first, second = unique_topic("jbod-a"), unique_topic("jbod-b")
    client = create_topic(rill.bootstrap, first, 6)
    create_topic(rill.bootstrap, second, 3)
    acked = produce_acked(rill.bootstrap, first, 6, 600) + [
        (p + 100, o, v) for p, o, v in produce_acked(rill.bootstrap, second, 3, 300)
    ]

    described = describe_log_dirs(rill.bootstrap)
    assert set(described) == {str(d.resolve()) for d in dirs}, described.keys()
    placement = {}
    for path, d in described.items():
        assert d["error_code"] == 0, d
        assert d["total_bytes"] > 0 and 0 <= d["usable_bytes"] <= d["total_bytes"], d
        for (topic, partition), size in d["partitions"].items():
            if topic in (first, second):
                assert size > 0, (topic, partition)
                placement[(topic, partition)] = path
                # The log is in that directory on disk, and nowhere else.
                assert (Path(path) / f"{topic}-{partition}").is_dir()
                others = [o for o in dirs if str(o.resolve()) != path]
                assert not any((o / f"{topic}-{partition}").exists() for o in others)
    assert len(placement) == 9, placement
    counts = sorted(list(placement.values()).count(str(d.resolve())) for d in dirs)
    assert counts == [3, 3, 3], placement

    # A second server may not take any of the directories.
    other = subprocess.run(
        [str(rill.binary), "server", "--listen", "127.0.0.1:0", "--override",
         f"log.dirs={tmp_path / 'elsewhere'},{dirs[2]}", "--override", "http.listeners="],
        capture_output=True, text=True, timeout=30,
    )
    assert other.returncode != 0 and "is locked by another process" in other.stderr, other.stderr

    rill.kill9()
    rill.restart()
    wait_for_leaders(client, first, 6)
    wait_for_leaders(client, second, 3)
    after = describe_log_dirs(rill.bootstrap)
    moved = {
        tp: path for path, d in after.items() for tp in d["partitions"]
        if tp in placement and placement[tp] != path
    }
    assert not moved, f"logs found elsewhere after the restart: {moved}"
    stored = {100 + p: r for p, r in read_all(rill.bootstrap, second, 3).items()}
    stored.update(read_all(rill.bootstrap, first, 6))
    for p, records in stored.items():
        assert sorted(records) == list(range(len(records))), f"partition {p} has gaps"
    for p, offset, value in acked:
        assert stored[p][offset].value == value, f"acknowledged {p}/{offset} lost or changed"
    # And it still takes writes in every directory.
    produce_acked(rill.bootstrap, first, 6, 60)


def mount_tmpfs(path: Path, size: str) -> None:
    """A small tmpfs at `path` (root, or a user namespace with mounts, is needed)."""
    path.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here to fail one log directory: {result.stderr.strip()}")


def fill(path: Path) -> None:
    """Writes to `path` until its file system is full."""
    with open(path / "filler", "wb") as f:
        chunk = b"\0" * (1 << 16)
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError:
            pass


def test_a_full_log_dir_takes_only_its_partitions_offline(rill_cluster_factory, tmp_path):
    # Node 2's third log directory is a 16 MB tmpfs (paths are relative to each node's
    # directory, so every node gets three of its own).
    failing = tmp_path / "cluster0" / "node2" / "data-c"
    mount_tmpfs(failing, "16m")
    try:
        run_full_log_dir(rill_cluster_factory, failing)
    finally:
        # Lazily: the node may still have it open until the fixture stops it.
        subprocess.run(["umount", "-l", str(failing)], capture_output=True)


def run_full_log_dir(rill_cluster_factory, failing: Path) -> None:
    cluster = rill_cluster_factory(
        overrides={"log.dirs": "data,data-b,data-c", "auto.leader.rebalance.enable": "false",
                   "http.listeners": "127.0.0.1:0"}
    )
    node2 = cluster.node(2)
    bootstrap = cluster.bootstrap
    client = admin(bootstrap)
    topic = unique_topic("jbod-fail")
    # Node 2 first in every replica list: it leads all six partitions.
    assignment = [[2, 1, 3], [2, 3, 1]] * 3
    futures = client.create_topics(
        [NewTopic(topic, num_partitions=6, replica_assignment=assignment,
                  config={"min.insync.replicas": "2"})],
        operation_timeout=ADMIN_TIMEOUT_S, request_timeout=ADMIN_TIMEOUT_S,
    )
    futures[topic].result(timeout=ADMIN_TIMEOUT_S)
    wait_for(lambda: all_in_sync(client, topic, 6, 3), SETTLE_TIMEOUT_S, "all replicas in sync")
    acked = produce_acked(bootstrap, topic, 6, 300)

    failing_path = str(failing.resolve())
    described = describe_log_dirs(bootstrap, broker_id=2)
    assert len(described) == 3 and failing_path in described, described.keys()
    on_failing = {p for (t, p) in described[failing_path]["partitions"] if t == topic}
    assert len(on_failing) == 2, described
    elsewhere = set(range(6)) - on_failing
    assert all(partition_metadata(client, topic)[p].leader == 2 for p in range(6))

    # The directory fills up while records keep coming: node 2's next write there fails.
    fill(failing)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
         "linger.ms": 5, "message.timeout.ms": 60000, "topic.metadata.refresh.interval.ms": 1000}
    )
    errors = []

    def on_delivery(error, message):
        if error is not None:
            errors.append(str(error))
        else:
            acked.append((message.partition(), message.offset(), message.value()))

    def failed_over() -> bool:
        parts = partition_metadata(client, topic)
        return all(parts[p].leader not in (2, -1) and 2 not in parts[p].isrs for p in on_failing)

    deadline = time.monotonic() + 60
    i = 0
    while time.monotonic() < deadline:
        for _ in range(50):
            producer.produce(topic, value=f"w{i:06d}".encode() + b"y" * 2000,
                             partition=i % 6, on_delivery=on_delivery)
            i += 1
        producer.poll(0.05)
        if i % 1000 == 0 and failed_over():
            break
    assert failed_over(), f"leaders did not move off node 2: {partition_metadata(client, topic)}"
    for _ in range(200):
        producer.produce(topic, value=f"w{i:06d}".encode(), partition=i % 6,
                         on_delivery=on_delivery)
        i += 1
    assert producer.flush(60) == 0
    assert not errors, errors[:5]

    # Node 2 is up, still leads the partitions of its other directories with every
    # replica in sync, and reports the full one failed.
    assert node2.is_running(), node2.log_excerpt()
    assert "log directory failed" in node2.log_text()
    parts = partition_metadata(client, topic)
    for p in elsewhere:
        assert parts[p].leader == 2 and len(parts[p].isrs) == 3, (p, parts[p])
    # Metadata names node 2 an offline replica of the partitions in the failed
    # directory (Kafka's `offline_replicas`), of those alone.
    from kafka import KafkaAdminClient

    kp = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        (described_topic,) = kp.describe_topics([topic])
    finally:
        kp.close()
    offline = {p["partition_index"]: p["offline_replicas"]
               for p in described_topic["partitions"]}
    assert offline == {p: [2] if p in on_failing else [] for p in range(6)}, offline
    described = describe_log_dirs(bootstrap, broker_id=2)
    assert described[failing_path]["error_code"] == KAFKA_STORAGE_ERROR, described
    assert described[failing_path]["partitions"] == {}
    for path, d in described.items():
        if path != failing_path:
            assert d["error_code"] == 0, (path, d)

    # And says so on /metrics (Kafka's LogManager gauges).
    import urllib.request

    page = urllib.request.urlopen(f"http://{node2.http_address()}/metrics", timeout=10).read()
    page = page.decode()
    assert "kafka_log_logmanager_offline_log_directory_count 1" in page
    assert f'kafka_log_logmanager_log_directory_offline{{log_directory="data-c"}} 1' in page

    # Nothing acknowledged is lost, before or after the failure.
    stored = read_all(bootstrap, topic, 6)
    for p, offset, value in acked:
        if offset is None:
            # librdkafka acknowledges a request that failed with an uncertain outcome
            # (a storage error, a lost connection) once a later request of the same
            # idempotent producer succeeds, without an offset: the broker must have
            # stored it. Its value is unique, so it is looked for by value.
            assert any(r.value == value for r in stored[p].values()), (p, value[:8])
            continue
        assert offset in stored[p] and stored[p][offset].value == value, (p, offset)
    for p, records in stored.items():
        assert sorted(records) == list(range(len(records))), f"partition {p} has gaps"


class Load:
    """An idempotent acks=all producer writing 0, 1, 2, ... to one partition and a
    consumer reading it from the beginning, both until stopped."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.acked: dict[int, bytes] = {}  # offset -> value
        self.seen: list[tuple[int, bytes]] = []
        self.errors: list[str] = []
        self._halt = threading.Event()
        # Set once the producer has flushed: what it acknowledges while flushing comes
        # after the halt, and the consumer must read that too.
        self._flushed = threading.Event()
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
            "linger.ms": 5, "message.timeout.ms": 120000,
        })
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        })
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]

    def start(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def _on_delivery(self, error, message):
        if error is not None:
            self.errors.append(str(error))
        else:
            self.acked[message.offset()] = message.value()

    def _produce(self):
        try:
            i = 0
            while not self._halt.is_set():
                try:
                    self.producer.produce(self.topic, value=f"{i:08d}".encode() + b"z" * 500,
                                          partition=0, on_delivery=self._on_delivery)
                    i += 1
                except BufferError:
                    pass
                self.producer.poll(0.001 if i % 20 else 0.01)
            if self.producer.flush(120):
                self.errors.append("undelivered after flush")
        finally:
            self._flushed.set()

    def _consume(self):
        self.consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        while not self._flushed.is_set() or self._behind():
            message = self.consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            self.seen.append((message.offset(), message.value()))

    def _behind(self) -> bool:
        last = max(self.acked, default=-1)
        return bool(self.seen) and self.seen[-1][0] < last or not self.seen and last >= 0

    def stop(self):
        self._halt.set()
        for t in self.threads:
            t.join(timeout=180)
        self.consumer.close()


def set_broker_config(bootstrap: str, key: str, value: str) -> None:
    resource = ConfigResource(
        ResourceType.BROKER, "1",
        incremental_configs=[ConfigEntry(key, value,
                                         incremental_operation=AlterConfigOpType.SET)],
    )
    client = admin(bootstrap)
    client.incremental_alter_configs([resource])[resource].result(ADMIN_TIMEOUT_S)


def alter_log_dir(bootstrap: str, topic: str, partition: int, broker: int, path: Path):
    from kafka import KafkaAdminClient
    from kafka.errors import NoError

    client = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        result = client.alter_replica_log_dirs({(topic, partition, broker): str(path)})
    finally:
        client.close()
    (error,) = result.values()
    assert error is NoError, result


def test_alter_replica_log_dirs_moves_a_partition_under_load(rill_factory, tmp_path):
    workdir = tmp_path / "rill0"
    dirs = [workdir / "data", workdir / "data-b"]
    # Throttled, so that the move takes a while and shows in DescribeLogDirs.
    rill = rill_factory({"log.dirs": ",".join(map(str, dirs)),
                         "replica.alter.log.dirs.io.max.bytes.per.second": "300000"})
    topic = unique_topic("move")
    create_topic(rill.bootstrap, topic, 1)
    resolved = [str(d.resolve()) for d in dirs]

    def where() -> tuple[str | None, dict]:
        described = describe_log_dirs(rill.bootstrap)
        current = [p for p, d in described.items() if (topic, 0) in d["partitions"]]
        futures = {p: d["future"][(topic, 0)] for p, d in described.items()
                   if (topic, 0) in d["future"]}
        return (current[0] if len(current) == 1 else None), futures

    source, _ = where()
    dest = next(Path(d) for d in resolved if d != source)
    load = Load(rill.bootstrap, topic).start()
    wait_for(lambda: len(load.acked) > 8000, 60, "4 MB acknowledged before the move")

    # A move cut by kill -9 leaves the partition whole where it was.
    alter_log_dir(rill.bootstrap, topic, 0, 1, dest)
    current, futures = wait_for(lambda: (w := where())[1] and w, 30, "a future replica")
    assert current == source and futures[str(dest)] > 0, (current, futures)
    rill.kill9()
    rill.restart()
    current, futures = where()
    assert (current, futures) == (source, {}), (current, futures)
    leftovers = [p.name for p in dest.iterdir() if p.name.startswith(topic)]
    assert leftovers == [], leftovers

    # Moved again, while the producer and the consumer carry on; then unthrottled.
    alter_log_dir(rill.bootstrap, topic, 0, 1, dest)
    lags = []
    wait_for(lambda: (w := where())[1] and lags.append(w[1][str(dest)]) is None,
             30, "the future replica again")
    time.sleep(1)
    set_broker_config(rill.bootstrap, "replica.alter.log.dirs.io.max.bytes.per.second",
                      "9223372036854775807")
    wait_for(lambda: where() == (str(dest), {}), 60, "the partition in its new directory")
    assert not (Path(source) / f"{topic}-0").exists()
    acked_at_move = max(load.acked)
    wait_for(lambda: max(load.acked) > acked_at_move + 1000, 60, "writes after the move")
    load.stop()
    assert not load.errors, load.errors[:5]

    # The consumer saw every offset once, each with what was acknowledged there.
    offsets = [o for o, _ in load.seen]
    assert offsets == list(range(len(offsets))), "offsets skipped or seen twice"
    seen = dict(load.seen)
    for offset, value in load.acked.items():
        assert seen.get(offset) == value, f"acknowledged offset {offset} lost or changed"
    stored = read_all(rill.bootstrap, topic, 1)[0]
    for offset, value in load.acked.items():
        assert stored[offset].value == value
