"""One broker, one sitting: the machine's ceilings, then throughput, latency, the broker's
CPU per GB and its memory, each measured in the same run.

    python3 bench/single_node.py --rill target/release/rill [--records 1000000]
        [--port 19192] [--data-dir DIR] [--e2e-rate 50000] [--partitions-under-load 1000]
        [--rdkafka-performance target/rdkafka-performance/rdkafka_performance]

Steps (each a `rill bench` command, run one after the other against one fresh server):
1. `bench limits` on the server's data directory (loopback TCP, disk, memcpy);
2. `bench produce --acks 1` of RECORDS 1 KiB records to a 6-partition topic, the same
   with `--acks all` to another, then `bench consume` of the first topic's records; around each, the server's CPU time (utime +
   stime from /proc/PID/stat) gives CPU-seconds per GB of record values ingested and
   served, and a sampler (every 50 ms) gives its peak RSS;
3. `bench e2e` at E2E_RATE records/s for 10 s;
4. `bench produce --acks 1` of RECORDS records to a topic of PARTITIONS_UNDER_LOAD
   partitions, with the peak RSS during it: memory at full load with many partitions;
5. with --rdkafka-python, `bench/rdkafka_throughput.py` (librdkafka) for RECORDS/2 records;
6. with --rdkafka-performance (built by `cargo xtask rdkafka-performance`), librdkafka's own
   rdkafka_performance produces RECORDS records with acks=1 to a 6-partition topic and
   reads them back, with the broker's CPU-seconds per GB (`bench/rdkafka_performance.py`
   runs it several times beside `rill bench`).
The server's idle RSS is read before step 1 and after step 4.

Prints one JSON object with every figure, each throughput also as a fraction of the
loopback figure of step 1.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kafka_wire import cpu_seconds, hwm_mib, rss_mib  # noqa: E402


class PeakRss:
    """Samples a process's VmRSS on a thread until stopped."""

    def __init__(self, pid: int, interval_s: float = 0.05):
        self.pid = pid
        self.interval_s = interval_s
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mib(self.pid))
            time.sleep(self.interval_s)

    def __enter__(self) -> "PeakRss":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def bench(rill: str, bootstrap: str, *args: str) -> dict:
    out = subprocess.run(
        [rill, "bench", *args, "-b", bootstrap, "--output", "json"],
        check=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ).stdout
    return json.loads(out)


def measured(pid: int, run) -> tuple[dict, float, float]:
    """Runs `run()`; returns its result, the server's CPU seconds during it, peak RSS."""
    before = cpu_seconds(pid)
    with PeakRss(pid) as peak:
        result = run()
    return result, cpu_seconds(pid) - before, peak.peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rill", default="target/release/rill")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--port", type=int, default=19192)
    ap.add_argument("--data-dir", type=Path)
    ap.add_argument("--e2e-rate", type=int, default=50_000)
    ap.add_argument("--e2e-seconds", type=int, default=10)
    ap.add_argument("--partitions-under-load", type=int, default=1000)
    ap.add_argument("--rdkafka-python", help="a python with confluent-kafka: also run rdkafka_throughput.py")
    ap.add_argument("--rdkafka-performance", help="librdkafka's rdkafka_performance: also run it")
    args = ap.parse_args()

    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="rill-single-"))
    bootstrap = f"127.0.0.1:{args.port}"
    log = open(f"{data_dir}.log", "w")
    server = subprocess.Popen(
        [args.rill, "server", "--listen", bootstrap, "--data-dir", str(data_dir),
         "--override", "http.listeners="],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )
    result: dict = {"records": args.records, "record_size": args.record_size}
    try:
        assert server.stdout is not None
        while "rill listening on" not in (line := server.stdout.readline()):
            if not line:
                sys.exit("rill server exited before listening")
        pid = server.pid
        time.sleep(2.0)
        result["idle_rss_mib"] = round(rss_mib(pid), 1)

        limits = bench(args.rill, bootstrap, "limits", "--data-dir", str(data_dir))
        result["limits"] = limits
        loopback = limits["loopback_tcp_mb_per_sec"]
        gb = args.records * args.record_size / 1e9

        produce, cpu, peak = measured(pid, lambda: bench(
            args.rill, bootstrap, "produce", "--topic", "p1", "--records", str(args.records),
            "--record-size", str(args.record_size), "--acks", "1"))
        result["produce_acks1"] = {
            **produce,
            "fraction_of_loopback": round(produce["mb_per_sec"] / loopback, 3),
            "broker_cpu_s": round(cpu, 2),
            "broker_cpu_s_per_gb": round(cpu / gb, 3),
            "broker_peak_rss_mib": round(peak, 1),
        }

        all_acks, cpu, peak = measured(pid, lambda: bench(
            args.rill, bootstrap, "produce", "--topic", "p2", "--records", str(args.records),
            "--record-size", str(args.record_size), "--acks", "all"))
        result["produce_acks_all"] = {
            **all_acks,
            "fraction_of_loopback": round(all_acks["mb_per_sec"] / loopback, 3),
            "broker_cpu_s_per_gb": round(cpu / gb, 3),
            "broker_peak_rss_mib": round(peak, 1),
        }

        consume, cpu, peak = measured(pid, lambda: bench(args.rill, bootstrap, "consume", "--topic", "p1"))
        result["consume"] = {
            **consume,
            "fraction_of_loopback": round(consume["mb_per_sec"] / loopback, 3),
            "broker_cpu_s": round(cpu, 2),
            "broker_cpu_s_per_gb": round(cpu / gb, 3),
            "broker_peak_rss_mib": round(peak, 1),
        }

        e2e, cpu, peak = measured(pid, lambda: bench(
            args.rill, bootstrap, "e2e", "--topic", "e1", "--rate", str(args.e2e_rate),
            "--duration", str(args.e2e_seconds)))
        result["e2e"] = {
            **e2e,
            "offered_fraction_of_loopback": round(args.e2e_rate * args.record_size / 1e6 / loopback, 4),
            "broker_cpu_s": round(cpu, 2),
            "broker_peak_rss_mib": round(peak, 1),
        }

        many, cpu, peak = measured(pid, lambda: bench(
            args.rill, bootstrap, "produce", "--topic", "p1000",
            "--partitions", str(args.partitions_under_load), "--records", str(args.records),
            "--record-size", str(args.record_size), "--acks", "1"))
        result["produce_many_partitions"] = {
            **many,
            "partitions": args.partitions_under_load,
            "broker_cpu_s": round(cpu, 2),
            "broker_peak_rss_mib": round(peak, 1),
        }
        if args.rdkafka_python:
            script = Path(__file__).resolve().parent / "rdkafka_throughput.py"
            out = subprocess.run(
                [args.rdkafka_python, str(script), "--bootstrap", bootstrap,
                 "--records", str(args.records // 2), "--record-size", str(args.record_size),
                 "--acks", "1", "--pid", str(pid)],
                check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            ).stdout
            result["rdkafka"] = out.strip().splitlines()
        if args.rdkafka_performance:
            from rdkafka_performance import Setup, tool_round

            setup = Setup(args.rill, bootstrap, [pid], args.records, args.record_size, 6)
            tool = tool_round(args.rdkafka_performance, setup, "rk1")
            for side in tool.values():
                side["fraction_of_loopback"] = round(side["mb_per_sec"] / loopback, 3)
            result["rdkafka_performance"] = tool
        time.sleep(2.0)
        result["idle_rss_after_mib"] = round(rss_mib(pid), 1)
        result["hwm_mib"] = round(hwm_mib(pid), 1)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(300)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
