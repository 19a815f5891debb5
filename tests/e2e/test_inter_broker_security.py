"""Replication and transaction markers over SASL_SSL between brokers (issue #17).

Three nodes, each with two SASL_SSL listeners: CLIENT (the harness's port, so the ready
line names it) and INTERNAL, the inter-broker listener, which also asks for a client
certificate (mTLS), so a broker must present its keystore when it dials another. The
authorizer is on and nothing is anonymous:

- on CLIENT, PLAIN users `admin` (a super user), `alice` (allowed to produce and consume
  one topic) and `mallory` (no ACL);
- on INTERNAL, SCRAM-SHA-512 only, as `User:broker`, a super user, which is how brokers
  get CLUSTER_ACTION for follower fetches and WriteTxnMarkers.

SCRAM credentials live in the metadata log, so the `broker` user cannot exist before the
cluster does. Kafka answers that with `kafka-storage format --add-scram`; here the admin
creates it with AlterUserScramCredentials right after the nodes start, and the fetchers,
which back off and retry a refused login, start replicating once it reached every node.
The controller quorum runs on its own plaintext listener, so the metadata (and with it
the credential) reaches every node without the inter-broker listener.
"""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path

import pytest
import trustme
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from conftest import CLUSTER_OVERRIDES
from kafka_helpers import wait_for
from rill_harness import RillCluster, free_port

CLIENT_USERS = {"admin": "admin-secret", "alice": "alice-secret", "mallory": "mallory-secret"}
BROKER_PASSWORD = "broker-secret"
PARTITIONS = 3


class InterBrokerCluster:
    """A three-node cluster whose client and inter-broker listeners are SASL_SSL."""

    def __init__(
        self,
        workdir: Path,
        broker_passwords: dict[int, str] | None = None,
        super_users: str = "User:admin;User:broker",
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.ca = trustme.CA(organization_name="Rill inter-broker test CA")
        self.ca_path = workdir / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_path))
        keystore = workdir / "broker-keystore.pem"
        self.ca.issue_cert("127.0.0.1", "localhost", common_name="broker").private_key_and_cert_chain_pem.write_to_path(
            str(keystore)
        )
        plain = "org.apache.kafka.common.security.plain.PlainLoginModule required " + " ".join(
            f'user_{u}="{p}"' for u, p in CLIENT_USERS.items()
        ) + ";"
        overrides = {
            **CLUSTER_OVERRIDES,
            "min.insync.replicas": "2",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": super_users,
            "listener.security.protocol.map": "CLIENT:SASL_SSL,INTERNAL:SASL_SSL",
            "inter.broker.listener.name": "INTERNAL",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "ssl.truststore.location": str(self.ca_path),
            "listener.name.client.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.client.plain.sasl.jaas.config": plain,
            "listener.name.internal.sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.internal.ssl.client.auth": "required",
        }
        self.cluster = RillCluster(workdir / "cluster", 3, overrides)
        self.internal_ports: dict[int, int] = {}
        for node_id, node in self.cluster.nodes.items():
            password = (broker_passwords or {}).get(node_id, BROKER_PASSWORD)
            internal = free_port()
            self.internal_ports[node_id] = internal
            node.overrides["listeners"] = (
                f"CLIENT://127.0.0.1:{node.port},INTERNAL://127.0.0.1:{internal}"
            )
            node.overrides["listener.name.internal.scram-sha-512.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="broker" password="{password}";'
            )

    def start(self) -> "InterBrokerCluster":
        self.cluster.start()
        admin = self.admin()
        upsert = UserScramCredentialUpsertion(
            "broker", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), BROKER_PASSWORD.encode()
        )
        for f in admin.alter_user_scram_credentials([upsert]).values():
            f.result(timeout=30)
        return self

    def conf(self, user: str, node_id: int | None = None, **extra) -> dict:
        """confluent-kafka settings for `user` on CLIENT (of one node, or of all)."""
        nodes = [node_id] if node_id is not None else list(self.cluster.nodes)
        return {
            "bootstrap.servers": ",".join(self.cluster.node(i).bootstrap for i in nodes),
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(self.ca_path),
            "sasl.mechanism": "PLAIN",
            "sasl.username": user,
            "sasl.password": CLIENT_USERS[user],
            "socket.timeout.ms": 10_000,
            **extra,
        }

    def admin(self) -> AdminClient:
        return AdminClient(self.conf("admin"))

    def isrs(self, topic: str) -> dict[int, tuple[int, set[int]]]:
        """{partition: (leader, isr)} as Metadata answers it."""
        md = self.admin().list_topics(topic=topic, timeout=10)
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            return {}
        return {p.id: (p.leader, set(p.isrs)) for p in t.partitions.values()}

    def wait_for_full_isr(self, topic: str, timeout_s: float = 60) -> None:
        def full() -> bool:
            isrs = self.isrs(topic)
            return len(isrs) == PARTITIONS and all(
                leader >= 0 and isr == {1, 2, 3} for leader, isr in isrs.values()
            )

        wait_for(full, timeout_s, f"every partition of {topic} with 3 in-sync replicas")

    def create_topic(self, topic: str) -> None:
        admin = self.admin()
        for f in admin.create_topics([NewTopic(topic, PARTITIONS, 3)]).values():
            f.result(timeout=30)

    def allow_alice(self, topic: str, group: str) -> None:
        def acl(rt, name, op, pattern=ResourcePatternType.LITERAL) -> AclBinding:
            return AclBinding(rt, name, pattern, "User:alice", "*", op, AclPermissionType.ALLOW)

        bindings = [
            acl(ResourceType.TOPIC, topic, AclOperation.WRITE),
            acl(ResourceType.TOPIC, topic, AclOperation.READ),
            acl(ResourceType.TOPIC, topic, AclOperation.DESCRIBE),
            acl(ResourceType.GROUP, group, AclOperation.READ, ResourcePatternType.PREFIXED),
            acl(ResourceType.TRANSACTIONAL_ID, "txn-", AclOperation.WRITE,
                ResourcePatternType.PREFIXED),
        ]
        admin = self.admin()  # held until the futures resolve: a dropped client cancels them
        for f in admin.create_acls(bindings).values():
            f.result(timeout=30)

        # Each node enforces the ACLs once it applied their records from the metadata log.
        # A new client's first Metadata goes to its only bootstrap node, so this asks each.
        def described_on(node_id: int) -> bool:
            md = AdminClient(self.conf("alice", node_id)).list_topics(topic=topic, timeout=5)
            t = md.topics.get(topic)
            return t is not None and t.error is None

        for node_id in self.cluster.nodes:
            wait_for(lambda: described_on(node_id), 30, f"node {node_id} to apply alice's ACLs")


def strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def produce(conf: dict, topic: str, values: list[bytes]) -> list:
    """acks=all; the delivery errors (None for each stored record)."""
    outcome: list = []
    producer = Producer({"acks": "all", "enable.idempotence": True, "message.timeout.ms": 60_000,
                         **conf})
    for i, v in enumerate(values):
        producer.produce(topic, v, partition=i % PARTITIONS,
                         on_delivery=lambda err, msg: outcome.append(err))
        producer.poll(0)
    assert producer.flush(90) == 0, "records still in flight"
    return outcome


def consume_all(conf: dict, topic: str, group: str, expected: int, timeout_s: float = 60) -> list[bytes]:
    consumer = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    try:
        consumer.subscribe([topic])
        got: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        while len(got) < expected and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=500, timeout=1.0):
                assert m.error() is None, f"consumer error: {m.error()}"
                got.append(m.value())
        return got
    finally:
        consumer.close()


@pytest.fixture
def inter_broker_cluster(tmp_path):
    started: list[InterBrokerCluster] = []

    def start(**kwargs) -> InterBrokerCluster:
        c = InterBrokerCluster(tmp_path / f"ib{len(started)}", **kwargs)
        started.append(c)
        return c.start()

    yield start
    problems = []
    for c in started:
        problems += c.cluster.teardown()
    if problems:
        pytest.fail("server problems at teardown:\n" + "\n".join(problems), pytrace=False)


def test_replication_over_sasl_ssl_with_scram_and_mtls(inter_broker_cluster):
    c = inter_broker_cluster()
    topic = "orders-" + uuid.uuid4().hex[:8]
    group = "billing-" + uuid.uuid4().hex[:6]
    c.create_topic(topic)
    c.allow_alice(topic, group)
    c.wait_for_full_isr(topic)
    for node in c.cluster.nodes.values():
        assert re.search(r'inter-broker listener.*listener\W*="INTERNAL".*protocol\W*="SASL_SSL"',
                         strip_ansi(node.log_text())), node.log_excerpt()

    values = [f"{topic}-{i}".encode() for i in range(300)]
    assert produce(c.conf("alice"), topic, values) == [None] * len(values)
    assert sorted(consume_all(c.conf("alice"), topic, group, len(values))) == sorted(values)
    c.wait_for_full_isr(topic)

    # A transaction over every partition: the coordinator writes its markers to leaders on
    # the other nodes with WriteTxnMarkers over SASL_SSL, as User:broker.
    txn = Producer({**c.conf("alice"), "transactional.id": "txn-" + uuid.uuid4().hex[:6],
                    "transaction.timeout.ms": 60_000})
    txn.init_transactions(60)
    txn.begin_transaction()
    committed = [f"{topic}-txn-{i}".encode() for i in range(30)]
    for i, v in enumerate(committed):
        txn.produce(topic, v, partition=i % PARTITIONS)
    txn.commit_transaction(60)
    values += committed
    assert sorted(consume_all(c.conf("alice", **{"isolation.level": "read_committed"}), topic,
                              group + "-txn", len(values))) == sorted(values)

    # A follower of partition 0 dies with kill -9; acks=all writes go on with the ISR that
    # is left (min.insync.replicas=2), then it restarts and catches up over SASL_SSL.
    leader0, _ = c.isrs(topic)[0]
    victim = next(i for i in (1, 2, 3) if i != leader0)
    c.cluster.node(victim).kill9()

    def victim_out() -> bool:
        isrs = c.isrs(topic)
        return len(isrs) == PARTITIONS and all(
            leader >= 0 and leader != victim and victim not in isr for leader, isr in isrs.values()
        )

    wait_for(victim_out, 60, f"node {victim} out of every ISR after kill -9")
    more = [f"{topic}-more-{i}".encode() for i in range(150)]
    survivors = [i for i in (1, 2, 3) if i != victim]
    conf = {**c.conf("alice"), "bootstrap.servers": ",".join(
        c.cluster.node(i).bootstrap for i in survivors)}
    assert produce(conf, topic, more) == [None] * len(more)
    c.cluster.start_node(victim)
    c.wait_for_full_isr(topic)
    assert sorted(consume_all(c.conf("alice"), topic, group + "-2", len(values) + len(more))) == sorted(
        values + more
    )
    restarted_log = c.cluster.node(victim).log_text()
    assert "authentication" not in restarted_log.split("start #2")[-1].lower(), restarted_log[-3000:]

    # Every node, alone as the bootstrap, refuses mallory.
    for node_id in (1, 2, 3):
        errors = produce(c.conf("mallory", node_id, **{"message.timeout.ms": 10_000}), topic, [b"x"])
        assert len(errors) == 1 and errors[0] is not None
        assert errors[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (node_id, errors)


def test_a_wrong_inter_broker_password_keeps_the_broker_out_of_the_isr(inter_broker_cluster):
    c = inter_broker_cluster(broker_passwords={3: "not-the-password"})
    topic = "wrong-" + uuid.uuid4().hex[:8]
    c.create_topic(topic)
    c.allow_alice(topic, "g")

    # Node 3 cannot log in to the others: every partition they lead leaves it out of its
    # ISR (once replica.lag.time.max.ms passed), while nodes 1 and 2 still follow node 3.
    def shrunk() -> bool:
        isrs = c.isrs(topic)
        return len(isrs) == PARTITIONS and all(
            leader >= 0 and (leader == 3 or 3 not in isr) for leader, isr in isrs.values()
        )

    wait_for(shrunk, 60, "node 3 out of the ISR of the partitions it does not lead")
    isrs = c.isrs(topic)
    assert any(leader != 3 for leader, _ in isrs.values()), isrs
    # Writes still succeed: the ISR left meets min.insync.replicas=2.
    values = [f"v{i}".encode() for i in range(30)]
    assert produce(c.conf("alice"), topic, values) == [None] * len(values)
    time.sleep(1)
    isrs = c.isrs(topic)
    assert all(leader == 3 or 3 not in isr for leader, isr in isrs.values()), isrs

    # Its log says why, naming the mechanism, the user and the server's answer.
    log = c.cluster.node(3).log_text()
    assert "cannot connect to the leader to replicate" in log, log[-3000:]
    assert 'SASL SCRAM-SHA-512 authentication as "broker"' in log, log[-3000:]
    assert "SASL_AUTHENTICATION_FAILED" in log, log[-3000:]


def test_brokers_without_cluster_action_do_not_replicate(inter_broker_cluster):
    # User:broker logs in, but is no super user and has no ACL: Kafka's follower fetch
    # needs CLUSTER_ACTION on the cluster, so every follower is refused and each ISR
    # shrinks to its leader; acks=all writes then fail min.insync.replicas=2.
    c = inter_broker_cluster(super_users="User:admin")
    topic = "noaction-" + uuid.uuid4().hex[:8]
    c.create_topic(topic)
    c.allow_alice(topic, "g")

    def leaders_alone() -> bool:
        isrs = c.isrs(topic)
        return len(isrs) == PARTITIONS and all(
            leader >= 0 and isr == {leader} for leader, isr in isrs.values()
        )

    wait_for(leaders_alone, 60, "every ISR shrunk to its leader")
    errors = produce(c.conf("alice", **{"message.timeout.ms": 5_000}), topic, [b"x"])
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() in (
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError._MSG_TIMED_OUT,
    ), errors
    # Each follower says why it cannot replicate.
    for node in c.cluster.nodes.values():
        log = strip_ansi(node.log_text())
        assert "TOPIC_AUTHORIZATION_FAILED" in log and "needs CLUSTER_ACTION" in log, log[-3000:]
