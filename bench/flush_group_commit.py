"""Produce to a topic with `flush.messages=1` (every append fsynced before it is
acknowledged): what group commit of those fsyncs buys with several producers per
partition, and what it costs with one.

    python3 bench/flush_group_commit.py --rill target/release/rill [--records 50000]
        [--partitions 4] [--producers 4] [--acks 1] [--batch-size BYTES] [--linger-ms MS]
        [--rate RECORDS_PER_S] [--topic-config flush.messages=1] [--port 19292] [--strace]

Steps: a fresh one-node server on its own data directory (on the disk, not tmpfs:
fsync must cost what it costs), `rill topic create` of PARTITIONS partitions with
`flush.messages=1` (or the TOPIC_CONFIG given, repeatable; `--topic-config none` for the
defaults, which fsync nothing: the produce path without the flush), then `rill bench produce` of RECORDS 1 KiB records with PRODUCERS
producers and ACKS (with BATCH_SIZE, LINGER_MS and RATE passed on when given: small
batches make many appends, so many fsyncs; a RATE below the ceiling makes the latency
the broker's rather than the producers' queueing). With --strace, `strace -f -c -e trace=fsync,fdatasync` is attached to
the server once the topic exists and detached when the producers are done, and the
number of those calls is reported (strace slows every traced call: compare runs with
the same flag only).

Prints one JSON object: the bench figures (records/s, MB/s, latency percentiles), and
with --strace the fsync and fdatasync counts.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_json(cmd: list[str]) -> dict:
    out = subprocess.run(
        cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ).stdout
    return json.loads(out)


def syscall_counts(strace_out: str) -> dict:
    """The `calls` column of `strace -c` for fsync and fdatasync."""
    counts = {}
    for line in strace_out.splitlines():
        m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(fsync|fdatasync)\s*$", line)
        if m:
            counts[m.group(2)] = int(m.group(1))
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rill", required=True)
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--batch-size", type=int)
    ap.add_argument("--linger-ms", type=int)
    ap.add_argument("--rate", type=int)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--acks", default="1")
    ap.add_argument("--port", type=int, default=19292)
    ap.add_argument("--data-dir", help="parent of the server's data directory (default: the system's temp dir)")
    ap.add_argument("--topic-config", action="append")
    ap.add_argument("--strace", action="store_true")
    args = ap.parse_args()
    topic_config = [c for c in (args.topic_config or ["flush.messages=1"]) if c != "none"]

    bootstrap = f"127.0.0.1:{args.port}"
    workdir = Path(tempfile.mkdtemp(prefix="rill-flush-bench-", dir=args.data_dir))
    strace_file = workdir / "strace.txt"
    cmd = [args.rill, "server", "--listen", bootstrap, "--data-dir", str(workdir / "data"),
           "--override", "http.listeners="]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tracer = None
    result: dict = {}
    try:
        assert server.stdout is not None
        deadline = time.monotonic() + 60
        while "rill listening on" not in (line := server.stdout.readline()):
            if not line and server.poll() is not None or time.monotonic() > deadline:
                sys.exit("rill server did not start listening")
        subprocess.run(
            [args.rill, "topic", "create", "t", "-b", bootstrap, "-p", str(args.partitions),
             "-r", "1", *[arg for c in topic_config for arg in ("-c", c)]],
            check=True, stdout=subprocess.DEVNULL,
        )
        if args.strace:
            tracer = subprocess.Popen(
                ["strace", "-f", "-c", "-e", "trace=fsync,fdatasync", "-o", str(strace_file),
                 "-p", str(server.pid)],
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)  # attached to every thread before the load starts
        produce = [
            args.rill, "bench", "produce", "-b", bootstrap, "--output", "json", "--topic", "t",
            "--records", str(args.records), "--record-size", str(args.record_size),
            "--acks", args.acks, "--producers", str(args.producers),
        ]
        for flag, value in [("--batch-size", args.batch_size), ("--linger-ms", args.linger_ms),
                            ("--rate", args.rate)]:
            if value is not None:
                produce += [flag, str(value)]
        result = run_json(produce)
    finally:
        if tracer is not None:
            tracer.send_signal(signal.SIGINT)  # detaches and writes the summary
            tracer.wait(60)
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(120)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    if args.strace and strace_file.exists():
        result["syscalls"] = syscall_counts(strace_file.read_text())
    shutil.rmtree(workdir, ignore_errors=True)
    result["setup"] = {
        "partitions": args.partitions, "producers": args.producers, "acks": args.acks,
        "topic_config": topic_config,
        "records": args.records, "record_size": args.record_size,
        "batch_size": args.batch_size, "linger_ms": args.linger_ms, "rate": args.rate,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
