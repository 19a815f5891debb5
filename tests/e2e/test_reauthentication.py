"""SASL sessions that end (KIP-368) and OAUTHBEARER tokens (issue #17), with real clients.

A listener's `connections.max.reauth.ms` (per mechanism) bounds each SASL session, and an
OAUTHBEARER token's `exp` bounds it further. confluent-kafka (librdkafka re-authenticates
since 2.2) keeps one connection across several lifetimes by re-authenticating on it; a
client that does not re-authenticate is closed at its first request after the end.
OAUTHBEARER tokens are JWTs signed at test time (PyJWT) with a key whose public half is in
the broker's JWKS file, and handed to confluent-kafka by its `oauth_cb`.
"""

from __future__ import annotations

import json
import socket
import struct
import time
import uuid
from pathlib import Path

import jwt
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from kafka_helpers import create_topic, unique_topic
from test_metrics import scrape, value
from test_security import Pki, SecureServer, closed, kbytes, kstring, recv, send

LIFETIME_MS = 2000
REAUTH = {
    "listener.name.sasl_plaintext.plain.connections.max.reauth.ms": str(LIFETIME_MS),
    "http.listeners": "127.0.0.1:0",
    "http.authentication": "none",
}


@pytest.fixture
def servers(tmp_path):
    started: list[SecureServer] = []

    def start(extra: dict[str, str]) -> SecureServer:
        s = SecureServer(tmp_path / f"s{len(started)}", Pki(tmp_path), extra)
        started.append(s)
        return s.start()

    yield start
    problems = []
    for s in started:
        problems += s.server.teardown()
    if problems:
        pytest.fail("server problems at teardown:\n" + "\n".join(problems), pytrace=False)


def produce_for(conf: dict, topic: str, seconds: float) -> int:
    """Produces one record every 100 ms for `seconds` with one producer; returns how many
    were acknowledged, failing on any delivery error."""
    producer = Producer({**conf, "acks": "all", "linger.ms": 0})
    errors: list = []
    sent = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        producer.produce(topic, f"{topic}-{sent}".encode(), on_delivery=lambda e, m: e and errors.append(e))
        sent += 1
        producer.poll(0.1)
    assert producer.flush(30) == 0, "messages left unsent"
    assert not errors, errors
    return sent


def read_back(conf: dict, topic: str, count: int) -> list[bytes]:
    consumer = Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex[:6]}", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            m = consumer.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.value())
        return got
    finally:
        consumer.close()


def test_confluent_kafka_reauthenticates_on_its_connection_across_lifetimes(servers):
    s = servers(REAUTH)
    topic = unique_topic("reauth")
    create_topic(s.server.bootstrap, topic, partitions=1)
    creds = {"sasl.mechanism": "PLAIN", "sasl.username": "alice", "sasl.password": "alice-secret"}
    conf = s.confluent("SASL_PLAINTEXT", **creds)
    sent = produce_for(conf, topic, seconds=4 * LIFETIME_MS / 1000)
    assert read_back(conf, topic, sent) == [f"{topic}-{i}".encode() for i in range(sent)]
    samples = scrape(s.server.http_address())
    # Several lifetimes went by on the producer's connections: they were renewed in place,
    # not closed (librdkafka re-authenticates before the end).
    assert value(samples, "kafka_server_socketserver_successful_reauthentication_total") >= 2
    assert value(samples, "kafka_server_socketserver_expired_connections_killed_total") == 0


def sasl_plain_socket(bootstrap: str, user: str, password: str, authenticate_version: int) -> tuple[socket.socket, int]:
    """A connection authenticated with PLAIN over SaslHandshake v1 and SaslAuthenticate
    `authenticate_version`; returns it with the session lifetime the broker gave (v1+)."""
    host, port = bootstrap.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    send(sock, 17, 1, 1, kstring("PLAIN"))
    assert struct.unpack(">h", recv(sock)[4:6])[0] == 0
    send(sock, 36, authenticate_version, 2, kbytes(f"\0{user}\0{password}".encode()))
    answer = recv(sock)[4:]
    assert struct.unpack(">h", answer[:2])[0] == 0, answer
    lifetime = 0
    if authenticate_version >= 1:
        (message_len,) = struct.unpack(">h", answer[2:4])
        at = 4 + max(message_len, 0)
        (auth_len,) = struct.unpack(">i", answer[at:at + 4])
        (lifetime,) = struct.unpack(">q", answer[at + 4 + auth_len:at + 12 + auth_len])
    return sock, lifetime


def metadata_ok(sock: socket.socket, correlation_id: int) -> bool:
    """A Metadata v1 request for no topics answered on `sock`."""
    send(sock, 3, 1, correlation_id, struct.pack(">i", 0))
    try:
        return struct.unpack(">i", recv(sock)[:4])[0] == correlation_id
    except (ConnectionError, OSError):
        return False


def test_a_client_that_does_not_reauthenticate_is_closed_after_its_lifetime(servers):
    s = servers(REAUTH)
    bootstrap = s.bootstrap("SASL_PLAINTEXT")
    for version in (0, 1):
        sock, lifetime = sasl_plain_socket(bootstrap, "alice", "alice-secret", version)
        with sock:
            if version == 1:
                assert lifetime == LIFETIME_MS
            assert metadata_ok(sock, 10)
            time.sleep(LIFETIME_MS / 1000 + 0.5)
            # The session is over: the next request closes the connection unanswered.
            assert not metadata_ok(sock, 11)
            assert closed(sock)
    samples = scrape(s.server.http_address())
    assert value(samples, "kafka_server_socketserver_expired_connections_killed_total") == 2


def test_a_reauthentication_must_keep_its_principal(servers):
    s = servers(REAUTH)
    sock, _ = sasl_plain_socket(s.bootstrap("SASL_PLAINTEXT"), "alice", "alice-secret", 1)
    with sock:
        time.sleep(1.1)
        send(sock, 17, 1, 20, kstring("PLAIN"))
        assert struct.unpack(">h", recv(sock)[4:6])[0] == 0
        send(sock, 36, 1, 21, kbytes(b"\0bob\0bob-secret"))
        answer = recv(sock)[4:]
        assert struct.unpack(">h", answer[:2])[0] == 58  # SASL_AUTHENTICATION_FAILED
        assert closed(sock)


# --- OAUTHBEARER ------------------------------------------------------------------------

ISSUER = "https://issuer.rill.test"
AUDIENCE = "rill-brokers"


class Signer:
    """An RSA and an EC key, their public halves in a JWKS file, and tokens they sign."""

    def __init__(self, directory: Path) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        keys = []
        for kid, key, alg in (("rsa-1", self.rsa, "RS256"), ("ec-1", self.ec, "ES256")):
            jwk = json.loads(jwt.algorithms.get_default_algorithms()[alg].to_jwk(key.public_key()))
            keys.append({**jwk, "kid": kid, "use": "sig", "alg": alg})
        self.jwks = directory / "jwks.json"
        self.jwks.write_text(json.dumps({"keys": keys}))

    def token(self, sub: str, lifetime_s: int = 3600, kid: str = "rsa-1", **claims) -> str:
        now = int(time.time())
        body = {"sub": sub, "iss": ISSUER, "aud": AUDIENCE, "iat": now, "exp": now + lifetime_s,
                "scope": "kafka", **claims}
        key, alg = (self.rsa, "RS256") if kid == "rsa-1" else (self.ec, "ES256")
        return jwt.encode(body, key, algorithm=alg, headers={"kid": kid})


def oauth_server(servers, tmp_path: Path, extra: dict[str, str] | None = None) -> tuple[SecureServer, Signer]:
    signer = Signer(tmp_path)
    s = servers({
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "OAUTHBEARER,PLAIN",
        "listener.name.sasl_plaintext.sasl.oauthbearer.jwks.endpoint.url": f"file://{signer.jwks}",
        "listener.name.sasl_plaintext.sasl.oauthbearer.expected.issuer": ISSUER,
        "listener.name.sasl_plaintext.sasl.oauthbearer.expected.audience": AUDIENCE,
        **(extra or {}),
    })
    return s, signer


def oauth_conf(s: SecureServer, make_token) -> dict:
    def oauth_cb(_config):
        token = make_token()
        claims = jwt.decode(token, options={"verify_signature": False})
        return token, float(claims["exp"]), claims["sub"], {}

    return s.confluent("SASL_PLAINTEXT", **{"sasl.mechanism": "OAUTHBEARER", "oauth_cb": oauth_cb})


def test_oauthbearer_with_signed_tokens_produces_and_consumes(servers, tmp_path):
    s, signer = oauth_server(servers, tmp_path)
    topic = unique_topic("oauth")
    create_topic(s.server.bootstrap, topic, partitions=1)
    for kid in ("rsa-1", "ec-1"):
        conf = oauth_conf(s, lambda kid=kid: signer.token("svc-orders", kid=kid))
        sent = produce_for(conf, topic, seconds=1)
        assert sent > 0
    got = read_back(oauth_conf(s, lambda: signer.token("svc-orders")), topic, 1)
    assert got, "nothing read back over OAUTHBEARER"


@pytest.mark.parametrize("bad", ["wrong_audience", "wrong_issuer", "expired", "unknown_kid", "other_key", "none"])
def test_oauthbearer_refuses_tokens_that_do_not_validate(servers, tmp_path, bad):
    s, signer = oauth_server(servers, tmp_path)

    def make() -> str:
        if bad == "wrong_audience":
            return signer.token("mallory", aud="someone-else")
        if bad == "wrong_issuer":
            return signer.token("mallory", iss="https://evil.test")
        if bad == "expired":
            return signer.token("mallory", lifetime_s=-120)
        if bad == "unknown_kid":
            return jwt.encode({"sub": "mallory", "iss": ISSUER, "aud": AUDIENCE, "iat": int(time.time()),
                               "exp": int(time.time()) + 600}, signer.rsa, algorithm="RS256",
                              headers={"kid": "nope"})
        if bad == "other_key":
            other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            return jwt.encode({"sub": "mallory", "iss": ISSUER, "aud": AUDIENCE, "iat": int(time.time()),
                               "exp": int(time.time()) + 600}, other, algorithm="RS256",
                              headers={"kid": "rsa-1"})
        return jwt.encode({"sub": "mallory", "iss": ISSUER, "aud": AUDIENCE, "iat": int(time.time()),
                           "exp": int(time.time()) + 600}, None, algorithm="none")

    def oauth_cb(_config):
        # librdkafka wants a lifetime in the future whatever the token says.
        return make(), time.time() + 600, "mallory", {}

    errors: list[str] = []
    conf = s.confluent("SASL_PLAINTEXT", **{"sasl.mechanism": "OAUTHBEARER", "oauth_cb": oauth_cb,
                                            "error_cb": lambda e: errors.append(str(e))})
    admin = AdminClient(conf)
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=4)
    admin.poll(1)  # serves the error callbacks
    # The broker refused the token with RFC 6750's status, as Kafka does.
    assert any("SASL authentication error" in e and "invalid_token" in e for e in errors), errors


def test_an_oauthbearer_session_ends_with_its_token_and_a_new_token_renews_it(servers, tmp_path):
    s, signer = oauth_server(servers, tmp_path, {
        "listener.name.sasl_plaintext.oauthbearer.connections.max.reauth.ms": "3600000",
        "http.listeners": "127.0.0.1:0",
        "http.authentication": "none",
    })
    topic = unique_topic("oauth-renew")
    create_topic(s.server.bootstrap, topic, partitions=1)
    # Tokens of 3 s: the session of each ends with it, long before the listener's hour.
    conf = oauth_conf(s, lambda: signer.token("svc-short", lifetime_s=3))
    sent = produce_for(conf, topic, seconds=8)
    assert len(read_back(oauth_conf(s, lambda: signer.token("svc-short")), topic, sent)) == sent
    samples = scrape(s.server.http_address())
    assert value(samples, "kafka_server_socketserver_successful_reauthentication_total") >= 1


def test_the_rill_cli_logs_in_with_an_oauthbearer_token_file(servers, tmp_path):
    """`rill`'s own client takes its OAUTHBEARER token from the file a `file:` token
    endpoint URL names (KIP-768), read again for every connection: a valid token lets it
    in, an expired or foreign one is refused with the broker's reason, and a renewed
    file works at once."""
    import subprocess

    from rill_harness import rill_binary

    s, signer = oauth_server(servers, tmp_path)
    topic = unique_topic("oauth-cli")
    create_topic(s.server.bootstrap, topic, partitions=1)
    token_file = tmp_path / "token.jwt"

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(rill_binary()), *args, "-b", s.bootstrap("SASL_PLAINTEXT"),
             "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=OAUTHBEARER",
             "-X", f"sasl.oauthbearer.token.endpoint.url=file://{token_file}"],
            capture_output=True, text=True, timeout=60,
        )

    token_file.write_text(signer.token("svc-cli") + "\n")
    listed = cli("topic", "list")
    assert listed.returncode == 0 and topic in listed.stdout, listed.stderr
    produced = cli("produce", topic)
    assert produced.returncode == 0, produced.stderr

    token_file.write_text(signer.token("svc-cli", lifetime_s=-120))
    expired = cli("topic", "list")
    assert expired.returncode != 0 and "invalid_token" in expired.stderr, expired.stderr
    token_file.write_text(signer.token("svc-cli", aud="someone-else"))
    foreign = cli("topic", "list")
    assert foreign.returncode != 0 and "authentication" in foreign.stderr.lower(), foreign.stderr

    token_file.write_text(signer.token("svc-cli", kid="ec-1"))
    renewed = cli("topic", "list")
    assert renewed.returncode == 0 and topic in renewed.stdout, renewed.stderr
    token_file.write_text("")
    empty = cli("topic", "list")
    assert empty.returncode != 0 and "holds no token" in empty.stderr, empty.stderr
