"""Starts and stops a real `rill server` process for the end-to-end tests.

Each server gets a free loopback port, its own data directory and a log file that
collects its stdout and stderr (appended across restarts, with a marker line per start).
Readiness is the line `rill listening on 127.0.0.1:PORT` on stdout; the harness polls the
log file for it rather than reading a pipe, so a chatty server can never block on a full
pipe while the test is busy elsewhere.

The binary is `$RILL_BIN`, else `target/debug/rill` under the workspace root.
"""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

WORKSPACE_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
LOG_TAIL_LINES = 300


class HarnessError(AssertionError):
    """The server did not start, stop or stay up as it must (shown with its log)."""


def rill_binary() -> Path:
    configured = os.environ.get("RILL_BIN")
    binary = Path(configured) if configured else WORKSPACE_ROOT / "target" / "debug" / "rill"
    if not binary.is_absolute():
        binary = WORKSPACE_ROOT / binary
    if not binary.is_file():
        raise HarnessError(
            f"rill binary not found at {binary}: run `cargo build -p rill` "
            "(or `cargo xtask test`), or set RILL_BIN"
        )
    return binary


# Ports this process handed out: the kernel may pick a port again once its socket is
# closed, and a cluster given one port twice (two controllers on one address) cannot start.
_HANDED_OUT: set[int] = set()

# Under pytest-xdist (`-n`) each worker takes ports from a block of its own, below the
# kernel's ephemeral range (32768 and up on Linux), so that neither another worker nor
# an outgoing connection is given a port between its hand-out here and the server's
# bind. Without workers the kernel picks (port 0).
_WORKER_PORT_BLOCK = 4000
_WORKER_PORT_BASE = 12000


def _worker_index() -> int | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else None


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A loopback port that was free a moment ago, never one this process handed out
    before: the kernel's pick for port 0, or under xdist the next free one of this
    worker's block."""
    worker = _worker_index()
    if worker is not None:
        start = _WORKER_PORT_BASE + worker * _WORKER_PORT_BLOCK
        for port in range(start, start + _WORKER_PORT_BLOCK):
            if port not in _HANDED_OUT and _bindable(port):
                _HANDED_OUT.add(port)
                return port
        raise HarnessError(f"worker {worker} used up its {_WORKER_PORT_BLOCK} ports")
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def is_ready_line(line: str, ready_line: str) -> bool:
    """`rill listening on 127.0.0.1:PORT`, alone or followed by more words (but not digits)."""
    line = line.strip()
    return line == ready_line or line.startswith(ready_line + " ")


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGKILL it if pytest dies, so nothing outlives a run."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except OSError:
        pass


class RillServer:
    """One `rill server` process; restartable on the same port and data directory."""

    def __init__(
        self,
        workdir: Path,
        overrides: dict[str, str] | None = None,
        binary: Path | None = None,
        extra_args: list[str] | None = None,
        ready_timeout_s: float = READY_TIMEOUT_S,
        file_size_limit_bytes: int | None = None,
    ) -> None:
        self.binary = binary if binary is not None else rill_binary()
        self.data_dir = workdir / "data"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = workdir / "rill.log"
        self.overrides = dict(overrides or {})
        self.extra_args = list(extra_args or [])
        self.ready_timeout_s = ready_timeout_s
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.starts = 0
        # Set when a test stops or kills the server on purpose, so teardown does not
        # mistake that for a crash.
        self._expected_down = False
        # RLIMIT_FSIZE (bytes) for the next starts, None for the inherited limit: a write
        # past it fails with EFBIG, the way a full disk fails one with ENOSPC.
        self.file_size_limit_bytes = file_size_limit_bytes
        # Variables added to the environment of the next starts (the fault-injection
        # suite's clock jumps preload libfaketime this way).
        self.extra_env: dict[str, str] = {}

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def command(self) -> list[str]:
        args = [
            str(self.binary),
            "server",
            "--listen",
            self.bootstrap,
            "--data-dir",
            str(self.data_dir),
        ]
        for key, value in self.http_overrides().items():
            args += ["--override", f"{key}={value}"]
        return args + self.extra_args

    def http_overrides(self) -> dict[str, str]:
        """The overrides with `http.listeners` off unless a test asked for it: every node
        would otherwise take the default 127.0.0.1:9644, and the second would fail."""
        return {"http.listeners": "", **self.overrides}

    def http_address(self) -> str:
        """`HOST:PORT` of the HTTP listener (/metrics, /health/*), from the line the server
        prints once ready; a test turns it on with `http.listeners=127.0.0.1:0`."""
        prefix = "rill http listening on "
        for line in reversed(self._log_since_start().splitlines()):
            line = line.strip()
            if line.startswith(prefix):
                return line[len(prefix):].split()[0]
        raise HarnessError("the server printed no HTTP listener (is http.listeners set?)")

    def start(self) -> "RillServer":
        if self.is_running():
            raise HarnessError(f"server already running (pid {self.pid})")
        attempts = 3 if self.starts == 0 else 1
        for attempt in range(attempts):
            try:
                self._start_once()
                return self
            except HarnessError as error:
                # Another process may have taken the port between free_port() and bind;
                # only a first start may move (a restart must keep its address).
                if attempt + 1 < attempts and "in use" in self._log_since_start().lower():
                    self.port = free_port()
                    continue
                raise error
        return self

    def _start_once(self) -> None:
        self.launch()
        self.wait_ready()

    def launch(self) -> None:
        """Starts the process without waiting for it to be ready (see `wait_ready`): the
        nodes of a cluster must all be up before any of them can finish starting."""
        if self.is_running():
            raise HarnessError(f"server already running (pid {self.pid})")
        self.starts += 1
        with open(self.log_path, "ab") as log:
            self._start_offset = log.tell()
            marker = f"=== rill-harness: start #{self.starts}: {' '.join(self.command())}\n"
            log.write(marker.encode())
            log.flush()
            self._start_offset += len(marker.encode())
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir.parent,
                # Its own process group, so that a kill reaches anything it started too.
                start_new_session=True,
                preexec_fn=self._preexec,
                env={**os.environ, **self.extra_env} if self.extra_env else None,
            )
        self._expected_down = False

    def ready_line(self) -> str:
        """The line the server prints once it serves."""
        return f"rill listening on {self.bootstrap}"

    def _preexec(self) -> None:
        _die_with_parent()
        if self.file_size_limit_bytes is not None:
            limit = self.file_size_limit_bytes
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    def wait_exit(self, timeout_s: float) -> int:
        """Waits for a server that is expected to stop by itself; returns its exit code."""
        self._expected_down = True
        return self.process.wait(timeout=timeout_s)

    def wait_ready(self) -> None:
        ready_line = self.ready_line()
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if any(
                is_ready_line(line, ready_line) for line in self._log_since_start().splitlines()
            ):
                return
            if self.process.poll() is not None:
                self._expected_down = True  # reported here, not again as a crash at teardown
                code = self.process.returncode
                raise HarnessError(
                    f"rill server exited with {code} before printing {ready_line!r}\n"
                    + self.log_excerpt()
                )
            time.sleep(0.05)
        self._expected_down = True
        self._kill()
        raise HarnessError(
            f"rill server did not print {ready_line!r} within {self.ready_timeout_s:.0f} s\n"
            + self.log_excerpt()
        )

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> int:
        """SIGTERM and wait for a clean exit; returns the exit code.

        Raises when the server does not exit in time (it is then killed) or exits non-zero:
        a clean shutdown on SIGTERM is part of the contract.
        """
        self._expected_down = True
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                threads = self.thread_dump()
                self._kill()
                raise HarnessError(
                    f"rill server did not exit within {timeout_s:.0f} s of SIGTERM "
                    f"(its threads: {self.thread_dump_path})\n"
                    + threads + "\n" + self.log_excerpt()
                )
        code = self.process.returncode
        if code != 0:
            raise HarnessError(f"rill server exited with {code} on SIGTERM\n" + self.log_excerpt())
        return code

    def kill9(self) -> None:
        """The crash: SIGKILL, no chance to flush or close anything."""
        self._expected_down = True
        self._kill()

    def _kill(self) -> None:
        if self.process is not None:
            # The group too: a child of the server must not outlive the test either.
            self._signal_group(signal.SIGKILL)
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait(timeout=10)

    def _signal_group(self, signum: int) -> None:
        try:
            os.killpg(self.process.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def restart(self) -> "RillServer":
        """Stops (cleanly) if running, then starts on the same port and data directory."""
        if self.is_running():
            self.stop()
        return self.start()

    def crashed(self) -> bool:
        """True when the process died without the test stopping or killing it."""
        return (
            self.process is not None and self.process.poll() is not None and not self._expected_down
        )

    def rss_bytes(self) -> int:
        """Resident memory of the server process, from /proc."""
        if self.pid is None:
            return 0
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _log_since_start(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(getattr(self, "_start_offset", 0))
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def thread_dump_path(self) -> Path:
        return self.data_dir.parent / "threads.txt"

    def thread_dump(self) -> str:
        """What each thread of a server that will not stop is doing, for the report, and
        written to `thread_dump_path`: from /proc, each thread's name, state and the
        kernel function it sleeps in; with gdb on the machine, each one's stack too (a
        blocking task holds a runtime thread in a syscall or a lock, an async task that
        never ends leaves every worker idle in epoll_wait)."""
        pid = self.pid
        lines = [f"threads of pid {pid}:"]
        for task in sorted(Path(f"/proc/{pid}/task").glob("*"), key=lambda t: int(t.name)):
            try:
                name = (task / "comm").read_text().strip()
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                wchan = (task / "wchan").read_text().strip() or "-"
            except (OSError, IndexError):
                continue
            lines.append(f"  {task.name} {name} state={state} wchan={wchan}")
        gdb = shutil.which("gdb")
        if gdb:
            try:
                stacks = subprocess.run(
                    [gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt 25"],
                    capture_output=True, text=True, timeout=30,
                ).stdout
                lines += ["", stacks]
            except (OSError, subprocess.TimeoutExpired) as error:
                lines.append(f"gdb: {error}")
        text = "\n".join(lines)
        try:
            self.thread_dump_path.write_text(text)
        except OSError:
            pass
        return "\n".join(lines[:60])

    def log_excerpt(self, lines: int = LOG_TAIL_LINES) -> str:
        all_lines = self.log_text().splitlines()
        shown = all_lines[-lines:]
        header = (
            f"--- rill server log {self.log_path} (last {len(shown)} of {len(all_lines)} lines) ---"
        )
        return "\n".join([header, *shown, "--- end of rill server log ---"])

    def teardown(self) -> list[str]:
        """Ends the process whatever state it is in; returns the problems found."""
        problems = []
        if self.crashed():
            problems.append(f"rill server died during the test (exit {self.process.returncode})")
        if self.is_running():
            try:
                self.stop()
            except HarnessError as error:
                # One line in the problem list; the threads and the log on stderr, which
                # the failing test's report shows.
                problems.append(str(error).splitlines()[0])
                print(str(error), file=sys.stderr)
        self._kill()
        return problems


class RillController(RillServer):
    """A controller-only node (`process.roles=controller`): no client listener, so it is
    started without `--listen` and is ready when it prints its controller address."""

    def __init__(self, workdir: Path, controller_port: int, **kwargs) -> None:
        super().__init__(workdir, **kwargs)
        self.controller_port = controller_port

    def command(self) -> list[str]:
        args = [str(self.binary), "server", "--data-dir", str(self.data_dir)]
        for key, value in self.http_overrides().items():
            args += ["--override", f"{key}={value}"]
        return args + self.extra_args

    def ready_line(self) -> str:
        return f"rill controller listening on 127.0.0.1:{self.controller_port}"


class RillCluster:
    """Several `rill server` processes that form one cluster. By default every node is a
    controller (a voter of the quorum) and a broker, as `process.roles=broker,controller`
    makes it; `roles` maps node ids to `"controller"` or `"broker"` for nodes with one
    role (controller-only nodes are `RillController`s; broker-only nodes are not voters).

    Ports are chosen once and kept across restarts, so that a restarted node rejoins at
    the address the others know."""

    def __init__(
        self,
        workdir: Path,
        size: int = 3,
        overrides: dict[str, str] | None = None,
        roles: dict[int, str] | None = None,
    ):
        self.nodes: dict[int, RillServer] = {}
        self.roles = {i: (roles or {}).get(i, "broker,controller") for i in range(1, size + 1)}
        controller_ports = {node_id: free_port() for node_id in range(1, size + 1)}
        voters = ",".join(
            f"{i}@127.0.0.1:{port}"
            for i, port in controller_ports.items()
            if "controller" in self.roles[i]
        )
        for node_id, cport in controller_ports.items():
            node_dir = workdir / f"node{node_id}"
            node_dir.mkdir(parents=True, exist_ok=True)
            role = self.roles[node_id]
            node_overrides = dict(overrides or {})
            if role != "broker,controller":
                node_overrides["process.roles"] = role
            kind = (
                partial(RillController, controller_port=cport) if role == "controller" else RillServer
            )
            self.nodes[node_id] = kind(
                node_dir,
                overrides=node_overrides,
                extra_args=[
                    "--node-id",
                    str(node_id),
                    "--controller-listen",
                    f"127.0.0.1:{cport}",
                    "--controller-quorum",
                    voters,
                ],
            )

    def brokers(self) -> dict[int, RillServer]:
        """The nodes with a client listener."""
        return {i: n for i, n in self.nodes.items() if self.roles[i] != "controller"}

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.brokers().values())

    def running_bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.brokers().values() if n.is_running())

    def node(self, node_id: int) -> RillServer:
        return self.nodes[node_id]

    def node_by_port(self, port: int) -> RillServer:
        return next(n for n in self.nodes.values() if n.port == port)

    def start(self) -> "RillCluster":
        for node in self.nodes.values():
            node.launch()
        for node in self.nodes.values():
            node.wait_ready()
        return self

    def start_node(self, node_id: int) -> RillServer:
        """(Re)starts one node on its old ports and data directory."""
        node = self.nodes[node_id]
        node.launch()
        node.wait_ready()
        return node

    def teardown(self) -> list[str]:
        problems = []
        for node_id, node in self.nodes.items():
            problems += [f"node {node_id}: {p}" for p in node.teardown()]
        return problems
