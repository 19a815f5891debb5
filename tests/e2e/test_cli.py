"""The `rill` command line against a real server: produce and consume through a group,
lag after consuming, records crossing between `rill` and confluent-kafka both ways (keyed
records landing on the partitions librdkafka's murmur2 partitioner picks), a mixed group
of `rill consume` processes and confluent-kafka members, and the topic, group and
cluster subcommands with `--output json`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer
from kafka_helpers import create_topic, read_all, unique_topic, wait_for
from rill_harness import rill_binary

CLI_TIMEOUT_S = 120


def cli(rill, *args, stdin: str | None = None, check: bool = True, env=None) -> subprocess.CompletedProcess:
    """Runs `rill ARGS -b BOOTSTRAP`, bounded; fails the test on a non-zero exit."""
    command = [str(rill_binary()), *args]
    if rill is not None:
        command += ["-b", rill.bootstrap]
    result = subprocess.run(
        command,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=env,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {result.returncode}: {result.stderr}")
    return result


def cli_json(rill, *args):
    return json.loads(cli(rill, *args, "--output", "json").stdout)


def test_seq_produce_then_group_consume_gives_the_same_lines_and_lag_zero(rill):
    topic = unique_topic("cli-seq")
    cli(rill, "topic", "create", topic, "--partitions", "3")
    lines = [str(i) for i in range(1, 3001)]
    cli(rill, "produce", topic, stdin="\n".join(lines) + "\n")

    out = cli(rill, "consume", topic, "--group", "g", "--from-beginning", "--max-messages", "3000")
    got = out.stdout.splitlines()
    assert len(got) == 3000
    assert sorted(got, key=int) == lines

    described = cli_json(rill, "group", "describe", "g")
    rows = described[0]["partitions"]
    assert {r["partition"] for r in rows} == {0, 1, 2}
    assert all(r["lag"] == 0 for r in rows), rows
    assert sum(r["committed"] for r in rows) == 3000
    table = cli(rill, "group", "describe", "g").stdout
    assert "LAG" in table.splitlines()[1]

    # The group continues where it stopped: nothing left to read.
    more = cli(rill, "consume", topic, "--group", "g", "--timeout-ms", "2000")
    assert more.stdout == ""
    # After reset-offsets --to-earliest the group reads everything again.
    cli(rill, "group", "reset-offsets", "g", "--topic", topic, "--to-earliest")
    again = cli(rill, "consume", topic, "--group", "g", "--max-messages", "3000")
    assert sorted(again.stdout.splitlines(), key=int) == lines


def test_max_messages_leaves_the_rest_for_the_group(rill):
    topic = unique_topic("cli-partial")
    cli(rill, "topic", "create", topic, "--partitions", "1")
    cli(rill, "produce", topic, stdin="".join(f"{i}\n" for i in range(100)))
    first = cli(rill, "consume", topic, "-g", "half", "--from-beginning", "-n", "40").stdout.splitlines()
    second = cli(rill, "consume", topic, "-g", "half", "-n", "60").stdout.splitlines()
    assert first + second == [str(i) for i in range(100)]
    [row] = cli_json(rill, "group", "describe", "half")[0]["partitions"]
    assert (row["committed"], row["end"], row["lag"]) == (100, 100, 0)


def test_confluent_records_are_read_by_rill_consume(rill):
    topic = unique_topic("cli-from-confluent")
    create_topic(rill.bootstrap, topic, 2)
    producer = Producer({"bootstrap.servers": rill.bootstrap, "compression.type": "lz4"})
    for i in range(500):
        producer.produce(topic, key=f"k{i}", value=f"value-{i}", headers={"n": str(i)})
    assert producer.flush(60) == 0

    out = cli(rill, "consume", topic, "--from-beginning", "--max-messages", "500", "--output", "json")
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted(int(r["value"].split("-")[1]) for r in records) == list(range(500))
    for r in records:
        i = r["value"].split("-")[1]
        assert r["key"] == f"k{i}"
        assert r["headers"] == {"n": i}


def test_rill_produce_is_read_by_confluent_on_librdkafkas_partitions(rill):
    topic = unique_topic("cli-to-confluent")
    partitions = 6
    cli(rill, "topic", "create", topic, "-p", str(partitions))
    lines = [f"key-{i}:value-{i}" for i in range(600)]
    cli(rill, "produce", topic, "--key-separator", ":", "--compression", "zstd", "-H", "origin=rill",
        stdin="\n".join(lines) + "\n")

    # Where librdkafka's Java-compatible partitioner puts the same keys.
    reference = unique_topic("cli-reference")
    create_topic(rill.bootstrap, reference, partitions)
    expected = {}

    def report(error, message):
        assert error is None, error
        expected[message.key().decode()] = message.partition()

    producer = Producer({"bootstrap.servers": rill.bootstrap, "partitioner": "murmur2_random"})
    for i in range(600):
        producer.produce(reference, key=f"key-{i}", value=b"x", on_delivery=report)
    assert producer.flush(60) == 0

    got = read_all(rill.bootstrap, topic, partitions)
    seen = 0
    for p, records in got.items():
        for record in records.values():
            key = record.key.decode()
            assert record.value.decode() == key.replace("key", "value")
            assert expected[key] == p, f"{key} on partition {p}, librdkafka says {expected[key]}"
            assert dict(record.headers) == {"origin": b"rill"}
            seen += 1
    assert seen == 600


class RillMember:
    """A `rill consume --group` process whose printed records are collected."""

    def __init__(self, rill, group: str, topic: str, assignor: str):
        self.process = subprocess.Popen(
            [str(rill_binary()), "consume", topic, "--group", group, "--from-beginning",
             "--assignor", assignor, "--format", "full", "-b", rill.bootstrap],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.seen: list[tuple[int, int]] = []
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.process.stdout:
            partition, offset, *_ = line.rstrip("\n").split("\t")
            with self.lock:
                self.seen.append((int(partition), int(offset)))

    def close(self) -> str:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError("rill consume did not exit on SIGINT")
        self.thread.join(timeout=10)
        return self.process.stderr.read()


class ConfluentMember:
    def __init__(self, bootstrap: str, group: str, topic: str, assignor: str):
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "partition.assignment.strategy": assignor,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 500,
        })
        self.consumer.subscribe([topic])
        self.seen: list[tuple[int, int]] = []
        self.errors: list = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            message = self.consumer.poll(0.1)
            if message is None:
                continue
            if message.error():
                self.errors.append(message.error())
                continue
            with self.lock:
                self.seen.append((message.partition(), message.offset()))
        self.consumer.close()

    def close(self):
        self.stop.set()
        self.thread.join(timeout=30)


@pytest.mark.parametrize("assignor", ["range", "roundrobin"])
def test_mixed_group_agrees_and_reads_every_record_once(rill, assignor):
    topic = unique_topic(f"cli-mixed-{assignor}")
    partitions = 6
    create_topic(rill.bootstrap, topic, partitions)
    group = f"mixed-{uuid.uuid4().hex[:8]}"
    rills = [RillMember(rill, group, topic, assignor) for _ in range(2)]
    confluents = [ConfluentMember(rill.bootstrap, group, topic, assignor) for _ in range(2)]
    try:
        def stable():
            [g] = cli_json(rill, "group", "describe", group)
            if g["state"] != "Stable" or len(g["members"]) != 4:
                return None
            assigned = [p for m in g["members"] for p in m["assignment"]]
            if sorted(assigned) != sorted(f"{topic}-{p}" for p in range(partitions)):
                return None
            return g

        described = wait_for(stable, 90, "a stable group of 4 covering every partition once")
        assert described["protocol"] == assignor
        clients = sorted(m["client_id"] for m in described["members"])
        assert clients.count("rill-cli") == 2, clients
        assert all(len(m["assignment"]) in (1, 2) for m in described["members"])

        # Records written after the group settled: each is read by exactly one member.
        producer = Producer({"bootstrap.servers": rill.bootstrap, "linger.ms": 5})
        for p in range(partitions):
            for i in range(100):
                producer.produce(topic, value=f"{p}-{i}", partition=p)
        assert producer.flush(60) == 0
        everyone = rills + confluents

        def all_seen():
            total = []
            for m in everyone:
                with m.lock:
                    total += m.seen
            return len(total) >= 600 and total

        wait_for(all_seen, 90, "every record read by the group")
        time.sleep(1)  # anything read twice would show up by now
        total = []
        for m in everyone:
            with m.lock:
                total += m.seen
        assert len(total) == 600 and len(set(total)) == 600, "records read twice"
        assert set(total) == {(p, o) for p in range(partitions) for o in range(100)}
        assert all(m.seen for m in everyone), "every member read its share"
    finally:
        stderr = [m.close() for m in rills]
        for m in confluents:
            m.close()
    for m in confluents:
        assert m.errors == [], m.errors
    assert all("error" not in s for s in stderr), stderr


def test_topic_and_cluster_subcommands(rill):
    topic = unique_topic("cli-admin")
    cli(rill, "topic", "create", topic, "-p", "2", "-c", "retention.ms=3600000")
    again = cli(rill, "topic", "create", topic, "-p", "2", check=False)
    assert again.returncode != 0
    assert again.stderr.startswith("error:") and len(again.stderr.strip().splitlines()) == 1
    cli(rill, "topic", "create", topic, "-p", "2", "--if-not-exists")
    assert topic in cli(rill, "topic", "list").stdout.split()
    cli(rill, "topic", "alter", topic, "--partitions", "4", "--config", "retention.ms=7200000")
    [described] = cli_json(rill, "topic", "describe", topic)
    assert len(described["partitions"]) == 4
    assert described["configs"]["retention.ms"] == "7200000"
    assert "PARTITION" in cli(rill, "topic", "describe", topic).stdout

    cluster = cli_json(rill, "cluster", "describe")
    assert len(cluster["brokers"]) == 1 and cluster["cluster_id"]
    assert cluster["brokers"][0]["port"] == int(rill.bootstrap.rsplit(":", 1)[1])

    # RILL_BOOTSTRAP_SERVER instead of -b.
    env = dict(os.environ, RILL_BOOTSTRAP_SERVER=rill.bootstrap)
    listed = json.loads(cli(None, "topic", "list", "--output", "json", env=env).stdout)
    assert topic in [t["name"] for t in listed]

    cli(rill, "topic", "delete", topic)
    assert topic not in cli(rill, "topic", "list").stdout.split()
    missing = cli(rill, "topic", "describe", topic, check=False)
    assert missing.returncode != 0 and "unknown topic" in missing.stderr


def test_group_list_and_delete(rill):
    topic = unique_topic("cli-groups")
    cli(rill, "topic", "create", topic, "-p", "1")
    cli(rill, "produce", topic, stdin="a\nb\n")
    cli(rill, "consume", topic, "-g", "listed", "--from-beginning", "-n", "2")
    groups = cli_json(rill, "group", "list")
    assert {"group": "listed", "state": "Empty", "protocol_type": "consumer"}.items() <= next(
        g for g in groups if g["group"] == "listed"
    ).items()
    cli(rill, "group", "delete", "listed")
    assert "listed" not in [g["group"] for g in cli_json(rill, "group", "list")]


def test_unreachable_broker_is_a_one_line_error(tmp_path):
    result = subprocess.run(
        [str(rill_binary()), "topic", "list", "-b", "127.0.0.1:1", "--request-timeout-ms", "2000"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert result.stderr.startswith("error:"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
