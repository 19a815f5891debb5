"""The HTTP listener's security (issue #18 item 1): Basic authentication against the
cluster's own users, the Host check against DNS rebinding, and HTTPS.

Each node has the harness's PLAINTEXT listener (for `rill user create`) and a
SASL_PLAINTEXT one, which turns `http.authentication` to `basic` by default. PLAIN users
come from the JAAS config, SCRAM users from `rill user create` (the metadata log).
Certificates are made at test time by `trustme`, as in test_security.py.
"""

from __future__ import annotations

import base64
import http.client
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trustme

from conftest import DEFAULT_OVERRIDES
from kafka_helpers import wait_for
from rill_harness import RillServer, free_port, rill_binary
from test_security import PLAIN_USERS

JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    + " ".join(f'user_{u}="{p}"' for u, p in PLAIN_USERS.items())
    + ";"
)


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def get(
    url: str,
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> tuple[int, http.client.HTTPMessage, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


class Node:
    """A rill server with PLAINTEXT and SASL_PLAINTEXT listeners and the HTTP listener."""

    def __init__(self, workdir: Path, extra: dict[str, str] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.sasl_port = free_port()
        self.server = RillServer(
            workdir,
            overrides={
                **DEFAULT_OVERRIDES,
                "http.listeners": "127.0.0.1:0",
                "plain.sasl.jaas.config": JAAS,
                **(extra or {}),
            },
        )
        self.server.overrides["listeners"] = (
            f"PLAINTEXT://127.0.0.1:{self.server.port},"
            f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}"
        )

    def user_create(self, *args: str) -> None:
        out = subprocess.run(
            [str(rill_binary()), "user", "create", *args, "-b", self.server.bootstrap],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr


@pytest.fixture
def node(tmp_path):
    started: list[Node] = []

    def start(extra: dict[str, str] | None = None) -> Node:
        n = Node(tmp_path / f"node{len(started)}", extra)
        started.append(n)
        n.server.start()
        return n

    yield start
    problems = []
    for n in started:
        problems += n.server.teardown()
    if problems:
        pytest.fail("server problems at teardown:\n" + "\n".join(problems), pytrace=False)


PROTECTED = ["/metrics", "/api/cluster", "/"]


def test_basic_auth_with_plain_and_scram_users(node):
    n = node()
    n.user_create("carol", "--password", "carol-pw", "--mechanism", "SCRAM-SHA-256")
    n.user_create("dave", "--password", "dave-pw", "--mechanism", "SCRAM-SHA-512")
    base = f"http://{n.server.http_address()}"
    assert "authentication basic (a client listener uses SASL)" in n.server.log_text()

    # The probes stay open.
    assert get(f"{base}/health/live")[0] == 200
    wait_for(lambda: get(f"{base}/health/ready")[0] == 200, 30, "ready")

    refused = [
        None,
        basic("alice", "wrong"),
        basic("carol", "dave-pw"),
        basic("nobody", "alice-secret"),
        "Basic !!!",
        "Bearer " + "x" * 20,
        basic("alice", "alice-secret" + "x" * 5000),
    ]
    for path in PROTECTED:
        bodies = set()
        for authorization in refused:
            headers = {} if authorization is None else {"Authorization": authorization}
            status, answer_headers, body = get(f"{base}{path}", headers)
            assert status == 401, (path, authorization, status)
            assert answer_headers.get("WWW-Authenticate", "").startswith('Basic realm="rill"')
            bodies.add(body)
        # The same answer whatever was wrong: it does not tell which users exist.
        assert len(bodies) == 1, bodies
        for user, password in [
            ("alice", "alice-secret"),  # PLAIN, from the JAAS config
            ("carol", "carol-pw"),  # SCRAM-SHA-256
            ("dave", "dave-pw"),  # SCRAM-SHA-512
        ]:
            status, _, body = get(f"{base}{path}", {"Authorization": basic(user, password)})
            assert status == 200, (path, user, status, body[:200])
    status, _, body = get(f"{base}/metrics", {"Authorization": basic("carol", "carol-pw")})
    assert b"# EOF" in body


def test_a_loopback_listener_refuses_other_hosts(node):
    n = node()
    address = n.server.http_address()
    port = address.rsplit(":", 1)[1]
    base = f"http://{address}"
    alice = {"Authorization": basic("alice", "alice-secret")}
    for host in ["evil.example", f"evil.example:{port}", "localhost.evil.example", "10.0.0.1"]:
        status, _, _ = get(f"{base}/api/cluster", {**alice, "Host": host})
        assert status == 403, host
        # Refused before authentication, so without credentials too.
        assert get(f"{base}/", {"Host": host})[0] == 403, host
    for host in [f"localhost:{port}", f"127.0.0.1:{port}", "[::1]"]:
        assert get(f"{base}/api/cluster", {**alice, "Host": host})[0] == 200, host
    # Probes carry whatever Host an orchestrator uses.
    assert get(f"{base}/health/live", {"Host": "evil.example"})[0] == 200


def test_bearer_tokens_from_a_file(node, tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("# the Prometheus job\nscrape-3f9a1c\n\nscript-77b2\n")
    n = node({"http.bearer.tokens.file": str(tokens)})
    base = f"http://{n.server.http_address()}"
    for token in ["scrape-3f9a1c", "script-77b2"]:
        status, _, body = get(f"{base}/metrics", {"Authorization": f"Bearer {token}"})
        assert status == 200 and b"# EOF" in body
    for token in ["scrape-3f9a1", "scrape-3f9a1cX", "# the Prometheus job", "x" * 5000]:
        assert get(f"{base}/metrics", {"Authorization": f"Bearer {token}"})[0] == 401, token
    # Basic still works beside the tokens.
    assert get(f"{base}/api/cluster", {"Authorization": basic("bob", "bob-secret")})[0] == 200


def test_authentication_none_opens_the_listener(node):
    n = node({"http.authentication": "none"})
    base = f"http://{n.server.http_address()}"
    assert "authentication none (http.authentication)" in n.server.log_text()
    assert get(f"{base}/metrics")[0] == 200
    assert get(f"{base}/api/cluster")[0] == 200


def test_https_with_basic_auth(node, tmp_path):
    ca = trustme.CA(organization_name="Rill test CA")
    ca_path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_path))
    keystore = tmp_path / "http-keystore.pem"
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
        str(keystore)
    )
    n = node({"http.ssl.enabled": "true", "http.ssl.keystore.location": str(keystore)})
    address = n.server.http_address()
    assert "https, authentication basic" in n.server.log_text()
    context = ssl.create_default_context(cafile=str(ca_path))

    assert get(f"https://{address}/health/live", context=context)[0] == 200
    assert get(f"https://{address}/metrics", context=context)[0] == 401
    status, _, body = get(
        f"https://{address}/metrics",
        {"Authorization": basic("bob", "bob-secret")},
        context=context,
    )
    assert status == 200 and b"# EOF" in body
    status, _, body = get(
        f"https://localhost:{address.rsplit(':', 1)[1]}/api/cluster",
        {"Authorization": basic("bob", "bob-secret")},
        context=context,
    )
    assert status == 200, body[:200]

    # A client that does not know the CA refuses the certificate.
    with pytest.raises(urllib.error.URLError):
        get(f"https://{address}/health/live", context=ssl.create_default_context())
    # Plain HTTP to the same port gets no page.
    with pytest.raises((http.client.HTTPException, ConnectionError, urllib.error.URLError)):
        get(f"http://{address}/health/live")
    # The listener still serves after the failed handshakes.
    assert get(f"https://{address}/health/live", context=context)[0] == 200


def test_a_renewed_https_certificate_is_served_without_a_restart(node, tmp_path):
    """The HTTP listener loads its key and certificate again when the file changes, as a
    Kafka listener does; a file that does not load leaves the old certificate serving."""
    old_ca, new_ca = trustme.CA(), trustme.CA()
    paths = {}
    for name, ca in (("old", old_ca), ("new", new_ca)):
        paths[name] = tmp_path / f"{name}-ca.pem"
        ca.cert_pem.write_to_path(str(paths[name]))
    keystore = tmp_path / "http-keystore.pem"
    old_ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(keystore))
    n = node({"http.ssl.enabled": "true", "http.ssl.keystore.location": str(keystore),
              "http.authentication": "none"})
    address = n.server.http_address()
    trusts = {name: ssl.create_default_context(cafile=str(p)) for name, p in paths.items()}

    def served_by(name: str) -> bool:
        try:
            return get(f"https://{address}/health/live", context=trusts[name])[0] == 200
        except urllib.error.URLError:
            return False

    assert served_by("old") and not served_by("new")
    # Half a file: it does not load, and the old certificate keeps serving.
    keystore.write_text(keystore.read_text()[:200])
    os.utime(keystore, (time.time() + 5, time.time() + 5))
    assert served_by("old")
    new_ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(keystore))
    os.utime(keystore, (time.time() + 10, time.time() + 10))
    wait_for(lambda: served_by("new"), 10, "the renewed certificate served")
    assert not served_by("old")
    assert "TLS key and certificates reloaded" in n.server.log_text()


def test_a_bad_http_ssl_setting_refuses_the_start(tmp_path):
    missing = tmp_path / "nope.pem"
    result = subprocess.run(
        [
            str(rill_binary()), "server", "--listen", f"127.0.0.1:{free_port()}",
            "--data-dir", str(tmp_path / "data"),
            "--override", "http.listeners=127.0.0.1:0",
            "--override", "http.ssl.enabled=true",
            "--override", f"http.ssl.keystore.location={missing}",
        ],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 1, result
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "ssl.keystore.location" in errors[0], result.stderr
    assert str(missing) in errors[0], errors
