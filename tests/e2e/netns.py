"""Three `rill server` nodes in network namespaces of their own, so that one can be cut off
from its peers while the clients still reach it: the network of the fault-injection suite
(`chaos.py`) and of the partition fault of `bench/cluster_failover.py`.

Each node runs in a namespace `rc<tag>n<i>` at 10.213.0.<i> (every port fixed: 9092 for
clients, 9093 for the controller quorum), with a veth into a bridge that lives in a fourth
namespace (`rc<tag>c`, 10.213.0.254). The process that drives the cluster moves its main
thread into that fourth namespace (`Network.enter_hub`) before it opens a socket or starts
a thread, so the clients reach every node through the bridge and nothing of it is in the
machine's own namespace. A partition of node X resolves the peers' addresses in X's
namespace, and X's address in each peer's, to a MAC address nobody has (a permanent
neighbour entry): every packet between X and its peers is dropped silently, while the
clients still reach everyone. (No qdisc but the default is available here, and nftables is
not needed.) `Network.make` says why when namespaces cannot be made here (not root, no
`ip`); as root on Debian it installs iproute2 first when `ip` is missing.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import threading
import uuid
from pathlib import Path

from rill_harness import RillCluster, RillServer

CLIENT_PORT = 9092
CONTROLLER_PORT = 9093
SUBNET = "10.213.0"
HUB_ADDRESS = f"{SUBNET}.254"
CLONE_NEWNET = 0x40000000
NODES = (1, 2, 3)


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, check=check, timeout=30)


def ensure_program(program: str, package: str) -> str | None:
    """The path of `program`, installing Debian's `package` first when it is missing and
    this process is root with apt-get (as on CI); None when it cannot be had."""
    found = shutil.which(program)
    if found or os.geteuid() != 0 or shutil.which("apt-get") is None:
        return found
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for args in (["update", "-qq"], ["install", "-y", "-qq", "--no-install-recommends", package]):
        if subprocess.run(["apt-get", *args], capture_output=True, env=env, timeout=600).returncode != 0:
            return None
    return shutil.which(program)


def _setns(name: str) -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({name})")
    finally:
        os.close(fd)


class Network:
    """The namespaces of one run; `None` from `make` when they cannot be made here."""

    def __init__(self, tag: str):
        self.tag = tag
        self.hub = f"rc{tag}c"
        self.cut: set[tuple[int, int]] = set()

    def ns(self, node_id: int) -> str:
        return f"rc{self.tag}n{node_id}"

    @staticmethod
    def address(node_id: int) -> str:
        return f"{SUBNET}.{node_id}"

    @classmethod
    def make(cls) -> tuple["Network | None", str]:
        if os.geteuid() != 0:
            return None, "not root"
        if ensure_program("ip", "iproute2") is None:
            return None, "no `ip` (iproute2), and apt-get could not install it"
        try:
            _run("ip", "-V")
        except (OSError, subprocess.CalledProcessError) as error:
            return None, f"no usable `ip` ({error})"
        net = cls(uuid.uuid4().hex[:6])
        try:
            net._create()
        except (OSError, subprocess.CalledProcessError) as error:
            detail = getattr(error, "stderr", "") or str(error)
            net.teardown()
            return None, f"network namespaces unavailable: {detail.strip()}"
        return net, ""

    def _create(self) -> None:
        _run("ip", "netns", "add", self.hub)
        _run("ip", "-n", self.hub, "link", "set", "lo", "up")
        _run("ip", "-n", self.hub, "link", "add", "rcbr", "type", "bridge")
        _run("ip", "-n", self.hub, "addr", "add", f"{HUB_ADDRESS}/24", "dev", "rcbr")
        _run("ip", "-n", self.hub, "link", "set", "rcbr", "up")
        for i in NODES:
            ns = self.ns(i)
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}",
                 "netns", self.hub)
            _run("ip", "-n", ns, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", self.hub, "link", "set", f"p{i}", "master", "rcbr")
            _run("ip", "-n", self.hub, "link", "set", f"p{i}", "up")

    def enter_hub(self) -> None:
        """Moves this thread (the main one, before any other starts) into the hub."""
        assert threading.active_count() == 1, "enter the hub before starting threads"
        _setns(self.hub)

    # The peer's address resolves, in the cut node's namespace, to a MAC that no
    # interface has: frames still leave (the bridge floods them) and every receiver
    # drops them, so the cut is silent both ways, for new and established connections
    # alike, like a dropped link (a blackhole route would fail connects at once instead).
    DEAD_MAC = "02:00:00:00:de:ad"

    def _cut(self, node: int, peer: int) -> None:
        _run("ip", "-n", self.ns(node), "neigh", "replace", self.address(peer), "lladdr", self.DEAD_MAC,
             "dev", "eth0", "nud", "permanent")

    def _uncut(self, node: int, peer: int) -> None:
        _run("ip", "-n", self.ns(node), "neigh", "del", self.address(peer), "dev", "eth0", check=False)

    def partition(self, node: int) -> None:
        for peer in NODES:
            if peer != node:
                for a, b in ((node, peer), (peer, node)):
                    if (a, b) not in self.cut:
                        self._cut(a, b)
                        self.cut.add((a, b))

    def heal(self) -> None:
        for a, b in sorted(self.cut):
            self._uncut(a, b)
        self.cut.clear()

    def teardown(self) -> None:
        for name in [self.ns(i) for i in NODES] + [self.hub]:
            _run("ip", "netns", "del", name, check=False)


class NamespacedServer(RillServer):
    """A `rill server` inside a node's namespace, on that namespace's address."""

    def __init__(self, workdir: Path, node_id: int, net: Network, **kwargs):
        self.host = net.address(node_id)
        self.netns = net.ns(node_id)
        super().__init__(workdir, **kwargs)
        self.port = CLIENT_PORT

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{CLIENT_PORT}"

    def _preexec(self) -> None:
        _setns(self.netns)
        super()._preexec()


def namespaced_cluster(workdir: Path, net: Network, overrides: dict[str, str],
                       server=NamespacedServer) -> RillCluster:
    """Three combined broker+controller nodes, one in each of `net`'s node namespaces.
    `server` is the class of each node (a `NamespacedServer` or a subclass of it)."""
    cluster = RillCluster.__new__(RillCluster)
    cluster.roles = {i: "broker,controller" for i in NODES}
    voters = ",".join(f"{i}@{net.address(i)}:{CONTROLLER_PORT}" for i in NODES)
    cluster.nodes = {}
    for i in NODES:
        node_dir = workdir / f"node{i}"
        node_dir.mkdir(parents=True, exist_ok=True)
        cluster.nodes[i] = server(
            node_dir,
            i,
            net,
            overrides=dict(overrides),
            extra_args=[
                "--node-id", str(i),
                "--controller-listen", f"{net.address(i)}:{CONTROLLER_PORT}",
                "--controller-quorum", voters,
            ],
        )
    return cluster
