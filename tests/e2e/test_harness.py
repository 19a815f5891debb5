"""Checks of the harness itself (rill_harness.py), against fake_rill.py instead of rill.

These run without a working broker, so that a broken harness is told apart from a broken
broker: start and ready-line wait, port and data directory kept across restarts, kill -9,
clean stop, and clear failures (with the server's log) when a server misbehaves.
"""

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from rill_harness import HarnessError, RillServer, free_port, is_ready_line

FAKE = Path(__file__).with_name("fake_rill.py")


@pytest.fixture
def fake_binary(tmp_path) -> Path:
    wrapper = tmp_path / "fake-rill"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def fake_server(tmp_path, binary, mode="normal", **kwargs) -> RillServer:
    workdir = tmp_path / f"server-{mode}"
    workdir.mkdir()
    return RillServer(
        workdir,
        overrides={"num.partitions": "1"},
        binary=binary,
        extra_args=["--fake-mode", mode],
        **kwargs,
    )


def connects(bootstrap: str) -> bool:
    host, port = bootstrap.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def test_free_port_is_bindable():
    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


@pytest.mark.parametrize("worker", ["gw0", "gw1"])
def test_xdist_workers_take_ports_from_blocks_of_their_own(monkeypatch, worker):
    """Under pytest-xdist two workers never hand out one port: each takes distinct,
    bindable ports from its own block, below the kernel's ephemeral range."""
    import rill_harness

    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    index = int(worker[2:])
    start = rill_harness._WORKER_PORT_BASE + index * rill_harness._WORKER_PORT_BLOCK
    ports = [free_port() for _ in range(5)]
    assert len(set(ports)) == 5, ports
    assert all(start <= p < start + rill_harness._WORKER_PORT_BLOCK for p in ports), ports
    assert all(p < 32768 for p in ports), ports
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[-1]))


def test_ready_line_matches_whole_address_only():
    ready = "rill listening on 127.0.0.1:9092"
    assert is_ready_line("rill listening on 127.0.0.1:9092\n", ready)
    assert is_ready_line("rill listening on 127.0.0.1:9092 (data in /tmp/x)", ready)
    assert not is_ready_line("rill listening on 127.0.0.1:90921", ready)
    assert not is_ready_line("not rill listening on 127.0.0.1:9092", ready)


def test_fixture_starts_restarts_and_stops(rill_factory, fake_binary):
    server = rill_factory(binary=fake_binary, overrides={"num.partitions": "1"})
    assert server.is_running()
    assert server.bootstrap == f"127.0.0.1:{server.port}"
    assert connects(server.bootstrap)
    starts = (server.data_dir / "starts").read_text().splitlines()
    assert starts == [
        f"{server.bootstrap} http.listeners= group.initial.rebalance.delay.ms=0 num.partitions=1"
    ]
    assert "fake rill: starting" in server.log_text(), "stderr must reach the log"

    first_pid = server.pid
    server.restart()
    assert server.pid != first_pid
    assert connects(server.bootstrap)

    server.kill9()
    assert server.process.returncode == -signal.SIGKILL
    assert not connects(server.bootstrap)
    assert not server.crashed(), "a kill the test asked for is not a crash"
    server.restart()
    assert connects(server.bootstrap)

    starts = (server.data_dir / "starts").read_text().splitlines()
    assert len(starts) == 3
    assert len(set(starts)) == 1, "restarts keep the port, data dir and overrides"
    assert server.log_text().count("=== rill-harness: start #") == 3

    assert server.stop() == 0
    assert not server.is_running()
    assert "fake rill: stopped" in server.log_text()


def test_never_ready_fails_within_timeout_with_log(tmp_path, fake_binary):
    server = fake_server(tmp_path, fake_binary, "never-ready", ready_timeout_s=1.5)
    started = time.monotonic()
    with pytest.raises(HarnessError) as error:
        server.start()
    assert time.monotonic() - started < 10
    message = str(error.value)
    assert "did not print 'rill listening on" in message
    assert "fake rill: starting" in message, "the failure shows the server's log"
    assert not server.is_running(), "a server that never got ready is killed"


def test_early_exit_is_reported_with_exit_code(tmp_path, fake_binary):
    server = fake_server(tmp_path, fake_binary, "exit-early")
    with pytest.raises(HarnessError) as error:
        server.start()
    assert "exited with 3" in str(error.value)
    assert "fake rill: giving up" in str(error.value)
    assert server.teardown() == [], "a failed start is reported once, not again as a crash"


def test_stop_fails_when_sigterm_is_ignored(tmp_path, fake_binary):
    server = fake_server(tmp_path, fake_binary, "ignore-sigterm")
    server.start()
    with pytest.raises(HarnessError) as error:
        server.stop(timeout_s=1)
    assert "did not exit within 1 s of SIGTERM" in str(error.value)
    assert not server.is_running(), "it is killed after the grace period"


def test_crash_is_detected_at_teardown(tmp_path, fake_binary):
    server = fake_server(tmp_path, fake_binary)
    server.start()
    assert server.rss_bytes() > 0
    os.kill(server.pid, signal.SIGKILL)
    server.process.wait(timeout=10)
    assert server.crashed()
    problems = server.teardown()
    assert problems and "died during the test" in problems[0]
