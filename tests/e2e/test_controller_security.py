"""The controller quorum over TLS and SASL (issue #17): `CONTROLLER:SSL` and
`CONTROLLER:SASL_SSL` in `listener.security.protocol.map`.

Each test starts a real cluster whose controller listener (the quorum's Raft, forwarded
controller requests and observers' joins) demands TLS with a client certificate, or TLS
then SASL PLAIN as a super user, and shows that the quorum elects, metadata flows
(topics created, produced to and consumed from), the active controller fails over, and
that the controller port refuses whoever cannot pass what it demands. The probes speak
the quorum's own RPC (a DescribeQuorum frame) so that each refusal is checked against a
dial that passes and gets an answer.
"""

from __future__ import annotations

import socket
import subprocess
import ssl
import struct
import uuid
from pathlib import Path

import trustme
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import CLUSTER_OVERRIDES
from kafka_helpers import wait_for
from rill_harness import RillCluster

# The quorum RPC frame of `RpcRequest::DescribeQuorum` (postcard: the variant's index),
# and the index of its answer in `RpcResponse`.
DESCRIBE_QUORUM = struct.pack(">I", 1) + bytes([6])
DESCRIBE_QUORUM_ANSWER = 6
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
SASL_AUTHENTICATION_FAILED = 58
CONTROLLER_PASSWORD = "controller-secret"


def certificates(workdir: Path) -> tuple[Path, Path]:
    """A CA and one keystore (key and chain, PEM) that every node uses; the certificate
    names 127.0.0.1, where the voters are dialed."""
    workdir.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA(organization_name="Rill controller test CA")
    ca_path = workdir / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    keystore = workdir / "node-keystore.pem"
    ca.issue_cert("127.0.0.1", "localhost", common_name="controller").private_key_and_cert_chain_pem.write_to_path(
        str(keystore)
    )
    return ca_path, keystore


def tls_overrides(ca: Path, keystore: Path, protocol: str) -> dict[str, str]:
    return {
        **CLUSTER_OVERRIDES,
        "listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,CONTROLLER:{protocol}",
        "listener.name.controller.ssl.keystore.type": "PEM",
        "listener.name.controller.ssl.keystore.location": str(keystore),
        "listener.name.controller.ssl.truststore.location": str(ca),
        "listener.name.controller.ssl.client.auth": "required",
    }


def controller_port(cluster: RillCluster, node_id: int) -> int:
    voters = cluster.node(node_id).extra_args
    listen = voters[voters.index("--controller-listen") + 1]
    return int(listen.rsplit(":", 1)[1])


def read_exact(sock, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


def describe_quorum_answered(sock) -> bool:
    """Sends DescribeQuorum on `sock`: whether an answer came (False: the node closed)."""
    try:
        sock.sendall(DESCRIBE_QUORUM)
        size = struct.unpack(">I", read_exact(sock, 4))[0]
        payload = read_exact(sock, size)
    except (ConnectionError, OSError, ssl.SSLError):
        return False
    return payload[:1] == bytes([DESCRIBE_QUORUM_ANSWER])


def tls_dial(port: int, ca: Path, client_cert: Path | None) -> ssl.SSLSocket:
    ctx = ssl.create_default_context(cafile=str(ca))
    if client_cert is not None:
        ctx.load_cert_chain(str(client_cert))
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    sock.settimeout(10)
    return sock


def kstring(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def kafka_call(sock, api_key: int, version: int, correlation: int, body: bytes) -> bytes:
    header = struct.pack(">hhi", api_key, version, correlation) + kstring("probe")
    sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
    size = struct.unpack(">i", read_exact(sock, 4))[0]
    return read_exact(sock, size)[4:]  # after the correlation id


def sasl_plain(sock, user: str, password: str) -> int:
    """SaslHandshake v1 then SaslAuthenticate v0 with PLAIN: the authenticate error code."""
    handshake = kafka_call(sock, SASL_HANDSHAKE, 1, 1, kstring("PLAIN"))
    assert struct.unpack(">h", handshake[:2])[0] == 0, "PLAIN is enabled"
    token = b"\0" + user.encode() + b"\0" + password.encode()
    answer = kafka_call(sock, SASL_AUTHENTICATE, 0, 2, struct.pack(">i", len(token)) + token)
    return struct.unpack(">h", answer[:2])[0]


def wait_for_controller(admin: AdminClient, not_in: tuple[int, ...] = (-1,)) -> int:
    found: list[int] = []

    def elected() -> bool:
        c = admin.list_topics(timeout=5).controller_id
        found[:] = [c]
        return c not in not_in

    wait_for(elected, 60, "an active controller")
    return found[0]


def round_trip(bootstrap: str, count: int = 30) -> None:
    """Creates a replicated topic, produces `count` records with acks=all and reads them
    back: the controller decided, and every node applied it."""
    topic = f"ctl-sec-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, 2, 3)], operation_timeout=30).values():
        f.result(timeout=60)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "message.timeout.ms": 60_000})
    errors: list = []
    for i in range(count):
        producer.produce(topic, f"v{i}".encode(), on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(90) == 0
    assert errors == [None] * count
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}",
                         "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        got: list[bytes] = []

        def read() -> bool:
            msg = consumer.poll(1.0)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
            return len(got) >= count

        wait_for(read, 60, f"{count} records back from {topic}")
        assert sorted(got) == sorted(f"v{i}".encode() for i in range(count))
    finally:
        consumer.close()


def fail_over(cluster: RillCluster, voters: tuple[int, ...]) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    old = wait_for_controller(admin)
    assert old in voters
    cluster.node(old).kill9()
    survivors = AdminClient({"bootstrap.servers": cluster.running_bootstrap()})
    new = wait_for_controller(survivors, (-1, old))
    assert new in voters and new != old
    # A new topic needs the new controller, and its records two live replicas.
    topic = f"after-failover-{uuid.uuid4().hex[:8]}"
    for f in survivors.create_topics([NewTopic(topic, 1, 2)], operation_timeout=30).values():
        f.result(timeout=60)
    producer = Producer({"bootstrap.servers": cluster.running_bootstrap(), "acks": "all",
                         "message.timeout.ms": 60_000})
    errors: list = []
    producer.produce(topic, b"after", on_delivery=lambda err, msg: errors.append(err))
    assert producer.flush(90) == 0 and errors == [None]


def test_the_quorum_runs_over_mtls_and_refuses_other_dials(tmp_path):
    ca, keystore = certificates(tmp_path / "tls")
    cluster = RillCluster(tmp_path / "cluster", 4, tls_overrides(ca, keystore, "SSL"),
                          roles={4: "broker"})
    try:
        cluster.start()
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        wait_for_controller(admin)
        # The broker-only node follows the log as an observer: the controllers dial its
        # controller port over TLS too. Metadata through it alone shows it applied.
        round_trip(cluster.node(4).bootstrap)
        round_trip(cluster.bootstrap)

        port = controller_port(cluster, 1)
        # With the node's certificate, the quorum answers.
        with tls_dial(port, ca, keystore) as sock:
            assert describe_quorum_answered(sock), "a dial with the certificate is answered"
        # Plaintext: the TLS accept fails on the frame and closes, answering nothing.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.settimeout(10)
            assert not describe_quorum_answered(sock), "a plaintext dial is refused"
        # TLS without a client certificate (ssl.client.auth=required): refused.
        try:
            with tls_dial(port, ca, None) as sock:
                answered = describe_quorum_answered(sock)
        except (ssl.SSLError, OSError):
            answered = False
        assert not answered, "a TLS dial without a certificate is refused"

        fail_over(cluster, (1, 2, 3))
    finally:
        problems = cluster.teardown()
    assert not problems, problems


def test_the_quorum_runs_over_sasl_ssl_and_refuses_who_is_not_a_controller(tmp_path):
    ca, keystore = certificates(tmp_path / "tls")
    overrides = tls_overrides(ca, keystore, "SASL_SSL")
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        f'username="controller" password="{CONTROLLER_PASSWORD}" '
        f'user_controller="{CONTROLLER_PASSWORD}" user_intruder="intruder-secret";'
    )
    overrides.update({
        # The client and inter-broker listener stays PLAINTEXT (its principal,
        # ANONYMOUS, a super user); the controller listener's peers must log in as
        # User:controller, the other super user.
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:controller;User:ANONYMOUS",
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.ssl.client.auth": "none",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": jaas,
    })
    cluster = RillCluster(tmp_path / "cluster", 3, overrides)
    try:
        cluster.start()
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        wait_for_controller(admin)
        round_trip(cluster.bootstrap)

        port = controller_port(cluster, 2)
        with tls_dial(port, ca, None) as sock:
            assert sasl_plain(sock, "controller", CONTROLLER_PASSWORD) == 0
            assert describe_quorum_answered(sock), "the controller login is answered"
        # TLS but no SASL: the RPC frame is not a SASL request; closed.
        with tls_dial(port, ca, None) as sock:
            assert not describe_quorum_answered(sock), "an unauthenticated dial is refused"
        with tls_dial(port, ca, None) as sock:
            assert sasl_plain(sock, "controller", "wrong") == SASL_AUTHENTICATION_FAILED
            assert not describe_quorum_answered(sock)
        # Authenticated, but not allowed CLUSTER_ACTION: closed after the exchange.
        with tls_dial(port, ca, None) as sock:
            try:
                sasl_plain(sock, "intruder", "intruder-secret")
            except ConnectionError:
                pass
            assert not describe_quorum_answered(sock), "a non-controller principal is refused"
        # Plaintext on the SASL_SSL port: refused.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.settimeout(10)
            assert not describe_quorum_answered(sock)

        fail_over(cluster, (1, 2, 3))
    finally:
        problems = cluster.teardown()
    assert not problems, problems


def test_format_add_scram_gives_a_sasl_ssl_only_cluster_its_inter_broker_login(tmp_path):
    """Clients and brokers on SASL_SSL, the quorum on SASL_SSL with SCRAM: the logins,
    SCRAM-SHA-512 as User:broker between brokers and SCRAM-SHA-256 as User:controller on
    the quorum, exist only because `rill format --add-scram` put them in each node's data
    directory. Without them the quorum could not form (its SCRAM logins need a
    credential before the log can hold one) and no follower could fetch (the
    inter-broker test shows the ISR staying short until the user is created)."""
    from rill_harness import rill_binary
    from test_inter_broker_security import BROKER_PASSWORD, InterBrokerCluster, consume_all, produce

    c = InterBrokerCluster(tmp_path / "ib", super_users="User:admin;User:broker;User:controller")
    ca, keystore = c.ca_path, tmp_path / "ib" / "broker-keystore.pem"
    jaas = (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="controller" password="{CONTROLLER_PASSWORD}";'
    )
    for node in c.cluster.nodes.values():
        node.overrides.update({
            "listener.security.protocol.map": "CLIENT:SASL_SSL,INTERNAL:SASL_SSL,CONTROLLER:SASL_SSL",
            "listener.name.controller.ssl.keystore.type": "PEM",
            "listener.name.controller.ssl.keystore.location": str(keystore),
            "listener.name.controller.ssl.truststore.location": str(ca),
            "sasl.mechanism.controller.protocol": "SCRAM-SHA-256",
            "listener.name.controller.sasl.enabled.mechanisms": "SCRAM-SHA-256",
            "listener.name.controller.scram-sha-256.sasl.jaas.config": jaas,
        })
        formatted = subprocess.run(
            [str(rill_binary()), "format", "--data-dir", str(node.data_dir),
             "--add-scram", f"SCRAM-SHA-512=[name=broker,password={BROKER_PASSWORD}]",
             "--add-scram", f"SCRAM-SHA-256=[name=controller,password={CONTROLLER_PASSWORD}]"],
            capture_output=True, text=True, timeout=60,
        )
        assert formatted.returncode == 0, formatted.stderr
    try:
        c.cluster.start()  # no AlterUserScramCredentials: the login comes from the format
        admin = c.admin()  # held until the futures resolve: a dropped client cancels them
        infos: list = []

        def written() -> bool:
            try:
                described = admin.describe_user_scram_credentials(["broker"])
                infos[:] = described["broker"].result(timeout=10).scram_credential_infos
            except Exception:  # RESOURCE_NOT_FOUND until the first node has written it
                return False
            return bool(infos)

        wait_for(written, 30, "User:broker's credential in the metadata log")
        assert [(i.mechanism.name, i.iterations) for i in infos] == [("SCRAM_SHA_512", 4096)]

        topic = "formatted-" + uuid.uuid4().hex[:8]
        group = "g-" + uuid.uuid4().hex[:6]
        c.create_topic(topic)
        c.allow_alice(topic, group)
        c.wait_for_full_isr(topic)
        values = [f"{topic}-{i}".encode() for i in range(100)]
        assert produce(c.conf("alice"), topic, values) == [None] * len(values)
        assert sorted(consume_all(c.conf("alice"), topic, group, len(values))) == sorted(values)

        # The quorum's SCRAM logins survive the loss of the active controller.
        fail_over_sasl = AdminClient(c.conf("admin"))
        old = wait_for_controller(fail_over_sasl)
        c.cluster.node(old).kill9()
        survivors = AdminClient({**c.conf("admin"), "bootstrap.servers": c.cluster.running_bootstrap()})
        assert wait_for_controller(survivors, (-1, old)) != old
        after = "after-" + uuid.uuid4().hex[:8]
        for f in survivors.create_topics([NewTopic(after, 1, 2)], operation_timeout=30).values():
            f.result(timeout=60)

        # A bad --add-scram is refused, naming what is wrong.
        bad = subprocess.run(
            [str(rill_binary()), "format", "--data-dir", str(tmp_path / "bad"), "--add-scram",
             "SCRAM-SHA-1=[name=x,password=y]"],
            capture_output=True, text=True, timeout=60,
        )
        assert bad.returncode == 1 and "SCRAM-SHA-256 or SCRAM-SHA-512" in bad.stderr
    finally:
        problems = c.cluster.teardown()
    assert not problems, problems
