"""Fixtures for the end-to-end suite: a real `rill server` per test.

- `rill`: a started server with the default overrides; `.bootstrap`, `.data_dir`,
  `.kill9()`, `.restart()`, `.stop()` (see rill_harness.RillServer).
- `rill_factory(overrides=..., binary=...)`: starts more servers, or ones with other
  settings; every one is ended at teardown.

A test that fails gets the tail of each of its servers' logs in its report, and a server
that died during a test, or did not exit cleanly on SIGTERM at teardown, fails the test.
"""

from __future__ import annotations

import os
import shutil

import pytest

from rill_harness import RillCluster, RillServer

# Settings that make tests fast and deterministic, in Kafka's broker config names.
DEFAULT_OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
}

_SERVERS = pytest.StashKey[list]()


@pytest.fixture
def rill_factory(request, tmp_path):
    servers: list[RillServer] = []
    request.node.stash[_SERVERS] = servers

    def start(overrides=None, binary=None, **kwargs) -> RillServer:
        settings = dict(DEFAULT_OVERRIDES)
        settings.update(overrides or {})
        workdir = tmp_path / f"rill{len(servers)}"
        workdir.mkdir()
        server = RillServer(workdir, overrides=settings, binary=binary, **kwargs)
        servers.append(server)
        return server.start()

    yield start

    problems = []
    for server in servers:
        problems += [f"{server.bootstrap}: {problem}" for problem in server.teardown()]
    if problems:
        pytest.fail("server problems at teardown:\n" + "\n".join(problems), pytrace=False)


# A cluster's failure detection, shortened so that failover takes seconds in tests.
CLUSTER_OVERRIDES = {
    **DEFAULT_OVERRIDES,
    "broker.heartbeat.interval.ms": "300",
    "broker.session.timeout.ms": "2000",
    "replica.lag.time.max.ms": "3000",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "6",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.num.partitions": "6",
    "default.replication.factor": "3",
}


@pytest.fixture
def rill_cluster_factory(request, tmp_path):
    """`rill_cluster_factory(size=3, overrides=..., roles=...)` starts a cluster of real
    nodes (`roles`: node id -> "controller" or "broker" for single-role nodes; an override
    of None unsets a key of CLUSTER_OVERRIDES)."""
    clusters: list[RillCluster] = []
    request.node.stash[_SERVERS] = []

    def start(size: int = 3, overrides=None, roles=None) -> RillCluster:
        settings = dict(CLUSTER_OVERRIDES)
        settings.update(overrides or {})
        # An override of None leaves the key unset: the server's own default applies.
        settings = {k: v for k, v in settings.items() if v is not None}
        cluster = RillCluster(tmp_path / f"cluster{len(clusters)}", size, settings, roles)
        clusters.append(cluster)
        request.node.stash[_SERVERS].extend(cluster.nodes.values())
        return cluster.start()

    yield start

    problems = []
    for cluster in clusters:
        problems += cluster.teardown()
    if problems:
        pytest.fail("cluster problems at teardown:\n" + "\n".join(problems), pytrace=False)


@pytest.fixture
def rill(rill_factory) -> RillServer:
    return rill_factory()


@pytest.fixture
def kcat() -> str:
    """Path to kcat; skips (or, on CI, fails) when it is not installed."""
    path = os.environ.get("KCAT") or shutil.which("kcat")
    if path:
        return path
    if os.environ.get("RILL_E2E_REQUIRE_KCAT") == "1":
        pytest.fail("kcat is required here (RILL_E2E_REQUIRE_KCAT=1) but is not installed")
    pytest.skip("kcat is not installed (`apt-get install -y kcat`, as `cargo xtask test` does)")


@pytest.fixture
def rdkafka_performance() -> str:
    """Path to librdkafka's rdkafka_performance, which `cargo xtask test` builds and passes
    in RDKAFKA_PERFORMANCE (`cargo xtask rdkafka-performance` builds it alone); skips (or,
    on CI, fails) when it is absent."""
    path = os.environ.get("RDKAFKA_PERFORMANCE")
    if path and os.access(path, os.X_OK):
        return path
    if os.environ.get("RILL_E2E_REQUIRE_RDKAFKA_PERFORMANCE") == "1":
        pytest.fail(
            "rdkafka_performance is required here (RILL_E2E_REQUIRE_RDKAFKA_PERFORMANCE=1) "
            f"but RDKAFKA_PERFORMANCE={path!r} is not an executable"
        )
    pytest.skip("rdkafka_performance is not built (`cargo xtask rdkafka-performance`)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for server in item.stash.get(_SERVERS, []):
        report.sections.append((f"rill server {server.bootstrap}", server.log_excerpt()))
