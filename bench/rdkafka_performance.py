"""`rill bench` and librdkafka's rdkafka_performance side by side, against one fresh server:
the same records through our client and through an independent one (issue #8).

    cargo xtask rdkafka-performance          # builds the tool, prints its path
    python3 bench/rdkafka_performance.py --rill target/release/rill \\
        --rdkafka-performance target/rdkafka-performance/rdkafka_performance \\
        [--records 1000000] [--record-size 1024] [--partitions 6] [--runs 3] [--port 19193]
        [--rf3] [--keep-topics]

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
With --rf3 the same runs go to three nodes on loopback (the end-to-end harness), on topics
with replication factor 3 and min.insync.replicas=2, produced with acks=all; CPU is the sum
over the three nodes.

Prints one JSON object: every run, and per measure the minimum, median and maximum over the
runs (a shared machine is noisy: compare medians, and the best case with the maximum).

rdkafka_performance reports its own rates: the producer's from its first produce call to
the last delivery report, the consumer's from the first record received. The wall-clock
rate of the whole process is given beside them; for the consumer it includes ~0.5 s of
librdkafka's own making: its partition consumer (-C) asks for the start offsets before the
first metadata response names the leaders, and retries only after a 500 ms backoff. Its records are a repeated text pattern, `rill bench`'s are random bytes; no
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
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
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


def cpu_split(pids: list[int]) -> tuple[float, float]:
    """utime and stime of processes from /proc/PID/stat, summed, in seconds."""
    ticks = os.sysconf("SC_CLK_TCK")
    user = system = 0.0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
        rest = stat[stat.rindex(")") + 2:].split()
        user += int(rest[11]) / ticks
        system += int(rest[12]) / ticks
    return user, system


def measured(pids: list[int], run, gb: float) -> tuple:
    """Runs `run()`; returns its result and the servers' CPU during it: seconds per GB,
    and the share of them spent in the kernel (stime), where page-cache writeback and
    reclaim show when the machine's memory fills with the sitting's writes."""
    user0, sys0 = cpu_split(pids)
    result = run()
    user1, sys1 = cpu_split(pids)
    total = (user1 - user0) + (sys1 - sys0)
    return result, {
        "broker_cpu_s_per_gb": round(total / gb, 3),
        "broker_kernel_share": round((sys1 - sys0) / total, 2) if total else 0.0,
    }


@dataclass
class Setup:
    """What every round shares: the servers, and how topics are made and written."""
    rill: str
    bootstrap: str
    pids: list[int]
    records: int
    record_size: int
    partitions: int
    replication: int = 1
    acks: str = "1"

    def create_topic(self, topic: str) -> None:
        extra = ["-c", "min.insync.replicas=2"] if self.replication >= 3 else []
        subprocess.run(
            [self.rill, "topic", "create", "-b", self.bootstrap, "-p", str(self.partitions),
             "-r", str(self.replication), *extra, topic],
            check=True, stdout=subprocess.DEVNULL,
        )

    @property
    def gb(self) -> float:
        return self.records * self.record_size / 1e9


def start_server(rill: str, bootstrap: str, data_dir: Path, log) -> subprocess.Popen:
    # Deleted topics' files go at once, so that a run's deletion frees its page cache.
    server = subprocess.Popen(
        [rill, "server", "--listen", bootstrap, "--data-dir", str(data_dir),
         "--override", "log.segment.delete.delay.ms=0", "--override", "http.listeners="],
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


def tool_round(binary: str, setup: Setup, topic: str) -> dict:
    """rdkafka_performance produces RECORDS records with the setup's acks and reads them
    back."""
    setup.create_topic(topic)
    gb, mb, records = setup.gb, setup.gb * 1e3, setup.records
    (summary, wall), cpu = measured(setup.pids, lambda: run_tool(binary, [
        "-P", "-t", topic, "-b", setup.bootstrap, "-s", str(setup.record_size),
        "-c", str(records), "-a", setup.acks, "-X", "linger.ms=5", "-X", "batch.size=1048576",
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
    partition_args = [arg for p in range(setup.partitions) for arg in ("-p", str(p))]
    (summary, wall), cpu = measured(setup.pids, lambda: run_tool(binary, [
        "-C", "-t", topic, "-b", setup.bootstrap, *partition_args, "-o", "beginning",
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
    return {f"produce_acks{setup.acks}": produce, "consume": consume}


def rill_round(setup: Setup, topic: str) -> dict:
    """`rill bench produce` of RECORDS records with the setup's acks, then `rill bench
    consume` of them."""
    setup.create_topic(topic)
    produce, produce_cpu = measured(setup.pids, lambda: bench(
        setup.rill, setup.bootstrap, "produce", "--topic", topic,
        "--records", str(setup.records), "--record-size", str(setup.record_size),
        "--acks", setup.acks), setup.gb)
    consume, consume_cpu = measured(
        setup.pids, lambda: bench(setup.rill, setup.bootstrap, "consume", "--topic", topic),
        setup.gb)
    pick = ("records_per_sec", "mb_per_sec")
    return {
        f"produce_acks{setup.acks}": {**{k: round(produce[k], 1) for k in pick},
                                      **produce_cpu},
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


def sitting(setup: Setup, binary: str, runs: int, keep_topics: bool, loopback: float) -> dict:
    """RUNS rounds of both clients; every run, and min/median/max over them."""
    results = []
    for i in range(runs):
        rounds = {
            "rill_bench": lambda: rill_round(setup, f"rb{i}"),
            "rdkafka_performance": lambda: tool_round(binary, setup, f"rk{i}"),
        }
        # Alternate which client goes first: the later one of a run meets more of the
        # sitting's writes still in the page cache.
        order = list(rounds) if i % 2 == 0 else list(reversed(rounds))
        done = {client: rounds[client]() for client in order}
        run = {client: done[client] for client in rounds}
        if not keep_topics:
            subprocess.run(
                [setup.rill, "topic", "delete", "-b", setup.bootstrap, f"rb{i}", f"rk{i}"],
                check=True, stdout=subprocess.DEVNULL,
            )
        for sides in run.values():
            for figures in sides.values():
                figures["fraction_of_loopback"] = round(figures["mb_per_sec"] / loopback, 3)
        results.append(run)
        print(f"run {i + 1}/{runs}: {json.dumps(run)}", file=sys.stderr)
    return {"runs": results, "over_runs": spread(results)}


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
    ap.add_argument("--rf3", action="store_true",
                    help="three nodes on loopback (tests/e2e/rill_harness.py), topics with "
                         "replication factor 3 and min.insync.replicas=2, acks=all")
    args = ap.parse_args()
    if args.rf3:
        main_rf3(args)
        return

    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="rill-rdperf-"))
    bootstrap = f"127.0.0.1:{args.port}"
    log = open(f"{data_dir}.log", "w")
    server = start_server(args.rill, bootstrap, data_dir, log)
    setup = Setup(args.rill, bootstrap, [server.pid], args.records, args.record_size,
                  args.partitions)
    result: dict = {
        "records": args.records, "record_size": args.record_size,
        "partitions": args.partitions, "replication": 1, "acks": setup.acks,
    }
    try:
        time.sleep(1.0)
        limits = bench(args.rill, bootstrap, "limits", "--data-dir", str(data_dir))
        loopback = limits["loopback_tcp_mb_per_sec"]
        result["loopback_tcp_mb_per_sec"] = loopback
        result.update(sitting(setup, args.rdkafka_performance, args.runs, args.keep_topics,
                              loopback))
        result["broker_cpu_s_total"] = round(sum(cpu_split(setup.pids)), 2)
    finally:
        stop_server(server)
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    print(json.dumps(result, indent=2))


def main_rf3(args: argparse.Namespace) -> None:
    """The same sitting on three nodes, RF=3, acks=all; CPU is the three nodes' sum."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))
    os.environ["RILL_BIN"] = str(Path(args.rill).resolve())
    from rill_harness import RillCluster

    overrides = {"group.initial.rebalance.delay.ms": "0", "log.segment.delete.delay.ms": "0"}
    result: dict = {
        "records": args.records, "record_size": args.record_size,
        "partitions": args.partitions, "replication": 3, "acks": "all",
    }
    with tempfile.TemporaryDirectory(prefix="rill-rdperf-rf3-") as tmp:
        cluster = RillCluster(Path(tmp), 3, overrides).start()
        try:
            pids = [node.pid for node in cluster.nodes.values()]
            setup = Setup(args.rill, cluster.bootstrap, pids, args.records, args.record_size,
                          args.partitions, replication=3, acks="all")
            limits = bench(args.rill, cluster.bootstrap, "limits", "--data-dir", tmp)
            loopback = limits["loopback_tcp_mb_per_sec"]
            result["loopback_tcp_mb_per_sec"] = loopback
            result.update(sitting(setup, args.rdkafka_performance, args.runs,
                                  args.keep_topics, loopback))
        finally:
            problems = cluster.teardown()
            if problems:
                print("\n".join(problems), file=sys.stderr)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
