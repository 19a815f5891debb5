"""Roles per node (issue #5): controller-only and broker-only `rill server` processes.

A controller-only node (`process.roles=controller`) is a voter of the metadata quorum
with no client listener; a broker-only node (`process.roles=broker`) is not a voter: it
joins the quorum as an observer (an openraft learner) that the active controller
replicates the metadata log to, and sends its own requests to the controller over the
quorum port. What these tests hold such a cluster to, driven by confluent-kafka:
- Metadata lists the brokers and only them; clients are told a broker as controller;
- topics with replication factor 2 take acks=all writes that read back whole;
- the active controller can be killed with SIGKILL: another voter takes over, new topics
  can be created and written, and the brokers serve throughout;
- a broker-only node killed and restarted catches up and returns to the ISR;
- a combined node with a broker-only node beside it makes a working cluster;
- a stopped broker-only node can be unregistered (`rill cluster unregister`, Kafka's
  UnregisterBroker): the controller forgets it and drops its observer, and when it comes
  back it joins and registers again and returns to the ISR; one unregistered while it
  runs registers again at once;
- a broker-only node without a node id is given one (1001) and keeps it across restarts;
- a node whose roles contradict the voter list refuses to start, saying why.
"""

from __future__ import annotations

import re
import subprocess
import time

from confluent_kafka import Producer

from kafka_helpers import admin, read_all, unique_topic, wait_for
from rill_harness import rill_binary
from test_cluster import (
    SETTLE_TIMEOUT_S,
    AckedProducer,
    check_log_matches_acks,
    create_replicated_topic,
    partition_metadata,
)

CONTROLLERS = (1, 2, 3)
BROKERS = (4, 5)
# Two brokers: replicated topics (the offsets topic among them) can have two replicas.
TWO_BROKERS = {"default.replication.factor": "2", "offsets.topic.replication.factor": "2"}

ANSI = re.compile(r"\x1b\[[0-9;]*m")
BECAME_ACTIVE = re.compile(r"became the active controller.*?node=(\d+) term=(\d+)")


def split_cluster(rill_cluster_factory):
    """Three controller-only voters (1-3) and two broker-only observers (4, 5)."""
    roles = {**{i: "controller" for i in CONTROLLERS}, **{i: "broker" for i in BROKERS}}
    return rill_cluster_factory(size=5, overrides=TWO_BROKERS, roles=roles)


def active_controller(cluster) -> tuple[int, int]:
    """(node, term) of the newest takeover any running controller logged."""
    best = (-1, -1)
    for node_id in CONTROLLERS:
        node = cluster.node(node_id)
        if not node.is_running():
            continue
        for match in BECAME_ACTIVE.finditer(ANSI.sub("", node.log_text())):
            node_seen, term = int(match.group(1)), int(match.group(2))
            if term > best[1]:
                best = (node_seen, term)
    return best


def produce(bootstrap: str, topic: str, values: list[str]) -> dict[str, tuple[int, int]]:
    """Writes `values` with acks=all; returns value -> (partition, offset)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 60000,
        }
    )
    acked: dict[str, tuple[int, int]] = {}
    errors: list[str] = []

    def on_delivery(error, message):
        if error is not None:
            errors.append(str(error))
        else:
            acked[message.value().decode()] = (message.partition(), message.offset())

    for value in values:
        producer.produce(topic, key=value.encode(), value=value.encode(), on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(90) == 0, "producer did not deliver everything within 90 s"
    assert not errors, f"deliveries failed: {errors[:5]}"
    assert sorted(acked) == sorted(values)
    return acked


def check_readable(bootstrap: str, topic: str, partitions: int, acked: dict[str, tuple[int, int]]):
    """Every acknowledged value is where its acknowledgement said, once."""
    log = read_all(bootstrap, topic, partitions)
    stored = {(p, o): r.value.decode() for p, records in log.items() for o, r in records.items()}
    for value, at in acked.items():
        assert stored.get(at) == value, f"{value} acked at {at}, found {stored.get(at)!r}"
    assert len(stored) == len(set(stored.values())), "a value stored twice"


def test_controller_only_and_broker_only_nodes(rill_cluster_factory):
    cluster = split_cluster(rill_cluster_factory)
    client = admin(cluster.bootstrap)

    # Metadata lists exactly the two brokers; the controllers are not brokers, so a
    # broker is named controller (clients cannot talk to a controller-only node).
    cluster_md = client.list_topics(timeout=10)
    assert sorted(cluster_md.brokers) == list(BROKERS)
    assert cluster_md.controller_id in BROKERS

    topic = unique_topic("roles")
    create_replicated_topic(cluster.bootstrap, topic, 2, 2)
    parts = partition_metadata(client, topic)
    assert all(sorted(p.replicas) == list(BROKERS) for p in parts.values())
    acked = produce(cluster.bootstrap, topic, [f"a{i}" for i in range(300)])
    check_readable(cluster.bootstrap, topic, 2, acked)

    # The active controller dies while an idempotent acks=all producer runs: another
    # voter takes over in a later term, and the brokers serve throughout.
    steady = unique_topic("steady")
    create_replicated_topic(cluster.bootstrap, steady, 1, 2)
    producer = AckedProducer(cluster.bootstrap, steady, 0, rate_per_s=200)
    producer.start()
    wait_for(lambda: producer.acked_count() >= 50, SETTLE_TIMEOUT_S, "acks before the kill")
    old, old_term = active_controller(cluster)
    assert old in CONTROLLERS, "no controller logged its takeover"
    cluster.node(old).kill9()
    wait_for(
        lambda: active_controller(cluster)[1] > old_term,
        SETTLE_TIMEOUT_S,
        f"a new active controller after node {old}",
    )
    new, _ = active_controller(cluster)
    assert new in CONTROLLERS and new != old
    acks_at_takeover = producer.acked_count()
    wait_for(
        lambda: producer.acked_count() >= acks_at_takeover + 100,
        SETTLE_TIMEOUT_S,
        "acks after the takeover",
    )
    producer.stop()
    assert not producer.errors, f"producer errors across the failover: {producer.errors[:5]}"
    check_log_matches_acks(cluster.bootstrap, steady, 1, producer.acked, 0)
    # The new controller decides: topics can be created and written.
    acked.update(produce(cluster.bootstrap, topic, [f"b{i}" for i in range(200)]))
    after = unique_topic("after-controller-loss")
    create_replicated_topic(cluster.bootstrap, after, 1, 2)
    acked_after = produce(cluster.bootstrap, after, [f"c{i}" for i in range(100)])
    check_readable(cluster.bootstrap, after, 1, acked_after)
    assert sorted(client.list_topics(timeout=10).brokers) == list(BROKERS)

    # A broker-only node crashes; writes go on without it; it restarts, catches up and
    # returns to every ISR.
    cluster.node(5).kill9()
    wait_for(
        lambda: all(p.isrs == [4] for p in partition_metadata(client, topic).values()),
        SETTLE_TIMEOUT_S,
        "node 5 out of the ISRs",
    )
    acked.update(produce(cluster.node(4).bootstrap, topic, [f"d{i}" for i in range(200)]))
    cluster.start_node(5)
    wait_for(
        lambda: all(
            sorted(p.isrs) == list(BROKERS) for p in partition_metadata(client, topic).values()
        ),
        SETTLE_TIMEOUT_S,
        "node 5 back in the ISRs",
    )
    assert sorted(client.list_topics(timeout=10).brokers) == list(BROKERS)
    # Its copy is whole: make it lead everything by stopping node 4, then read it all.
    check_readable(cluster.bootstrap, topic, 2, acked)
    cluster.node(4).kill9()
    wait_for(
        lambda: all(p.leader == 5 for p in partition_metadata(client, topic).values()),
        SETTLE_TIMEOUT_S,
        "node 5 leading every partition",
    )
    check_readable(cluster.node(5).bootstrap, topic, 2, acked)


def test_combined_node_with_a_broker_only_node(rill_cluster_factory):
    cluster = rill_cluster_factory(size=2, overrides=TWO_BROKERS, roles={2: "broker"})
    client = admin(cluster.bootstrap)
    assert sorted(client.list_topics(timeout=10).brokers) == [1, 2]
    topic = unique_topic("combined")
    create_replicated_topic(cluster.bootstrap, topic, 2, 2)
    acked = produce(cluster.bootstrap, topic, [f"v{i}" for i in range(200)])
    check_readable(cluster.bootstrap, topic, 2, acked)
    # Node 2 is no voter: it joined as an observer, and the combined node 1 is the
    # controller (a broker too, so clients are told it).
    assert "joined the metadata quorum as an observer" in ANSI.sub("", cluster.node(2).log_text())
    assert client.list_topics(timeout=10).controller_id == 1


def rill_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(rill_binary()), *args], capture_output=True, text=True, timeout=60
    )


def test_a_stopped_broker_only_node_is_unregistered_and_may_return(rill_cluster_factory):
    cluster = rill_cluster_factory(size=2, overrides=TWO_BROKERS, roles={2: "broker"})
    bootstrap = cluster.node(1).bootstrap
    client = admin(bootstrap)
    topic = unique_topic("unregister")
    create_replicated_topic(cluster.bootstrap, topic, 2, 2)
    acked = produce(cluster.bootstrap, topic, [f"a{i}" for i in range(100)])

    unknown = rill_cli("cluster", "unregister", "--broker-id", "7", "-b", bootstrap)
    assert unknown.returncode != 0 and "BROKER_ID_NOT_REGISTERED" in unknown.stderr, unknown

    cluster.node(2).stop()
    done = rill_cli("cluster", "unregister", "--broker-id", "2", "-b", bootstrap)
    assert done.returncode == 0, done
    assert "Unregistered broker 2." in done.stdout
    wait_for(
        lambda: "removed the unregistered broker's observer" in ANSI.sub("", cluster.node(1).log_text()),
        SETTLE_TIMEOUT_S,
        "the controller to drop node 2's observer",
    )
    for p in partition_metadata(client, topic).values():
        assert p.leader == 1 and p.isrs == [1], p
        assert sorted(p.replicas) == [1, 2], "replica lists stay until reassigned"
    again = rill_cli("cluster", "unregister", "--broker-id", "2", "-b", bootstrap)
    assert again.returncode != 0 and "BROKER_ID_NOT_REGISTERED" in again.stderr, again
    # The cluster writes on without it (min.insync.replicas is 1 here).
    acked.update(produce(bootstrap, topic, [f"b{i}" for i in range(100)]))

    # Back: it joins the quorum again, registers, catches up and rejoins the ISR.
    cluster.start_node(2)
    wait_for(
        lambda: sorted(client.list_topics(timeout=10).brokers) == [1, 2],
        SETTLE_TIMEOUT_S,
        "node 2 registered again",
    )
    wait_for(
        lambda: all(sorted(p.isrs) == [1, 2] for p in partition_metadata(client, topic).values()),
        SETTLE_TIMEOUT_S,
        "node 2 back in every ISR",
    )
    check_readable(cluster.node(2).bootstrap, topic, 2, acked)

    # Unregistered while running, a broker registers again at its next heartbeat (as in
    # Kafka) and keeps its place in the quorum.
    live = rill_cli("cluster", "unregister", "--broker-id", "2", "-b", bootstrap)
    assert live.returncode == 0, live
    wait_for(
        lambda: "heartbeat refused; registering again" in ANSI.sub("", cluster.node(2).log_text()),
        SETTLE_TIMEOUT_S,
        "node 2 to register again",
    )
    wait_for(
        lambda: all(sorted(p.isrs) == [1, 2] for p in partition_metadata(client, topic).values()),
        SETTLE_TIMEOUT_S,
        "node 2 back in every ISR after registering again",
    )
    acked.update(produce(cluster.bootstrap, topic, [f"c{i}" for i in range(100)]))
    check_readable(cluster.node(2).bootstrap, topic, 2, acked)


def start_fails(tmp_path, *args: str) -> str:
    """Runs `rill server ARGS`, which must exit non-zero at once; returns its stderr."""
    result = subprocess.run(
        [str(rill_binary()), "server", "--data-dir", str(tmp_path / "data"),
         "--override", "http.listeners=", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0, f"started anyway:\n{result.stdout}\n{result.stderr}"
    return ANSI.sub("", result.stderr)


def test_roles_that_contradict_the_voters_refuse_to_start(tmp_path):
    voters = "1@127.0.0.1:1,2@127.0.0.1:2"
    broker_in_voters = start_fails(
        tmp_path,
        "--node-id", "2",
        "--controller-quorum", voters,
        "--override", "process.roles=broker",
    )
    assert "node.id 2 is in controller.quorum.voters" in broker_in_voters
    # A controller outside the voters is no contradiction since KIP-853: it starts and
    # follows the quorum until AddRaftVoter adds it (the kafka-tools family).
    joining = subprocess.Popen(
        [str(rill_binary()), "server", "--data-dir", str(tmp_path / "joining"),
         "--override", "http.listeners=", "--node-id", "3", "--controller-quorum", voters,
         "--override", "process.roles=controller",
         "--controller-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        said = ""
        deadline = time.monotonic() + 30
        while "rill controller listening on" not in said and time.monotonic() < deadline:
            line = joining.stdout.readline()
            if not line:
                break
            said += ANSI.sub("", line)
        assert "joining the metadata quorum to be added as a voter" in said, said
        assert "rill controller listening on" in said, said
    finally:
        joining.kill()
        joining.wait(timeout=10)
    broker_without_voters = start_fails(tmp_path, "--override", "process.roles=broker")
    assert "needs controller.quorum.voters" in broker_without_voters
    controller_with_listen = start_fails(
        tmp_path, "--listen", "127.0.0.1:0", "--override", "process.roles=controller"
    )
    assert "controller-only node" in controller_with_listen


def test_broker_only_node_without_node_id_gets_a_generated_one(rill_cluster_factory, rill_factory):
    """broker.id.generation.enable: a broker-only node started without `node.id` is given
    one by the controller above reserved.broker.max.id (1000), keeps it in
    meta.properties, and comes back under the same id after a restart."""
    from rill_harness import free_port

    cluster = rill_cluster_factory(size=1, overrides={"offsets.topic.replication.factor": "1"})
    args = cluster.node(1).extra_args
    voters = args[args.index("--controller-quorum") + 1]
    broker = rill_factory(
        overrides={"process.roles": "broker", "broker.session.timeout.ms": "2000"},
        extra_args=["--controller-listen", f"127.0.0.1:{free_port()}", "--controller-quorum", voters],
    )
    bootstrap = f"{cluster.bootstrap},{broker.bootstrap}"

    def brokers():
        return sorted(admin(bootstrap).list_topics(timeout=10).brokers)

    assert wait_for(lambda: brokers() == [1, 1001], 30, "brokers 1 and 1001")
    stored = (broker.data_dir / "meta.properties").read_text()
    assert "node.id=1001" in stored, stored
    broker.stop()
    broker.start()
    assert wait_for(lambda: brokers() == [1, 1001], 30, "broker 1001 back under its id")
    topic = unique_topic("generated")
    create_replicated_topic(bootstrap, topic, 2, 2)
    acked = produce(bootstrap, topic, [f"v{i}" for i in range(50)])
    check_readable(bootstrap, topic, 2, acked)
