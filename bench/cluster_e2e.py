"""Produce-to-consume latency on a three-node Rill cluster, RF=3, acks=all.

Starts three real `rill server` nodes on loopback (the e2e harness: each node a voter of
the controller quorum and a broker), creates a topic with replication factor 3 and
`min.insync.replicas=2`, and runs `rill bench e2e --acks all` against it at each rate
given, so that a record counts as delivered only once the leader has it on every in-sync
replica and the consumer has read it past the high watermark. Every byte is written three
times by processes that share the machine's cores with the load generator.

    cargo build --release -p rill
    RILL_BIN=target/release/rill target/e2e-venv/bin/python bench/cluster_e2e.py \
        --rates 10000,50000 --duration 10

Prints one JSON object per rate (what `rill bench e2e --output json` prints, plus the rate
and the partition count) and a summary line of the p99s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

from rill_harness import RillCluster, rill_binary  # noqa: E402


def run_rate(rill: str, bootstrap: str, rate: int, args: argparse.Namespace) -> dict:
    topic = f"e2e-rf3-{rate}"
    subprocess.run(
        [rill, "topic", "create", topic, "-b", bootstrap, "-p", str(args.partitions),
         "-r", "3", "-c", "min.insync.replicas=2"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    out = subprocess.run(
        [rill, "bench", "e2e", "-b", bootstrap, "--topic", topic, "--rate", str(rate),
         "--duration", str(args.duration), "--acks", "all", "--output", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"rill bench e2e at {rate}/s failed: {out.stderr.strip()[-2000:]}")
    result = json.loads(out.stdout)
    result["rate"] = rate
    result["partitions"] = args.partitions
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="10000,50000", help="records/s, comma-separated")
    parser.add_argument("--duration", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=1)
    args = parser.parse_args()
    rill = str(rill_binary())
    results = []
    with tempfile.TemporaryDirectory(prefix="rill-e2e-rf3-") as tmp:
        cluster = RillCluster(Path(tmp), 3, {"group.initial.rebalance.delay.ms": "0"}).start()
        try:
            for rate in (int(r) for r in args.rates.split(",")):
                result = run_rate(rill, cluster.bootstrap, rate, args)
                results.append(result)
                print(json.dumps(result), flush=True)
        finally:
            problems = cluster.teardown()
            if problems:
                print("\n".join(problems), file=sys.stderr)
    summary = ", ".join(
        f"{r['rate']}/s: p99 {r['latency_ms']['p99']} ms" for r in results if "latency_ms" in r
    )
    print(f"RF=3 acks=all e2e ({os.path.basename(rill)}): {summary}")


if __name__ == "__main__":
    main()
