"""/metrics on a broker with many partitions: the page's size and the time a scrape takes.

    python3 bench/metrics_scrape.py --rill target/release/rill [--topics 100]
        [--partitions-per-topic 100] [--scrapes 20] [--groups 1] [--data-dir DIR]

1. Starts `rill server` with its HTTP listener on an empty data directory and creates
   TOPICS topics of PARTITIONS_PER_TOPIC partitions (RF=1) with `rill topic create`, then
   waits until /metrics shows every partition led here. Then GROUPS groups commit an
   offset (the earliest, 0) on every partition with `rill group reset-offsets`, so that
   the page holds a consumer lag per group and partition too.
2. For `metrics.partition.series.max` at its default (1000, so per-partition series are
   off above it) and at a value above the partition count (on), restarts the server with
   that value and times SCRAPES scrapes of /metrics one after another (wall clock, from the
   request to the last byte), and the server's CPU time they cost.
3. Prints one JSON object: per setting the page's bytes and series, and the median, 90th
   percentile and maximum scrape time in milliseconds.

Only the standard library and the `rill` binary are needed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from server_ab import cpu_seconds, free_port


def get(address: str, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=60) as response:
        return response.read()


def start(rill: str, data_dir: Path, port: int, http: str, series_max: int) -> subprocess.Popen:
    log = open(f"{data_dir}.log", "a")
    proc = subprocess.Popen(
        [rill, "server", "--listen", f"127.0.0.1:{port}", "--data-dir", str(data_dir),
         "--override", f"http.listeners={http}",
         "--override", f"metrics.partition.series.max={series_max}"],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("rill listening"):
            return proc
    raise RuntimeError("the server exited before listening")


def partitions_led(page: bytes) -> int:
    for line in page.decode().splitlines():
        if line.startswith("kafka_server_replicamanager_leader_count "):
            return int(line.split()[1])
    return -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rill", required=True)
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--partitions-per-topic", type=int, default=100)
    ap.add_argument("--scrapes", type=int, default=20)
    ap.add_argument("--groups", type=int, default=1)
    ap.add_argument("--data-dir", type=Path)
    args = ap.parse_args()
    expected = args.topics * args.partitions_per_topic
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="rill-scrape-")) / "data"
    port, http_port = free_port(), free_port()
    http = f"127.0.0.1:{http_port}"
    bootstrap = f"127.0.0.1:{port}"
    result: dict = {"partitions": expected}
    proc = start(args.rill, data_dir, port, http, 1000)
    try:
        created = time.monotonic()
        for t in range(args.topics):
            subprocess.run(
                [args.rill, "topic", "create", f"scrape-{t:04}", "-p",
                 str(args.partitions_per_topic), "-b", bootstrap],
                check=True, capture_output=True,
            )
        deadline = time.monotonic() + 600
        while partitions_led(get(http, "/metrics")) < expected:
            if time.monotonic() > deadline:
                raise RuntimeError("partitions not all led within 600 s")
            time.sleep(0.5)
        result["create_s"] = round(time.monotonic() - created, 1)
        for g in range(args.groups):
            for t in range(args.topics):
                subprocess.run(
                    [args.rill, "group", "reset-offsets", f"scrape-group-{g}", "--topic",
                     f"scrape-{t:04}", "--to-earliest", "-b", bootstrap],
                    check=True, capture_output=True,
                )
        result["groups"] = args.groups
        for name, series_max in (("per_partition_off", 1000), ("per_partition_on", expected + 1000)):
            proc.terminate()
            proc.wait(120)
            proc = start(args.rill, data_dir, port, http, series_max)
            deadline = time.monotonic() + 600
            while partitions_led(get(http, "/metrics")) < expected:
                if time.monotonic() > deadline:
                    raise RuntimeError("partitions not all led again within 600 s")
                time.sleep(0.5)
            time.sleep(2)
            times, size = [], 0
            cpu_before = cpu_seconds(proc.pid)
            for _ in range(args.scrapes):
                started = time.monotonic()
                page = get(http, "/metrics")
                times.append((time.monotonic() - started) * 1000)
                size = len(page)
            cpu = cpu_seconds(proc.pid) - cpu_before
            times.sort()
            result[name] = {
                "series_max": series_max,
                "page_bytes": size,
                "series": sum(1 for line in page.decode().splitlines()
                              if line and not line.startswith("#")),
                "scrape_ms_median": round(statistics.median(times), 1),
                "scrape_ms_p90": round(times[int(len(times) * 0.9) - 1], 1),
                "scrape_ms_max": round(times[-1], 1),
                "server_cpu_ms_per_scrape": round(cpu * 1000 / args.scrapes, 1),
            }
            print(name, json.dumps(result[name]), flush=True)
    finally:
        proc.terminate()
        proc.wait(120)
        if args.data_dir is None:
            shutil.rmtree(data_dir.parent, ignore_errors=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
