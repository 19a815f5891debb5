"""TLS against plaintext on one server in one sitting (issue #17): produce and fetch
throughput and broker CPU per GB through librdkafka's rdkafka_performance, and the time a
TLS handshake takes.

    cargo build --release -p rill && cargo xtask rdkafka-performance
    python3 bench/tls.py --rill target/release/rill \\
        --rdkafka-performance target/rdkafka-performance/rdkafka_performance \\
        [--records 1000000] [--record-size 1024] [--partitions 6] [--runs 3]

One `rill server` with a PLAINTEXT and an SSL listener (a throwaway CA and server key made
with the `openssl` command in a temporary directory). RUNS rounds, each producing RECORDS
records (acks=1, linger.ms=5, batch.size=1 MiB) to a new topic and reading them back,
once per listener, alternating which goes first. Handshakes: HANDSHAKES connections
opened and closed one after another from Python's `ssl` (TLS 1.3, then 1.2), timed from
`connect` to the end of the handshake; plain TCP connects beside them. Prints one JSON
object with every run and per measure the minimum, median and maximum.
"""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rdkafka_performance import CONSUMED, PRODUCED, measured, run_tool, stop_server  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_pki(directory: Path) -> tuple[Path, Path]:
    """A CA and a server keystore (key + chain, PEM) for 127.0.0.1."""
    ca_key, ca = directory / "ca.key", directory / "ca.pem"
    key, csr, cert = directory / "server.key", directory / "server.csr", directory / "server.pem"
    ext = directory / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-nodes", "-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-subj", "/CN=bench CA")
    run("openssl", "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))
    keystore = directory / "keystore.pem"
    keystore.write_bytes(key.read_bytes() + cert.read_bytes() + ca.read_bytes())
    return keystore, ca


def start(rill: str, plain: int, tls: int, keystore: Path, data: Path, log) -> subprocess.Popen:
    server = subprocess.Popen(
        [rill, "server", "--listen", f"127.0.0.1:{plain}", "--data-dir", str(data),
         "--override", f"listeners=PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{tls}",
         "--override", f"ssl.keystore.location={keystore}",
         "--override", "log.segment.delete.delay.ms=0", "--override", "http.listeners="],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )
    assert server.stdout is not None
    while "rill listening on" not in (line := server.stdout.readline()):
        if not line:
            sys.exit("rill server exited before listening")
    return server


def handshakes(port: int, ca: Path, count: int, version: ssl.TLSVersion | None) -> dict:
    times = []
    context = None
    if version is not None:
        context = ssl.create_default_context(cafile=str(ca))
        context.minimum_version = version
        context.maximum_version = version
    for _ in range(count):
        started = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port)) as raw:
            if context is None:
                times.append(time.perf_counter() - started)
                continue
            with context.wrap_socket(raw, server_hostname="127.0.0.1"):
                times.append(time.perf_counter() - started)
    times.sort()
    return {
        "median_ms": round(statistics.median(times) * 1e3, 3),
        "p99_ms": round(times[int(len(times) * 0.99) - 1] * 1e3, 3),
    }


def round_for(binary: str, rill: str, admin: str, bootstrap: str, tls_args: list[str],
              pids: list[int], topic: str, records: int, size: int, partitions: int) -> dict:
    """One produce and one consume of RECORDS through `bootstrap`; `rill` manages the topic
    through the plaintext listener `admin` (its client speaks no TLS)."""
    subprocess.run([rill, "topic", "create", "-b", admin, "-p", str(partitions), topic],
                   check=True, stdout=subprocess.DEVNULL)
    gb = records * size / 1e9
    (summary, wall), cpu = measured(pids, lambda: run_tool(binary, [
        "-P", "-t", topic, "-b", bootstrap, "-s", str(size), "-c", str(records), "-a", "1",
        "-X", "linger.ms=5", "-X", "batch.size=1048576",
        "-X", "queue.buffering.max.messages=1000000", "-X", "queue.buffering.max.kbytes=1048576",
        *tls_args,
    ], PRODUCED), gb)
    if int(summary["delivered"]) != records:
        sys.exit(f"delivered {summary} of {records}")
    produce = {"mb_per_sec": float(summary["mb_per_sec"]), "wall_mb_per_sec": round(gb * 1e3 / wall, 1), **cpu}
    parts = [a for p in range(partitions) for a in ("-p", str(p))]
    (summary, wall), cpu = measured(pids, lambda: run_tool(binary, [
        "-C", "-t", topic, "-b", bootstrap, *parts, "-o", "beginning", "-c", str(records), "-e",
        "-X", "enable.partition.eof=true", *tls_args,
    ], CONSUMED), gb)
    if int(summary["messages"]) != records:
        sys.exit(f"consumed {summary['messages']} of {records}")
    consume = {"mb_per_sec": float(summary["mb_per_sec"]), "wall_mb_per_sec": round(gb * 1e3 / wall, 1), **cpu}
    subprocess.run([rill, "topic", "delete", "-b", admin, topic], stdout=subprocess.DEVNULL)
    return {"produce": produce, "consume": consume}


def spread(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rill", default="target/release/rill")
    ap.add_argument("--rdkafka-performance", default="target/rdkafka-performance/rdkafka_performance")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--record-size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--handshakes", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rill-tls-bench-") as tmp:
        tmp = Path(tmp)
        keystore, ca = make_pki(tmp)
        plain, tls = free_port(), free_port()
        with open(tmp / "server.log", "w") as log:
            server = start(args.rill, plain, tls, keystore, tmp / "data", log)
            try:
                result: dict = {
                    "records": args.records, "record_size": args.record_size,
                    "partitions": args.partitions,
                    "handshake": {
                        "tcp_connect": handshakes(plain, ca, args.handshakes, None),
                        "tls13": handshakes(tls, ca, args.handshakes, ssl.TLSVersion.TLSv1_3),
                        "tls12": handshakes(tls, ca, args.handshakes, ssl.TLSVersion.TLSv1_2),
                    },
                    "runs": [],
                }
                listeners = {
                    "plaintext": (f"127.0.0.1:{plain}", []),
                    "ssl": (f"127.0.0.1:{tls}", ["-X", "security.protocol=SSL", "-X", f"ssl.ca.location={ca}"]),
                }
                for i in range(args.runs):
                    order = ["plaintext", "ssl"] if i % 2 == 0 else ["ssl", "plaintext"]
                    run = {}
                    for name in order:
                        bootstrap, extra = listeners[name]
                        run[name] = round_for(args.rdkafka_performance, args.rill,
                                              f"127.0.0.1:{plain}", bootstrap, extra,
                                              [server.pid], f"{name}-{i}", args.records,
                                              args.record_size, args.partitions)
                    result["runs"].append(run)
                summary = {}
                for name in listeners:
                    for phase in ("produce", "consume"):
                        for measure in ("mb_per_sec", "broker_cpu_s_per_gb"):
                            summary[f"{name}.{phase}.{measure}"] = spread(
                                [r[name][phase][measure] for r in result["runs"]])
                for phase in ("produce", "consume"):
                    summary[f"ssl_over_plaintext.{phase}"] = round(
                        summary[f"ssl.{phase}.mb_per_sec"]["median"]
                        / summary[f"plaintext.{phase}.mb_per_sec"]["median"], 3)
                result["summary"] = summary
                print(json.dumps(result, indent=1))
            finally:
                stop_server(server)


if __name__ == "__main__":
    main()
