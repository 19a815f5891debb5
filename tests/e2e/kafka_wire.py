"""Kafka requests built by hand, one per fresh connection, for the fault-injection suite
(`chaos.py`) and the failover tests: a client library hides which node answered and
retries behind the caller's back, and these checks need one answer from one node.

Each helper sends one request at a fixed version (non-flexible, request header v1) and
parses only the fields the checks read; a short or odd answer raises `struct.error` or
`OSError`, which the callers count as "no answer"."""

from __future__ import annotations

import socket
import struct

# Every request of the checkers is bounded by this (they ask often, and a node that does
# not answer within it is as good as unreachable).
REQUEST_TIMEOUT_S = 2.0

# FindCoordinator's key types.
GROUP, TRANSACTION = 0, 1
# ListOffsets' isolation levels, and its "latest" timestamp: the high watermark at
# READ_UNCOMMITTED, the last stable offset at READ_COMMITTED.
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
LATEST_TIMESTAMP = -1

def kstring(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">h", len(raw)) + raw


def call(host: str, api_key: int, version: int, body: bytes, timeout_s: float) -> tuple[bytes, int]:
    """One request on a fresh connection; the response body and where it starts."""
    header = struct.pack(">hhi", api_key, version, 1) + kstring("chaos-checker")
    frame = struct.pack(">i", len(header) + len(body)) + header + body
    address, port = host.rsplit(":", 1)
    with socket.create_connection((address, int(port)), timeout=timeout_s) as sock:
        sock.settimeout(timeout_s)
        sock.sendall(frame)
        size = struct.unpack(">i", read_exact(sock, 4))[0]
        return read_exact(sock, size), 4  # after the correlation id


def offset_fetch(host: str, group: str, topic: str, partitions: int, timeout_s: float):
    """OffsetFetch v2 sent to one node; {partition: offset} for the partitions it answered
    without error (as the coordinator), plus the error codes it gave for the rest. (v2 has
    the top-level error; a v1 answer carries a failed request's error on each partition,
    see test_failover.py.)"""
    body = kstring(group) + struct.pack(">i", 1) + kstring(topic) + struct.pack(">i", partitions)
    body += b"".join(struct.pack(">i", p) for p in range(partitions))
    payload, pos = call(host, 9, 2, body, timeout_s)
    offsets, errors = {}, {}
    answered, pos = offset_fetch_partitions(payload, pos)
    for p, (offset, error) in answered.items():
        if error == 0:
            if offset >= 0:
                offsets[p] = offset
        else:
            errors[p] = error
    (top_error,) = struct.unpack_from(">h", payload, pos)
    if top_error != 0:
        return {}, {p: top_error for p in range(partitions)}
    return offsets, errors


def offset_fetch_partitions(payload: bytes, pos: int) -> tuple[dict[int, tuple[int, int]], int]:
    """The topics array of an OffsetFetch v1-v5 response (one topic asked for):
    {partition: (committed offset, error code)}, and where the array ends."""
    answered = {}
    (topics,) = struct.unpack_from(">i", payload, pos)
    pos += 4
    for _ in range(topics):
        (n,) = struct.unpack_from(">h", payload, pos)
        pos += 2 + n
        (count,) = struct.unpack_from(">i", payload, pos)
        pos += 4
        for _ in range(count):
            p, offset, meta_len = struct.unpack_from(">iqh", payload, pos)
            pos += 14 + max(meta_len, 0)
            (error,) = struct.unpack_from(">h", payload, pos)
            pos += 2
            answered[p] = (offset, error)
    return answered, pos


def find_coordinator_raw(host: str, key: str, timeout_s: float, key_type: int = GROUP) -> tuple[int, int]:
    """FindCoordinator v1 sent to one node, for a group or (key_type TRANSACTION) a
    transactional id: (error code, coordinator node id)."""
    payload, pos = call(host, 10, 1, kstring(key) + struct.pack(">b", key_type), timeout_s)
    _throttle, error = struct.unpack_from(">ih", payload, pos)
    pos += 6
    (n,) = struct.unpack_from(">h", payload, pos)
    pos += 2 + max(n, 0)
    (node_id,) = struct.unpack_from(">i", payload, pos)
    return error, node_id


def offset_commit(host: str, group: str, topic: str, partition: int, offset: int, timeout_s: float) -> int:
    """OffsetCommit v2 of one offset, as a consumer outside any generation (Kafka's
    "simple" group, generation -1) does it; returns the partition's error code."""
    body = kstring(group) + struct.pack(">i", -1) + kstring("") + struct.pack(">q", -1)
    body += struct.pack(">i", 1) + kstring(topic) + struct.pack(">i", 1)
    body += struct.pack(">iqh", partition, offset, -1)
    payload, pos = call(host, 8, 2, body, timeout_s)
    pos += 4  # one topic
    (n,) = struct.unpack_from(">h", payload, pos)
    pos += 2 + n + 4  # its name, one partition
    _p, error = struct.unpack_from(">ih", payload, pos)
    return error


def read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("connection closed")
        data += chunk
    return data


def list_offsets(host: str, isolation: int, topics: dict[str, int],
                 timeout_s: float, timestamp: int = LATEST_TIMESTAMP
                 ) -> dict[tuple[str, int], tuple[int, int, int]]:
    """ListOffsets v4 (latest, or another `timestamp`) of every partition of `topics`
    ({name: partition count}), sent to one node as a consumer sends it: {(topic,
    partition): (error code, offset, leader epoch)}. Only the partitions the node leads
    answer without an error."""
    body = struct.pack(">ib", -1, isolation) + struct.pack(">i", len(topics))
    for name, count in topics.items():
        body += kstring(name) + struct.pack(">i", count)
        body += b"".join(struct.pack(">iiq", p, -1, timestamp) for p in range(count))
    payload, pos = call(host, 2, 4, body, timeout_s)
    pos += 4  # throttle time
    answered = {}
    (count,) = struct.unpack_from(">i", payload, pos)
    pos += 4
    for _ in range(count):
        (n,) = struct.unpack_from(">h", payload, pos)
        name = payload[pos + 2: pos + 2 + n].decode()
        pos += 2 + n
        (partitions,) = struct.unpack_from(">i", payload, pos)
        pos += 4
        for _ in range(partitions):
            p, error, _timestamp, offset, epoch = struct.unpack_from(">ihqqi", payload, pos)
            pos += 26
            answered[(name, p)] = (error, offset, epoch)
    return answered


def find_on_any(hosts: dict[int, str], key: str, key_type: int = GROUP) -> int | None:
    """The coordinator of `key` (a group, or a transactional id) as the first node that
    answers names it."""
    for host in hosts.values():
        try:
            error, node = find_coordinator_raw(host, key, REQUEST_TIMEOUT_S, key_type)
        except (OSError, struct.error):
            continue
        if error == 0:
            return node
    return None
