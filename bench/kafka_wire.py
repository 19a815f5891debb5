"""Just enough of the Kafka wire protocol, over plain sockets, for the scale benchmarks:
ApiVersions v0 and Metadata v1 requests, and a reader of the Metadata v1 response.

The benchmarks use raw requests rather than a client library so that what they time is the
broker: no client-side backoff, metadata cache or background thread sits between the
measurement and the answer.
"""

from __future__ import annotations

import socket
import struct

API_VERSIONS = 18
METADATA = 3


def request(api_key: int, version: int, correlation_id: int, body: bytes, client_id: bytes = b"rill-bench") -> bytes:
    """A whole frame with a v1 request header (api key, version, correlation id, client id)."""
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def api_versions_request(correlation_id: int) -> bytes:
    return request(API_VERSIONS, 0, correlation_id, b"")


def metadata_request(correlation_id: int, topics: list[str] | None = None) -> bytes:
    """Metadata v1; `None` asks for every topic."""
    if topics is None:
        body = struct.pack(">i", -1)
    else:
        body = struct.pack(">i", len(topics))
        for t in topics:
            raw = t.encode()
            body += struct.pack(">h", len(raw)) + raw
    return request(METADATA, 1, correlation_id, body)


def read_frame(sock: socket.socket) -> bytes:
    """One response frame's payload (correlation id first)."""
    size = struct.unpack(">i", read_exact(sock, 4))[0]
    return read_exact(sock, size)


def read_exact(sock: socket.socket, n: int) -> bytes:
    chunks = []
    while n > 0:
        chunk = sock.recv(min(n, 1 << 20))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def take(self, fmt: str):
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def i8(self) -> int:
        return self.take(">b")[0]

    def i16(self) -> int:
        return self.take(">h")[0]

    def i32(self) -> int:
        return self.take(">i")[0]

    def string(self) -> str | None:
        n = self.i16()
        if n < 0:
            return None
        s = self.data[self.pos : self.pos + n].decode()
        self.pos += n
        return s

    def int32s(self) -> list[int]:
        n = self.i32()
        return [self.i32() for _ in range(max(n, 0))]


def parse_metadata_v1(payload: bytes) -> dict[str, list[tuple[int, int]]]:
    """topic -> [(partition, leader)] from a Metadata v1 response (correlation id first)."""
    r = _Reader(payload)
    r.i32()  # correlation id
    for _ in range(r.i32()):  # brokers
        r.i32()
        r.string()
        r.i32()
        r.string()
    r.i32()  # controller id
    topics: dict[str, list[tuple[int, int]]] = {}
    for _ in range(r.i32()):
        error = r.i16()
        name = r.string() or ""
        r.i8()  # is_internal
        parts = []
        for _ in range(r.i32()):
            perror = r.i16()
            index = r.i32()
            leader = r.i32()
            r.int32s()  # replicas
            r.int32s()  # isr
            parts.append((index, leader if perror == 0 else -1))
        if error == 0:
            topics[name] = parts
    return topics


def led_partitions(host: str, port: int, timeout_s: float = 5.0, prefix: str = "") -> int:
    """How many partitions of topics named `prefix`… the broker reports with a leader."""
    with socket.create_connection((host, port), timeout=timeout_s) as sock:
        sock.sendall(metadata_request(1))
        topics = parse_metadata_v1(read_frame(sock))
    return sum(
        1 for name, parts in topics.items() if name.startswith(prefix) for _, leader in parts if leader >= 0
    )


def proc_status(pid: int) -> dict[str, str]:
    fields = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return fields


def rss_mib(pid: int) -> float:
    """VmRSS of a process in MiB."""
    return int(proc_status(pid)["VmRSS"].split()[0]) / 1024


def hwm_mib(pid: int) -> float:
    """VmHWM (peak RSS) of a process in MiB."""
    return int(proc_status(pid)["VmHWM"].split()[0]) / 1024


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc/PID/stat, in seconds."""
    import os

    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # Fields after the command name, which is in parentheses and may hold spaces.
    rest = stat[stat.rindex(")") + 2 :].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(rest[11]) + int(rest[12])) / ticks
