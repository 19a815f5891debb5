"""Apache Kafka itself as a reference broker: one KRaft node (broker + controller in one
process) started from the jars `jvm.classpath()` fetched, on free loopback ports, with its
own data directory.

    with KafkaBroker(tmp_path / "kafka") as kafka:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})

Start = `kafka.tools.StorageTool format` with a fresh cluster id, then `kafka.Kafka` with a
generated `server.properties` (single-node defaults: replication factors 1, no initial
rebalance delay, `num.partitions=1` as Rill's default); ready when the log says
`Kafka Server started`. `stop()` sends SIGTERM (a controlled shutdown) and waits.
The differential harness (`kafka-diff` family) runs the same scenario here and on Rill.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

import jvm  # noqa: E402
from rill_harness import _die_with_parent, free_port  # noqa: E402

READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
READY_LINE = "Kafka Server started"


# Share groups (KIP-932) are a preview in Kafka 4.1, off unless the `share.version` feature
# is 1 (its upgrade notes: `kafka-features.sh upgrade --feature share.version=1`); formatting
# with the feature finalized is the same. No broker config is needed besides.
SHARE_GROUPS = {"share.version": 1}


class KafkaError(AssertionError):
    """Kafka did not start or stop as it must (shown with its log's tail)."""


class KafkaBroker:
    def __init__(
        self,
        workdir: Path,
        overrides: dict[str, str] | None = None,
        heap_mb: int = 512,
        features: dict[str, int] | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / "kafka.log"
        self.properties_path = self.workdir / "server.properties"
        self.overrides = dict(overrides or {})
        self.heap_mb = heap_mb
        # Feature levels set when the storage is formatted (`--feature name=level`), such as
        # SHARE_GROUPS: what `kafka-features.sh upgrade` would finalize, without a round trip.
        self.features = dict(features or {})
        self.port = free_port()
        self.controller_port = free_port()
        # Never one that starts with '-', which kafka-storage's argument parser takes for
        # an option (Kafka's own Uuid.randomUuid avoids them too).
        self.cluster_id = "-"
        while self.cluster_id.startswith("-"):
            self.cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        self.process: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def properties(self) -> dict[str, str]:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
            f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Fewer threads than the defaults: two cores are shared by every test.
            "num.network.threads": "2",
            "num.io.threads": "2",
            "background.threads": "2",
        }
        props.update(self.overrides)
        return props

    def start(self) -> "KafkaBroker":
        if self.process is not None and self.process.poll() is None:
            raise KafkaError(f"kafka already running (pid {self.process.pid})")
        self.properties_path.write_text(
            "".join(f"{key}={value}\n" for key, value in self.properties().items())
        )
        with open(self.log_path, "ab") as log:
            if not (self.data_dir / "meta.properties").exists():
                fmt = jvm.java_command(
                    "kafka.tools.StorageTool",
                    ["format", "-t", self.cluster_id, "-c", str(self.properties_path),
                     *(arg for name, level in self.features.items()
                       for arg in ("--feature", f"{name}={level}"))],
                )
                result = subprocess.run(fmt, stdout=log, stderr=subprocess.STDOUT, timeout=120)
                if result.returncode != 0:
                    raise KafkaError(f"kafka-storage format failed\n{self.log_tail()}")
            self._offset = log.tell()
            command = jvm.java_command(
                "kafka.Kafka",
                [str(self.properties_path)],
                heap_mb=self.heap_mb,
                jvm_args=["-Drill.compat.log.level=INFO"],
            )
            # The broker runs long enough that C2 pays off: drop the C1-only flag.
            command = [arg for arg in command if arg != "-XX:TieredStopAtLevel=1"]
            self.process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                raise KafkaError(f"kafka exited before it was ready\n{self.log_tail()}")
            with open(self.log_path, "rb") as log:
                log.seek(self._offset)
                if READY_LINE.encode() in log.read():
                    return
            time.sleep(0.2)
        self.stop()
        raise KafkaError(f"kafka not ready after {READY_TIMEOUT_S:.0f}s\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> "KafkaBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    # `python tests/compat/kafka_ref.py DIR`: a reference broker to poke at by hand.
    workdir = Path(sys.argv[1] if len(sys.argv) > 1 else "target/compat-cache/kafka-manual")
    with KafkaBroker(workdir) as kafka:
        print(f"kafka listening on {kafka.bootstrap} (log {kafka.log_path}); Ctrl-C stops it")
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    os._exit(0)
