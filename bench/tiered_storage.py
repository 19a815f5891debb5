"""Tiered storage (issue #22) in one sitting: one broker whose remote tier is moto's S3
server on loopback (the e2e suite's `s3_server.py`), a topic that keeps a few segments
locally, GB of records produced through it, then:

- upload throughput: the remote tier's copied bytes over the time from the first copy
  to the last (`kafka_server_brokertopicmetrics_remote_copy_bytes_total`, sampled), and
  each copy's own rate (the broker logs it);
- reads: the remote part read from offset 0 cold (every segment fetched from the store
  into the broker's cache), the same again cached, the local part, and a control topic
  (not tiered) holding the same records read from local disk, each in MB/s of record
  bytes a confluent-kafka consumer received;
- disk: bytes in the partition's local directory against the whole log (local plus
  the bucket's objects).

    target/e2e-venv/bin/python bench/tiered_storage.py --rill target/release/rill \\
        [--gb 1.0] [--segment-mb 16] [--local-segments 3] [--record-kb 8] [--partitions 1]

With --partitions N the records spread over N partitions and only the upload (N at a
time, `remote.log.manager.copier.thread.pool.size`) and disk figures are taken.

It needs the e2e venv (moto, boto3, confluent-kafka: `cargo xtask test --e2e-only` makes
it). moto is a Python server: the upload and cold-read figures are bounded by it, and
are a floor for a real store's. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "e2e"))

from confluent_kafka import Consumer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

import kafka_wire  # noqa: E402
from rill_harness import RillServer  # noqa: E402
from s3_server import S3Server  # noqa: E402


def metric(http: str, name: str) -> float:
    text = urllib.request.urlopen(f"http://{http}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "_total "):
            return float(line.split()[-1])
    return 0.0


def list_offset(bootstrap: str, topic: str, timestamp: int) -> int:
    error, offset, _ = kafka_wire.list_offsets(bootstrap, 0, {topic: 1}, 30.0, timestamp=timestamp)[(topic, 0)]
    assert error == 0, error
    return offset


def read_range(bootstrap: str, topic: str, start: int, end: int) -> tuple[float, int]:
    """Seconds to read offsets [start, end) and the record bytes received."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "bench-tiered", "enable.auto.commit": False,
        "fetch.max.bytes": 64 * 1024 * 1024, "max.partition.fetch.bytes": 16 * 1024 * 1024,
        "queued.max.messages.kbytes": 256 * 1024,
    })
    consumer.assign([TopicPartition(topic, 0, start)])
    got = 0
    position = start
    started = time.monotonic()
    while position < end:
        # A short timeout: consume() waits for all of num_messages or the timeout.
        for m in consumer.consume(num_messages=10000, timeout=0.05):
            if m.error():
                raise RuntimeError(m.error())
            if m.offset() >= end:
                continue
            got += len(m.value() or b"") + len(m.key() or b"")
            position = m.offset() + 1
        if time.monotonic() - started > 600:
            raise RuntimeError(f"read stuck at {position} of [{start}, {end})")
    elapsed = time.monotonic() - started
    consumer.close()
    return elapsed, got


def first_record_ms(bootstrap: str, topic: str, offset: int) -> float:
    """Milliseconds from assigning `offset` to receiving its record (a new consumer each
    time, so the figure includes its connection and metadata: compare them together)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-tiered-latency",
                         "enable.auto.commit": False})
    started = time.monotonic()
    consumer.assign([TopicPartition(topic, 0, offset)])
    while True:
        m = consumer.poll(0.01)
        if m is not None and not m.error():
            break
    elapsed = (time.monotonic() - started) * 1e3
    consumer.close()
    return round(elapsed, 1)


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rill", default=str(ROOT / "target" / "release" / "rill"))
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--segment-mb", type=int, default=16)
    ap.add_argument("--local-segments", type=int, default=3)
    ap.add_argument("--record-kb", type=int, default=8)
    ap.add_argument("--partitions", type=int, default=1,
                    help="partitions of the tiered topic (the reads use partition 0 only)")
    args = ap.parse_args()
    args.rill = str(Path(args.rill).resolve())
    os.environ["RILL_BIN"] = args.rill
    work = Path(tempfile.mkdtemp(prefix="rill-tiered-bench-"))
    s3 = S3Server(work)
    segment = args.segment_mb * 1024 * 1024
    overrides = {
        **s3.broker_overrides(),
        "http.listeners": "127.0.0.1:0",
        "remote.log.manager.task.interval.ms": "500",
        "log.retention.check.interval.ms": "1000",
        # The whole remote part fits the cache, so the second read is all cached.
        "remote.log.reader.cache.size.bytes": str(int(args.gb * 2 * 1024**3)),
    }
    (work / "rill").mkdir()
    rill = RillServer(work / "rill", overrides=overrides, binary=Path(args.rill)).start()
    out: dict = {"partitions": args.partitions, "gb": args.gb, "segment_mb": args.segment_mb, "local_segments": args.local_segments,
                 "record_kb": args.record_kb, "store": "moto (Python) on loopback"}
    try:
        http = rill.http_address()
        topic = "tiered-bench"
        admin = AdminClient({"bootstrap.servers": rill.bootstrap})
        admin.create_topics([NewTopic(topic, args.partitions, 1, config={
            "remote.storage.enable": "true",
            "segment.bytes": str(segment),
            "local.retention.bytes": str(args.local_segments * segment),
        })])[topic].result(30)
        records = int(args.gb * 1024**3 / (args.record_kb * 1024))
        samples: list[tuple[float, float]] = []
        t0 = time.monotonic()
        produce = subprocess.Popen(
            [args.rill, "bench", "produce", "-b", rill.bootstrap, "--topic", topic,
             "--records", str(records), "--record-size", str(args.record_kb * 1024),
             "--acks", "1", "--output", "json"],
            stdout=subprocess.PIPE, text=True)
        while produce.poll() is None:
            samples.append((time.monotonic(), metric(http, "kafka_server_brokertopicmetrics_remote_copy_bytes")))
            time.sleep(0.5)
        out["produce"] = json.loads(produce.stdout.read())
        # Until every closed segment is copied and the local tier is down to size.
        while True:
            samples.append((time.monotonic(), metric(http, "kafka_server_brokertopicmetrics_remote_copy_bytes")))
            lag = metric(http, "kafka_server_brokertopicmetrics_remote_copy_lag_segments")
            local = max(len(list((rill.data_dir / f"{topic}-{p}").glob("*.log")))
                        for p in range(args.partitions))
            if lag == 0 and local <= args.local_segments + 2:
                break
            if time.monotonic() - t0 > 1800:
                raise RuntimeError("uploads did not catch up in 30 minutes")
            time.sleep(0.5)
        moving = [(t, b) for t, b in samples if b > 0]
        first_t = next(t for t, b in samples if b > 0)
        last_b = samples[-1][1]
        last_t = next(t for t, b in samples if b == last_b)
        out["upload"] = {
            "bytes": last_b,
            "seconds_first_to_last_copy": round(last_t - first_t, 2),
            "mb_per_s": round(last_b / 1e6 / max(last_t - first_t, 1e-3), 1),
            "seconds_after_produce_end": round(samples[-1][0] - t0 - out["produce"].get("seconds", 0), 1)
            if isinstance(out["produce"], dict) and "seconds" in out["produce"] else None,
        }
        ansi = r"(?:\x1b\[[0-9;]*m)*"
        rates = [float(m) for m in re.findall(rf"mb_per_s{ansi}={ansi}([0-9.]+)", rill.log_text())]
        if rates:
            rates.sort()
            out["upload"]["per_copy_mb_per_s_median"] = round(rates[len(rates) // 2], 1)
        if args.partitions > 1:
            # Upload throughput is what a multi-partition run is for.
            out["rss_mb"] = round(rill.rss_bytes() / 1e6, 1)
            out["disk"] = {"local_bytes": sum(du(rill.data_dir / f"{topic}-{p}") for p in range(args.partitions)),
                           "remote_bytes": sum(s3.objects(topic).values())}
            return
        end = list_offset(rill.bootstrap, topic, -1)
        local_start = list_offset(rill.bootstrap, topic, -4)
        out["offsets"] = {"end": end, "local_start": local_start,
                          "earliest": list_offset(rill.bootstrap, topic, -2),
                          "latest_tiered": list_offset(rill.bootstrap, topic, -5)}
        local_bytes = sum(du(rill.data_dir / f"{topic}-{p}") for p in range(args.partitions))
        remote_bytes = sum(s3.objects("tiered-bench").values())
        out["disk"] = {"local_bytes": local_bytes, "remote_bytes": remote_bytes,
                       "local_share": round(local_bytes / max(local_bytes + remote_bytes, 1), 4)}
        # The control: the same records in a topic that is not tiered, read from disk.
        control = "local-bench"
        admin.create_topics([NewTopic(control, 1, 1, config={"segment.bytes": str(segment)})])[control].result(30)
        subprocess.run(
            [args.rill, "bench", "produce", "-b", rill.bootstrap, "--topic", control,
             "--records", str(records), "--record-size", str(args.record_kb * 1024),
             "--acks", "1", "--output", "json"],
            stdout=subprocess.DEVNULL, check=True)
        # One record's latency in the middle of the remote part, cold (its segment not
        # in the cache), then cached; and in the local part.
        middle = local_start // 2
        latency = {"remote_cold_ms": first_record_ms(rill.bootstrap, topic, middle),
                   "remote_cached_ms": first_record_ms(rill.bootstrap, topic, middle),
                   "local_ms": first_record_ms(rill.bootstrap, topic, local_start + 10)}
        out["first_record_latency"] = latency
        reads = {}
        for name, (t, a, b) in [("remote_cold", (topic, 0, local_start)),
                                ("remote_cached", (topic, 0, local_start)),
                                ("local_part_of_tiered", (topic, local_start, end)),
                                ("local_control_topic", (control, 0, records))]:
            seconds, got = read_range(rill.bootstrap, t, a, b)
            reads[name] = {"topic": t, "records": b - a, "mb": round(got / 1e6, 1), "seconds": round(seconds, 2),
                           "mb_per_s": round(got / 1e6 / max(seconds, 1e-3), 1)}
        reads["cache"] = {"hits": metric(http, "rill_remote_log_cache_hits"),
                          "misses": metric(http, "rill_remote_log_cache_misses"),
                          "fetched_bytes": metric(http, "rill_remote_log_cache_fetched_bytes")}
        out["reads"] = reads
        out["rss_mb"] = round(rill.rss_bytes() / 1e6, 1)
    finally:
        rill.stop()
        s3.close()
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
