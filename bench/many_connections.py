"""Many client connections on one node: is every one served, and what do they cost.

    python3 bench/many_connections.py --bootstrap 127.0.0.1:9092 --pid PID
        [--connections 1000] [--rounds 3] [--producers 10] [--produce-seconds 10]
        [--rill target/release/rill]

1. Opens CONNECTIONS TCP connections to the broker (raising this process's soft fd
   limit to the hard one first) and keeps them all open.
2. For ROUNDS rounds, sends an ApiVersions (v0) and a Metadata (v1, every topic) request
   on every connection, all written before any answer is read, and counts the
   connections that answered both correctly; the round's wall time is reported.
3. Meanwhile PRODUCERS `rill bench produce` processes (if --rill is given) write 1 KiB
   records for PRODUCE_SECONDS at a bounded rate, so that some connections carry data.
4. Reads the broker's RSS (VmRSS, VmHWM), threads and open descriptors with every
   connection open, and again after they are closed.

Prints one JSON object. Only the standard library (and, for the producers, the `rill`
binary) is needed. The broker's `max.connections` (Kafka's default: no limit) and its fd
limit (`rill server` lifts its soft limit to the hard one) bound how many it accepts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kafka_wire import api_versions_request, metadata_request, proc_status  # noqa: E402


def broker_snapshot(pid: int | None) -> dict:
    if pid is None:
        return {}
    status = proc_status(pid)
    return {
        "rss_mib": round(int(status["VmRSS"].split()[0]) / 1024, 1),
        "hwm_mib": round(int(status["VmHWM"].split()[0]) / 1024, 1),
        "threads": int(status["Threads"]),
        "open_fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        sys.exit(f"fd limit {soft} is below the {needed} this run needs (ulimit -n)")


def one_round(conns: list[socket.socket], correlation: int, timeout_s: float) -> tuple[int, float]:
    """Both requests on every connection; returns (connections fully answered, seconds)."""
    sel = selectors.DefaultSelector()
    frames = api_versions_request(correlation) + metadata_request(correlation + 1)
    started = time.monotonic()
    for c in conns:
        c.setblocking(True)
        c.sendall(frames)
        c.setblocking(False)
    buffers = {c.fileno(): bytearray() for c in conns}
    answered = {c.fileno(): 0 for c in conns}
    for c in conns:
        sel.register(c, selectors.EVENT_READ)
    pending = len(conns)
    deadline = started + timeout_s
    while pending and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.5):
            sock: socket.socket = key.fileobj  # type: ignore[assignment]
            fd = sock.fileno()
            try:
                chunk = sock.recv(1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                sel.unregister(sock)
                pending -= 1
                continue
            buf = buffers[fd]
            buf += chunk
            while len(buf) >= 4:
                size = struct.unpack_from(">i", buf)[0]
                if len(buf) < 4 + size:
                    break
                got = struct.unpack_from(">i", buf, 4)[0]
                del buf[: 4 + size]
                if got == correlation + answered[fd]:
                    answered[fd] += 1
                if answered[fd] == 2:
                    sel.unregister(sock)
                    pending -= 1
    sel.close()
    return sum(1 for n in answered.values() if n == 2), time.monotonic() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    ap.add_argument("--pid", type=int, help="the broker's pid, for its RSS and descriptors")
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rill", help="the rill binary, to run producers alongside")
    ap.add_argument("--producers", type=int, default=10)
    ap.add_argument("--produce-seconds", type=int, default=10)
    ap.add_argument("--produce-rate", type=int, default=2000, help="records/s per producer")
    ap.add_argument("--timeout-s", type=float, default=60.0)
    args = ap.parse_args()

    host, port = args.bootstrap.rsplit(":", 1)
    raise_fd_limit(args.connections + 64)
    result: dict = {"connections": args.connections, "before": broker_snapshot(args.pid)}

    producers = []
    if args.rill:
        for i in range(args.producers):
            producers.append(
                subprocess.Popen(
                    [args.rill, "bench", "produce", "-b", args.bootstrap, "--topic", "many-conns",
                     "--records", str(args.produce_rate * args.produce_seconds),
                     "--rate", str(args.produce_rate), "--output", "json"],
                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                )
            )
            if i == 0:
                time.sleep(1.0)  # the first one creates the topic

    conns = []
    refused = 0
    started = time.monotonic()
    for _ in range(args.connections):
        try:
            conns.append(socket.create_connection((host, int(port)), timeout=args.timeout_s))
        except OSError:
            refused += 1
    result["connect_s"] = round(time.monotonic() - started, 3)
    result["connect_failures"] = refused

    result["rounds"] = []
    for r in range(args.rounds):
        served, seconds = one_round(conns, 1000 + 10 * r, args.timeout_s)
        result["rounds"].append({"served": served, "of": len(conns), "seconds": round(seconds, 3)})
    result["all_open"] = broker_snapshot(args.pid)

    for c in conns:
        c.close()
    produced = []
    for p in producers:
        out, _ = p.communicate(timeout=args.produce_seconds * 6 + 60)
        try:
            produced.append(json.loads(out))
        except json.JSONDecodeError:
            produced.append({"exit": p.returncode})
    if produced:
        result["producers"] = {
            "count": len(produced),
            "exit_codes": [p.returncode for p in producers],
            "records_per_sec_each": [round(p.get("records_per_sec", 0)) for p in produced],
        }
    time.sleep(1.0)
    result["after_close"] = broker_snapshot(args.pid)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
