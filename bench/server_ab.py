"""Two server binaries side by side: `rill bench produce` then `rill bench consume` against
a fresh single-node server of each, in turn (A B, then B A, ...), so that a drift in the
machine's speed lands on both.

    python3 bench/server_ab.py --a OLD/rill --b NEW/rill [--client NEW/rill]
        [--rounds 10] [--records 1000000] [--record-size 1024]
        [--http-on b [--http-on a]] [--scrape-interval 1.0]

Each round starts each server on free loopback ports with an empty data directory,
produces RECORDS records (acks=1, 6 partitions) to a new topic and reads them back. Around
each step the server's CPU time (utime + stime of /proc/PID/stat) gives its CPU-seconds per
GB of record values. One client binary drives both servers (default: B's), so that only the
server differs. The servers run with their HTTP listener off, except a side named by
`--http-on`, whose listener is on and whose /metrics a thread of this script scrapes every
`--scrape-interval` seconds while it produces and consumes (the scrapes' CPU is the
server's and counts); `--a` and `--b` may then be the same binary. Prints a line per run and, per binary, the median, min and max of produce
MB/s, consume MB/s and the two CPU-s/GB figures, then the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import threading
import time
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bench(client: str, kind: str, bootstrap: str, topic: str, records: int, size: int) -> dict:
    args = [client, "bench", kind, "-b", bootstrap, "--topic", topic, "--records", str(records)]
    if kind == "produce":
        args += ["--record-size", str(size), "--acks", "1"]
    out = subprocess.run(args + ["--output", "json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


class Scraper(threading.Thread):
    """GETs /metrics every `interval` seconds until stopped; counts scrapes and bytes."""

    def __init__(self, address: str, interval: float):
        super().__init__(daemon=True)
        self.url, self.interval = f"http://{address}/metrics", interval
        self.stopped = threading.Event()
        self.scrapes, self.bytes, self.seconds = 0, 0, 0.0

    def run(self):
        while not self.stopped.wait(self.interval):
            started = time.monotonic()
            with urllib.request.urlopen(self.url, timeout=10) as response:
                self.bytes += len(response.read())
            self.seconds += time.monotonic() - started
            self.scrapes += 1


def one_run(server: str, client: str, topic: str, records: int, size: int,
            http: bool = False, scrape_interval: float = 1.0) -> dict:
    data = tempfile.mkdtemp(prefix="rill-ab-")
    port, controller = free_port(), free_port()
    http_address = f"127.0.0.1:{free_port()}" if http else ""
    proc = subprocess.Popen(
        [server, "server", "--listen", f"127.0.0.1:{port}",
         "--controller-listen", f"127.0.0.1:{controller}", "--data-dir", data,
         "--override", f"http.listeners={http_address}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    scraper = None
    try:
        for line in proc.stdout:
            if line.startswith("rill listening"):
                break
        else:
            raise RuntimeError(f"{server} exited before listening")
        time.sleep(1)  # the broker's registration and unfencing
        bootstrap = f"127.0.0.1:{port}"
        gb = records * size / 1e9
        if http:
            scraper = Scraper(http_address, scrape_interval)
            scraper.start()
        before = cpu_seconds(proc.pid)
        produced = bench(client, "produce", bootstrap, topic, records, size)
        middle = cpu_seconds(proc.pid)
        consumed = bench(client, "consume", bootstrap, topic, records, size)
        after = cpu_seconds(proc.pid)
        result = {
            "produce_mb_s": produced["mb_per_sec"],
            "consume_mb_s": consumed["mb_per_sec"],
            "produce_cpu_s_per_gb": (middle - before) / gb,
            "consume_cpu_s_per_gb": (after - middle) / gb,
        }
        if scraper is not None:
            scraper.stopped.set()
            scraper.join(15)
            result["scrapes"] = float(scraper.scrapes)
        return result
    finally:
        if scraper is not None:
            scraper.stopped.set()
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="the first server binary (e.g. the old one)")
    ap.add_argument("--b", required=True, help="the second server binary")
    ap.add_argument("--client", help="the rill binary whose `bench` drives both (default: --b)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--http-on", action="append", choices=["a", "b"], default=[],
                    help="run this side with its HTTP listener on and /metrics scraped")
    ap.add_argument("--scrape-interval", type=float, default=1.0)
    args = ap.parse_args()
    client = args.client or args.b
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    for round_ in range(args.rounds):
        for name in ("a", "b") if round_ % 2 == 0 else ("b", "a"):
            run = one_run(getattr(args, name), client, f"ab-{round_}", args.records,
                          args.record_size, name in args.http_on, args.scrape_interval)
            runs[name].append(run)
            print(name, round_, " ".join(f"{k}={v:.2f}" for k, v in run.items()), flush=True)
    summary = {}
    for name, rows in runs.items():
        summary[name] = {
            key: {
                "median": statistics.median(r[key] for r in rows),
                "min": min(r[key] for r in rows),
                "max": max(r[key] for r in rows),
            }
            for key in rows[0]
            if key != "scrapes"
        }
        cells = ", ".join(
            f"{key} {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})"
            for key, v in summary[name].items()
        )
        print(f"{name}: {cells}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
