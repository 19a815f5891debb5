"""A real S3-compatible server for the tiered storage tests: moto's server mode (the
`moto[server]` pin of requirements.txt) on a loopback port, behind a TCP proxy the test
can cut (the store unreachable: connections refused) or slow down (a bandwidth cap, so
that an upload is in flight long enough to kill its broker), and a boto3 view of the
bucket. Nothing here stubs the HTTP API: the brokers speak S3 to moto through the proxy.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3

from rill_harness import free_port

START_TIMEOUT_S = 30.0
REGION = "us-east-1"
ACCESS_KEY = "rill-test"
SECRET_KEY = "rill-test-secret"


class StoreProxy:
    """Forwards loopback TCP connections to `target_port`. `cut()` closes every
    connection and refuses new ones until `restore()`; `bytes_per_s` caps what each
    connection forwards upstream (None: no cap). `last_upstream` is when a client last
    sent bytes (an upload in flight)."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.port = free_port()
        self.bytes_per_s: float | None = None
        self.last_upstream = 0.0
        self._open = True
        self._lock = threading.Lock()
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self._stop = False
        self._listen()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        s.settimeout(0.2)
        self._listener = s

    def _accept_loop(self) -> None:
        while not self._stop:
            listener = self._listener
            if listener is None:
                time.sleep(0.05)
                continue
            try:
                client, _ = listener.accept()
            except (socket.timeout, OSError):
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._conns += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(client, selectors.EVENT_READ, upstream)
        sel.register(upstream, selectors.EVENT_READ, client)
        try:
            while not self._stop:
                for key, _ in sel.select(timeout=0.5):
                    src, dst = key.fileobj, key.data
                    data = src.recv(65536)
                    if not data:
                        return
                    if src is client:
                        self.last_upstream = time.monotonic()
                        cap = self.bytes_per_s
                        if cap:
                            time.sleep(len(data) / cap)
                    dst.sendall(data)
        except OSError:
            return
        finally:
            for s in (client, upstream):
                try:
                    s.close()
                except OSError:
                    pass

    def cut(self) -> None:
        """The store becomes unreachable: open connections are reset, new ones refused."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass

    def restore(self) -> None:
        if self._listener is None:
            self._listen()

    def close(self) -> None:
        self._stop = True
        self.cut()


class S3Server:
    """moto's S3 server with a bucket, reached by the brokers through a `StoreProxy`."""

    def __init__(self, workdir: Path, bucket: str = "rill-tier"):
        self.bucket = bucket
        self.port = free_port()
        log = open(workdir / "moto.log", "wb")
        env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self.client = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{self.port}",
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                self.client.create_bucket(Bucket=bucket)
                break
            except Exception:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"moto did not start: see {workdir / 'moto.log'}")
                time.sleep(0.2)
        self.proxy = StoreProxy(self.port)

    def broker_overrides(self, prefix: str = "") -> dict[str, str]:
        """The broker keys that put a broker's remote tier in this bucket."""
        return {
            "remote.log.storage.system.enable": "true",
            "remote.log.storage.s3.bucket": self.bucket,
            "remote.log.storage.s3.prefix": prefix,
            "remote.log.storage.s3.endpoint": f"http://127.0.0.1:{self.proxy.port}",
            "remote.log.storage.s3.region": REGION,
            "remote.log.storage.s3.access.key.id": ACCESS_KEY,
            "remote.log.storage.s3.secret.access.key": SECRET_KEY,
            "remote.log.manager.task.interval.ms": "200",
            "remote.log.manager.task.retry.backoff.ms": "100",
            "remote.log.manager.task.retry.backoff.max.ms": "1000",
            "remote.log.manager.copy.cleanup.delay.ms": "3000",
            "log.retention.check.interval.ms": "200",
        }

    def objects(self, prefix: str = "") -> dict[str, int]:
        """Every object of the bucket under `prefix`: {key: size}."""
        out = {}
        token = None
        while True:
            kwargs = {"Bucket": self.bucket, "Prefix": prefix}
            if token:
                kwargs["ContinuationToken"] = token
            page = self.client.list_objects_v2(**kwargs)
            for o in page.get("Contents", []):
                out[o["Key"]] = o["Size"]
            if not page.get("IsTruncated"):
                return out
            token = page["NextContinuationToken"]

    def copies(self, prefix: str = "") -> dict[str, set[str]]:
        """The remote segment copies: {"<start>-<segment id>": {suffixes present}}."""
        out: dict[str, set[str]] = {}
        for key in self.objects(prefix):
            name = key.rsplit("/", 1)[-1]
            stem, _, suffix = name.partition(".")
            out.setdefault(stem, set()).add(suffix)
        return out

    def close(self) -> None:
        self.proxy.close()
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
