"""Many consumers long-polling idle partitions while one partition takes a produce load:
what do the parked fetches cost the broker.

    python3 bench/parked_fetches.py --rill target/release/rill [--fetchers 1000]
        [--records 1000000] [--port 19392] [--runs 1]

1. Starts `rill server` on an empty data directory, creates the topic `busy` (1
   partition) and the topic `idle` of FETCHERS partitions.
2. Opens FETCHERS connections, each sending Fetch v4 requests for its own idle partition
   (min_bytes 1, max_wait 500 ms) and sending the next one as soon as an answer arrives:
   FETCHERS fetches parked in the broker at all times, as consumers of quiet topics are.
3. Runs `rill bench produce --topic busy --records RECORDS --acks 1` (1 KiB records) and
   reads the broker's CPU time (utime + stime) around it, and the fetch answers received
   meanwhile (mostly at the 500 ms timeout: an answer before it is a wake-up that found
   nothing to return, which costs a read but does not answer early).
4. Prints one JSON object: produce MB/s, broker CPU-seconds per GB produced, and the
   same for a run without parked fetches first (the baseline on this machine).

Only the standard library and the `rill` binary are needed.
"""

from __future__ import annotations

import argparse
import json
import resource
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kafka_wire import cpu_seconds, request  # noqa: E402

FETCH = 1
READY_LINE = "rill listening on"


def fetch_v4(correlation_id: int, topic: str, partition: int, max_wait_ms: int) -> bytes:
    raw = topic.encode()
    body = struct.pack(">iiiib", -1, max_wait_ms, 1, 1 << 20, 0)
    body += struct.pack(">i", 1) + struct.pack(">h", len(raw)) + raw
    body += struct.pack(">i", 1) + struct.pack(">iqi", partition, 0, 1 << 20)
    return request(FETCH, 4, correlation_id, body)


class Fetchers:
    """FETCHERS connections, each with one Fetch always outstanding, on one thread."""

    def __init__(self, port: int, count: int):
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, count + 256)), hard))
        self.sel = selectors.DefaultSelector()
        self.answers = 0
        self.stop = threading.Event()
        for p in range(count):
            s = socket.create_connection(("127.0.0.1", port))
            s.setblocking(False)
            frame = fetch_v4(0, "idle", p, 500)
            s.sendall(frame)  # small: fits the socket buffer
            self.sel.register(s, selectors.EVENT_READ, {"frame": frame, "buf": b""})
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            for key, _ in self.sel.select(0.2):
                sock, st = key.fileobj, key.data
                data = sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("broker closed a fetch connection")
                st["buf"] += data
                while len(st["buf"]) >= 4:
                    size = struct.unpack(">i", st["buf"][:4])[0]
                    if len(st["buf"]) < 4 + size:
                        break
                    st["buf"] = st["buf"][4 + size :]
                    self.answers += 1
                    sock.sendall(st["frame"])

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        for key in list(self.sel.get_map().values()):
            key.fileobj.close()


def produce(rill: str, bootstrap: str, records: int, pid: int) -> dict:
    cpu0, t0 = cpu_seconds(pid), time.monotonic()
    out = subprocess.run(
        [rill, "bench", "produce", "--topic", "busy", "--records", str(records), "--record-size", "1024",
         "--acks", "1", "--partitions", "1", "-b", bootstrap, "--output", "json"],
        check=True, capture_output=True, text=True,
    )
    cpu, secs = cpu_seconds(pid) - cpu0, time.monotonic() - t0
    report = json.loads(out.stdout)
    gb = records * 1024 / 1e9
    return {
        "mb_per_sec": round(report["mb_per_sec"], 1),
        "broker_cpu_s": round(cpu, 2),
        "broker_cpu_s_per_gb": round(cpu / gb, 3),
        "wall_s": round(secs, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rill", default="target/release/rill")
    ap.add_argument("--fetchers", type=int, default=1000)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--port", type=int, default=19392)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="rill-parked-"))
    bootstrap = f"127.0.0.1:{args.port}"
    log = open(f"{data_dir}.log", "w")
    server = subprocess.Popen(
        [args.rill, "server", "--listen", bootstrap, "--data-dir", str(data_dir),
         "--override", "http.listeners="],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )
    result: dict = {"fetchers": args.fetchers, "records": args.records}
    fetchers = None
    try:
        assert server.stdout is not None
        while READY_LINE not in server.stdout.readline():
            if server.poll() is not None:
                sys.exit(f"rill server exited; see {data_dir}.log")
        subprocess.run(
            [args.rill, "topic", "create", "idle", "-p", str(args.fetchers), "-r", "1", "-b", bootstrap],
            check=True, stdout=subprocess.DEVNULL,
        )
        result["baseline"] = [produce(args.rill, bootstrap, args.records, server.pid) for _ in range(args.runs)]
        fetchers = Fetchers(args.port, args.fetchers)
        time.sleep(2)
        idle_cpu0, idle_t0, answers0 = cpu_seconds(server.pid), time.monotonic(), fetchers.answers
        time.sleep(3)
        result["parked_idle_cpu_per_s"] = round(
            (cpu_seconds(server.pid) - idle_cpu0) / (time.monotonic() - idle_t0), 3
        )
        result["parked_idle_answers_per_s"] = round((fetchers.answers - answers0) / 3, 1)
        runs = []
        for _ in range(args.runs):
            answers0 = fetchers.answers
            run = produce(args.rill, bootstrap, args.records, server.pid)
            run["fetch_answers_per_s"] = round((fetchers.answers - answers0) / run["wall_s"], 1)
            runs.append(run)
        result["with_parked_fetches"] = runs
    finally:
        if fetchers is not None:
            fetchers.close()
        server.terminate()
        server.wait(60)
        shutil.rmtree(data_dir, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
