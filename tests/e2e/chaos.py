"""The fault-injection suite (issue #14, item 5): a three-node cluster of real `rill server`
processes, a workload of real clients, seeded faults, and a checker of what the workload
was promised.

    python tests/e2e/chaos.py --scenario coordinator-partition --seed 7
    python tests/e2e/chaos.py --scenario random --seconds 1800 --seed 42
    cargo xtask chaos --minutes 30 --seed 42          # the same, with the venv and binary
    cargo xtask chaos --minutes 10 --transactional    # with the transactional workload

# Topology

Each node runs in a network namespace of its own (`rc<tag>n<i>`, address 10.213.0.<i>,
every port fixed: 9092 for clients, 9093 for the controller quorum), with a veth into a
bridge that lives in a fourth namespace (`rc<tag>c`, 10.213.0.254). This process moves
itself into that fourth namespace before it opens a socket or starts a thread, so the
clients reach every node through the bridge and nothing of it is in the machine's own
namespace. A partition of node X resolves the peers' addresses in X's namespace, and X's
address in each peer's, to a MAC address nobody has (a permanent neighbour entry): every
packet between X and its peers is dropped silently, while the clients still reach
everyone. (No qdisc but the default is available here, and nftables is not needed.)
Where namespaces cannot be made (not root, no `ip`), the nodes run on 127.0.0.1 and the
partition faults are skipped, and the output says so.

# Modules

This file is the run and its command line; the parts are beside it: `netns.py` (the
network, shared with `bench/cluster_failover.py --fault partition`), `chaos_workload.py`
(the clients and what they record), `chaos_txn.py` (the transactional workload),
`chaos_faults.py` (schedules and the nemesis), `chaos_checker.py` (the checks) and
`kafka_wire.py` (the requests built by hand, so that an answer is one node's).

# Workload

- `--producers` idempotent acks=all confluent-kafka producers write the values
  `p<id>-<seq>` round-robin over the partitions of an RF=3, `min.insync.replicas=2` topic,
  recording every acknowledged (partition, offset, value);
- a consumer group of two members (confluent-kafka) reads that topic and commits
  synchronously. Commits only ever move forward: an attempt is made only above the
  highest offset any member has attempted for that partition, under one lock, so that the
  commits the coordinator receives are increasing whatever the rebalances do;
- a session that follows the protocol as a client does (FindCoordinator, keep that
  coordinator until it answers "not the coordinator" or cannot be reached) reads both
  groups' offsets from its coordinator, and commits to a group of its own the values
  1, 2, 3, ..., each once and only to the coordinator it has (a commit that times out is
  not sent again elsewhere; librdkafka's members do resend theirs to a new coordinator);
  the two groups share a coordinator;
- an every-node checker sends OffsetFetch (v2, raw) to each node in turn and records
  every answer a node gave as the coordinator (no error): each is a claim that the
  offsets in it were committed.

With `--transactional` (and in the short run of `test_chaos.py`), on two more topics
(`chaos_txn.py` says how each outcome is known):
- `--txn-producers` transactional producers (`transactional.id`, acks=all) write
  multi-partition transactions of 3-8 records, committing or aborting them in a seeded
  pattern (an abort is flushed first, so that its records are in the log); every twelfth
  is fenced halfway by a new producer of the same `transactional.id`, after which the
  old one, now a zombie, produces the rest and asks to commit;
- a consume-transform-produce member copies the idempotent producers' topic, one
  transaction per batch with the group's offsets (`send_offsets_to_transaction`), some
  aborted on purpose and then rewound to the committed offsets;
- a read_committed consumer reads both topics throughout, noting when it saw each record;
- ListOffsets is sent at READ_COMMITTED and then at READ_UNCOMMITTED to every node.
Faults may then also aim at `txn-coordinator`, the first transactional id's coordinator.

# Faults

Chosen by a seeded RNG (the seed is printed; `--seed` replays the schedule) and printed as
a schedule before the run: `kill` (SIGKILL, restart after the window), `pause` (SIGSTOP,
SIGCONT after it), `partition` (cut from its peers, healed after it), `disk-full` (SIGKILL,
restart with RLIMIT_FSIZE just above its largest segment, so that a write fails with EFBIG
and the node stops itself as for a full disk; restarted without the limit after the
window), `slow-disk` (strace attached to the running node holds each pwritev, pwrite64,
fsync and fdatasync for 20-400 ms, drawn per fault; detached after the window; see
`SlowDisk` for what else it slows) and `clock-jump` (the node's wall clock steps by
30-3600 s, forward or back, drawn per fault, and steps back to true time after the
window: every node then runs under libfaketime, whose offset file it re-reads each
second; only CLOCK_REALTIME moves, the monotonic clocks do not). strace and libfaketime
come from Debian and are installed when missing (as root); a kind whose tool cannot be
had is skipped, and said so. The target is a node id or `coordinator`: the coordinator
of the workload's group at the moment the fault starts (FindCoordinator). One fault at a
time, so a majority is always up.

# Checks

After the schedule, everything is healed, the cluster settles (every partition led, its
ISR full) and the workload stops. Then:
- `no_lost_ack`: every acknowledged record is in the log at its acknowledged offset;
- `no_duplicate`: no value is stored twice;
- `no_offset_two_records`: no offset was acknowledged for two values;
- `producer_order`: in each partition, each producer's sequence numbers increase with
  the offset;
- `acks_without_offset_implicit`: no more acknowledgements came without an offset (-1)
  than librdkafka logged as implicit (an earlier request's answer lost, a later one's
  success acknowledging it), so none was the broker's answer;
- `replicas_identical`: with all three nodes paused together, each partition's segment
  bytes are the same on every replica (every topic of the workload, `__consumer_offsets`
  and, with transactions, `__transaction_state`);
- `offsets_never_backwards`: per group and partition, the answers the session got, in
  order, and then the group's offsets after heal, never decrease;
- `offsets_fetched_were_committed`: every offset any node answered is one whose commit
  record is in `__consumer_offsets` after heal, i.e. it was replicated (read back with a
  read_uncommitted consumer; the check refuses to pass if that log has been compacted,
  i.e. an offset it was not handed is not a transaction marker's in the segment files);
- `acked_commit_visible`: no answer to the session after its own acknowledged commit is
  below it, and after heal each group's offsets are at least its acknowledged commits;
  (What is not checked: the order of answers across nodes. A deposed coordinator cut off
  from the controller goes on answering OffsetFetch with the offsets it had committed
  until it hears of its successor, as Kafka's does: stale, but replicated, which
  `offsets_fetched_were_committed` holds it to; a client keeps one coordinator.)
With the transactional workload (`chaos_checker.check_transactions`, `check_copy`,
`check_stable_offsets`, each on both topics read back at both isolation levels):
- `read_committed_no_aborted`: no record of an aborted transaction, and nothing a zombie
  wrote, was handed to a read_committed reader, during the run or after heal;
- `committed_txn_visible_once`: every record of a transaction whose commit was
  acknowledged is read_committed after heal exactly once, at its acknowledged offset; a
  transaction of unknown outcome is visible whole or not at all;
- `txn_order`: each producer's records are in the order written, per partition;
- `open_txn_invisible`: the run's reader saw no record before its commit was asked for;
- `fenced_writes_invisible`: a zombie's records are neither acknowledged nor read, and
  its commit is refused;
- `read_uncommitted_control`: read_uncommitted finds every acknowledged record (the
  aborted ones too) at its offset, once, and at least one aborted record, so that the
  first check cannot pass for want of anything to hide;
- `copy_exactly_once`: the copy holds input records 0..C-1 of each partition, once and in
  order, C being the copy group's offset after heal;
- `lso_at_most_high_watermark`: each leader's LSO is not above the high watermark it
  answers next, and neither goes back under one leader epoch;
- `no_hanging_transaction`: once the workload ended its transactions, every LSO reaches
  its high watermark.
A failure prints the seed, the schedule as it ran and the evidence; the report is also
written as JSON (`--report`). librdkafka's log lines of the idempotent producers
(`debug=eos`, which logs their produce errors and the messages it acknowledged without an
offset) and of the transactional clients go to `idempotent-clients.log` and
`txn-clients.log` in the run's directory. The exit status is 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
import time
import traceback
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos_checker import (  # noqa: E402
    check_acks_without_offset,
    check_copy,
    check_offsets,
    check_records,
    check_stable_offsets,
    check_transactions,
    committed_history,
    compare_replicas,
    control_offsets,
    explain_duplicates,
)
from chaos_faults import (  # noqa: E402
    FAULT_KINDS,
    TARGETS,
    Fault,
    Nemesis,
    coordinator_partition_schedule,
    find_libfaketime,
    log,
    preload_faketime,
    random_schedule,
)
from chaos_txn import TxnWorkload, read_isolated  # noqa: E402
from chaos_workload import Clock, Group, OffsetChecker, ProbeSession, Producers  # noqa: E402
from kafka_wire import REQUEST_TIMEOUT_S, find_on_any, offset_fetch  # noqa: E402
from netns import HUB_ADDRESS, NODES, Network, ensure_program, namespaced_cluster  # noqa: E402
from rill_harness import RillCluster, rill_binary  # noqa: E402


# Failure detection shortened so that a fault is noticed within seconds (the same values
# as the cluster tests' conftest.CLUSTER_OVERRIDES), and min.insync.replicas=2 everywhere.
OVERRIDES = {
    "group.initial.rebalance.delay.ms": "0",
    "broker.heartbeat.interval.ms": "300",
    "broker.session.timeout.ms": "2000",
    "replica.lag.time.max.ms": "3000",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "3",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "transaction.state.log.num.partitions": "3",
}

# Every wait of the run is bounded by one of these.
SETTLE_TIMEOUT_S = 60.0


def make_cluster(workdir: Path, net: Network | None) -> RillCluster:
    if net is None:
        return RillCluster(workdir, 3, OVERRIDES)
    return namespaced_cluster(workdir, net, OVERRIDES)


# ---------------------------------------------------------------------------------------
# A run.


def wait_settled(bootstrap: str, topics: dict[str, int], timeout_s: float) -> None:
    from confluent_kafka.admin import AdminClient

    client = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        try:
            md = client.list_topics(timeout=5)
            ok = True
            for topic, count in topics.items():
                t = md.topics.get(topic)
                if t is None or t.error is not None or len(t.partitions) != count:
                    ok, last = False, f"{topic} not described"
                    break
                for p in t.partitions.values():
                    if p.leader < 0 or len(p.isrs) != len(NODES):
                        ok, last = False, f"{topic}[{p.id}] leader {p.leader} isr {p.isrs}"
                        break
                if not ok:
                    break
            if ok:
                return
        except Exception as error:  # noqa: BLE001 - settling
            last = repr(error)
        time.sleep(0.3)
    raise RuntimeError(f"cluster did not settle within {timeout_s:.0f}s: {last}")


def probe_group_beside(hosts: dict[int, str], group: str, rng: random.Random, tries: int = 64) -> str:
    """A name for the session's own group with the same coordinator as `group`, so that a
    fault aimed at the coordinator hits both."""
    want = find_on_any(hosts, group)
    for _ in range(tries):
        name = f"{group}-probe-{rng.randrange(16**6):06x}"
        if find_on_any(hosts, name) == want:
            return name
    raise RuntimeError(f"no probe group name shares node {want}'s coordination in {tries} tries")


def final_offsets(hosts: dict[int, str], group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's offsets after heal, from the coordinator FindCoordinator names."""
    for _ in range(50):
        node = find_on_any(hosts, group)
        if node is not None:
            try:
                offsets, errors = offset_fetch(hosts[node], group, topic, partitions, REQUEST_TIMEOUT_S)
                if not errors:
                    return offsets
            except (OSError, struct.error):
                pass
        time.sleep(0.2)
    raise RuntimeError(f"no coordinator answered for {group} after heal")


def read_records(bootstrap: str, topic: str, partitions: int) -> dict[int, dict[int, tuple]]:
    """Every record of `topic`, read_uncommitted: {partition: {offset: (key, value)}}."""
    return {p: {o: (k, v) for o, k, v in recs} for p, recs in read_isolated(
        bootstrap, topic, partitions, "read_uncommitted").items()}


def read_log(bootstrap: str, topic: str, partitions: int) -> dict[int, dict[int, bytes]]:
    from kafka_helpers import read_all

    return {p: {o: r.value for o, r in recs.items()} for p, recs in read_all(bootstrap, topic, partitions).items()}


def run(args: argparse.Namespace) -> dict:
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    rng = random.Random(seed)
    workdir = Path(args.workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    log(f"seed {seed} (replay with --seed {seed} --scenario {args.scenario} --seconds {args.seconds})")
    log(f"workdir {workdir}, binary {rill_binary()}")
    skipped: list[str] = []
    requested = args.faults.split(",")
    unknown = set(requested) - set(FAULT_KINDS)
    if unknown or not requested:
        raise SystemExit(f"--faults: unknown or no fault kinds {sorted(unknown)} (known: {', '.join(FAULT_KINDS)})")
    # The tools of the slow disk and the clock jump, installed (Debian, as root) when
    # missing; a kind whose tool cannot be had is left out of the schedule, and said so.
    strace = ensure_program("strace", "strace") if "slow-disk" in requested else None
    if "slow-disk" in requested and strace is None:
        skipped.append("slow-disk: no strace, and apt-get could not install it")
        log("SLOW DISK SKIPPED: no strace")
    faketime = find_libfaketime() if "clock-jump" in requested else None
    if "clock-jump" in requested and faketime is None:
        skipped.append("clock-jump: no libfaketime, and apt-get could not install it")
        log("CLOCK JUMPS SKIPPED: no libfaketime")
    net, why = (None, "--no-netns given") if args.no_netns else Network.make()
    if net is None:
        skipped.append(f"partition: {why}; nodes on 127.0.0.1, no partitions")
        log(f"PARTITIONS SKIPPED: {why}")
    else:
        net.enter_hub()
        log(f"network namespaces {net.hub} (hub, {HUB_ADDRESS}) and {', '.join(net.ns(i) for i in NODES)}")
    unavailable = {
        "partition": net is None,
        "slow-disk": strace is None,
        "clock-jump": faketime is None,
    }
    kinds = tuple(k for k in requested if not unavailable.get(k, False))
    if not kinds:
        raise SystemExit(f"--faults {args.faults}: none of these kinds can be injected here ({'; '.join(skipped)})")

    warmup = 8.0
    # A transactional run also aims faults at the coordinator of the first transactional
    # producer (drawn only then, so that the other runs' schedules stay what they were).
    targets = TARGETS + (("txn-coordinator",) if args.transactional else ())
    if args.scenario == "coordinator-partition":
        schedule = coordinator_partition_schedule(rng, warmup)
    elif args.scenario == "random":
        schedule = random_schedule(rng, warmup, args.seconds, kinds, targets)
    else:  # ci: the targeted fault first, then random ones
        schedule = coordinator_partition_schedule(rng, warmup)
        first_end = schedule[0].at_s + schedule[0].window_s + 4.0
        schedule += random_schedule(rng, first_end, max(args.seconds - first_end, 0), kinds, targets)
    if net is None:
        schedule = [f for f in schedule if f.kind != "partition"] or schedule
    log("schedule:")
    for fault in schedule:
        log(f"  {fault.describe()}")

    # Every refused produce and transaction marker in the nodes' logs (debug in the
    # handlers and the marker sender), so that a duplicate, a loss or a visible aborted
    # record comes with the error codes the clients and the coordinator were given.
    os.environ.setdefault("RILL_LOG", "info,openraft=off,rill_broker::server::data=debug,"
                          "rill_broker::server::txn_partition=debug,"
                          "rill_broker::coordinator::transaction_marker=debug")
    cluster = make_cluster(workdir, net)
    preloaded = faketime is not None and any(f.kind == "clock-jump" for f in schedule)
    if preloaded:
        preload_faketime(cluster, faketime)
        log(f"every node reads its wall clock through {faketime} (clock-jump faults)")
    # Names from the seed too, so that a replay has the same coordinators (a group's is
    # chosen by a hash of its name).
    topic, group, partitions = f"chaos-{seed}", f"chaos-group-{seed}", args.partitions
    report: dict = {"seed": seed, "scenario": args.scenario, "skipped": skipped}
    producers = group_members = checker = session = txn = None
    try:
        cluster.start()
        bootstrap = cluster.bootstrap
        from confluent_kafka.admin import AdminClient, NewTopic

        client = AdminClient({"bootstrap.servers": bootstrap})
        clock = Clock()
        hosts = {i: n.bootstrap for i, n in cluster.nodes.items()}
        workload_topics = {topic: partitions}
        if args.transactional:
            txn = TxnWorkload(bootstrap, hosts, seed, topic, partitions, args.txn_producers, clock, workdir)
            workload_topics.update(txn.topics)
        for _name, created in client.create_topics(
            [NewTopic(t, n, 3, config={"min.insync.replicas": "2"}) for t, n in workload_topics.items()],
            operation_timeout=30,
        ).items():
            created.result(timeout=30)
        wait_settled(bootstrap, workload_topics, SETTLE_TIMEOUT_S)
        producers = Producers(bootstrap, topic, partitions, args.producers, args.rate, clock,
                              workdir / "idempotent-clients.log")
        group_members = Group(bootstrap, topic, group, clock)
        probe_group = probe_group_beside(hosts, group, rng)
        checker = OffsetChecker(hosts, [group, probe_group], topic, partitions, clock)
        session = ProbeSession(hosts, probe_group, group, topic, partitions, clock, random.Random(seed + 1))
        producers.start()
        group_members.start()
        checker.start()
        session.start()
        if txn is not None:
            txn.start()
        nemesis = Nemesis(cluster, net, group, clock, strace, preloaded,
                          txn.transactional_ids[0] if txn is not None else None)
        for fault in schedule:
            nemesis.run(fault)
        rest = max(0.0, warmup + args.seconds - clock.now()) if args.scenario != "coordinator-partition" else 6.0
        time.sleep(rest)
        log("healing everything, then settling")
        nemesis.heal_all()
        offsets_partitions = int(OVERRIDES["offsets.topic.num.partitions"])
        internal = {"__consumer_offsets": offsets_partitions}
        if txn is not None:
            internal["__transaction_state"] = int(OVERRIDES["transaction.state.log.num.partitions"])
        wait_settled(cluster.bootstrap, {**workload_topics, **internal}, SETTLE_TIMEOUT_S)
        time.sleep(3.0)  # the workload runs on the healed cluster for a moment
        producers.stop()
        group_members.stop()
        checker.stop()
        session.stop()
        final = {g: final_offsets(hosts, g, topic, partitions) for g in (group, probe_group)}
        log(f"workload: {producers.sent} sent, {len(producers.acks)} acknowledged, "
            f"{len(producers.errors)} producer errors, {group_members.consumed} consumed, "
            f"{sum(a.acked for a in group_members.attempts)}/{len(group_members.attempts)} commits acknowledged; "
            f"session: {sum(a.acked for a in session.attempts)}/{len(session.attempts)} commits acknowledged, "
            f"{len(session.observations)} answers, coordinators found {session.finds[:12]}; "
            f"{len(checker.observations)} answers to the every-node checker ({checker.errors} error codes, "
            f"{checker.unreachable} unreachable); after heal {final}")
        stored = read_log(cluster.bootstrap, topic, partitions)
        checks = check_records(producers.acks, stored)
        checks.append(check_acks_without_offset(producers.acks, producers.eos_log.implicitly_acked))
        for check in checks:
            if check.name == "no_duplicate" and not check.ok:
                explain_duplicates(check, cluster, topic)
        offsets_log = read_records(cluster.bootstrap, "__consumer_offsets", offsets_partitions)
        checks += check_offsets(
            session.observations,
            checker.observations,
            {group: group_members.attempts, probe_group: session.attempts},
            final,
            committed_history(offsets_log, topic, {
                p: control_offsets(cluster.node(1).data_dir / f"__consumer_offsets-{p}")
                for p in range(offsets_partitions)
            }),
            schedule,
        )
        if txn is not None:
            history = txn.finish()
            report["transactional"] = txn.summary()
            log(f"transactional workload: {report['transactional']}")
            checks += check_transactions(history.txns, history.committed, history.uncommitted, history.live)
            copied = final_offsets(hosts, txn.copy_group, topic, partitions)
            checks.append(check_copy(history.committed[txn.copy_topic], copied, partitions))
            checks += check_stable_offsets(history.stable_offsets, history.settled, history.last_stable_offsets)
        checks.append(compare_replicas(cluster, [*workload_topics, *internal]))
        failures = [f for part in (producers, group_members, checker, session) for f in part.failures]
        failures += txn.failures() if txn is not None else []
        if failures:
            report.setdefault("problems", []).extend(failures)
        report.update(
            acknowledged=len(producers.acks),
            # librdkafka's implicit acknowledgements: a message whose own answer was lost
            # is acknowledged, without an offset, when a later sequence is.
            acknowledged_without_offset=[asdict(a) for a in producers.acks if a.offset is None][:20],
            acknowledged_without_offset_count=sum(a.offset is None for a in producers.acks),
            implicitly_acked=producers.eos_log.implicitly_acked,
            eos_log=producers.eos_log.lines[:50],
            sent=producers.sent,
            producer_errors=producers.errors[:10],
            commits=len(group_members.attempts),
            commits_acknowledged=sum(a.acked for a in group_members.attempts),
            offset_fetch_answers=len(checker.observations) + len(session.observations),
            session_commits=len(session.attempts),
            session_commits_acknowledged=sum(a.acked for a in session.attempts),
            probe_group=probe_group,
            final_offsets=final,
            faults=[asdict(f) for f in schedule],
            faults_injected=sum(1 for f in schedule if f.node),
            checks={c.name: asdict(c) for c in checks},
        )
    except Exception:  # noqa: BLE001 - reported with the seed and the schedule
        report["error"] = traceback.format_exc()
        report.setdefault("faults", [asdict(f) for f in schedule])
    finally:
        for thing in (producers, group_members, checker, session):
            if thing is not None:
                thing.halt()
        if txn is not None:
            txn.halt()
        problems = cluster.teardown()
        if problems:
            report.setdefault("problems", []).extend(problems)
        if net is not None:
            net.teardown()
    return report


def print_report(report: dict) -> bool:
    checks = report.get("checks", {})
    ok = bool(checks) and all(c["ok"] for c in checks.values()) and "error" not in report
    ok = ok and not report.get("problems")
    if "error" in report:
        log(f"the run itself failed:\n{report['error']}")
    for problem in report.get("problems", []):
        log(f"problem: {problem}")
    log(f"seed {report['seed']}, scenario {report['scenario']}: "
        f"{report.get('acknowledged', 0)} acknowledged writes checked, "
        f"{report.get('faults_injected', 0)} faults injected, "
        f"{report.get('offset_fetch_answers', 0)} OffsetFetch answers checked")
    if "transactional" in report:
        t = report["transactional"]
        log(f"transactions checked: {t['transactions']}, {t['fenced']} fenced, {t['records']} records, "
            f"{t['copy_committed']}/{t['copy_transactions']} copy transactions committed, "
            f"{t['stable_offset_answers']} LSO/high watermark answers, {t['producer_restarts']} producer restarts")
    log("schedule as run:")
    for f in report.get("faults", []):
        log("  " + Fault(**f).describe())
    for skipped in report.get("skipped", []):
        log(f"skipped: {skipped}")
    for ack in report.get("acknowledged_without_offset", []):
        log(f"note: p{ack['producer']}-{ack['seq']} was acknowledged without an offset "
            f"(partition {ack['partition']}, t={ack['at']:.2f}s)")
    if report.get("acknowledged_without_offset_count"):
        log(f"note: {report['acknowledged_without_offset_count']} acknowledged without an offset; librdkafka "
            f"logged {report.get('implicitly_acked', 0)} message(s) implicitly acked (an earlier request's "
            f"answer lost, a later one's success acknowledging it)")
    for c in checks.values():
        log(f"  {'PASS' if c['ok'] else 'FAIL'} {c['name']} ({c['checked']} checked)")
        for line in c["evidence"]:
            log(f"      {line}")
    if not ok:
        log(f"FAILED: replay with --seed {report['seed']} --scenario {report['scenario']}")
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=["ci", "random", "coordinator-partition"], default="random")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--seconds", type=float, default=60.0, help="length of the fault schedule")
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--rate", type=float, default=100.0, help="records per second per producer")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--transactional", action="store_true",
                        help="add transactional producers, a consume-transform-produce member and "
                             "read_committed readers, and their checks")
    parser.add_argument("--txn-producers", type=int, default=2)
    parser.add_argument("--faults", default=",".join(FAULT_KINDS),
                        help=f"the fault kinds the random schedule picks from (default: all of {', '.join(FAULT_KINDS)})")
    parser.add_argument("--no-netns", action="store_true",
                        help="run the nodes on 127.0.0.1 without namespaces (no partitions), "
                             "as on a machine that cannot make them")
    parser.add_argument("--workdir", default=f"/tmp/rill-chaos-{os.getpid()}")
    parser.add_argument("--report", help="write the report here as JSON")
    args = parser.parse_args(argv)
    report = run(args)
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=2))
    return 0 if print_report(report) else 1


if __name__ == "__main__":
    sys.exit(main())
