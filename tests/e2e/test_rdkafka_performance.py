"""librdkafka's rdkafka_performance (built by `cargo xtask rdkafka-performance` against the
venv's librdkafka) against rill: produce N records of 1 KiB with acks=all and acks=1, with
and without compression, then read them all back, by partition (-C) and in a group (-G).

The tool's exit status covers only the producer (0 when every record was delivered); the
counts come from its closing summary lines, which these tests parse and check exactly. The
producer's "produce failures" are local queue-full backpressure, not delivery failures.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

import pytest

from kafka_helpers import create_topic, reading_consumer, unique_topic, watermarks

RECORDS = 10_000
RECORD_SIZE = 1024
PARTITIONS = 6
TIMEOUT_S = 60

# `% 10000 messages produced (10240000 bytes), 10000 delivered (offset 1712, 0 failed) in
# 402ms: 24875 msgs/s and 25.47 MB/s, 3 produce failures, 0 in queue, lz4 compression`
PRODUCED = re.compile(
    r"^% (?P<messages>\d+) messages produced \((?P<bytes>\d+) bytes\), "
    r"(?P<delivered>\d+) delivered \(offset -?\d+, (?P<failed>\d+) failed\) in \d+ms: "
    r"\d+ msgs/s and [\d.]+ MB/s, \d+ produce failures, (?P<queued>\d+) in queue, "
    r"(?P<compression>\S+) compression$",
    re.MULTILINE,
)
# `% 10000 messages (10240000 bytes) consumed in 271ms: 36900 msgs/s (37.79 MB/s)`
CONSUMED = re.compile(
    r"^% (?P<messages>\d+) messages \((?P<bytes>\d+) bytes\) consumed in \d+ms: ",
    re.MULTILINE,
)
# Lines the tool prints for errors: librdkafka's error callback, a failed delivery report,
# a failed fetch.
ERRORS = re.compile(
    r"^% (FATAL ERROR CALLBACK|ERROR CALLBACK|Message delivery failed|Consume error).*$",
    re.MULTILINE,
)


@dataclass
class Run:
    args: list[str]
    returncode: int
    output: str

    def describe(self) -> str:
        return f"rdkafka_performance {' '.join(self.args)} -> {self.returncode}\n{self.output[-4000:]}"

    def last(self, pattern: re.Pattern) -> dict[str, str]:
        """The last summary line of this kind: the tool repeats it every second, and the
        closing one carries the final counts."""
        matches = list(pattern.finditer(self.output))
        assert matches, f"no summary line matching {pattern.pattern!r}:\n{self.describe()}"
        return matches[-1].groupdict()

    def errors(self) -> list[str]:
        return [m.group(0) for m in ERRORS.finditer(self.output)]


def run_tool(binary: str, args: list[str]) -> Run:
    result = subprocess.run(
        [binary, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=TIMEOUT_S,
    )
    return Run(args, result.returncode, result.stdout)


def produce(binary: str, bootstrap: str, topic: str, acks: str, compression: str) -> None:
    run = run_tool(
        binary,
        [
            "-P", "-t", topic, "-b", bootstrap,
            "-s", str(RECORD_SIZE), "-c", str(RECORDS),
            "-a", acks, "-z", compression,
            # The tool's own default is linger.ms=1000; these are ordinary producer settings.
            "-X", "linger.ms=5", "-X", "batch.size=1000000",
            # Without a key the sticky partitioner sends a short run to one partition;
            # a random partition per record spreads it over all of them.
            "-X", "sticky.partitioning.linger.ms=0",
        ],
    )
    assert run.returncode == 0, f"not every record was delivered:\n{run.describe()}"
    summary = run.last(PRODUCED)
    assert int(summary["messages"]) == RECORDS, run.describe()
    assert int(summary["bytes"]) == RECORDS * RECORD_SIZE, run.describe()
    assert int(summary["delivered"]) == RECORDS, run.describe()
    assert int(summary["failed"]) == 0, run.describe()
    assert int(summary["queued"]) == 0, run.describe()
    assert summary["compression"] == compression, run.describe()
    assert run.errors() == [], run.describe()


def check_consumed(run: Run) -> None:
    summary = run.last(CONSUMED)
    assert int(summary["messages"]) == RECORDS, run.describe()
    assert int(summary["bytes"]) == RECORDS * RECORD_SIZE, run.describe()
    assert run.errors() == [], run.describe()


def check_log_holds_exactly(bootstrap: str, topic: str) -> None:
    """The broker holds RECORDS records, no more (a retried batch would show here), spread
    over every partition."""
    consumer = reading_consumer(bootstrap)
    try:
        marks = watermarks(consumer, topic, PARTITIONS)
    finally:
        consumer.close()
    assert sum(high - low for low, high in marks.values()) == RECORDS, marks
    assert all(high > low for low, high in marks.values()), marks


@pytest.mark.parametrize(
    ("acks", "compression"),
    [("all", "none"), ("1", "none"), ("all", "lz4"), ("1", "zstd")],
)
def test_produce_then_consume_partitions(rill, rdkafka_performance, acks, compression):
    topic = unique_topic("rdperf")
    create_topic(rill.bootstrap, topic, PARTITIONS)
    produce(rdkafka_performance, rill.bootstrap, topic, acks, compression)
    check_log_holds_exactly(rill.bootstrap, topic)

    partitions = [arg for p in range(PARTITIONS) for arg in ("-p", str(p))]
    run = run_tool(
        rdkafka_performance,
        [
            "-C", "-t", topic, "-b", rill.bootstrap, *partitions,
            "-o", "beginning", "-c", str(RECORDS),
            # -e stops at the end of every partition, so a short log fails fast rather
            # than waiting out the timeout; it needs partition EOF events turned on.
            "-e", "-X", "enable.partition.eof=true",
        ],
    )
    assert run.returncode == 0, run.describe()
    check_consumed(run)


def test_produce_then_consume_in_group(rill, rdkafka_performance):
    topic = unique_topic("rdperf-group")
    create_topic(rill.bootstrap, topic, PARTITIONS)
    produce(rdkafka_performance, rill.bootstrap, topic, "all", "none")
    check_log_holds_exactly(rill.bootstrap, topic)

    group = unique_topic("rdperf-group")
    run = run_tool(
        rdkafka_performance,
        ["-G", group, "-t", topic, "-b", rill.bootstrap, "-c", str(RECORDS)],
    )
    assert run.returncode == 0, run.describe()
    check_consumed(run)
