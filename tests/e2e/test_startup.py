"""Start-up as a new user meets it, against the real binary: a second server on a data
directory that one is using is refused (and the first keeps serving, and recovers
normally after a kill -9), an unknown config key is warned about with the key it likely
meant and refused with --strict-config, a new directory is logged as new, and start-up
errors (a meta.properties that is no such file, one of another node, a port taken) are
one plain line with each cause once."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from confluent_kafka import Producer

from kafka_helpers import create_topic, read_all, unique_topic
from rill_harness import RillController, free_port, rill_binary

ANSI = re.compile(r"\x1b\[[0-9;]*m")
START_TIMEOUT_S = 30


def run_server(*args: str) -> subprocess.CompletedProcess:
    """Runs `rill server ARGS` to completion (it must refuse to start); stderr without ANSI."""
    result = subprocess.run(
        # No HTTP listener: runs in parallel with other servers must not meet on 9644.
        [str(rill_binary()), "server", "--override", "http.listeners=", *args],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    result.stderr = ANSI.sub("", result.stderr)
    return result


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one `error:` line a refused start prints (log lines may come before it)."""
    assert result.returncode == 1, (
        f"expected exit status 1, got {result.returncode}\n{result.stdout}\n{result.stderr}"
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, f"expected one error line:\n{result.stderr}"
    assert "Caused by" not in result.stderr and "Error:" not in result.stderr, result.stderr
    assert errors[0] == result.stderr.strip().splitlines()[-1], result.stderr
    return errors[0]


def log_of(server, since_start: int = 1) -> str:
    """The server's log (without ANSI colours) from its start number `since_start` on,
    without the harness's own marker lines (which repeat the command line)."""
    text = ANSI.sub("", server.log_text())
    text = text.split(f"=== rill-harness: start #{since_start}:", 1)[-1]
    return "\n".join(
        line for line in text.splitlines()[1:] if not line.startswith("=== rill-harness")
    )


def produce(bootstrap: str, topic: str, values: list[str]) -> list[tuple[int, int, bytes]]:
    """Produces with acks=all; returns every acknowledged (partition, offset, value)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 2})
    acked = []

    def on_delivery(error, message):
        assert error is None, f"delivery failed: {error}"
        acked.append((message.partition(), message.offset(), message.value()))

    for value in values:
        producer.produce(topic, value=value.encode(), on_delivery=on_delivery)
    assert producer.flush(30) == 0, "producer did not deliver everything within 30 s"
    return acked


def check_stored(bootstrap: str, topic: str, acked) -> None:
    stored = read_all(bootstrap, topic, 1)[0]
    assert sorted(stored) == list(range(len(stored))), "offsets are not dense"
    for _p, offset, value in acked:
        assert stored[offset].value == value, f"record {offset} differs"


def test_a_second_server_on_a_data_directory_is_refused_and_the_first_keeps_serving(
    rill_factory,
):
    first = rill_factory()
    data_dir: Path = first.data_dir
    assert "data directory is new" in log_of(first)
    assert (data_dir / ".lock").read_text().strip() == str(first.pid)
    topic = unique_topic("lock")
    client = create_topic(first.bootstrap, topic, 1)
    acked = produce(first.bootstrap, topic, [f"before-{i}" for i in range(50)])

    second = run_server("--listen", f"127.0.0.1:{free_port()}", "--data-dir", str(data_dir))
    line = error_line(second)
    assert f"data directory {data_dir} is locked by another process (pid {first.pid})" in line, (
        line
    )
    # It stopped before reading anything: no metadata applied, no marker of its own.
    assert "rill listening" not in second.stdout
    assert "meta.properties" not in second.stderr and "metadata" not in second.stderr.lower()
    assert not (data_dir / ".clean_shutdown").exists()

    assert first.is_running()
    acked += produce(first.bootstrap, topic, [f"after-{i}" for i in range(50)])
    check_stored(first.bootstrap, topic, acked)

    # A kill -9 leaves `.lock` behind with the dead PID in it; the kernel dropped the lock
    # itself, so the restart needs no clean-up and recovers as after any crash.
    first.kill9()
    assert (data_dir / ".lock").exists()
    first.start()
    since_restart = log_of(first, 2)
    assert "previous_shutdown=Unclean" in since_restart, since_restart
    assert "data directory is new" not in since_restart
    assert (data_dir / ".lock").read_text().strip() == str(first.pid)
    check_stored(first.bootstrap, topic, acked)
    client.list_topics(timeout=10)

    # And a clean stop is recorded as one, by the only process that wrote the directory.
    first.restart()
    assert "previous_shutdown=Clean" in log_of(first, 3)


def test_a_second_controller_only_node_on_a_data_directory_is_refused(tmp_path):
    port = free_port()
    args = [
        "--node-id", "1",
        "--controller-listen", f"127.0.0.1:{port}",
        "--controller-quorum", f"1@127.0.0.1:{port}",
    ]
    controller = RillController(
        tmp_path / "c1",
        controller_port=port,
        overrides={"process.roles": "controller"},
        extra_args=args,
    )
    try:
        controller.start()
        second = run_server(
            "--data-dir", str(controller.data_dir),
            "--override", "process.roles=controller",
            *args,
        )
        line = error_line(second)
        assert f"{controller.data_dir} is locked by another process (pid {controller.pid})" in (
            line
        ), line
        assert controller.is_running()
    finally:
        problems = controller.teardown()
    assert not problems, problems


def test_a_typo_in_a_key_is_warned_with_the_key_it_likely_meant(rill_factory, tmp_path):
    config = tmp_path / "server.toml"
    config.write_text('"log.retention.hour" = 1\n"num.partition" = 3\n')
    server = rill_factory(
        overrides={"bogus.key": "1", "num.io.threads": "8"},
        extra_args=["--config", str(config)],
    )
    log = log_of(server)
    assert (
        "`log.retention.hour` is not a configuration Rill knows; did you mean "
        "`log.retention.hours`?"
    ) in log, log
    assert "did you mean `num.partitions`?" in log, log
    assert "`bogus.key` is not a configuration Rill knows; it has no effect" in log, log
    # A Kafka key that Rill accepts and ignores on purpose is not warned about.
    assert "num.io.threads" not in log, log
    # It serves all the same, with the defaults the typos did not change.
    topic = unique_topic("typo")
    create_topic(server.bootstrap, topic, 1)
    check_stored(server.bootstrap, topic, produce(server.bootstrap, topic, ["a", "b"]))


def test_strict_config_refuses_an_unknown_key(rill_factory, tmp_path):
    data = tmp_path / "strict"
    refused = run_server(
        "--listen", f"127.0.0.1:{free_port()}",
        "--data-dir", str(data),
        "--override", "log.retention.hour=1",
        "--strict-config",
    )
    line = error_line(refused)
    assert "`log.retention.hour` is not a configuration Rill knows" in line, line
    assert "did you mean `log.retention.hours`?" in line, line
    assert "rill listening" not in refused.stdout

    config = tmp_path / "strict.toml"
    config.write_text('"config.strict" = true\n"bogus.key" = 1\n')
    refused = run_server(
        "--listen", f"127.0.0.1:{free_port()}",
        "--data-dir", str(data),
        "--config", str(config),
    )
    assert "`bogus.key` is not a configuration Rill knows" in error_line(refused)

    # A value of the wrong type is refused with or without strictness, naming the key,
    # the value and what is allowed.
    refused = run_server(
        "--listen", f"127.0.0.1:{free_port()}",
        "--data-dir", str(data),
        "--override", "log.retention.hours=a-day",
    )
    line = error_line(refused)
    assert "log.retention.hours" in line and '"a-day"' in line and "integer from" in line, line

    # Strict with keys that are all known starts (the harness's default overrides too).
    server = rill_factory(overrides={"log.retention.hours": "24"}, extra_args=["--strict-config"])
    assert "is not a configuration Rill knows" not in log_of(server)


def test_an_unreadable_meta_properties_is_explained(rill_factory):
    server = rill_factory()
    server.stop()
    meta = server.data_dir / "meta.properties"
    good = meta.read_text()

    meta.write_bytes(b"\x00\x01garbage that is no properties file\n")
    refused = run_server("--listen", server.bootstrap, "--data-dir", str(server.data_dir))
    line = error_line(refused)
    assert f"{meta} is unreadable: it has no node.id" in line, line
    assert "node.id=<number>" in line and "None" not in line, line

    meta.write_text(good.replace("node.id=1", "node.id=one"))
    line = error_line(run_server("--listen", server.bootstrap, "--data-dir", str(server.data_dir)))
    assert 'its node.id "one" is not a number' in line, line

    meta.write_text(good)
    line = error_line(
        run_server(
            "--listen", server.bootstrap,
            "--data-dir", str(server.data_dir),
            "--node-id", "2",
        )
    )
    assert f"{server.data_dir} belongs to node 1, but this is node 2" in line, line
    assert "Some(" not in line, line

    # Put right, the directory starts again as it was.
    server.start()
    assert "previous_shutdown=Clean" in log_of(server, 2)


def test_a_start_up_error_names_its_cause_once(rill_factory, tmp_path):
    first = rill_factory()
    taken = run_server("--listen", first.bootstrap, "--data-dir", str(tmp_path / "other"))
    line = error_line(taken)
    assert first.bootstrap in line, line
    assert line.lower().count("address already in use") == 1, line
