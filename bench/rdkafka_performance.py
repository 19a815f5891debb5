"""`rill bench` and librdkafka's rdkafka_performance side by side, against one fresh server:
the same records through our client and through an independent one (issue #8).

    cargo xtask rdkafka-performance          # builds the tool, prints its path
    python3 bench/rdkafka_performance.py --rill target/release/rill \\
        --rdkafka-performance target/rdkafka-performance/rdkafka_performance \\
        [--records 1000000] [--record-size 1024] [--partitions 6] [--runs 3] [--port 19193]

Steps, against one `rill server` on a fresh data directory:
1. `rill bench limits` (loopback TCP is the ceiling every figure is a fraction of);
2. RUNS rounds, each on new 6-partition topics (which client goes first alternates):
   a. `rill bench produce --acks 1` of RECORDS records, then `rill bench consume` of them;
   b. `rdkafka_performance -P -a 1` of RECORDS records (linger.ms=5 and batch.size=1 MiB, as
      `rill bench` uses, instead of the tool's linger.ms=1000), then `rdkafka_performance -C`
      of every partition from the beginning until RECORDS are read.
   Around each, the server's CPU time (utime + stime from /proc) gives CPU-seconds per GB
   of record values, and stime's share of it. The run's topics are then deleted (unless
   --keep-topics): as a sitting's writes fill the machine's memory with page cache, the
   kernel's share of a produce grows (0.45 CPU-s/GB became 2 on a 23 GB machine after
   ~6 GB), and the runs would stop being alike.
Prints one JSON object: every run, and per measure the minimum, median and maximum over the
runs (a shared machine is noisy: compare medians, and the best case with the maximum).

rdkafka_performance reports its own rates: the producer's from its first produce call to
the last delivery report, the consumer's from the first record received (so its time leaves
out connecting and the first fetch). The wall-clock rate of the whole process is given
beside them. Its records are a repeated text pattern, `rill bench`'s are random bytes; no
compression is used by either.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kafka_wire import cpu_seconds  # noqa: E402
from single_node import bench  # noqa: E402

PRODUCED = re.compile(
    r"^% (?P<messages>\d+) messages produced \((?P<bytes>\d+) bytes\), "
    r"(?P<delivered>\d+) delivered \(offset -?\d+, (?P<failed>\d+) failed\) in (?P<ms>\d+)ms: "
    r"(?P<msgs_per_sec>\d+) msgs/s and (?P<mb_per_sec>[\d.]+) MB/s, "
    r"(?P<backpressures>\d+) produce failures",
    re.MULTILINE,
)
CONSUMED = re.compile(
    r"^% (?P<messages>\d+) messages \((?P<bytes>\d+) bytes\) consumed in (?P<ms>\d+)ms: "
    r"(?P<msgs_per_sec>\d+) msgs/s \((?P<mb_per_sec>[\d.]+) MB/s\)",
    re.MULTILINE,
)
ERRORS = re.compile(
    r"^% (FATAL ERROR CALLBACK|ERROR CALLBACK|Message delivery failed|Consume error).*$",
    re.MULTILINE,
)
TIMEOUT_S = 600


def cpu_split(pid: int) -> tuple[float, float]:
    """utime and stime of a process from /proc/PID/stat, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    rest = stat[stat.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(rest[11]) / ticks, int(rest[12]) / ticks


def measured(pid: int, run, gb: float) -> tuple:
    """Runs `run()`; returns its result and the server's CPU during it: seconds per GB,
    and the share of them spent in the kernel (stime), where page-cache writeback and
    reclaim show when the machine's memory fills with the sitting's writes."""
    user0, sys0 = cpu_split(pid)
    result = run()
    user1, sys1 = cpu_split(pid)
    total = (user1 - user0) + (sys1 - sys0)
    return result, {
        "broker_cpu_s_per_gb": round(total / gb, 3),
        "broker_kernel_share": round((sys1 - sys0) / total, 2) if total else 0.0,
    }


def start_server(rill: str, bootstrap: str, data_dir: Path, log) -> subprocess.Popen:
    # Deleted topics' files go at once, so that a run's deletion frees its page cache.
    server = subprocess.Popen(
        [rill, "server", "--listen", bootstrap, "--data-dir", str(data_dir),
         "--override", "log.segment.delete.delay.ms=0"],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )
    assert server.stdout is not None
    while "rill listening on" not in (line := server.stdout.readline()):
        if not line:
            sys.exit("rill server exited before listening")
    return server


def stop_server(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(300)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def run_tool(binary: str, args: list[str], pattern: re.Pattern) -> tuple[dict, float]:
    """Runs rdkafka_performance; returns its closing summary line's fields and the wall
    seconds of the whole process. Fails on a non-zero exit or on an error line."""
    started = time.perf_counter()
    result = subprocess.run(
        [binary, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        timeout=TIMEOUT_S,
    )
    wall = time.perf_counter() - started
    out = result.stdout
    errors = [m.group(0) for m in ERRORS.finditer(out)]
    matches = list(pattern.finditer(out))
    if result.returncode != 0 or errors or not matches:
        sys.exit(f"rdkafka_performance {' '.join(args)} -> {result.returncode}\n{out[-4000:]}")
    return matches[-1].groupdict(), wall


def tool_round(binary: str, rill: str, bootstrap: str, pid: int, topic: str, records: int,
               record_size: int, partitions: int) -> dict:
    """rdkafka_performance produces RECORDS records with acks=1 and reads them back."""
    subprocess.run(
        [rill, "topic", "create", "-b", bootstrap, "-p", str(partitions), topic],
        check=True, stdout=subprocess.DEVNULL,
    )
    gb = records * record_size / 1e9
    mb = records * record_size / 1e6
    (summary, wall), cpu = measured(pid, lambda: run_tool(binary, [
        "-P", "-t", topic, "-b", bootstrap, "-s", str(record_size), "-c", str(records),
        "-a", "1", "-X", "linger.ms=5", "-X", "batch.size=1048576",
        "-X", "queue.buffering.max.messages=1000000",
        "-X", "queue.buffering.max.kbytes=1048576",
    ], PRODUCED), gb)
    if int(summary["delivered"]) != records or int(summary["failed"]) != 0:
        sys.exit(f"rdkafka_performance delivered {summary} of {records}")
    produce = {
        "records_per_sec": int(summary["msgs_per_sec"]),
        "mb_per_sec": float(summary["mb_per_sec"]),
        "wall_mb_per_sec": round(mb / wall, 1),
        "queue_full_backpressures": int(summary["backpressures"]),
        **cpu,
    }
    partition_args = [arg for p in range(partitions) for arg in ("-p", str(p))]
    (summary, wall), cpu = measured(pid, lambda: run_tool(binary, [
        "-C", "-t", topic, "-b", bootstrap, *partition_args, "-o", "beginning",
        "-c", str(records), "-e", "-X", "enable.partition.eof=true",
    ], CONSUMED), gb)
    if int(summary["messages"]) != records:
        sys.exit(f"rdkafka_performance consumed {summary['messages']} of {records}")
    consume = {
        "records_per_sec": int(summary["msgs_per_sec"]),
        "mb_per_sec": float(summary["mb_per_sec"]),
        "wall_mb_per_sec": round(mb / wall, 1),
        **cpu,
    }
    return {"produce_acks1": produce, "consume": consume}


def rill_round(rill: str, bootstrap: str, pid: int, topic: str, records: int,
               record_size: int, partitions: int) -> dict:
    """`rill bench produce --acks 1` of RECORDS records, then `rill bench consume`."""
    gb = records * record_size / 1e9
    produce, produce_cpu = measured(pid, lambda: bench(
        rill, bootstrap, "produce", "--topic", topic, "--records", str(records),
        "--record-size", str(record_size), "--acks", "1", "--partitions", str(partitions)), gb)
    consume, consume_cpu = measured(
        pid, lambda: bench(rill, bootstrap, "consume", "--topic", topic), gb)
    pick = ("records_per_sec", "mb_per_sec")
    return {
        "produce_acks1": {**{k: round(produce[k], 1) for k in pick}, **produce_cpu},
        "consume": {**{k: round(consume[k], 1) for k in pick}, **consume_cpu},
    }


def spread(runs: list[dict]) -> dict:
    """min, median, max of every numeric leaf over the runs, keyed like one run."""
    out: dict = {}
    for client, sides in runs[0].items():
        out[client] = {}
        for side, figures in sides.items():
            out[client][side] = {}
            for key in figures:
                values = [run[client][side][key] for run in runs]
                out[client][side][key] = {
                    "min": min(values),
                    "median": round(statistics.median(values), 3),
                    "max": max(values),
                }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rill", default="target/release/rill")
    ap.add_argument("--rdkafka-performance", default="target/rdkafka-performance/rdkafka_performance")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port", type=int, default=19193)
    ap.add_argument("--data-dir", type=Path)
    ap.add_argument("--keep-topics", action="store_true",
                    help="keep each run's topics (by default deleted after the run)")
    args = ap.parse_args()

    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="rill-rdperf-"))
    bootstrap = f"127.0.0.1:{args.port}"
    log = open(f"{data_dir}.log", "w")
    server = start_server(args.rill, bootstrap, data_dir, log)
    result: dict = {
        "records": args.records, "record_size": args.record_size,
        "partitions": args.partitions, "acks": "1",
    }
    try:
        pid = server.pid
        time.sleep(1.0)
        limits = bench(args.rill, bootstrap, "limits", "--data-dir", str(data_dir))
        result["loopback_tcp_mb_per_sec"] = limits["loopback_tcp_mb_per_sec"]
        runs = []
        for i in range(args.runs):
            rounds = {
                "rill_bench": lambda: rill_round(
                    args.rill, bootstrap, pid, f"rb{i}", args.records, args.record_size,
                    args.partitions),
                "rdkafka_performance": lambda: tool_round(
                    args.rdkafka_performance, args.rill, bootstrap, pid, f"rk{i}",
                    args.records, args.record_size, args.partitions),
            }
            # Alternate which client goes first: the later one of a run meets more of the
            # sitting's writes still in the page cache.
            order = list(rounds) if i % 2 == 0 else list(reversed(rounds))
            done = {client: rounds[client]() for client in order}
            run = {client: done[client] for client in rounds}
            if not args.keep_topics:
                subprocess.run(
                    [args.rill, "topic", "delete", "-b", bootstrap, f"rb{i}", f"rk{i}"],
                    check=True, stdout=subprocess.DEVNULL,
                )
            for sides in run.values():
                for figures in sides.values():
                    figures["fraction_of_loopback"] = round(
                        figures["mb_per_sec"] / result["loopback_tcp_mb_per_sec"], 3)
            runs.append(run)
            print(f"run {i + 1}/{args.runs}: {json.dumps(runs[-1])}", file=sys.stderr)
        result["runs"] = runs
        result["over_runs"] = spread(runs)
        result["broker_cpu_s_total"] = round(cpu_seconds(pid), 2)
    finally:
        stop_server(server)
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
