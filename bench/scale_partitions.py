"""Many partitions on one node: start-up time and memory.

    python3 bench/scale_partitions.py --rill target/release/rill [--topics 100]
        [--partitions-per-topic 100] [--restarts 3] [--data-dir DIR] [--port 19092]
        [--data-gb 10] [--unclean-restarts 1]

1. Starts `rill server` on an empty data directory and creates TOPICS topics of
   PARTITIONS_PER_TOPIC partitions each (RF=1) with `rill topic create`, then waits until a
   Metadata request shows every partition with a leader.
   With --data-gb, fills the partitions with that much data (1 KiB records through
   `rill bench produce`, one run a topic, acks=1) and reports the write rate and the
   bytes on disk.
2. Lets the broker settle, then reads its idle RSS (VmRSS), open files and threads.
3. Stops it with SIGTERM (a clean shutdown) and starts it again RESTARTS times, each
   time measuring, from the moment the process was spawned:
   - `listening`: until the server prints its `rill listening on …` line;
   - `ready`: until a Metadata request (v1, every topic) answers with every partition
     led, polled every 20 ms over a fresh connection;
   and the idle RSS a few seconds later. With --unclean-restarts, then kills it with
   SIGKILL and restarts that many times, measured the same way (the recovery of the
   segments past each log's recovery point is in these figures).
4. Prints one JSON object with every figure.

Only the standard library and the `rill` binary are needed. The broker's stdout and
stderr go to `DATA_DIR.log`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kafka_wire import led_partitions, proc_status, rss_mib  # noqa: E402

READY_LINE = "rill listening on"


class Server:
    def __init__(self, rill: str, data_dir: Path, port: int, overrides: list[str]):
        self.rill = rill
        self.data_dir = data_dir
        self.port = port
        self.overrides = overrides
        self.log_path = Path(f"{data_dir}.log")
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float) -> tuple[float, float]:
        """Spawns the server; returns (spawn time, seconds until its ready line)."""
        args = [self.rill, "server", "--listen", f"127.0.0.1:{self.port}", "--data-dir", str(self.data_dir),
                "--override", "http.listeners="]
        for kv in self.overrides:
            args += ["--override", kv]
        log = open(self.log_path, "a")
        spawned = time.monotonic()
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
        assert self.process.stdout is not None
        deadline = spawned + timeout_s
        while time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError(f"rill server exited ({self.process.poll()}); see {self.log_path}")
            log.write(line)
            log.flush()
            if READY_LINE in line:
                return spawned, time.monotonic() - spawned
        raise RuntimeError(f"no {READY_LINE!r} within {timeout_s} s; see {self.log_path}")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL and reap: the next start recovers as after a crash."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def stop(self, timeout_s: float) -> float:
        """SIGTERM and wait; returns seconds until exit."""
        assert self.process is not None
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise RuntimeError(f"rill server did not exit within {timeout_s} s of SIGTERM")
        if code != 0:
            raise RuntimeError(f"rill server exited with {code}; see {self.log_path}")
        return time.monotonic() - started


def wait_ready(port: int, expected: int, since: float, timeout_s: float, prefix: str) -> float:
    """Seconds from `since` until Metadata shows `expected` led partitions."""
    deadline = time.monotonic() + timeout_s
    last = 0
    while time.monotonic() < deadline:
        try:
            last = led_partitions("127.0.0.1", port, timeout_s=10, prefix=prefix)
            if last >= expected:
                return time.monotonic() - since
        except OSError:
            pass
        time.sleep(0.02)
    raise RuntimeError(f"only {last} of {expected} partitions led after {timeout_s} s")


def snapshot(pid: int) -> dict:
    status = proc_status(pid)
    return {
        "rss_mib": round(rss_mib(pid), 1),
        "hwm_mib": round(int(status["VmHWM"].split()[0]) / 1024, 1),
        "threads": int(status["Threads"]),
        "open_fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def fill(args: argparse.Namespace, bootstrap: str, prefix: str, data_dir: Path) -> dict:
    """Writes about `args.data_gb` GB of 1 KiB records, the same share to each topic."""
    record_size = 1024
    per_topic = int(args.data_gb * 1e9 / record_size / args.topics)
    started = time.monotonic()
    for t in range(args.topics):
        subprocess.run(
            [args.rill, "bench", "produce", "--topic", f"{prefix}{t:04}", "--records", str(per_topic),
             "--record-size", str(record_size), "--acks", "1", "-b", bootstrap, "--output", "json"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    seconds = time.monotonic() - started
    on_disk = sum(f.stat().st_size for f in data_dir.rglob("*.log") if f.is_file())
    return {
        "records": per_topic * args.topics,
        "seconds": round(seconds, 1),
        "mb_per_sec": round(per_topic * args.topics * record_size / seconds / 1e6, 1),
        "log_bytes_on_disk": on_disk,
        "segments": sum(1 for _ in data_dir.rglob("*.log")),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rill", default="target/release/rill")
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--partitions-per-topic", type=int, default=100)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--data-dir", type=Path)
    ap.add_argument("--port", type=int, default=19092)
    ap.add_argument("--settle-s", type=float, default=5.0, help="wait before reading idle RSS")
    ap.add_argument("--timeout-s", type=float, default=600.0)
    ap.add_argument("--override", action="append", default=[], help="broker config KEY=VALUE")
    ap.add_argument("--keep", action="store_true", help="keep the data directory")
    ap.add_argument("--data-gb", type=float, default=0.0, help="GB of 1 KiB records to write before restarting")
    ap.add_argument("--unclean-restarts", type=int, default=0, help="kill -9 and restart this many times")
    args = ap.parse_args()

    expected = args.topics * args.partitions_per_topic
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="rill-scale-"))
    if data_dir.exists() and any(data_dir.iterdir()):
        sys.exit(f"{data_dir} is not empty")
    prefix = "scale-"
    bootstrap = f"127.0.0.1:{args.port}"
    result: dict = {"partitions": expected, "topics": args.topics, "data_dir": str(data_dir)}

    server = Server(args.rill, data_dir, args.port, args.override)
    try:
        _, listening = server.start(args.timeout_s)
        result["empty_start_listening_s"] = round(listening, 3)
        result["empty_idle"] = snapshot(server.pid)

        created = time.monotonic()
        for t in range(args.topics):
            subprocess.run(
                [args.rill, "topic", "create", f"{prefix}{t:04}", "-p", str(args.partitions_per_topic),
                 "-r", "1", "-b", bootstrap, "--request-timeout-ms", "120000"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        result["create_s"] = round(wait_ready(args.port, expected, created, args.timeout_s, prefix), 3)
        if args.data_gb > 0:
            result["fill"] = fill(args, bootstrap, prefix, data_dir)
            print(json.dumps({"fill": result["fill"]}), file=sys.stderr)
        time.sleep(args.settle_s)
        result["after_create_idle"] = snapshot(server.pid)
        result["stop_s"] = [round(server.stop(args.timeout_s), 3)]

        def restart() -> dict:
            spawned, listening = server.start(args.timeout_s)
            ready = wait_ready(args.port, expected, spawned, args.timeout_s, prefix)
            at_ready = snapshot(server.pid)
            time.sleep(args.settle_s)
            run = {
                "listening_s": round(listening, 3),
                "ready_s": round(ready, 3),
                "at_ready": at_ready,
                "idle": snapshot(server.pid),
            }
            print(json.dumps(run), file=sys.stderr)
            return run

        result["restarts"] = []
        for _ in range(args.restarts):
            result["restarts"].append(restart())
            result["stop_s"].append(round(server.stop(args.timeout_s), 3))
        if args.unclean_restarts > 0:
            server.start(args.timeout_s)
            wait_ready(args.port, expected, time.monotonic(), args.timeout_s, prefix)
            result["unclean_restarts"] = []
            for _ in range(args.unclean_restarts):
                server.kill()
                result["unclean_restarts"].append(restart())
            result["stop_s"].append(round(server.stop(args.timeout_s), 3))
    finally:
        if server.process is not None and server.process.poll() is None:
            server.process.kill()
            server.process.wait()
        if not args.keep and args.data_dir is None:
            shutil.rmtree(data_dir, ignore_errors=True)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
