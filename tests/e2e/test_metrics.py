"""The HTTP listener (issue #18): /health/live, /health/ready and /metrics on real nodes.

What these tests hold the broker to, each value checked against what the test did or
against the broker's own disk, on a page that the Prometheus client's OpenMetrics parser
accepts:
- bytes in equals the size of the record batches the log holds for the topic (the log
  files, parsed here), and lies within the exact per-batch and per-record overhead of what
  was produced; messages in equals the number produced; bytes out equals what one full
  read sent;
- a fetch out of range is counted as a failed fetch under its error code; connections are
  counted per listener while open; a deleted topic's series leave the page;
- a group's lag on each partition equals the end offset (high watermark) minus its
  committed offset; a group that joins counts a completed rebalance;
- on three nodes, acks=all produce on a replicated topic moves the leader's Produce time
  breakdown (request queue, local, remote — waiting for the followers —, response queue,
  send, total: one observation each per request) and the followers' Fetch counts;
- on three nodes, a follower stopped is an ISR shrink on the leader, one
  under-replicated partition and a follower lag of at least what was written meanwhile,
  and back in sync it is an expansion, none, and a lag of zero;
- /health/ready answers 503 with a reason while a node cannot register (no quorum yet)
  and 200 once it has; /health/live answers 200 throughout;
- a taken HTTP port refuses the start in one line; `--log-format json` logs JSON lines;
- controller-only nodes serve health and their own page: one active controller in all;
- every API's error codes are counted (a second CreateTopics of a topic, a DeleteTopics of
  none), and each response's quota throttle is in the throttle-time histogram, to the
  millisecond the clients were told;
- on three nodes, a leader killed is a failed request on its followers' fetchers, and on
  the active controller the dead voter's metadata lag grows past zero while the others'
  stay at zero.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from kafka_helpers import create_topic, unique_topic, wait_for
from kafka_wire import read_exact
from rill_harness import RillCluster, free_port, rill_binary
from test_cluster import create_replicated_topic, leader_of
from test_quotas import metadata_throttle_ms, rill_quota

HTTP_ON = {"http.listeners": "127.0.0.1:0"}
# The record batch header (magic 2) before the first record: baseOffset 8, batchLength 4,
# partitionLeaderEpoch 4, magic 1, crc 4, attributes 2, lastOffsetDelta 4, baseTimestamp 8,
# maxTimestamp 8, producerId 8, producerEpoch 2, baseSequence 4, records count 4.
BATCH_HEADER_BYTES = 61


def http_get(address: str, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def scrape(address: str) -> dict:
    """The page parsed: {(sample name, frozenset(labels)): value}. The parser raises on
    anything that is not valid OpenMetrics text."""
    status, body = http_get(address, "/metrics")
    assert status == 200, body
    samples = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    """The value of the one series of `name` with exactly `labels`; 0 when absent."""
    return samples.get((name, frozenset(labels.items())), 0.0)


def log_batches(data_dir: Path, topic: str, partition: int) -> tuple[int, int, int]:
    """(bytes, batches, records) of the record batches in the partition's .log files,
    parsed from the files themselves."""
    total = batches = records = 0
    for path in sorted((data_dir / f"{topic}-{partition}").glob("*.log")):
        data = path.read_bytes()
        at = 0
        while at + 12 <= len(data):
            (length,) = struct.unpack_from(">i", data, at + 8)
            if length <= 0:
                break
            (count,) = struct.unpack_from(">i", data, at + 57)
            total += 12 + length
            batches += 1
            records += count
            at += 12 + length
    return total, batches, records


def produce(bootstrap: str, topic: str, partition: int, count: int, size: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20,
                         "compression.type": "none"})
    failures = []
    for i in range(count):
        payload = (b"%08d" % i).ljust(size, b"x")
        producer.produce(topic, value=payload, partition=partition,
                         on_delivery=lambda err, _msg: err and failures.append(err))
    assert producer.flush(60) == 0
    assert not failures, failures[:3]


def test_produce_and_fetch_are_counted_exactly(rill_factory):
    rill = rill_factory(overrides=HTTP_ON)
    address = rill.http_address()
    topic = unique_topic("metrics")
    create_topic(rill.bootstrap, topic, 1)
    count, size = 1000, 100
    before = scrape(address)
    produce(rill.bootstrap, topic, 0, count, size)

    samples = scrape(address)
    log_bytes, batches, records = log_batches(rill.data_dir, topic, 0)
    assert records == count
    bytes_in = value(samples, "kafka_server_brokertopicmetrics_topic_bytes_in_total", topic=topic)
    assert bytes_in == log_bytes, (bytes_in, log_bytes)
    # A record without key or headers costs 8 to 12 bytes beside its value: length,
    # attributes, timestamp delta, offset delta, key length (-1), value length, header
    # count, as varints; each batch adds its 61-byte header.
    payload = count * size
    low = payload + 8 * count + BATCH_HEADER_BYTES * batches
    high = payload + 12 * count + BATCH_HEADER_BYTES * batches
    assert low <= bytes_in <= high, (low, bytes_in, high, batches)
    assert value(samples, "kafka_server_brokertopicmetrics_topic_messages_in_total",
                 topic=topic) == count
    all_in = value(samples, "kafka_server_brokertopicmetrics_bytes_in_total")
    assert all_in - value(before, "kafka_server_brokertopicmetrics_bytes_in_total") >= bytes_in
    produce_requests = value(samples, "kafka_network_requestmetrics_requests_total",
                             request="Produce")
    assert produce_requests >= 1
    assert value(samples, "kafka_network_requestmetrics_total_time_seconds_count",
                 request="Produce") == produce_requests
    assert value(samples, "kafka_server_brokertopicmetrics_topic_total_produce_requests_total",
                 topic=topic) >= 1
    assert value(samples, "kafka_server_replicamanager_leader_count") >= 1
    assert value(samples, "kafka_log_log_end_offset", topic=topic, partition="0") == count
    assert value(samples, "kafka_log_log_start_offset", topic=topic, partition="0") == 0
    assert value(samples, "kafka_log_log_size_bytes", topic=topic, partition="0") == log_bytes
    assert value(samples, "kafka_log_log_num_log_segments", topic=topic, partition="0") == 1
    # The cluster as this node's image has it: one broker, active, and the quorum's
    # position (this node leads it).
    assert value(samples, "kafka_controller_kafkacontroller_global_topic_count") >= 1
    assert value(samples, "kafka_controller_kafkacontroller_global_partition_count") >= 1
    assert value(samples, "kafka_controller_kafkacontroller_active_broker_count") == 1
    assert value(samples, "kafka_controller_kafkacontroller_fenced_broker_count") == 0
    assert value(samples, "kafka_server_raft_metrics_current_leader") == 1
    assert value(samples, "kafka_server_raft_metrics_current_epoch") >= 1
    applied = value(samples, "kafka_server_broker_metadata_metrics_last_applied_record_offset")
    assert 0 <= applied < value(samples, "kafka_server_raft_metrics_high_watermark")
    assert value(samples, "process_resident_memory_bytes") > 1 << 20
    assert value(samples, "process_open_fds") > 3

    # One full read sends every stored byte once.
    consumer = Consumer({"bootstrap.servers": rill.bootstrap, "group.id": "unused",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    seen = 0
    deadline = time.monotonic() + 60
    while seen < count and time.monotonic() < deadline:
        message = consumer.poll(1.0)
        if message is not None and message.error() is None:
            seen += 1
    consumer.close()
    assert seen == count
    samples = scrape(address)
    assert value(samples, "kafka_server_brokertopicmetrics_topic_bytes_out_total",
                 topic=topic) == log_bytes

    # A fetch past the end is a failed fetch, counted under its error code.
    errors_before = value(samples, "kafka_network_requestmetrics_errors_total",
                          request="Fetch", error="OFFSET_OUT_OF_RANGE")
    failed_before = value(samples, "kafka_server_brokertopicmetrics_topic_failed_fetch_requests_total",
                          topic=topic)
    consumer = Consumer({"bootstrap.servers": rill.bootstrap, "group.id": "unused",
                         "enable.auto.commit": False, "auto.offset.reset": "error"})
    consumer.assign([TopicPartition(topic, 0, count + 500)])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is not None:
            break
    consumer.close()
    samples = scrape(address)
    assert value(samples, "kafka_network_requestmetrics_errors_total",
                 request="Fetch", error="OFFSET_OUT_OF_RANGE") > errors_before
    assert value(samples, "kafka_server_brokertopicmetrics_topic_failed_fetch_requests_total",
                 topic=topic) > failed_before

    # Connections per listener: three held open are counted, and none once every client
    # of this test has closed.
    connections = "kafka_server_socketserver_connection_count"
    held = [socket.create_connection((rill.bootstrap.split(":")[0], rill.port)) for _ in range(3)]
    try:
        wait_for(lambda: value(scrape(address), connections, listener="PLAINTEXT") >= 3, 10,
                 "three open connections counted")
    finally:
        for s in held:
            s.close()
    wait_for(lambda: value(scrape(address), connections, listener="PLAINTEXT") == 0, 10,
             "no open connection counted once all are closed")

    # A deleted topic's series leave the page.
    series = ("kafka_server_brokertopicmetrics_topic_bytes_in_total", frozenset({"topic": topic}.items()))
    assert series in scrape(address)
    client = create_topic(rill.bootstrap, unique_topic("other"), 1)
    client.delete_topics([topic], operation_timeout=30)[topic].result(30)
    wait_for(lambda: series not in scrape(address), 30, "the deleted topic's series gone")


def test_group_lag_is_end_offset_minus_committed(rill_factory):
    rill = rill_factory(overrides=HTTP_ON)
    address = rill.http_address()
    topic = unique_topic("lag")
    create_topic(rill.bootstrap, topic, 2)
    produce(rill.bootstrap, topic, 0, 300, 20)
    produce(rill.bootstrap, topic, 1, 200, 20)
    group = f"lag-{uuid.uuid4().hex[:8]}"
    committer = Consumer({"bootstrap.servers": rill.bootstrap, "group.id": group,
                          "enable.auto.commit": False})
    committer.commit(offsets=[TopicPartition(topic, 0, 120), TopicPartition(topic, 1, 200)],
                     asynchronous=False)
    ends = [committer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in (0, 1)]
    committer.close()
    assert ends == [300, 200]

    # A group id is any string: one that would end a label value and start a series of
    # its own if written unescaped must come back whole, and the page still parse.
    odd = f'odd"}} 1\nfake_series{{x="{uuid.uuid4().hex[:4]}\\'
    oddly = Consumer({"bootstrap.servers": rill.bootstrap, "group.id": odd,
                      "enable.auto.commit": False})
    oddly.commit(offsets=[TopicPartition(topic, 0, 10)], asynchronous=False)
    oddly.close()

    samples = scrape(address)
    assert value(samples, "kafka_consumergroup_lag", group=odd, topic=topic, partition="0") == 290
    assert not any(name == "fake_series" for name, _ in samples)
    lag0 = value(samples, "kafka_consumergroup_lag", group=group, topic=topic, partition="0")
    lag1 = value(samples, "kafka_consumergroup_lag", group=group, topic=topic, partition="1")
    assert (lag0, lag1) == (ends[0] - 120, ends[1] - 200)
    assert ((("kafka_consumergroup_lag", frozenset(
        {"group": group, "topic": topic, "partition": "1"}.items()))) in samples)
    assert value(samples, "kafka_consumergroup_lag_sum", group=group, topic=topic) == 180
    assert value(samples, "kafka_server_group_coordinator_metrics_classic_group_count",
                 state="Empty") >= 1
    assert value(samples, "kafka_consumergroup_members", group=group) == 0
    assert ("kafka_consumergroup_members", frozenset({"group": group}.items())) in samples

    # A member that joins completes a rebalance; once it has committed what it read,
    # the lag of that partition is zero.
    rebalances = value(samples,
                       "kafka_server_group_coordinator_metrics_classic_group_completed_rebalance_total")
    member = Consumer({"bootstrap.servers": rill.bootstrap, "group.id": group,
                       "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    member.subscribe([topic])
    read = 0
    deadline = time.monotonic() + 60
    while read < 180 and time.monotonic() < deadline:
        message = member.poll(0.5)
        if message is not None and message.error() is None and message.partition() == 0:
            read += 1
    assert read == 180
    member.commit(asynchronous=False)
    samples = wait_for(
        lambda: (s := scrape(address)) and value(
            s, "kafka_server_group_coordinator_metrics_classic_group_count", state="Stable") >= 1
        and s,
        30, "the group Stable on /metrics")
    assert value(samples, "kafka_consumergroup_lag", group=group, topic=topic, partition="0") == 0
    assert value(samples, "kafka_consumergroup_members", group=group) == 1
    assert value(samples,
                 "kafka_server_group_coordinator_metrics_classic_group_completed_rebalance_total"
                 ) >= rebalances + 1
    member.close()


REQUEST_STAGES = ("request_queue", "local", "remote", "response_queue", "response_send",
                  "total")


def test_acks_all_on_a_replicated_topic_moves_the_request_time_breakdown(rill_cluster_factory):
    cluster = rill_cluster_factory(overrides=HTTP_ON)
    topic = unique_topic("breakdown")
    client = create_replicated_topic(cluster.bootstrap, topic, 1, 3, {"min.insync.replicas": "2"})
    leader_id = leader_of(client, topic, 0)
    address = cluster.node(leader_id).http_address()
    before = scrape(address)
    count = 40
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "linger.ms": 0, "enable.idempotence": True})
    failures = []
    for i in range(count):
        # One at a time: every record is its own Produce request that waits for the ISR.
        producer.produce(topic, value=b"%d" % i, partition=0,
                         on_delivery=lambda err, _msg: err and failures.append(err))
        assert producer.flush(30) == 0
    assert not failures, failures[:3]
    after = scrape(address)

    def moved(name: str, sample: str) -> float:
        full = f"kafka_network_requestmetrics_{name}{sample}"
        return value(after, full, request="Produce") - value(before, full, request="Produce")

    requests = moved("requests", "_total")
    assert requests >= count
    for stage in REQUEST_STAGES:
        # Each stage observes every request once (no timing is asserted, only that the
        # series exist and count what was served).
        assert moved(f"{stage}_time_seconds", "_count") == requests, stage
        assert ((f"kafka_network_requestmetrics_{stage}_time_seconds_bucket",
                 frozenset({"request": "Produce", "le": "+Inf"}.items())) in after), stage
    # Waiting for the followers is remote time: it took some, and it is within the total.
    remote = moved("remote_time_seconds", "_sum")
    assert remote > 0
    assert remote <= moved("total_time_seconds", "_sum")
    # The followers fetched from the leader meanwhile, and the leader answered them.
    fetches = (value(after, "kafka_network_requestmetrics_requests_total", request="Fetch")
               - value(before, "kafka_network_requestmetrics_requests_total", request="Fetch"))
    assert fetches >= count


def test_isr_shrink_and_expand_show_on_the_leader(rill_cluster_factory):
    cluster = rill_cluster_factory(overrides=HTTP_ON)
    topic = unique_topic("isr")
    client = create_replicated_topic(cluster.bootstrap, topic, 1, 3, {"min.insync.replicas": "2"})
    leader_id = leader_of(client, topic, 0)
    leader = cluster.node(leader_id)
    address = leader.http_address()
    name = "kafka_server_replicamanager_"

    def settled(samples):
        return (value(samples, "kafka_cluster_partition_under_replicated",
                      topic=topic, partition="0") == 0
                and value(samples, f"{name}under_replicated_partitions") == 0)

    before = wait_for(lambda: (s := scrape(address)) and settled(s) and s, 30,
                      "no under-replicated partition on the leader")
    follower_id = next(i for i in (1, 2, 3) if i != leader_id)
    cluster.node(follower_id).kill9()
    produce(leader.bootstrap, topic, 0, 50, 50)

    def shrunk():
        s = scrape(address)
        return (value(s, f"{name}isr_shrinks_total") > value(before, f"{name}isr_shrinks_total")
                and value(s, f"{name}under_replicated_partitions") >= 1 and s)

    during = wait_for(shrunk, 30, "an ISR shrink and an under-replicated partition")
    fenced = "kafka_controller_kafkacontroller_fenced_broker_count"
    wait_for(lambda: value(scrape(address), fenced) == 1, 30, "the killed broker fenced")
    assert value(during, "kafka_cluster_partition_under_replicated", topic=topic,
                 partition="0") == 1
    assert value(during, f"{name}under_min_isr_partition_count") == 0  # 2 of 3 left
    lag = "kafka_server_replica_follower_lag_records"
    assert value(during, lag, topic=topic, partition="0", replica=str(follower_id)) >= 50
    assert value(during, f"{name}at_min_isr_partition_count") >= 1

    cluster.node(follower_id).start()

    def expanded():
        s = scrape(address)
        return (value(s, f"{name}isr_expands_total") > value(during, f"{name}isr_expands_total")
                and settled(s) and s)

    wait_for(expanded, 60, "the follower back in the ISR, counted as an expansion")
    wait_for(lambda: value(scrape(address), lag, topic=topic, partition="0",
                           replica=str(follower_id)) == 0
             and (lag, frozenset({"topic": topic, "partition": "0",
                                  "replica": str(follower_id)}.items())) in scrape(address),
             30, "the restarted follower's lag back to zero")


def test_controller_events_and_leader_elections_are_counted(rill_cluster_factory):
    """The active controller times each event on its queue and in its decision, counts its
    terms, and counts the leader elections it commits: killing a partition leader that is
    not the controller makes at least one, and none unclean."""
    cluster = rill_cluster_factory(overrides=HTTP_ON)
    topic = unique_topic("elections")
    # Three partitions led round-robin: one of them by a node that is not the controller.
    client = create_replicated_topic(cluster.bootstrap, topic, 3, 3)
    controller_id = client.describe_cluster().result(timeout=10).controller.id
    address = cluster.node(controller_id).http_address()
    queue = "kafka_controller_controllereventmanager_event_queue_time_seconds"
    processing = "kafka_controller_controllereventmanager_event_queue_processing_time_seconds"
    elections = "kafka_controller_controllerstats_leader_elections_total"
    before = scrape(address)
    # Every broker's heartbeats are events of the active controller's loop.
    assert value(before, f"{queue}_count") >= 1
    assert value(before, f"{processing}_count") >= 1
    assert value(before, "kafka_controller_kafkacontroller_new_active_controllers_total") >= 1
    leaders = {leader_of(client, topic, p) for p in range(3)}
    victim = next(i for i in sorted(leaders) if i != controller_id)
    cluster.node(victim).kill9()
    wait_for(lambda: value(scrape(address), elections) > value(before, elections), 30,
             "a leader election counted on the active controller")
    assert value(scrape(address),
                 "kafka_controller_controllerstats_unclean_leader_elections_total") == 0


def test_ready_waits_for_registration_and_live_answers_throughout(tmp_path):
    cluster = RillCluster(tmp_path / "cluster", 3, {
        "broker.heartbeat.interval.ms": "300",
        "broker.session.timeout.ms": "2000",
        "http.listeners": "127.0.0.1:0",
    })
    first = cluster.node(1)
    port = free_port()
    first.overrides["http.listeners"] = f"127.0.0.1:{port}"
    address = f"127.0.0.1:{port}"
    try:
        first.launch()
        # Alone, one voter of three elects no controller: the node cannot register.
        not_ready = wait_for(lambda: (r := http_get(address, "/health/ready"))[0] == 503 and r,
                             30, "/health/ready answering 503 on a lone voter")
        assert "not registered" in not_ready[1], not_ready
        assert http_get(address, "/health/live") == (200, "live\n")
        time.sleep(1.0)
        assert http_get(address, "/health/ready")[0] == 503
        for node_id in (2, 3):
            cluster.node(node_id).launch()
        for node_id in (1, 2, 3):
            cluster.node(node_id).wait_ready()
        wait_for(lambda: http_get(address, "/health/ready") == (200, "ready\n"), 30,
                 "/health/ready answering 200 once registered")
        for node_id in (2, 3):
            assert http_get(cluster.node(node_id).http_address(), "/health/ready")[0] == 200
        assert http_get(address, "/health/live") == (200, "live\n")
        assert http_get(address, "/nothing")[0] == 404
    finally:
        problems = cluster.teardown()
    assert not problems, problems


def test_a_taken_http_port_is_a_startup_error(tmp_path):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [str(rill_binary()), "server", "--listen", f"127.0.0.1:{free_port()}",
             "--data-dir", str(tmp_path / "data"), "--override", f"http.listeners=127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=30,
        )
    assert result.returncode == 1, result
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: configuration: http.listeners: cannot listen on 127.0.0.1:{port}: "
                      "Address already in use (os error 98)"], result.stderr


def test_log_format_json_writes_one_object_per_line(rill_factory):
    rill = rill_factory(extra_args=["--log-format", "json"])
    lines = [line for line in rill.log_text().splitlines()
             if line.startswith("{")]
    assert lines, rill.log_text()
    records = [json.loads(line) for line in lines]
    assert all({"timestamp", "level", "fields", "target"} <= set(r) for r in records), records[:3]
    assert any(r["fields"].get("message") == "registered with the controller"
               and r["fields"].get("node_id") == 1 for r in records), records
    # Nothing else is written in the text format meanwhile (the harness's own marker and
    # the ready lines on stdout aside).
    others = [line for line in rill.log_text().splitlines()
              if line and not line.startswith(("{", "===", "rill "))]
    assert not others, others


def test_controller_only_nodes_serve_health_and_their_own_metrics(rill_cluster_factory):
    roles = {1: "controller", 2: "controller", 3: "controller", 4: "broker"}
    cluster = rill_cluster_factory(size=4, roles=roles, overrides={
        **HTTP_ON, "default.replication.factor": "1", "offsets.topic.replication.factor": "1"})
    active = "kafka_controller_kafkacontroller_active_controller_count"

    leader_of = "kafka_server_raft_metrics_current_leader"

    def one_active_known_to_all():
        # An observer learns the leader a moment after the voters elect it (it shows -1
        # until then), so the pages are read until every node names the active one.
        pages = {i: scrape(cluster.node(i).http_address()) for i in (1, 2, 3, 4)}
        actives = [i for i in (1, 2, 3, 4) if value(pages[i], active) == 1]
        known = {value(p, leader_of) for p in pages.values()}
        return len(actives) == 1 and known == set(actives) and pages

    pages = wait_for(one_active_known_to_all, 30,
                     "exactly one active controller, named by every node as the quorum leader")
    assert value(pages[4], active) == 0  # a broker-only node is no voter
    [leader] = [i for i in (1, 2, 3) if value(pages[i], active) == 1]
    assert value(pages[leader], "kafka_controller_kafkacontroller_active_broker_count") == 1
    for i in (1, 2, 3):
        address = cluster.node(i).http_address()
        assert http_get(address, "/health/live") == (200, "live\n")
        assert http_get(address, "/health/ready") == (200, "ready\n")
        # A controller hosts no partitions: no broker series on its page.
        assert not any(name.startswith(("kafka_server_replicamanager",
                                        "kafka_server_brokertopicmetrics"))
                       for name, _ in pages[i]), sorted({n for n, _ in pages[i]})
        assert value(pages[i], "process_resident_memory_bytes") > 0
    assert ("kafka_server_replicamanager_leader_count", frozenset()) in pages[4]
    assert http_get(cluster.node(4).http_address(), "/health/ready") == (200, "ready\n")


def test_cleaner_metrics_follow_the_cleans(rill_factory):
    """The log cleaner's counters and Kafka's LogCleaner/LogCleanerManager gauges: after a
    compacted topic full of overwritten keys is cleaned, the cleans are counted, they wrote
    less than they read, and the time since the last round is served."""
    rill = rill_factory(overrides={**HTTP_ON, "log.cleaner.backoff.ms": "200"})
    address = rill.http_address()
    topic = unique_topic("cleaned")
    create_topic(rill.bootstrap, topic, 1, {
        "cleanup.policy": "compact", "segment.bytes": "16384", "segment.ms": "500",
        "min.cleanable.dirty.ratio": "0.01"})
    # Batches under segment.bytes: a larger one is refused (RECORD_LIST_TOO_LARGE).
    producer = Producer({"bootstrap.servers": rill.bootstrap, "linger.ms": 5, "batch.size": 8192})
    errors = []
    for i in range(3000):
        producer.produce(topic, key=f"k{i % 20}".encode(), value=b"v" * 50, partition=0,
                         on_delivery=lambda err, _m: err and errors.append(err))
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0 and not errors, errors[:3]
    name = "kafka_log_logcleaner_"

    def cleaned():
        # Segments roll by time on the next append; the active one is never cleaned.
        producer.produce(topic, key=b"tick", value=b"t", partition=0)
        producer.flush(10)
        s = scrape(address)
        return value(s, f"{name}bytes_read_total") > 100_000 and s

    samples = wait_for(cleaned, 60, "the 3,000 records' segments cleaned", interval_s=0.5)
    assert value(samples, f"{name}cleans_total") >= 1
    read = value(samples, f"{name}bytes_read_total")
    written = value(samples, f"{name}bytes_written_total")
    assert 0 < written < read, (written, read)
    # The last clean may have found little left to remove: at most all of it recopied.
    assert 0 < value(samples, f"{name}cleaner_recopy_percent") <= 100
    assert value(samples, f"{name}max_clean_time_seconds") > 0
    assert 0 <= value(samples, "kafka_log_logcleanermanager_max_dirty_percent") <= 100
    assert value(samples, "kafka_log_logcleanermanager_time_since_last_run_seconds") >= 0


def test_produce_fsync_waits_are_timed(rill_factory):
    """A topic with flush.messages=1 fsyncs before each produce is answered: each such
    request's wait is counted in the flush histogram; a topic without it adds nothing."""
    rill = rill_factory(overrides=HTTP_ON)
    address = rill.http_address()
    name = "kafka_log_logflushstats_produce_fsync_wait_seconds"
    plain, synced = unique_topic("unsynced"), unique_topic("synced")
    create_topic(rill.bootstrap, plain, 1)
    create_topic(rill.bootstrap, synced, 1, {"flush.messages": "1"})
    before = scrape(address)
    produce(rill.bootstrap, plain, 0, 200, 100)
    after_plain = scrape(address)
    assert value(after_plain, f"{name}_count") == value(before, f"{name}_count")
    produce(rill.bootstrap, synced, 0, 200, 100)

    def counts():
        samples = scrape(address)
        requests = value(samples, f"{name}_count") - value(after_plain, f"{name}_count")
        produced = (value(samples, "kafka_network_requestmetrics_requests_total", request="Produce")
                    - value(after_plain, "kafka_network_requestmetrics_requests_total", request="Produce"))
        return samples, requests, produced

    # A request is counted once its response is written, which the client can see first:
    # the last one's count may trail the producer's return by a moment.
    deadline = time.monotonic() + 10
    samples, requests, produced = counts()
    while requests > produced and time.monotonic() < deadline:
        time.sleep(0.1)
        samples, requests, produced = counts()
    assert 1 <= requests <= produced, (requests, produced)
    assert value(samples, f"{name}_sum") > value(after_plain, f"{name}_sum")


def test_every_apis_errors_and_each_responses_throttle_are_counted(rill_factory):
    rill = rill_factory(overrides=HTTP_ON)
    address = rill.http_address()
    topic = unique_topic("errors")
    create_topic(rill.bootstrap, topic, 1)
    admin = AdminClient({"bootstrap.servers": rill.bootstrap})
    errors = "kafka_network_requestmetrics_errors_total"
    before = scrape(address)
    for _ in range(2):
        try:
            admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=10)
            raise AssertionError("a second creation of the topic succeeded")
        except KafkaException as e:
            assert e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS, e
    missing = unique_topic("missing")
    try:
        admin.delete_topics([missing], operation_timeout=10)[missing].result(timeout=10)
        raise AssertionError("deleting a topic that does not exist succeeded")
    except KafkaException as e:
        assert e.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, e
    after = scrape(address)

    def grew(api, error):
        return (value(after, errors, request=api, error=error)
                - value(before, errors, request=api, error=error))

    assert grew("CreateTopics", "TOPIC_ALREADY_EXISTS") == 2
    assert grew("DeleteTopics", "UNKNOWN_TOPIC_OR_PARTITION") == 1

    # A hundredth of a percent of a thread: the client's Metadata requests are throttled.
    rill_quota(rill.bootstrap, "set", "--client-id", "busy", "request_percentage=0.01")
    throttle = "kafka_network_requestmetrics_throttle_time_seconds"
    start = scrape(address)
    throttles = []
    while len(throttles) < 500 and sum(throttles) < 2000:
        throttles.append(metadata_throttle_ms(rill.bootstrap, "busy"))
    assert max(throttles) > 0, throttles
    # A request's figures are taken just after its response is written.
    end = wait_for(lambda: (s := scrape(address))
                   and value(s, f"{throttle}_count", request="Metadata")
                   - value(start, f"{throttle}_count", request="Metadata") >= len(throttles)
                   and s, 10, "every throttled request counted")
    told_s = sum(throttles) / 1000
    held_s = (value(end, f"{throttle}_sum", request="Metadata")
              - value(start, f"{throttle}_sum", request="Metadata"))
    # Each response's throttle_time_ms is its throttle in whole milliseconds.
    assert told_s <= held_s < told_s + len(throttles) / 1000, (told_s, held_s)


def test_fetcher_failures_and_quorum_lag_show_when_a_leader_dies(rill_cluster_factory):
    cluster = rill_cluster_factory(overrides=HTTP_ON)
    topic = unique_topic("fetchers")
    client = create_replicated_topic(cluster.bootstrap, topic, 3, 3)
    controller_id = client.describe_cluster().result(timeout=10).controller.id
    fetch = "kafka_server_fetcherstats_"
    controller_page = cluster.node(controller_id).http_address()
    lag = "kafka_server_raft_metrics_replica_lag"

    def voters_caught_up():
        s = scrape(controller_page)
        return all((lag, frozenset({"replica": str(n), "role": "voter"}.items())) in s
                   and value(s, lag, replica=str(n), role="voter") == 0 for n in (1, 2, 3))

    wait_for(voters_caught_up, 30, "every voter's metadata lag at zero on the controller")
    for other in (1, 2, 3):
        if other != controller_id:
            assert lag not in {name for name, _ in scrape(cluster.node(other).http_address())}
    # The victim leads a partition and is not the controller, and is picked just before
    # the kill: on a loaded machine leaderships can move for a moment (a late heartbeat),
    # and a follower whose fetcher to the victim is gone has nothing that could fail.
    victim = wait_for(lambda: next((i for i in sorted({leader_of(client, topic, p) for p in range(3)})
                                    if i != controller_id), None),
                      30, "a partition led by a node that is not the controller")
    # Every partition has three replicas, so every other node follows the victim.
    follower = next(i for i in (1, 2, 3) if i not in (victim, controller_id))
    follower_page = cluster.node(follower).http_address()
    before = wait_for(lambda: (s := scrape(follower_page))
                      and value(s, f"{fetch}requests_total") > 0 and s,
                      30, "the follower's fetchers counting their requests")

    cluster.node(victim).kill9()

    def failed():
        s = scrape(follower_page)
        return sum(value(s, f"{fetch}{c}_total") - value(before, f"{fetch}{c}_total")
                   for c in ("request_failures", "connect_failures")) > 0

    wait_for(failed, 30, "the follower's fetcher to the killed leader counting a failure")
    # The victim's death is recorded (fenced, leaders elected) without it.
    wait_for(lambda: value(scrape(controller_page), lag, replica=str(victim), role="voter") > 0,
             30, "the killed voter's metadata lag above zero")
    age = "kafka_server_raft_metrics_replica_last_fetch_age_seconds"
    wait_for(lambda: value(scrape(controller_page), age, replica=str(victim), role="voter") > 1,
             30, "the killed voter's last contact growing old")
    s = scrape(controller_page)
    assert value(s, lag, replica=str(follower), role="voter") == 0 or wait_for(
        lambda: value(scrape(controller_page), lag, replica=str(follower), role="voter") == 0,
        30, "the live follower's lag back at zero")


def test_the_request_byte_pool_counts_frames_being_read_not_produces_waiting_for_replicas(
        rill_cluster_factory):
    """queued.max.request.bytes (MemoryPoolUsed) holds a frame's bytes from its size
    prefix on, before its body has come. A produce that has appended and waits for a
    frozen follower (acks=all) has given them back, as Kafka releases a request's buffer
    when its handler returns, before the purgatory: a produce waiting for its replicas
    must not keep the followers' fetches out of the pool."""
    cluster = rill_cluster_factory(overrides={**HTTP_ON, "replica.lag.time.max.ms": "60000"})
    topic = unique_topic("pool")
    client = create_replicated_topic(cluster.bootstrap, topic, 1, 3)
    leader_id = leader_of(client, topic, 0)
    leader = cluster.node(leader_id)
    address = leader.http_address()
    used = "kafka_network_socketserver_memory_pool_used_bytes"
    available = "kafka_network_socketserver_memory_pool_available_bytes"
    idle = scrape(address)
    assert value(idle, used) + value(idle, available) == 104_857_600

    # A connection that has been answered once (so its frames are charged to the pool)
    # sends the size prefix of a 1 MB frame and a few bytes of it.
    host, port = leader.bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        header = struct.pack(">hhi", 18, 0, 1) + struct.pack(">h", 4) + b"pool"
        sock.sendall(struct.pack(">i", len(header)) + header)
        size = struct.unpack(">i", read_exact(sock, 4))[0]
        read_exact(sock, size)
        sock.sendall(struct.pack(">i", 1_000_000) + b"\0" * 100)
        held = wait_for(lambda: (s := scrape(address)) and value(s, used) >= 1_000_000 and s,
                        30, "the frame's bytes in the pool while it is read")
        assert value(held, available) == 104_857_600 - value(held, used)
    wait_for(lambda: value(scrape(address), used) < 1_000_000, 30,
             "the bytes given back when the connection closed")

    follower = cluster.node(next(i for i in (1, 2, 3) if i != leader_id))
    follower._signal_group(signal.SIGSTOP)
    try:
        producer = Producer({"bootstrap.servers": leader.bootstrap, "acks": "all",
                             "compression.type": "none", "message.max.bytes": 2_000_000})
        delivered = []
        producer.produce(topic, value=b"p" * 1_000_000, partition=0,
                         on_delivery=lambda err, _m: delivered.append(err))
        producer.poll(0)
        segment = leader.data_dir / f"{topic}-0" / "00000000000000000000.log"
        wait_for(lambda: segment.exists() and segment.stat().st_size > 1_000_000, 30,
                 "the record appended on the leader")
        waiting = scrape(address)
        producer.poll(0.5)
        assert not delivered, "answered although a follower is frozen"
        assert value(waiting, used) < 1_000_000, value(waiting, used)
    finally:
        follower._signal_group(signal.SIGCONT)
    assert producer.flush(60) == 0 and delivered == [None], delivered


def test_segment_rolls_are_timed_as_flushes_and_retention_deletions_counted(rill_factory):
    """With the default flush policy (the page cache's) the only log flushes are the
    rolls: one per segment after the first. Retention deletes whole segments, and what it
    counts is exactly what left the disk."""
    rill = rill_factory(overrides={**HTTP_ON, "log.retention.check.interval.ms": "200"})
    address = rill.http_address()
    topic = unique_topic("retention")
    create_topic(rill.bootstrap, topic, 1,
                 {"segment.bytes": "20000", "retention.bytes": "60000"})
    flushes = "kafka_log_logflushstats_log_flush_seconds"
    before = scrape(address)
    # Batches well below a segment, so that every segment holds several.
    producer = Producer({"bootstrap.servers": rill.bootstrap, "acks": "all",
                         "linger.ms": 5, "batch.size": 4000, "compression.type": "none"})
    for i in range(2000):
        producer.produce(topic, value=(b"%08d" % i).ljust(200, b"x"), partition=0)
    assert producer.flush(60) == 0
    part = rill.data_dir / f"{topic}-0"

    def settled():
        s = scrape(address)
        logs = list(part.glob("*.log"))
        rolls = value(s, f"{flushes}_count") - value(before, f"{flushes}_count")
        deleted = value(s, "kafka_log_retention_deleted_segments_total")
        # Retention keeps at most retention.bytes plus the active segment.
        return (deleted > 0 and rolls + 1 - deleted == len(logs) and len(logs) <= 5
                and (s, logs, rolls, deleted))

    s, logs, rolls, deleted = wait_for(settled, 30, "the rolls and the deletions counted")
    assert rolls >= 20  # 400 KB of records in 20 KB segments
    assert value(s, f"{flushes}_sum") > 0
    bytes_in = value(s, "kafka_server_brokertopicmetrics_topic_bytes_in_total", topic=topic)
    kept = sum(p.stat().st_size for p in logs)
    assert value(s, "kafka_log_retention_deleted_bytes_total") == bytes_in - kept
