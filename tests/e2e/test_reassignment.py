"""Partition reassignment and preferred-leader election on a real three-node cluster.

Three `rill server` processes, each a controller quorum voter and a broker, with short
heartbeat and session timeouts so that a dead broker is noticed within seconds.

- A partition moves to another replica set (its leader among the removed replicas) while
  an idempotent acks=all producer keeps writing: the move completes, every acknowledged
  record is read back exactly once and in order, and the removed broker deletes its copy.
- The preferred leader of a partition is killed (leadership moves away), restarted (it
  rejoins the ISR as a follower), and `rill cluster elect-leaders` gives it back its
  leadership.

The cluster fixture lives here until tests/e2e has a shared one.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kafka_helpers import read_all, unique_topic, wait_for
from rill_harness import RillServer, free_port

NODES = 3
CLUSTER_OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "broker.heartbeat.interval.ms": "300",
    "broker.session.timeout.ms": "2000",
    # The election test must see the leader stay away until it asks for it back.
    "auto.leader.rebalance.enable": "false",
}
CLI_TIMEOUT_S = 30.0
REASSIGN_TIMEOUT_S = 30.0


class Cluster:
    """Three nodes started together (a lone voter cannot elect a controller, so each
    node's start waits for the others)."""

    def __init__(self, tmp_path: Path) -> None:
        controller_ports = [free_port() for _ in range(NODES)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{p}" for i, p in enumerate(controller_ports))
        self.nodes: dict[int, RillServer] = {}
        for i, port in enumerate(controller_ports):
            node_id = i + 1
            workdir = tmp_path / f"node{node_id}"
            workdir.mkdir()
            self.nodes[node_id] = RillServer(
                workdir,
                overrides=CLUSTER_OVERRIDES,
                extra_args=[
                    "--node-id",
                    str(node_id),
                    "--controller-listen",
                    f"127.0.0.1:{port}",
                    "--controller-quorum",
                    voters,
                ],
            )

    def start(self) -> "Cluster":
        # Each node starts on a thread of its own so that the three wait for each other's
        # votes at the same time. The harness asks the kernel to kill a server when the
        # thread that spawned it ends (PR_SET_PDEATHSIG follows the thread, not the
        # process), so each starter thread stays alive until teardown.
        errors: list[BaseException] = []
        started = threading.Barrier(len(self.nodes) + 1)

        def start_one(node: RillServer) -> None:
            try:
                node.start()
            except BaseException as error:  # reported below, with the node's log
                errors.append(error)
            started.wait()
            self._stopping.wait()

        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(target=start_one, args=(n,), daemon=True) for n in self.nodes.values()
        ]
        for t in self._threads:
            t.start()
        started.wait()
        if errors:
            raise errors[0]
        return self

    def bootstrap(self, *, without: int | None = None) -> str:
        return ",".join(
            n.bootstrap
            for node_id, n in self.nodes.items()
            if node_id != without and n.is_running()
        )

    def rill(self, *args: str, without: int | None = None, check: bool = True):
        """Runs a `rill` client command against the live nodes; returns the process."""
        node = next(iter(self.nodes.values()))
        command = [str(node.binary), *args, "--bootstrap-server", self.bootstrap(without=without)]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(args)} exited {result.returncode}: {result.stderr.strip()}"
            )
        return result

    def rill_json(self, *args: str, without: int | None = None):
        return json.loads(self.rill(*args, "--output", "json", without=without).stdout)

    def partition(self, topic: str, partition: int, *, without: int | None = None) -> dict:
        described = self.rill_json("topic", "describe", topic, without=without)
        return next(p for p in described[0]["partitions"] if p["partition"] == partition)

    def teardown(self) -> list[str]:
        problems = []
        for node_id, node in self.nodes.items():
            problems += [f"node {node_id}: {p}" for p in node.teardown()]
        if hasattr(self, "_stopping"):
            self._stopping.set()
            for t in self._threads:
                t.join(5)
        return problems


@pytest.fixture
def cluster(request, tmp_path):
    failed_before = request.session.testsfailed
    c = Cluster(tmp_path)
    try:
        c.start()
        yield c
    finally:
        problems = c.teardown()
        # The call phase's failure is counted before teardown runs; the logs printed here
        # are shown with the failure.
        if request.session.testsfailed > failed_before or problems:
            for node_id, node in c.nodes.items():
                print(f"--- node {node_id} ---\n{node.log_excerpt(150)}")
        if problems:
            pytest.fail("server problems at teardown:\n" + "\n".join(problems), pytrace=False)


def create_topic(cluster: Cluster, topic: str, partitions: int, rf: int) -> None:
    cluster.rill(
        "topic",
        "create",
        topic,
        "--partitions",
        str(partitions),
        "--replication-factor",
        str(rf),
    )

    def all_in_sync():
        described = cluster.rill_json("topic", "describe", topic)[0]["partitions"]
        return len(described) == partitions and all(
            p["leader"] >= 0 and sorted(p["isr"]) == sorted(p["replicas"]) for p in described
        )

    wait_for(all_in_sync, 20, f"every partition of {topic} to have a leader and a full ISR")


class BackgroundProducer:
    """An idempotent acks=all producer writing numbered records to every partition, round
    robin, from its own thread, until stopped; remembers what was acknowledged where."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self.acked: list[tuple[int, int, bytes]] = []
        self.errors: list[str] = []
        self.sent = 0
        self._stop = threading.Event()
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 5,
                "message.timeout.ms": 30000,
                "topic.metadata.refresh.interval.ms": 1000,
                "reconnect.backoff.max.ms": 500,
            }
        )
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, error, message) -> None:
        if error is None:
            self.acked.append((message.partition(), message.offset(), message.value()))
        else:
            self.errors.append(str(error))

    def _run(self) -> None:
        while not self._stop.is_set():
            partition = self.sent % self.partitions
            value = f"seq={self.sent:08d}".encode()
            try:
                self._producer.produce(
                    self.topic, value=value, partition=partition, on_delivery=self._on_delivery
                )
                self.sent += 1
            except BufferError:
                self._producer.poll(0.05)
            self._producer.poll(0)
            time.sleep(0.002)
        self._producer.flush(30)

    def start(self) -> "BackgroundProducer":
        self._thread.start()
        return self

    def acked_count(self) -> int:
        return len(self.acked)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(45)
        assert not self._thread.is_alive(), "the producer did not flush within 30 s"


def test_reassignment_under_load_moves_the_partition_and_loses_nothing(cluster):
    topic = unique_topic("reassign")
    partitions = 2
    create_topic(cluster, topic, partitions, rf=2)
    before = cluster.partition(topic, 0)
    old_replicas = before["replicas"]
    leader = before["leader"]
    # Move the partition off its leader onto the third broker: leadership must move too.
    (spare,) = set(cluster.nodes) - set(old_replicas)
    (kept,) = set(old_replicas) - {leader}
    target = [spare, kept]

    producer = BackgroundProducer(cluster.bootstrap(), topic, partitions).start()
    try:
        wait_for(lambda: producer.acked_count() >= 200, 20, "the producer to get going")
        moved = cluster.rill_json(
            "topic",
            "reassign",
            topic,
            "--partition",
            "0",
            "--replicas",
            ",".join(map(str, target)),
        )
        assert moved["partitions"] == [
            {
                "topic": topic,
                "partition": 0,
                "replicas": target,
                "error": "NONE",
                "message": None,
            }
        ]
        started = time.monotonic()
        wait_for(
            lambda: cluster.rill_json("topic", "reassignments", topic) == [],
            REASSIGN_TIMEOUT_S,
            f"the reassignment of {topic}-0 to {target} to complete",
        )
        print(f"reassignment completed in {time.monotonic() - started:.1f} s")
        acked_at_completion = producer.acked_count()
        # Keep writing through the new leader for a moment.
        wait_for(
            lambda: producer.acked_count() >= acked_at_completion + 200,
            20,
            "the producer to keep going after the move",
        )
    finally:
        producer.stop()
    assert producer.errors == [], f"deliveries failed: {producer.errors[:5]}"

    after = cluster.partition(topic, 0)
    assert after["replicas"] == target
    assert after["leader"] in target
    # Every replica of every partition, moved or not, keeps up with its leader.
    wait_for(
        lambda: (d := cluster.rill_json("cluster", "describe"))["under_replicated_partitions"] == []
        and d["offline_partitions"] == [],
        5,
        "no partition to be under-replicated after the move",
    )

    stored = read_all(cluster.bootstrap(), topic, partitions, timeout_s=30)
    for p in range(partitions):
        offsets = sorted(stored[p])
        assert offsets == list(range(len(offsets))), f"partition {p} has offset gaps"
        values = [stored[p][o].value for o in offsets]
        assert len(values) == len(set(values)), f"partition {p} stores a record twice"
        assert values == sorted(values), f"partition {p} is out of order"
    for p, offset, value in producer.acked:
        assert stored[p].get(offset) is not None, f"acknowledged {p}/{offset} is missing"
        assert stored[p][offset].value == value, f"acknowledged {p}/{offset} changed"
    print(f"sent {producer.sent}, acknowledged {len(producer.acked)}")

    removed_dir = cluster.nodes[leader].data_dir / f"{topic}-0"
    wait_for(lambda: not removed_dir.exists(), 10, f"broker {leader} to delete {removed_dir}")
    for node_id in target:
        assert (cluster.nodes[node_id].data_dir / f"{topic}-0").is_dir()


def test_preferred_leader_election_gives_leadership_back(cluster):
    topic = unique_topic("elect")
    create_topic(cluster, topic, 1, rf=3)
    before = cluster.partition(topic, 0)
    preferred = before["replicas"][0]
    assert before["leader"] == preferred

    # Nothing to do while the preferred replica leads.
    result = cluster.rill_json("cluster", "elect-leaders", "--topic", topic, "--partition", "0")
    assert result["partitions"][0]["error"] == "ELECTION_NOT_NEEDED"

    cluster.nodes[preferred].kill9()
    moved = wait_for(
        lambda: (p := cluster.partition(topic, 0, without=preferred))["leader"]
        not in (-1, preferred)
        and p,
        15,
        f"leadership of {topic}-0 to move off the killed broker {preferred}",
    )
    assert preferred not in moved["isr"]
    described = cluster.rill_json("cluster", "describe", without=preferred)
    assert any(p["topic"] == topic for p in described["under_replicated_partitions"]), described

    cluster.nodes[preferred].start()
    wait_for(
        lambda: preferred in cluster.partition(topic, 0)["isr"],
        20,
        f"broker {preferred} to rejoin the ISR of {topic}-0",
    )
    assert cluster.partition(topic, 0)["leader"] != preferred

    result = cluster.rill_json("cluster", "elect-leaders", "--type", "preferred")
    assert {"topic": topic, "partition": 0, "error": "NONE", "message": None} in result[
        "partitions"
    ]
    assert cluster.partition(topic, 0)["leader"] == preferred
    described = cluster.rill_json("cluster", "describe")
    assert described["under_replicated_partitions"] == []
    assert described["offline_partitions"] == []
