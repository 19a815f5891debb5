"""Log cleaner throughput, and produce latency while the cleaner runs versus while it idles.

    target/e2e-venv/bin/python bench/cleaner_latency.py --rill target/release/rill \
        [--fill-records 400000] [--record-size 1024] [--keys 1000] [--rate 5000] [--seconds 8]

Starts its own `rill server` (release build recommended) on a free loopback port with a
scratch data directory, then:

1. fills topic `dirty` (`--dirty-partitions`, 16 MiB segments, `cleanup.policy=delete`, so that
   nothing cleans it yet) with keyed records, `--keys` distinct keys;
2. idle: `rill bench produce --rate` to a fresh topic for `--seconds`, the cleaner with
   nothing to do;
3. cleaning: switches `dirty` to `cleanup.policy=compact` (a live config change) and at
   once runs the same `rill bench produce` again, while the cleaner rewrites `dirty`;
4. idle again, after the cleaner is done, so that an order effect would show.

Cleaner throughput comes from the server's own `cleaned log` lines (broker log_manager):
bytes read by each clean and the wall time of its rewrite (`clean_ms`, no lock held).
Prints one JSON object with the three latency runs, the cleans, and how much of the
cleaning run's window the cleaner was busy.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

ANSI = re.compile(r"\x1b\[[0-9;]*m")
CLEANED = re.compile(
    r"^(?P<ts>\S+)\s+INFO rill_broker::log_manager: cleaned log "
    r"tp=(?P<tp>\S+) bytes_read=(?P<read>\d+) bytes_written=(?P<written>\d+) "
    r"records_retained=(?P<kept>\d+) clean_ms=(?P<ms>[\d.]+)"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_produce(rill: str, bootstrap: str, topic: str, rate: int, seconds: float, size: int):
    started = time.time()
    out = subprocess.run(
        [
            rill, "bench", "produce", "--bootstrap-server", bootstrap, "--topic", topic,
            "--rate", str(rate), "--records", str(int(rate * seconds)),
            "--record-size", str(size), "--acks", "1", "--partitions", "1",
            "--output", "json",
        ],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    result = json.loads(out.stdout)
    result["window"] = (started, time.time())
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rill", default="target/release/rill")
    ap.add_argument("--fill-records", type=int, default=400_000)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--keys", type=int, default=1000)
    # The cleaner takes one log at a time, dirtiest first: several partitions keep it
    # busy for longer than one would.
    ap.add_argument("--dirty-partitions", type=int, default=4)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="rill-cleaner-bench-"))
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    log_path = workdir / "rill.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [
                args.rill, "server", "--listen", bootstrap, "--data-dir", str(workdir / "data"),
                "--override", "log.cleaner.backoff.ms=100", "--override", "http.listeners=",
            ],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NO_COLOR": "1"},
        )  # fmt: skip
    try:
        deadline = time.time() + 30
        while f"rill listening on {bootstrap}" not in log_path.read_text(errors="replace"):
            if time.time() > deadline or server.poll() is not None:
                sys.exit(f"server did not start:\n{log_path.read_text(errors='replace')}")
            time.sleep(0.1)

        admin = AdminClient({"bootstrap.servers": bootstrap})
        config = {
            "cleanup.policy": "delete",
            "segment.bytes": str(16 << 20),
            "min.cleanable.dirty.ratio": "0.01",
        }
        dirty_partitions = args.dirty_partitions
        admin.create_topics([NewTopic("dirty", dirty_partitions, 1, config=config)])[
            "dirty"
        ].result(30)

        fill_started = time.time()
        producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20}
        )
        value = b"x" * args.record_size
        for i in range(args.fill_records):
            while True:
                try:
                    producer.produce(
                        "dirty",
                        key=b"key-%d" % (i % args.keys),
                        value=value,
                        partition=i % dirty_partitions,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
        assert producer.flush(120) == 0
        fill_s = time.time() - fill_started
        dirty_bytes = sum(f.stat().st_size for f in (workdir / "data").glob("dirty-*/*.log"))

        rate, secs, size = args.rate, args.seconds, args.record_size
        # The fill leaves gigabytes of dirty pages whose writeback would stall the runs
        # below whichever comes first; each run starts with the page cache clean.
        os.sync()
        idle = bench_produce(args.rill, bootstrap, "lat-idle", rate, secs, size)

        os.sync()
        subprocess.run(
            [args.rill, "topic", "alter", "dirty", "--bootstrap-server", bootstrap,
             "-c", "cleanup.policy=compact"],
            check=True, capture_output=True,
        )  # fmt: skip
        cleaning = bench_produce(args.rill, bootstrap, "lat-clean", rate, secs, size)
        time.sleep(2)  # let a clean that is still running finish before the idle rerun
        os.sync()
        idle_after = bench_produce(args.rill, bootstrap, "lat-idle2", rate, secs, size)
    finally:
        server.terminate()
        server.wait(30)
        # The filled log is large; the server's log stays for inspection.
        shutil.rmtree(workdir / "data", ignore_errors=True)

    cleans = []
    for line in log_path.read_text(errors="replace").splitlines():
        m = CLEANED.match(ANSI.sub("", line))
        if m and m["tp"].startswith("dirty-"):
            end = datetime.fromisoformat(m["ts"].replace("Z", "+00:00")).timestamp()
            ms = float(m["ms"])
            cleans.append(
                {"bytes_read": int(m["read"]), "bytes_written": int(m["written"]),
                 "clean_ms": ms, "start": end - ms / 1e3, "end": end}
            )  # fmt: skip
    read = sum(c["bytes_read"] for c in cleans)
    busy_ms = sum(c["clean_ms"] for c in cleans)
    w0, w1 = cleaning["window"]
    overlap = sum(max(0.0, min(c["end"], w1) - max(c["start"], w0)) for c in cleans)

    def lat(r):
        return {k: round(v, 3) for k, v in r["latency_ms"].items()} | {
            "records_per_sec": round(r.get("records_per_sec", 0), 1)
        }

    print(
        json.dumps(
            {
                "fill": {
                    "records": args.fill_records,
                    "partitions": args.dirty_partitions,
                    "keys": args.keys,
                    "log_bytes": dirty_bytes,
                    "seconds": round(fill_s, 2),
                },
                "cleaner": {
                    "cleans": len(cleans),
                    "bytes_read": read,
                    "bytes_written": sum(c["bytes_written"] for c in cleans),
                    "busy_ms": round(busy_ms, 1),
                    "mb_per_sec": round(read / 1e6 / (busy_ms / 1e3), 1) if busy_ms else None,
                    "busy_share_of_cleaning_window": round(overlap / (w1 - w0), 3),
                },
                "produce_latency_ms": {
                    "rate": args.rate,
                    "idle": lat(idle),
                    "cleaning": lat(cleaning),
                    "idle_after": lat(idle_after),
                },
                "workdir": str(workdir),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
