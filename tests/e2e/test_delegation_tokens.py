"""Delegation tokens (KIP-48, issue #17) with `rill token` and tokens logging in over SCRAM.

Each server runs Kafka's `StandardAuthorizer` with a PLAINTEXT listener (the harness's;
`User:ANONYMOUS` is a super user there) and a SASL_PLAINTEXT listener with SCRAM, where
alice, bob and carol are SCRAM users made with `rill user create`. alice may read and write
the `dt-` topics and read the `dt-` groups; nobody else may. A token logs in with its id as
the SCRAM user name, its HMAC as the password and `tokenauth="true"` in `sasl.jaas.config`
(what Kafka's Java client does; librdkafka and kafka-python have no token login), so the
logins here are `rill`'s own client's.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest

from conftest import CLUSTER_OVERRIDES, DEFAULT_OVERRIDES
from kafka_helpers import create_topic
from rill_harness import RillCluster, RillServer, free_port, rill_binary

PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw"}
MECHANISM = "SCRAM-SHA-256"
SECRET = {"delegation.token.secret.key": "a-secret-every-node-shares"}
AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "super.users": "User:ANONYMOUS",
    "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
}


def with_sasl_listener(server: RillServer) -> int:
    port = free_port()
    server.overrides["listeners"] = (
        f"PLAINTEXT://127.0.0.1:{server.port},SASL_PLAINTEXT://127.0.0.1:{port}"
    )
    return port


def rill(bootstrap: str, *args: str, config: dict[str, str] | None = None,
         stdin: str | None = None) -> subprocess.CompletedProcess:
    cmd = [str(rill_binary()), *args, "-b", bootstrap]
    for key, value in (config or {}).items():
        cmd += ["-X", f"{key}={value}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, input=stdin)


def ok(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 0, out.stderr + out.stdout
    return out.stdout


def as_user(user: str) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": MECHANISM,
            "sasl.username": user, "sasl.password": PASSWORDS[user]}


def as_token(token: dict, hmac: str | None = None, mechanism: str = MECHANISM) -> dict[str, str]:
    password = hmac if hmac is not None else token["hmac"]
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
                            f'username="{token["token_id"]}" password="{password}" tokenauth="true";',
    }


def token_json(out: subprocess.CompletedProcess):
    lines = [line for line in ok(out).splitlines() if line.strip()]
    return json.loads(lines[-1])


def setup_users_and_acls(admin: str) -> None:
    for user, password in PASSWORDS.items():
        ok(rill(admin, "user", "create", user, "--password", password,
                "--mechanism", "SCRAM-SHA-256", "--mechanism", "SCRAM-SHA-512"))
    ok(rill(admin, "acl", "add", "--allow-principal", "User:alice", "--operation", "All",
            "--topic", "dt-", "--resource-pattern-type", "prefixed"))
    ok(rill(admin, "acl", "add", "--allow-principal", "User:alice", "--operation", "Read",
            "--group", "dt-", "--resource-pattern-type", "prefixed"))


def produce(bootstrap: str, topic: str, lines: list[str], config: dict[str, str]) -> subprocess.CompletedProcess:
    return rill(bootstrap, "produce", topic, config=config, stdin="\n".join(lines) + "\n")


def consume(bootstrap: str, topic: str, n: int, config: dict[str, str]) -> list[str]:
    out = ok(rill(bootstrap, "consume", topic, "--group", f"dt-{uuid.uuid4().hex[:6]}",
                  "--from-beginning", "--max-messages", str(n), config=config))
    return out.splitlines()


@pytest.fixture
def token_server(tmp_path):
    servers: list[RillServer] = []

    def start(extra: dict[str, str] | None = None) -> tuple[RillServer, str]:
        s = RillServer(tmp_path / f"dt{len(servers)}",
                       overrides={**DEFAULT_OVERRIDES, **AUTHORIZER, **(extra or {})})
        port = with_sasl_listener(s)
        servers.append(s)
        s.start()
        return s, f"127.0.0.1:{port}"

    yield start
    problems = []
    for s in servers:
        problems += s.teardown()
    assert not problems, problems


def test_a_token_logs_in_as_its_owner_and_is_renewed_described_and_expired(token_server):
    server, sasl = token_server(SECRET)
    admin = server.bootstrap
    setup_users_and_acls(admin)
    topic = "dt-" + uuid.uuid4().hex[:8]
    create_topic(admin, topic, partitions=1)

    # No token over PLAINTEXT (Kafka's allowTokenRequests), whoever asks.
    refused = rill(admin, "token", "create")
    assert refused.returncode != 0 and "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED" in refused.stderr, refused.stderr

    token = token_json(rill(sasl, "token", "create", "--renewer-principal", "User:bob",
                            "--output", "json", config=as_user("alice")))
    assert token["owner"] == "User:alice" and token["requester"] == "User:alice"
    assert token["expiry_timestamp_ms"] > time.time() * 1000
    assert token["max_timestamp_ms"] >= token["expiry_timestamp_ms"]

    # The token is alice: it may write and read her topic, with either SCRAM mechanism.
    ok(produce(sasl, topic, [f"by-token-{i}" for i in range(20)], as_token(token)))
    assert consume(sasl, topic, 20, as_token(token, mechanism="SCRAM-SHA-512")) == \
        [f"by-token-{i}" for i in range(20)]
    # bob has no ACL on the topic: his own login does not even see it; the token does.
    assert topic not in ok(rill(sasl, "topic", "list", config=as_user("bob"))).split()
    assert topic in ok(rill(sasl, "topic", "list", config=as_token(token))).split()
    # A wrong secret for the token's id, and the id without `tokenauth`, do not log in.
    for config in (as_token(token, hmac="AAAA" + token["hmac"][4:]),
                   {**as_user("alice"), "sasl.username": token["token_id"],
                    "sasl.password": token["hmac"]}):
        failed = rill(sasl, "topic", "list", config=config)
        assert failed.returncode != 0 and "uthentication" in failed.stderr, failed.stderr

    # A token cannot ask for tokens.
    refused = rill(sasl, "token", "create", config=as_token(token))
    assert "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED" in refused.stderr, refused.stderr

    # Describe: the owner and the renewer see it (with its secret); carol does not.
    for user in ("alice", "bob"):
        seen = token_json(rill(sasl, "token", "describe", "--output", "json", config=as_user(user)))
        assert [t["token_id"] for t in seen] == [token["token_id"]], user
        assert seen[0]["hmac"] == token["hmac"] and seen[0]["renewers"] == ["User:bob"]
    assert token_json(rill(sasl, "token", "describe", "--output", "json", config=as_user("carol"))) == []
    # ... unless an ACL lets her DESCRIBE it.
    ok(rill(admin, "acl", "add", "--allow-principal", "User:carol", "--operation", "Describe",
            "--delegation-token", token["token_id"]))
    seen = token_json(rill(sasl, "token", "describe", "--output", "json", config=as_user("carol")))
    assert [t["token_id"] for t in seen] == [token["token_id"]]

    # Renewal: carol may not, bob (a renewer) may; a shorter period moves the expiry.
    refused = rill(sasl, "token", "renew", "--hmac", token["hmac"], config=as_user("carol"))
    assert "DELEGATION_TOKEN_OWNER_MISMATCH" in refused.stderr, refused.stderr
    renewed = token_json(rill(sasl, "token", "renew", "--hmac", token["hmac"],
                              "--renew-time-period", "600000", "--output", "json", config=as_user("bob")))
    now_ms = time.time() * 1000
    assert now_ms < renewed["expiry_timestamp_ms"] <= now_ms + 600_000

    # The token survives a restart: it is in the metadata log.
    server.restart()
    assert consume(sasl, topic, 20, as_token(token)) == [f"by-token-{i}" for i in range(20)]

    # Expired by its owner, it no longer logs in, and no one sees it.
    ok(rill(sasl, "token", "expire", "--hmac", token["hmac"], config=as_user("alice")))
    failed = rill(sasl, "topic", "list", config=as_token(token))
    assert failed.returncode != 0, failed.stdout
    assert token_json(rill(sasl, "token", "describe", "--output", "json", config=as_user("alice"))) == []
    refused = rill(sasl, "token", "renew", "--hmac", token["hmac"], config=as_user("alice"))
    assert "DELEGATION_TOKEN_NOT_FOUND" in refused.stderr, refused.stderr


def test_a_token_past_its_lifetime_is_refused_and_swept(token_server):
    server, sasl = token_server({**SECRET, "delegation.token.expiry.check.interval.ms": "1000"})
    setup_users_and_acls(server.bootstrap)
    token = token_json(rill(sasl, "token", "create", "--max-life-time-period", "3000",
                            "--output", "json", config=as_user("alice")))
    assert token["max_timestamp_ms"] - token["issue_timestamp_ms"] == 3000
    assert token["expiry_timestamp_ms"] == token["max_timestamp_ms"]
    ok(rill(sasl, "topic", "list", config=as_token(token)))
    time.sleep(max(0.0, token["max_timestamp_ms"] / 1000 - time.time()) + 0.5)
    failed = rill(sasl, "topic", "list", config=as_token(token))
    assert failed.returncode != 0, "a token past its maximum lifetime logged in"
    # The controller's sweep (every second here) removes it from the metadata log.
    deadline = time.monotonic() + 10
    while token_json(rill(sasl, "token", "describe", "--output", "json", config=as_user("alice"))):
        assert time.monotonic() < deadline, "the expired token was never swept"
        time.sleep(0.3)


def test_without_a_secret_key_tokens_are_off(token_server):
    server, sasl = token_server()
    ok(rill(server.bootstrap, "user", "create", "alice", "--password", PASSWORDS["alice"],
            "--mechanism", MECHANISM))
    for args in (["token", "create"], ["token", "describe"],
                 ["token", "renew", "--hmac", "AAAA"]):
        refused = rill(sasl, *args, config=as_user("alice"))
        assert "DELEGATION_TOKEN_AUTH_DISABLED" in refused.stderr, (args, refused.stderr)


def test_a_token_made_on_one_node_logs_in_on_every_node(tmp_path):
    cluster = RillCluster(tmp_path / "cluster", 3, {**CLUSTER_OVERRIDES, **AUTHORIZER, **SECRET})
    sasl = {i: f"127.0.0.1:{with_sasl_listener(n)}" for i, n in cluster.nodes.items()}
    cluster.start()
    try:
        admin = cluster.bootstrap
        setup_users_and_acls(admin)
        topic = "dt-" + uuid.uuid4().hex[:8]
        create_topic(admin, topic, partitions=3, config=None)
        token = token_json(rill(sasl[1], "token", "create", "--output", "json",
                                config=as_user("alice")))
        for node, boot in sasl.items():
            deadline = time.monotonic() + 15
            while True:
                out = produce(boot, topic, [f"node-{node}"], as_token(token))
                if out.returncode == 0:
                    break
                assert time.monotonic() < deadline, f"node {node}: {out.stderr}"
                time.sleep(0.3)
        got = sorted(consume(sasl[3], topic, 3, as_token(token)))
        assert got == ["node-1", "node-2", "node-3"]
    finally:
        problems = cluster.teardown()
    assert not problems, problems
