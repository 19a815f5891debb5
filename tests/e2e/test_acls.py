"""ACLs and the authorizer with real clients over SASL (issue #17, part 2).

Each server runs Kafka's `StandardAuthorizer` (`authorizer.class.name`) with two client
listeners: PLAINTEXT, the harness's and the admin's (its principal, `User:ANONYMOUS`, is
a super user here, as an operator's internal listener would be), and SASL_PLAINTEXT, where
the PLAIN users alice, bob and carol are judged by the ACLs and admin is a super user.
ACLs are added with `rill acl` on the PLAINTEXT listener and with confluent-kafka's
AdminClient; they live in the metadata log, so they survive a restart and every node of a
cluster enforces them.
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import (
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePatternFilter,
)
from kafka.admin import ResourceType as KpResourceType
from kafka.errors import (
    ClusterAuthorizationFailedError,
    GroupAuthorizationFailedError,
    SecurityDisabledError,
    TopicAuthorizationFailedError,
)

from conftest import CLUSTER_OVERRIDES, DEFAULT_OVERRIDES
from kafka_helpers import create_topic, read_all, unique_topic, wait_for_leaders
from rill_harness import RillCluster, RillServer, free_port, rill_binary
from test_security import recv_exact

USERS = {"alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret", "admin": "admin-secret"}
JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    + " ".join(f'user_{u}="{p}"' for u, p in USERS.items())
    + ";"
)
AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS;User:admin",
    "sasl.enabled.mechanisms": "PLAIN",
    "plain.sasl.jaas.config": JAAS,
}


def with_sasl_listener(server: RillServer) -> int:
    """Gives `server` a SASL_PLAINTEXT listener beside its PLAINTEXT one; returns its port."""
    port = free_port()
    server.overrides["listeners"] = (
        f"PLAINTEXT://127.0.0.1:{server.port},SASL_PLAINTEXT://127.0.0.1:{port}"
    )
    return port


class AclServer:
    def __init__(self, workdir: Path, extra: dict[str, str] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.server = RillServer(workdir, overrides={**DEFAULT_OVERRIDES, **AUTHORIZER, **(extra or {})})
        self.sasl_port = with_sasl_listener(self.server)

    @property
    def admin_bootstrap(self) -> str:
        return self.server.bootstrap

    def sasl(self, user: str, **extra) -> dict:
        return confluent_sasl(f"127.0.0.1:{self.sasl_port}", user, **extra)

    def kafka_python(self, user: str, **extra) -> dict:
        return {
            "bootstrap_servers": f"127.0.0.1:{self.sasl_port}",
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": user,
            "sasl_plain_password": USERS[user],
            "request_timeout_ms": 15_000,
            **extra,
        }


def confluent_sasl(bootstrap: str, user: str, **extra) -> dict:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": USERS[user],
        "socket.timeout.ms": 10_000,
        **extra,
    }


@pytest.fixture
def acl_server(tmp_path):
    started: list[AclServer] = []

    def start(extra: dict[str, str] | None = None) -> AclServer:
        s = AclServer(tmp_path / f"acl{len(started)}", extra)
        started.append(s)
        s.server.start()
        return s

    yield start
    problems = []
    for s in started:
        problems += s.server.teardown()
    if problems:
        pytest.fail("server problems at teardown:\n" + "\n".join(problems), pytrace=False)


def rill_acl(bootstrap: str, *args: str) -> list[dict]:
    """`rill acl ...` against `bootstrap`, its JSON output parsed."""
    out = subprocess.run(
        [str(rill_binary()), "acl", *args, "-b", bootstrap, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    lines = [line for line in out.stdout.splitlines() if line.strip()]
    return json.loads(lines[-1]) if lines else []


def values_of(bootstrap: str, topic: str, partitions: int = 1) -> list[bytes]:
    """Every value stored in the topic, read by the super user on PLAINTEXT."""
    stored = read_all(bootstrap, topic, partitions)
    return sorted(r.value for records in stored.values() for r in records.values())


def produce_one(conf: dict, topic: str, value: bytes) -> KafkaError | None:
    """One record with confluent-kafka; the delivery error, or None once stored."""
    outcome: list = []
    producer = Producer({**conf, "acks": "all", "message.timeout.ms": 10_000})
    producer.produce(topic, value, on_delivery=lambda err, msg: outcome.append(err))
    producer.flush(20)
    assert outcome, "no delivery report"
    return outcome[0]


def wait_for_acls(bootstrap: str, expected: int, timeout_s: float = 15.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        acls = rill_acl(bootstrap, "list")
        if len(acls) == expected or time.monotonic() > deadline:
            return acls
        time.sleep(0.2)


def test_prefixed_acl_lets_one_principal_produce_and_denies_another(acl_server):
    s = acl_server()
    eu, other = "orders-eu-" + uuid.uuid4().hex[:6], unique_topic("other")
    for t in (eu, other):
        create_topic(s.admin_bootstrap, t, partitions=1)
    added = rill_acl(
        s.admin_bootstrap, "add", "--allow-principal", "User:alice",
        "--operation", "Write", "--operation", "Describe",
        "--topic", "orders-", "--resource-pattern-type", "prefixed",
    )
    assert {(a["operation"], a["pattern_type"]) for a in added} == {
        ("WRITE", "PREFIXED"), ("DESCRIBE", "PREFIXED")}

    # confluent-kafka: alice writes under the prefix; bob and alice elsewhere are refused.
    assert produce_one(s.sasl("alice"), eu, b"from-alice") is None
    err = produce_one(s.sasl("bob"), eu, b"from-bob")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    err = produce_one(s.sasl("alice"), other, b"outside")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err

    # kafka-python likewise.
    kp = KafkaProducer(**s.kafka_python("alice"), acks="all")
    kp.send(eu, b"kp-alice").get(timeout=20)
    kp.close()
    kp_bob = KafkaProducer(**s.kafka_python("bob"), acks="all", max_block_ms=10_000)
    with pytest.raises(TopicAuthorizationFailedError):
        kp_bob.send(eu, b"kp-bob").get(timeout=20)
    kp_bob.close()

    # Only alice's records were stored (read as the super user).
    assert values_of(s.admin_bootstrap, eu) == [b"from-alice", b"kp-alice"]
    assert values_of(s.admin_bootstrap, other) == []


def test_consumer_without_read_on_its_group_gets_group_authorization_failed(acl_server):
    s = acl_server()
    topic, group = unique_topic("grp"), "g-" + uuid.uuid4().hex[:6]
    create_topic(s.admin_bootstrap, topic, partitions=1)
    assert produce_one({"bootstrap.servers": s.admin_bootstrap}, topic, b"v") is None
    rill_acl(s.admin_bootstrap, "add", "--allow-principal", "User:carol", "--operation", "Read",
             "--operation", "Describe", "--topic", topic)

    errors = []
    c = Consumer(s.sasl("carol", **{"group.id": group, "auto.offset.reset": "earliest"}))
    c.subscribe([topic], on_assign=lambda *_: None)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not errors:
        m = c.poll(0.5)
        if m is not None and m.error():
            errors.append(m.error())
    c.close()
    assert errors and errors[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED, errors

    kc = KafkaConsumer(topic, group_id=group, auto_offset_reset="earliest",
                       consumer_timeout_ms=10_000, **s.kafka_python("carol"))
    with pytest.raises(GroupAuthorizationFailedError):
        for _ in kc:
            break
    kc.close()

    # READ on the group: the same consumer joins and reads.
    rill_acl(s.admin_bootstrap, "add", "--allow-principal", "User:carol", "--operation", "Read",
             "--group", group)
    c = Consumer(s.sasl("carol", **{"group.id": group, "auto.offset.reset": "earliest"}))
    c.subscribe([topic])
    got = None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and got is None:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got = m.value()
    c.close()
    assert got == b"v"


def test_deny_beats_allow_and_super_users_bypass(acl_server):
    s = acl_server()
    topic, closed = unique_topic("deny"), unique_topic("closed")
    create_topic(s.admin_bootstrap, topic, partitions=1)
    create_topic(s.admin_bootstrap, closed, partitions=1)
    rill_acl(s.admin_bootstrap, "add", "--allow-principal", "User:*", "--operation", "All",
             "--topic", topic)
    rill_acl(s.admin_bootstrap, "add", "--deny-principal", "User:bob", "--operation", "Write",
             "--topic", topic)
    assert produce_one(s.sasl("alice"), topic, b"a") is None
    err = produce_one(s.sasl("bob"), topic, b"b")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    # A super user needs no ACL, and a DENY does not stop one either.
    rill_acl(s.admin_bootstrap, "add", "--deny-principal", "User:admin", "--operation", "All",
             "--topic", closed)
    assert produce_one(s.sasl("admin"), closed, b"root") is None
    # No ACL names `closed` for carol: allow.everyone.if.no.acl.found is false by default...
    err = produce_one(s.sasl("carol"), closed, b"c")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err
    assert values_of(s.admin_bootstrap, topic) == [b"a"]


def test_allow_everyone_if_no_acl_found_opens_only_resources_without_acls(acl_server):
    s = acl_server({"allow.everyone.if.no.acl.found": "true"})
    open_topic, guarded = unique_topic("open"), unique_topic("guarded")
    create_topic(s.admin_bootstrap, open_topic, partitions=1)
    create_topic(s.admin_bootstrap, guarded, partitions=1)
    rill_acl(s.admin_bootstrap, "add", "--allow-principal", "User:alice", "--operation", "Write",
             "--topic", guarded)
    assert produce_one(s.sasl("carol"), open_topic, b"x") is None
    err = produce_one(s.sasl("carol"), guarded, b"y")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, err


def test_metadata_hides_topics_the_principal_may_not_describe(acl_server):
    s = acl_server()
    seen, hidden = unique_topic("seen"), unique_topic("hidden")
    create_topic(s.admin_bootstrap, seen, partitions=2)
    create_topic(s.admin_bootstrap, hidden, partitions=1)
    rill_acl(s.admin_bootstrap, "add", "--allow-principal", "User:carol", "--operation", "Read",
             "--topic", seen)
    md = AdminClient(s.sasl("carol")).list_topics(timeout=15)
    assert seen in md.topics and hidden not in md.topics, sorted(md.topics)
    assert len(md.topics[seen].partitions) == 2
    # Asked by name, a hidden topic is TOPIC_AUTHORIZATION_FAILED, like one that does not
    # exist (the answer does not tell them apart).
    named = AdminClient(s.sasl("carol")).list_topics(topic=hidden, timeout=15)
    assert named.topics[hidden].error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    ghost = unique_topic("ghost")
    named = AdminClient(s.sasl("carol")).list_topics(topic=ghost, timeout=15)
    assert named.topics[ghost].error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    kc = KafkaConsumer(**s.kafka_python("carol"))
    assert seen in kc.topics() and hidden not in kc.topics()
    kc.close()
    # The super user sees both; the auto-creation of `ghost` was refused (no CREATE).
    all_topics = AdminClient({"bootstrap.servers": s.admin_bootstrap}).list_topics(timeout=15)
    assert {seen, hidden} <= set(all_topics.topics) and ghost not in all_topics.topics


def test_acls_survive_a_restart_and_the_cli_adds_lists_and_removes_them(acl_server):
    s = acl_server()
    topic = unique_topic("restart")
    create_topic(s.admin_bootstrap, topic, partitions=1)
    rill_acl(s.admin_bootstrap, "add", "--allow-principal", "User:alice", "--producer",
             "--topic", topic)
    rill_acl(s.admin_bootstrap, "add", "--allow-principal", "User:alice", "--consumer",
             "--topic", topic, "--group", "g1")
    listed = wait_for_acls(s.admin_bootstrap, 5)
    assert {(a["resource_type"], a["operation"]) for a in listed} == {
        ("TOPIC", "WRITE"), ("TOPIC", "DESCRIBE"), ("TOPIC", "CREATE"), ("TOPIC", "READ"),
        ("GROUP", "READ")}, listed

    s.server.restart()
    assert len(rill_acl(s.admin_bootstrap, "list")) == 5
    assert produce_one(s.sasl("alice"), topic, b"after-restart") is None
    err = produce_one(s.sasl("bob"), topic, b"x")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    # Filters: by resource, by principal; removal of exact bindings, then of all of a resource.
    assert len(rill_acl(s.admin_bootstrap, "list", "--group", "g1")) == 1
    assert rill_acl(s.admin_bootstrap, "list", "--principal", "User:bob") == []
    removed = rill_acl(s.admin_bootstrap, "remove", "--allow-principal", "User:alice",
                       "--operation", "Create", "--topic", topic)
    assert [a["operation"] for a in removed] == ["CREATE"]
    removed = rill_acl(s.admin_bootstrap, "remove", "--topic", topic)
    assert len(removed) == 3
    assert [a["resource_type"] for a in rill_acl(s.admin_bootstrap, "list")] == ["GROUP"]
    err = produce_one(s.sasl("alice"), topic, b"y")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_confluent_admin_creates_describes_and_deletes_acls(acl_server):
    s = acl_server()
    admin = AdminClient(s.sasl("admin"))
    bindings = [
        AclBinding(ResourceType.TOPIC, "pay-", ResourcePatternType.PREFIXED, "User:alice", "*",
                   AclOperation.READ, AclPermissionType.ALLOW),
        AclBinding(ResourceType.GROUP, "pay-group", ResourcePatternType.LITERAL, "User:alice",
                   "*", AclOperation.READ, AclPermissionType.ALLOW),
    ]
    for f in admin.create_acls(bindings).values():
        f.result(timeout=15)
    # MATCH finds the prefixed binding that applies to a topic of that prefix.
    match = AclBindingFilter(ResourceType.TOPIC, "pay-in", ResourcePatternType.MATCH, None, None,
                             AclOperation.ANY, AclPermissionType.ANY)
    found = admin.describe_acls(match).result(timeout=15)
    assert [(b.name, b.resource_pattern_type) for b in found] == [
        ("pay-", ResourcePatternType.PREFIXED)]
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    assert len(admin.describe_acls(everything).result(timeout=15)) == 2
    # A binding Kafka refuses: the Cluster resource has one name.
    bad = AclBinding(ResourceType.BROKER, "other", ResourcePatternType.LITERAL, "User:alice", "*",
                     AclOperation.ALTER, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as refused:
        list(admin.create_acls([bad]).values())[0].result(timeout=15)
    assert refused.value.args[0].code() == KafkaError.INVALID_REQUEST
    deleted = admin.delete_acls([everything]).values()
    assert sum(len(f.result(timeout=15)) for f in deleted) == 2
    assert admin.describe_acls(everything).result(timeout=15) == []
    # Alice may not touch ACLs: she lacks ALTER and DESCRIBE on the cluster. (librdkafka
    # drops DescribeAcls' error code and reports an empty list, so kafka-python checks it.)
    with pytest.raises(ClusterAuthorizationFailedError):
        kafka_python_admin(s.kafka_python("alice")).describe_acls(kp_everything())
    alice = AdminClient(s.sasl("alice"))
    with pytest.raises(KafkaException) as denied:
        list(alice.create_acls(bindings[:1]).values())[0].result(timeout=15)
    assert denied.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


def kafka_python_admin(conf: dict) -> KafkaAdminClient:
    return KafkaAdminClient(**conf)


def kp_everything() -> ACLFilter:
    return ACLFilter(principal=None, host=None, operation=ACLOperation.ANY,
                     permission_type=ACLPermissionType.ANY,
                     resource_pattern=ResourcePatternFilter(KpResourceType.ANY, None,
                                                            ACLResourcePatternType.ANY))


def test_without_an_authorizer_acl_apis_answer_security_disabled(rill):
    with pytest.raises(SecurityDisabledError):
        kafka_python_admin({"bootstrap_servers": rill.bootstrap}).describe_acls(kp_everything())
    admin = AdminClient({"bootstrap.servers": rill.bootstrap})
    binding = AclBinding(ResourceType.TOPIC, "t", ResourcePatternType.LITERAL, "User:a", "*",
                         AclOperation.READ, AclPermissionType.ALLOW)
    with pytest.raises(KafkaException) as e:
        list(admin.create_acls([binding]).values())[0].result(timeout=15)
    assert e.value.args[0].code() == KafkaError.SECURITY_DISABLED


# ---- follower fetches only from brokers (CVE-2018-1288) ----

def fetch_v4(sock: socket.socket, topic: str, replica_id: int) -> int:
    """A Fetch v4 (non-flexible) naming `replica_id`; returns partition 0's error code."""
    name = topic.encode()
    body = struct.pack(">iiiib", replica_id, 100, 1, 1 << 20, 0)
    body += struct.pack(">i", 1) + struct.pack(">h", len(name)) + name
    body += struct.pack(">i", 1) + struct.pack(">iqi", 0, 0, 1 << 20)
    client = b"acl-test"
    header = struct.pack(">hhi", 1, 4, 7) + struct.pack(">h", len(client)) + client
    frame = header + body
    sock.sendall(struct.pack(">i", len(frame)) + frame)
    size = struct.unpack(">i", recv_exact(sock, 4))[0]
    resp = recv_exact(sock, size)
    # correlation id, throttle, [responses: topic name, [partition, error...]]
    off = 4 + 4 + 4
    (nlen,) = struct.unpack_from(">h", resp, off)
    off += 2 + nlen + 4
    _, error = struct.unpack_from(">ih", resp, off)
    return error


TOPIC_AUTHORIZATION_FAILED = 29


def acl_count_of(port: int) -> int:
    """How many ACLs one broker's DescribeAcls v1 (every binding) lists, by hand."""
    null = struct.pack(">h", -1)
    body = struct.pack(">b", 1) + null + struct.pack(">b", 1) + null + null + struct.pack(">bb", 1, 1)
    client = b"acl-test"
    header = struct.pack(">hhi", 29, 1, 9) + struct.pack(">h", len(client)) + client
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        resp = recv_exact(sock, struct.unpack(">i", recv_exact(sock, 4))[0])
    off = 4 + 4
    error, msg_len = struct.unpack_from(">hh", resp, off)
    assert error == 0, error
    off += 4 + max(msg_len, 0)
    count = 0

    def string(at: int) -> int:
        (n,) = struct.unpack_from(">h", resp, at)
        return at + 2 + max(n, 0)

    (resources,) = struct.unpack_from(">i", resp, off)
    off += 4
    for _ in range(resources):
        off = string(off + 1) + 1
        (acls,) = struct.unpack_from(">i", resp, off)
        off += 4
        for _ in range(acls):
            off = string(string(off)) + 2
            count += 1
    return count


def test_a_follower_fetch_from_a_client_is_refused(acl_server, tmp_path):
    # With an authorizer: CLUSTER_ACTION decides. ANONYMOUS is no super user here.
    s = acl_server({"super.users": "User:admin"})
    topic = unique_topic("cve")
    admin = AdminClient(s.sasl("admin"))
    from confluent_kafka.admin import NewTopic
    for f in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        f.result(timeout=15)
    time.sleep(0.5)
    with socket.create_connection(("127.0.0.1", s.server.port), timeout=10) as sock:
        assert fetch_v4(sock, topic, replica_id=2) == TOPIC_AUTHORIZATION_FAILED
    for f in admin.create_acls([AclBinding(
            ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:ANONYMOUS",
            "*", AclOperation.CLUSTER_ACTION, AclPermissionType.ALLOW)]).values():
        f.result(timeout=15)
    time.sleep(0.5)
    with socket.create_connection(("127.0.0.1", s.server.port), timeout=10) as sock:
        # Now let through to the replica checks: replica 2 follows nothing here.
        assert fetch_v4(sock, topic, replica_id=2) not in (0, TOPIC_AUTHORIZATION_FAILED)

    # Without an authorizer: only on the inter-broker listener.
    (tmp_path / "plain").mkdir()
    server = RillServer(tmp_path / "plain", overrides={
        **DEFAULT_OVERRIDES,
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
    })
    external = free_port()
    server.overrides["listeners"] = (
        f"PLAINTEXT://127.0.0.1:{server.port},EXTERNAL://127.0.0.1:{external}")
    server.start()
    try:
        create_topic(server.bootstrap, topic, partitions=1)
        with socket.create_connection(("127.0.0.1", external), timeout=10) as sock:
            assert fetch_v4(sock, topic, replica_id=2) == TOPIC_AUTHORIZATION_FAILED
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            assert fetch_v4(sock, topic, replica_id=2) not in (0, TOPIC_AUTHORIZATION_FAILED)
        # A consumer's fetch (replica id -1) on the external listener is served.
        with socket.create_connection(("127.0.0.1", external), timeout=10) as sock:
            assert fetch_v4(sock, topic, replica_id=-1) == 0
    finally:
        problems = server.teardown()
    assert not problems, problems


# ---- three nodes ----

def test_every_node_of_a_cluster_enforces_the_same_acls(tmp_path):
    cluster = RillCluster(tmp_path / "cluster", 3, {**CLUSTER_OVERRIDES, **AUTHORIZER})
    sasl_ports = {i: with_sasl_listener(n) for i, n in cluster.nodes.items()}
    cluster.start()
    try:
        admin_bootstrap = cluster.bootstrap
        topic = "team-a." + uuid.uuid4().hex[:6]
        from confluent_kafka.admin import NewTopic
        admin = AdminClient({"bootstrap.servers": admin_bootstrap})
        for f in admin.create_topics([NewTopic(topic, 3, 3)]).values():
            f.result(timeout=30)
        wait_for_leaders(admin, topic, 3)
        rill_acl(admin_bootstrap, "add", "--allow-principal", "User:alice", "--operation", "Write",
                 "--operation", "Describe", "--topic", "team-a.", "--resource-pattern-type",
                 "prefixed")
        # Each node lists the ACLs from its own image once it has applied their records.
        for node in cluster.nodes.values():
            deadline = time.monotonic() + 15
            while acl_count_of(node.port) != 2:
                assert time.monotonic() < deadline, f"node on {node.port} never had the ACLs"
                time.sleep(0.2)
        # Each node alone, as the client's only bootstrap, answers the same: alice may write
        # every partition (each led by some node), bob may not.
        for node_id, port in sasl_ports.items():
            boot = f"127.0.0.1:{port}"
            for p in range(3):
                outcome: list = []
                producer = Producer({**confluent_sasl(boot, "alice"), "acks": "all",
                                     "message.timeout.ms": 15_000})
                producer.produce(topic, f"{node_id}-{p}".encode(), partition=p,
                                 on_delivery=lambda err, msg: outcome.append(err))
                producer.flush(30)
                assert outcome == [None], (node_id, p, outcome)
            err = produce_one(confluent_sasl(boot, "bob"), topic, b"bob")
            assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
            # Metadata from every node hides the topic from bob alike.
            md = AdminClient(confluent_sasl(boot, "bob")).list_topics(timeout=15)
            assert topic not in md.topics
        # Replication kept working under the authorizer (acks=all needed every replica).
        assert len(values_of(admin_bootstrap, topic, 3)) == 9
    finally:
        problems = cluster.teardown()
    assert not problems, problems


def test_admin_requests_check_their_operations_and_report_authorized_operations(acl_server):
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicCollection
    from confluent_kafka.admin import ConfigResource, NewPartitions, NewTopic

    s = acl_server()
    topic, group = unique_topic("adm"), "g-" + uuid.uuid4().hex[:6]
    create_topic(s.admin_bootstrap, topic, partitions=1)
    # A group the super user made, with a committed offset.
    c = Consumer({"bootstrap.servers": s.admin_bootstrap, "group.id": group})
    c.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
    c.close()
    carol = AdminClient(s.sasl("carol"))

    def error_of(futures: dict) -> int | None:
        # (The dict must stay whole: confluent-kafka resolves its futures through it.)
        try:
            list(futures.values())[0].result(timeout=15)
        except KafkaException as e:
            return e.args[0].code()
        return None

    assert error_of(carol.create_topics([NewTopic(unique_topic("c"), 1, 1)])) \
        == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert error_of(carol.delete_topics([topic])) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert error_of(carol.create_partitions([NewPartitions(topic, 2)])) \
        == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert error_of(carol.describe_configs([ConfigResource("topic", topic)])) \
        == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert error_of(carol.describe_configs([ConfigResource("broker", "1")])) \
        == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert error_of(carol.describe_consumer_groups([group])) \
        == KafkaError.GROUP_AUTHORIZATION_FAILED
    assert error_of(carol.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group)])) == KafkaError.GROUP_AUTHORIZATION_FAILED
    listed = carol.list_consumer_groups().result(timeout=15)
    assert group not in {g.group_id for g in listed.valid}

    # KIP-430: what carol may do, as Metadata, DescribeGroups and DescribeCluster report it.
    rill_acl(s.admin_bootstrap, "add", "--allow-principal", "User:carol", "--operation", "Read",
             "--topic", topic)
    rill_acl(s.admin_bootstrap, "add", "--allow-principal", "User:carol", "--operation", "Describe",
             "--group", group)
    described = carol.describe_topics(TopicCollection([topic]),
                                      include_authorized_operations=True)[topic].result(timeout=15)
    assert set(described.authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE}
    g = carol.describe_consumer_groups([group], include_authorized_operations=True)[group] \
        .result(timeout=15)
    assert set(g.authorized_operations) == {AclOperation.DESCRIBE}
    cluster = carol.describe_cluster(include_authorized_operations=True).result(timeout=15)
    assert not cluster.authorized_operations
    root_admin = AdminClient(s.sasl("admin"))
    root = root_admin.describe_cluster(include_authorized_operations=True).result(timeout=15)
    assert AclOperation.CLUSTER_ACTION in root.authorized_operations
    assert len(root.authorized_operations) == 7
    assert group in {g.group_id for g in carol.list_consumer_groups().result(timeout=15).valid}
    # An idempotent producer needs IDEMPOTENT_WRITE on the cluster or WRITE on some topic
    # (Kafka's authorizeByResourceType); carol now may describe the topic, not write it.
    p = Producer(s.sasl("carol", **{"enable.idempotence": True}))
    p.produce(topic, b"x")
    with pytest.raises(KafkaException) as e:  # librdkafka raises its fatal error here
        p.flush(15)
    assert e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED, e.value
    assert e.value.args[0].fatal()
    tp = Producer(s.sasl("carol", **{"transactional.id": "tx-" + uuid.uuid4().hex[:6]}))
    with pytest.raises(KafkaException) as e:
        tp.init_transactions(15)
    assert e.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    rill_acl(s.admin_bootstrap, "add", "--allow-principal", "User:carol", "--operation", "Write",
             "--topic", topic)
    assert produce_one(s.sasl("carol", **{"enable.idempotence": True}), topic, b"idem") is None
