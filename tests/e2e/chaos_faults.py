"""The fault-injection suite's faults (see `chaos.py`'s "Faults"): the seeded schedules,
and the nemesis that injects each fault on a node and undoes it (kill -9, SIGSTOP,
partitions through `netns.py`, disk full, slow disk under strace, clock jumps under
libfaketime)."""

from __future__ import annotations

import glob
import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from chaos_workload import Clock
from kafka_wire import TRANSACTION, find_on_any
from netns import Network, ensure_program
from rill_harness import RillCluster, RillServer

FAULT_WINDOW_S = (3.0, 9.0)
FAULT_GAP_S = (2.0, 5.0)
DISK_FULL_HEADROOM_BYTES = 16 * 1024


def log(message: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Fault:
    at_s: float
    kind: str  # one of FAULT_KINDS
    target: str  # a node id, "coordinator" or "txn-coordinator"
    window_s: float
    # How hard, drawn with the fault: slow-disk, the delay (ms) added to each disk
    # syscall; clock-jump, the seconds the wall clock moves (negative: backwards).
    amount: int = 0
    # Filled in as it runs:
    node: int = 0
    started: float = 0.0
    ended: float = 0.0
    note: str = ""

    def describe(self) -> str:
        text = f"t={self.at_s:5.1f}s {self.kind:<10} {self.target:<11} for {self.window_s:4.1f}s"
        if self.kind == "slow-disk":
            text += f", +{self.amount} ms on each {'/'.join(SLOW_DISK_SYSCALLS)}"
        elif self.kind == "clock-jump":
            text += f", wall clock {self.amount:+d} s"
        if self.node:
            text += f"  (ran on node {self.node} from t={self.started:.1f}s to t={self.ended:.1f}s)"
        return text + (f" [{self.note}]" if self.note else "")


FAULT_KINDS = ("kill", "pause", "partition", "disk-full", "slow-disk", "clock-jump")
# The syscalls a slow disk delays: those that only ever reach a file (segment appends
# are one pwritev, index entries pwrite, the metadata log's and every roll's durability
# fsync/fdatasync). `write` and `writev` are left alone: sockets, eventfd wake-ups and
# the log use them too, and a slow disk must not also be a slow network.
SLOW_DISK_SYSCALLS = ("pwritev", "pwrite64", "fsync", "fdatasync")
SLOW_DISK_DELAY_MS = (20, 400)
# Far enough to cross a segment.ms of a test or a session's length in wall-clock terms,
# short of retention.ms (7 days), whose lapse would delete acknowledged records by design.
CLOCK_JUMP_S = (30, 3600)


def coordinator_partition_schedule(rng: random.Random, start_s: float) -> list[Fault]:
    """The scenario of issue #14's bug 1: the group's coordinator cut off from its peers
    (clients still reach it) while the members commit, long enough for the controller to
    move its partitions."""
    return [Fault(start_s, "partition", "coordinator", round(rng.uniform(12.0, 16.0), 1))]


# What a fault may aim at: a node, or whichever node coordinates the workload's group
# (or, in a transactional run, its first transactional id) when the fault starts.
TARGETS = ("coordinator", "1", "2", "3")


def random_schedule(rng: random.Random, start_s: float, seconds: float, kinds: tuple[str, ...],
                    targets: tuple[str, ...] = TARGETS) -> list[Fault]:
    faults, t = [], start_s
    for _ in range(10_000):
        window = round(rng.uniform(*FAULT_WINDOW_S), 1)
        if t + window > start_s + seconds:
            break
        target = rng.choice(targets)
        kind = rng.choice(kinds)
        # Drawn only for the kinds that have one, so that the schedules of the other
        # kinds (and their seeds) stay what they were before these kinds existed.
        amount = 0
        if kind == "slow-disk":
            amount = rng.randint(*SLOW_DISK_DELAY_MS)
        elif kind == "clock-jump":
            amount = rng.randint(*CLOCK_JUMP_S) * rng.choice((-1, 1))
        faults.append(Fault(round(t, 1), kind, target, window, amount))
        t += window + rng.uniform(*FAULT_GAP_S)
    return faults


def clock_file(node: RillServer) -> Path:
    """The node's libfaketime timestamp file: the offset of its wall clock."""
    return node.data_dir.parent / "faketime.rc"


def set_clock_offset(node: RillServer, seconds: int) -> None:
    # Replaced whole, so that libfaketime never reads half a line.
    path = clock_file(node)
    scratch = path.with_suffix(".tmp")
    scratch.write_text(f"{seconds:+d}\n")
    scratch.replace(path)


def find_libfaketime() -> str | None:
    """Debian's libfaketime (the `faketime` package brings it), installed when missing."""
    if ensure_program("faketime", "faketime") is None:
        return None
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


def preload_faketime(cluster: RillCluster, library: str) -> None:
    """Every node (from its next start on) reads the wall clock through libfaketime, at
    the offset in its timestamp file, re-read each second. CLOCK_REALTIME and what is
    derived from it (time(), gettimeofday) move; CLOCK_MONOTONIC and CLOCK_BOOTTIME do
    not (FAKETIME_DONT_FAKE_MONOTONIC): a real clock step moves the one and not the
    others, and timers, leases and Raft's timeouts run on the monotonic clock."""
    for node in cluster.nodes.values():
        set_clock_offset(node, 0)
        node.extra_env = {
            "LD_PRELOAD": library,
            "FAKETIME_TIMESTAMP_FILE": str(clock_file(node)),
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        }


def preloaded(node: RillServer, library: str) -> bool:
    try:
        return library in Path(f"/proc/{node.pid}/maps").read_text()
    except OSError:
        return False


def tracer_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("TracerPid:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


class SlowDisk:
    """strace attached to a running node (every thread, and threads it starts), holding
    each of SLOW_DISK_SYSCALLS for the fault's delay before it runs; detached (SIGINT)
    at the window's end, which leaves the process running untraced. Attached with -p,
    strace cannot use a seccomp filter, so every syscall of the node stops at the tracer
    on its way in and out: the node is slower everywhere, and its disk path much slower.
    Measured on the 2-core machine: an idle node answered a single produce in 0.6-1.6 ms
    so traced (no delay on its appends); under a loaded machine (load average ~15) and a
    steady producer, the median produce latency went from 6-15 ms to about 300 ms with
    the delays set to zero, so on a busy machine this is a slow node as much as a slow
    disk."""

    ATTACH_TIMEOUT_S = 5.0

    def __init__(self, strace: str, node: RillServer, delay_ms: int):
        self.node = node
        calls = ",".join(SLOW_DISK_SYSCALLS)
        self.log_path = node.data_dir.parent / "strace.log"
        with open(self.log_path, "ab") as err:
            self.process = subprocess.Popen(
                [strace, "-f", "-qq", "-o", "/dev/null", "-e", f"trace={calls}",
                 "-e", f"inject={calls}:delay_enter={delay_ms * 1000}", "-p", str(node.pid)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
            )

    def wait_attached(self) -> str:
        """An empty note once the kernel names strace as the node's tracer, else why not."""
        deadline = time.monotonic() + self.ATTACH_TIMEOUT_S
        while time.monotonic() < deadline:
            if tracer_of(self.node.pid) == self.process.pid:
                return ""
            if self.process.poll() is not None:
                return f"strace exited with {self.process.returncode} before attaching ({self.log_path})"
            time.sleep(0.05)
        return f"strace had not attached within {self.ATTACH_TIMEOUT_S:.0f}s"

    def detach(self) -> str:
        """Detaches; returns what was seen of the node's health."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                # A dying tracer detaches its tracees too (strace attached with -p does
                # not ask for them to be killed with it).
                self.process.kill()
                self.process.wait(timeout=10)
                return "strace ignored SIGINT for 10s, killed"
        if not self.node.is_running():
            return f"node exited ({self.node.process.returncode}) while traced"
        if tracer_of(self.node.pid):
            return "node still traced after strace exited"
        return "detached, node running"


class Nemesis:
    def __init__(self, cluster: RillCluster, net: Network | None, group: str, clock: Clock,
                 strace: str | None = None, faketime: bool = False, transactional_id: str | None = None):
        self.cluster, self.net, self.group, self.clock = cluster, net, group, clock
        self.transactional_id = transactional_id
        self.strace, self.faketime = strace, faketime
        self.paused: set[int] = set()
        self.slow_disk: SlowDisk | None = None

    def resolve(self, fault: Fault) -> int:
        if fault.target not in ("coordinator", "txn-coordinator"):
            return int(fault.target)
        hosts = {i: n.bootstrap for i, n in self.cluster.nodes.items() if n.is_running()}
        if fault.target == "txn-coordinator":
            found = find_on_any(hosts, self.transactional_id, TRANSACTION)
        else:
            found = find_on_any(hosts, self.group)
        if found is None:
            fault.note = "no node named a coordinator; node 1 instead"
            return 1
        return found

    def run(self, fault: Fault) -> None:
        delay = fault.at_s - self.clock.now()
        if delay > 0:
            time.sleep(delay)
        if fault.kind == "partition" and self.net is None:
            fault.note = "skipped: no network namespaces on this machine"
            log(f"fault {fault.describe()}")
            return
        fault.node = self.resolve(fault)
        node = self.cluster.node(fault.node)
        fault.started = self.clock.now()
        log(f"fault start: {fault.kind} node {fault.node} for {fault.window_s}s")
        if fault.kind == "kill":
            node.kill9()
        elif fault.kind == "pause":
            os.killpg(node.pid, signal.SIGSTOP)
            self.paused.add(fault.node)
        elif fault.kind == "partition":
            self.net.partition(fault.node)
        elif fault.kind == "disk-full":
            node.kill9()
            # Just above its largest segment: the next few appends to it (or a new
            # index preallocated past it) fail with EFBIG, as on a full disk.
            largest = max((f.stat().st_size for f in node.data_dir.rglob("*.log")), default=0)
            node.file_size_limit_bytes = largest + DISK_FULL_HEADROOM_BYTES
            try:
                node.start()
            except Exception as error:  # noqa: BLE001 - dying of it early is the point
                fault.note = f"died at start under the limit: {str(error).splitlines()[0]}"
        elif fault.kind == "slow-disk":
            self.slow_disk = SlowDisk(self.strace, node, fault.amount)
            fault.note = self.slow_disk.wait_attached()
        elif fault.kind == "clock-jump":
            set_clock_offset(node, fault.amount)
            if not preloaded(node, "libfaketime"):
                fault.note = "libfaketime is not loaded in the node: its clock did not move"
        time.sleep(fault.window_s)
        self.undo(fault)
        fault.ended = self.clock.now()
        log(f"fault end:   {fault.describe()}")

    def undo(self, fault: Fault) -> None:
        node = self.cluster.node(fault.node)
        if fault.kind == "pause":
            os.killpg(node.pid, signal.SIGCONT)
            self.paused.discard(fault.node)
        elif fault.kind == "partition":
            self.net.heal()
        elif fault.kind == "slow-disk":
            note = self.slow_disk.detach()
            self.slow_disk = None
            fault.note = (fault.note + "; " if fault.note else "") + note
        elif fault.kind == "clock-jump":
            set_clock_offset(node, 0)
        elif fault.kind in ("kill", "disk-full"):
            if fault.kind == "disk-full":
                if node.is_running():
                    note = "still running at the window's end"
                else:
                    note = f"stopped itself with exit {node.process.returncode}"
                fault.note = (fault.note + "; " if fault.note else "") + note
                node.kill9()
                node.file_size_limit_bytes = None
            self.cluster.start_node(fault.node)

    def heal_all(self) -> None:
        if self.net is not None:
            self.net.heal()
        if self.slow_disk is not None:
            self.slow_disk.detach()
            self.slow_disk = None
        for node_id, node in self.cluster.nodes.items():
            if self.faketime:
                set_clock_offset(node, 0)
            if node_id in self.paused and node.is_running():
                os.killpg(node.pid, signal.SIGCONT)
            if not node.is_running():
                node.file_size_limit_bytes = None
                self.cluster.start_node(node_id)
        self.paused.clear()
