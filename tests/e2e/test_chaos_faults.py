"""The fault-injection suite's slow disk and clock jump (issue #14) act on a real node.

`chaos.py` draws these faults in its long runs (`cargo xtask chaos --faults
slow-disk,clock-jump,...`); a fault that silently did nothing would let every such run
pass. So, on one real `rill server`:
- a clock jump moves the broker's wall clock (the LogAppendTime it stamps) forward and
  back by the offset, and back to true time, while every write is still acknowledged at
  the next offset and read back;
- a slow disk holds each append for the delay while strace is attached, and the node is
  running, untraced and fast again once it detaches.

The tools come from Debian (strace; faketime, which brings libfaketime) and are
installed by the suite when missing; without root and apt-get these tests skip, and on
CI (`CI` set) they fail instead.
"""

from __future__ import annotations

import os
import statistics
import time
from types import SimpleNamespace

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

import chaos_faults
from kafka_helpers import ADMIN_TIMEOUT_S, admin, read_all
from netns import ensure_program
from rill_harness import RillServer

JUMP_S = 3600
SLOW_DISK_MS = 500


def _tool(found: str | None, what: str) -> str:
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail(f"{what} is needed on CI and could not be installed")
    pytest.skip(f"{what} is not installed and could not be (needs root and apt-get)")


@pytest.fixture
def server(tmp_path):
    # Not the rill fixture: the clock test preloads libfaketime before the first start.
    node = RillServer(tmp_path / "node")
    yield node
    problems = node.teardown()
    assert not problems, problems


def _create(bootstrap: str, topic: str, config: dict[str, str]) -> None:
    client = admin(bootstrap)
    client.create_topics([NewTopic(topic, 1, 1, config=config)],
                         operation_timeout=ADMIN_TIMEOUT_S)[topic].result(timeout=ADMIN_TIMEOUT_S)


def _produce(producer: Producer, topic: str, value: bytes) -> tuple[float, int, int]:
    """(seconds until acknowledged, offset, timestamp in ms) of one record."""
    delivered = []
    started = time.monotonic()
    producer.produce(topic, value=value, partition=0,
                     on_delivery=lambda err, msg: delivered.append((err, msg)))
    producer.flush(30)
    assert len(delivered) == 1, f"{value!r} not acknowledged within 30 s"
    err, msg = delivered[0]
    assert err is None, f"{value!r}: {err}"
    return time.monotonic() - started, msg.offset(), msg.timestamp()[1]


def test_clock_jump_moves_the_wall_clock_and_loses_nothing(server):
    library = _tool(chaos_faults.find_libfaketime(), "libfaketime (Debian's faketime)")
    chaos_faults.preload_faketime(SimpleNamespace(nodes={1: server}), library)
    server.start()
    assert chaos_faults.preloaded(server, "libfaketime")
    topic = "clock"
    _create(server.bootstrap, topic, {"message.timestamp.type": "LogAppendTime"})
    producer = Producer({"bootstrap.servers": server.bootstrap, "acks": "all",
                         "enable.idempotence": True})
    offsets = []

    def stamped_until(offset_s: int, what: str) -> int:
        # libfaketime re-reads its file at most once a second: a few records may still
        # carry the old time.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            _, offset, stamp = _produce(producer, topic, f"r{len(offsets)}".encode())
            offsets.append(offset)
            skew_s = stamp / 1000 - time.time()
            if abs(skew_s - offset_s) < 60:
                return stamp
            time.sleep(0.2)
        pytest.fail(f"{what}: LogAppendTime still {skew_s:+.0f} s from true time after 15 s")

    stamped_until(0, "before any jump")
    chaos_faults.set_clock_offset(server, JUMP_S)
    stamped_until(JUMP_S, "after a jump forward")
    chaos_faults.set_clock_offset(server, -JUMP_S)
    stamped_until(-JUMP_S, "after a jump back")
    chaos_faults.set_clock_offset(server, 0)
    stamped_until(0, "back to true time")
    assert offsets == list(range(len(offsets))), offsets
    stored = read_all(server.bootstrap, topic, 1)[0]
    assert [r.value for _, r in sorted(stored.items())] == [f"r{i}".encode() for i in range(len(offsets))]


def test_slow_disk_delays_appends_while_attached_only(server):
    strace = _tool(ensure_program("strace", "strace"), "strace")
    server.start()
    topic = "disk"
    _create(server.bootstrap, topic, {})
    producer = Producer({"bootstrap.servers": server.bootstrap, "acks": "1", "linger.ms": 0})
    _produce(producer, topic, b"warm-up")
    slow = chaos_faults.SlowDisk(strace, server, SLOW_DISK_MS)
    try:
        assert slow.wait_attached() == ""
        # Every append is a pwritev, held SLOW_DISK_MS before it runs.
        traced = [_produce(producer, topic, f"slow{i}".encode())[0] for i in range(3)]
    finally:
        health = slow.detach()
    assert health == "detached, node running"
    assert min(traced) >= SLOW_DISK_MS / 1000, f"appends under strace took {traced} s"
    after = [_produce(producer, topic, f"fast{i}".encode())[0] for i in range(5)]
    assert statistics.median(after) < SLOW_DISK_MS / 1000, f"appends after detaching took {after} s"
    assert len(read_all(server.bootstrap, topic, 1)[0]) == 1 + 3 + 5
