"""The fault-injection suite's checker (see `chaos.py`'s "Checks"): pure functions of what
the workload recorded and what the logs hold after heal, each returning a `Check` with
its evidence, plus the byte comparison of the replicas. `test_chaos.py` feeds each
check made-up histories it must fail on."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

from chaos_faults import Fault
from chaos_txn import Seen, StableOffsets, Txn, parse_txn_value
from chaos_workload import Ack, CommitAttempt, Observation, parse_value
from rill_harness import RillCluster

REPLICA_COMPARE_TRIES = 10
# The record batch attribute bit of a control batch.
CONTROL_BATCH = 0x20


@dataclass
class Check:
    name: str
    ok: bool
    checked: int
    evidence: list[str] = field(default_factory=list)


def check_records(acks: list[Ack], log_by_partition: dict[int, dict[int, bytes]]) -> list[Check]:
    stored: dict[tuple[int, int], tuple[int, int]] = {}  # (pid, seq) -> (partition, offset)
    duplicates = []
    for p, records in log_by_partition.items():
        for offset, value in records.items():
            key = parse_value(value)
            if key in stored:
                duplicates.append(f"p{key[0]}-{key[1]} at {stored[key]} and at {(p, offset)}")
            else:
                stored[key] = (p, offset)
    lost, moved = [], []
    by_offset: dict[tuple[int, int], set[tuple[int, int]]] = {}
    for ack in acks:
        key = (ack.producer, ack.seq)
        where = stored.get(key)
        if ack.offset is None:
            # Acknowledged without an offset: it must be stored, wherever it is.
            if where is None or where[0] != ack.partition:
                lost.append(f"p{ack.producer}-{ack.seq} acknowledged (no offset) in partition "
                            f"{ack.partition} at t={ack.at:.2f}s, not there ({where})")
            continue
        by_offset.setdefault((ack.partition, ack.offset), set()).add(key)
        if where is None:
            lost.append(f"p{ack.producer}-{ack.seq} acknowledged at {(ack.partition, ack.offset)}, not in the log")
        elif where != (ack.partition, ack.offset):
            moved.append(f"p{ack.producer}-{ack.seq} acknowledged at {(ack.partition, ack.offset)}, stored at {where}")
    two = [f"{at}: acknowledged for {sorted(keys)}" for at, keys in by_offset.items() if len(keys) > 1]
    order = []
    for p, records in log_by_partition.items():
        last: dict[int, tuple[int, int]] = {}
        for offset in sorted(records):
            pid, seq = parse_value(records[offset])
            if pid in last and seq <= last[pid][0]:
                order.append(f"partition {p}: p{pid}-{seq} at {offset} after p{pid}-{last[pid][0]} at {last[pid][1]}")
            last[pid] = (seq, offset)
    total = sum(len(r) for r in log_by_partition.values())
    return [
        Check("no_lost_ack", not lost and not moved, len(acks), (lost + moved)[:20]),
        Check("no_duplicate", not duplicates, total, duplicates[:20]),
        Check("no_offset_two_records", not two, len(by_offset), two[:20]),
        Check("producer_order", not order, total, order[:20]),
    ]


def check_acks_without_offset(acks: list[Ack], implicitly_acked: int) -> Check:
    """acks_without_offset_implicit: every acknowledgement without an offset (-1) is one
    of librdkafka's implicit ones, which it logs (IMPLICITACK, `debug=eos`) when a request
    whose answer was lost is acknowledged by a later request's success: a broker that
    answered a produce, or a retry of one, with NONE and base offset -1 would show here as
    more acknowledgements without an offset than librdkafka explains. (Kafka answers a
    retried batch with its original offset, from the producer state.)"""
    without = [a for a in acks if a.offset is None]
    wrong = [] if len(without) <= implicitly_acked else [
        f"{len(without)} acknowledged without an offset, {implicitly_acked} implicitly acknowledged by librdkafka: "
        + ", ".join(f"p{a.producer}-{a.seq} (partition {a.partition}, t={a.at:.2f}s)" for a in without[:10])
    ]
    return Check("acks_without_offset_implicit", not wrong, len(acks), wrong)


def committed_history(records: dict[int, dict[int, tuple[bytes | None, bytes | None]]], topic: str,
                      markers: dict[int, set[int]] | None = None):
    """{(group, partition): set of committed offsets} from `__consumer_offsets` as it is
    after heal (read_uncommitted), or None when that log no longer holds every record
    (compacted): an offset a consumer was not handed must be a transaction marker's
    (`markers`, per partition, from the segment files), which consumers never see."""
    history: dict[tuple[str, int], set[int]] = {}
    for p, records in records.items():
        offsets = sorted(records)
        if offsets and offsets[0] != 0:
            return None
        skipped = set(range(offsets[-1] + 1)) - set(offsets) if offsets else set()
        if skipped - (markers or {}).get(p, set()):
            return None
        for key, value in records.values():
            if key is None or value is None or len(key) < 2:
                continue
            (version,) = struct.unpack_from(">h", key, 0)
            if version not in (0, 1):
                continue  # group metadata, not an offset commit
            pos = 2
            fields = []
            for _ in range(2):
                (n,) = struct.unpack_from(">h", key, pos)
                fields.append(key[pos + 2: pos + 2 + n].decode())
                pos += 2 + n
            (partition,) = struct.unpack_from(">i", key, pos)
            if fields[1] != topic:
                continue
            (_vversion, offset) = struct.unpack_from(">hq", value, 0)
            history.setdefault((fields[0], partition), set()).add(offset)
    return history


def check_offsets(session: list[Observation], everyone: list[Observation],
                  attempts: dict[str, list[CommitAttempt]], final: dict[str, dict[int, int]],
                  history: dict[tuple[str, int], set[int]] | None, faults: list[Fault]) -> list[Check]:
    """What OffsetFetch answered, against what was committed.

    - offsets_never_backwards: per group, the answers the protocol-following session got,
      in order, then the group's offsets after heal, never decrease;
    - offsets_fetched_were_committed: every answer any node gave without an error is an
      offset whose commit is in `__consumer_offsets` after heal (it was replicated);
    - acked_commit_visible: no answer to the session after an acknowledged commit of its
      own is below it, and after heal every group's offsets are at least its acknowledged
      commits."""

    def during(t: float) -> str:
        active = [f"{f.kind} node {f.node}" for f in faults if f.node and f.started <= t <= f.ended]
        return ", ".join(active) or "no fault"

    def commit_of(group: str, p: int, offset: int) -> str:
        for a in attempts.get(group, []):
            if a.partition == p and a.offset == offset:
                outcome = "acknowledged" if a.acked else f"NOT acknowledged ({a.error or 'no answer'})"
                who = "the session" if a.member < 0 else f"member {a.member}"
                return f"; {who} committed {offset} at t={a.start:.2f}-{a.end:.2f}s: {outcome}"
        return ""

    backwards, unreplicated, unseen = [], [], []
    for group in sorted({o.group for o in session} | set(final)):
        best: dict[int, Observation] = {}
        shown: set[tuple[int, int, int]] = set()
        for obs in sorted((o for o in session if o.group == group), key=lambda o: o.start):
            for p, offset in obs.offsets.items():
                seen = best.get(p)
                if seen is not None and offset < seen.offsets[p] and (p, seen.offsets[p], offset) not in shown:
                    shown.add((p, seen.offsets[p], offset))
                    backwards.append(
                        f"{group} partition {p}: node {seen.node} answered {seen.offsets[p]} at "
                        f"t={seen.end:.2f}s ({during(seen.end)}), then node {obs.node} answered "
                        f"{offset} at t={obs.start:.2f}s ({during(obs.start)})"
                        + commit_of(group, p, seen.offsets[p])
                    )
                if seen is None or offset >= seen.offsets[p]:
                    best[p] = obs
        for p, offset in final.get(group, {}).items():
            seen = best.get(p)
            if seen is not None and offset < seen.offsets[p]:
                backwards.append(
                    f"{group} partition {p}: node {seen.node} answered {seen.offsets[p]} at "
                    f"t={seen.end:.2f}s ({during(seen.end)}); after heal the offset is {offset}"
                    + commit_of(group, p, seen.offsets[p])
                )
        for a in attempts.get(group, []):
            after_heal = final.get(group, {}).get(a.partition)
            if a.acked and after_heal is not None and after_heal < a.offset:
                unseen.append(f"{group} partition {a.partition}: commit of {a.offset} acknowledged at "
                              f"t={a.end:.2f}s; after heal the offset is {after_heal}")
    own = sorted((a for a in attempts.get(session[0].group if session else "", []) if a.acked and a.member < 0),
                 key=lambda a: a.end)
    for obs in session:
        for a in own:
            if a.end >= obs.start:
                break
            if obs.group == session[0].group:
                got = obs.offsets.get(a.partition)
                if got is not None and got < a.offset:
                    unseen.append(f"{obs.group} partition {a.partition}: commit of {a.offset} acknowledged "
                                  f"at t={a.end:.2f}s, node {obs.node} answered {got} at t={obs.start:.2f}s "
                                  f"({during(obs.start)})")
    if history is None:
        unreplicated.append("__consumer_offsets no longer holds every record (compacted): cannot check")
    else:
        reported: set[tuple[str, int, int, int]] = set()
        for obs in sorted(everyone + session, key=lambda o: o.start):
            for p, offset in obs.offsets.items():
                if offset not in history.get((obs.group, p), set()) and (obs.group, p, offset, obs.node) not in reported:
                    reported.add((obs.group, p, offset, obs.node))
                    unreplicated.append(
                        f"{obs.group} partition {p}: node {obs.node} answered {offset} at t={obs.start:.2f}s "
                        f"({during(obs.start)}), a commit not in __consumer_offsets after heal"
                        + commit_of(obs.group, p, offset)
                    )
    answers = sum(len(o.offsets) for o in everyone + session)
    acked = sum(a.acked for group_attempts in attempts.values() for a in group_attempts)
    return [
        Check("offsets_never_backwards", not backwards, sum(len(o.offsets) for o in session), _spread(backwards)),
        Check("offsets_fetched_were_committed", not unreplicated, answers, _spread(unreplicated)),
        Check("acked_commit_visible", not unseen, acked, _spread(unseen)),
    ]


Log = dict[str, dict[int, list[tuple[int, bytes]]]]  # topic -> partition -> [(offset, value)]


def check_transactions(txns: list[Txn], committed: Log, uncommitted: Log, live: list[Seen]) -> list[Check]:
    """What the transactional workload was promised, against what a read_committed and
    a read_uncommitted reader were handed after heal (`committed`, `uncommitted`) and
    what the read_committed reader of the run saw when (`live`):

    - read_committed_no_aborted: no record of an aborted transaction, and nothing a
      zombie wrote, is handed to a read_committed reader, then or after heal;
    - committed_txn_visible_once: every record of a transaction whose commit was
      acknowledged is there after heal, exactly once, at the offset its delivery was
      acknowledged at; a transaction of unknown outcome is there whole or not at all
      (each of its acknowledged records, or none);
    - txn_order: in each partition, each producer's records are in the order it wrote
      them (transaction number, then record);
    - open_txn_invisible: the run's reader saw no record before its transaction's
      commit was asked for (the last stable offset held it back);
    - fenced_writes_invisible: what a fenced producer wrote after its successor's
      `init_transactions` returned is neither acknowledged nor ever read, and its
      commit is refused;
    - read_uncommitted_control: a read_uncommitted reader finds every acknowledged
      record (aborted ones too) at its offset, none twice, and at least one aborted
      record: otherwise read_committed_no_aborted would pass for want of anything to
      hide."""
    owner: dict[bytes, Txn] = {}
    for txn in txns:
        for value in txn.values + txn.zombie_values:
            owner[value] = txn
    zombie = {v for txn in txns for v in txn.zombie_values}
    hidden = {v for txn in txns if txn.outcome == "aborted" for v in txn.values} | zombie

    def name(txn: Txn) -> str:
        return f"{txn.producer} transaction {txn.number} ({txn.outcome}{', fenced' if txn.fenced else ''})"

    def positions(log: Log) -> dict[bytes, list[tuple[str, int, int]]]:
        where: dict[bytes, list[tuple[str, int, int]]] = {}
        for topic, by_partition in log.items():
            for p, records in by_partition.items():
                for offset, value in records:
                    where.setdefault(value, []).append((topic, p, offset))
        return where

    visible, stored = positions(committed), positions(uncommitted)
    handed = sum(len(r) for by_partition in committed.values() for r in by_partition.values())

    leaked = [f"{t}[{p}] offset {o} after heal: {v!r} of {name(owner[v])}"
              for v, places in visible.items() if v in hidden for t, p, o in places]
    leaked += [f"{s.topic}[{s.partition}] offset {s.offset} at t={s.at:.2f}s: {s.value!r} of {name(owner[s.value])}"
               for s in live if s.value in hidden]

    missing, alien = [], []
    for value, places in visible.items():
        if value not in owner:
            alien.append(f"{places[0][0]}[{places[0][1]}] offset {places[0][2]}: {value!r}, which nobody wrote")
        elif len(places) > 1:
            missing.append(f"{value!r} of {name(owner[value])} handed {len(places)} times: {places}")
    checked_once = 0
    for txn in txns:
        if txn.outcome == "committed":
            checked_once += len(txn.values)
            for value, p in zip(txn.values, txn.partitions):
                at = txn.acks.get(value)
                places = visible.get(value, [])
                if not places:
                    missing.append(f"{value!r} of {name(txn)} (acknowledged at {at}) is not handed after heal")
                elif at is not None and at[1] is not None and places[0] != (txn.topic, at[0], at[1]):
                    missing.append(f"{value!r} of {name(txn)} acknowledged at {at}, handed at {places[0]}")
                elif places[0][:2] != (txn.topic, p):
                    missing.append(f"{value!r} of {name(txn)} written to partition {p}, handed at {places[0]}")
        elif txn.outcome == "unknown":
            checked_once += 1
            shown = [v for v in txn.values if v in visible]
            unshown = [v for v in txn.acks if v not in visible]
            if shown and unshown:
                missing.append(f"{name(txn)} is partly visible: {shown[:3]} handed, acknowledged {unshown[:3]} not")

    order = []
    for topic, by_partition in committed.items():
        for p, records in by_partition.items():
            last: dict[str, tuple[tuple[int, int], int]] = {}
            for offset, value in records:
                parsed = parse_txn_value(value)
                if parsed is None:
                    continue
                producer, n, k = parsed
                if producer in last and (n, k) <= last[producer][0]:
                    order.append(f"{topic}[{p}]: {value!r} at {offset} after {producer}'s "
                                 f"{last[producer][0]} at {last[producer][1]}")
                last[producer] = ((n, k), offset)

    early = []
    for s in live:
        txn = owner.get(s.value)
        if txn is None or s.value in hidden:
            continue  # reported above
        if txn.commit_started is None or s.at < txn.commit_started:
            asked = "never" if txn.commit_started is None else f"at t={txn.commit_started:.2f}s"
            early.append(f"{s.topic}[{s.partition}] offset {s.offset}: {s.value!r} read at t={s.at:.2f}s; "
                         f"the commit of {name(txn)} was asked for {asked}")

    fenced = [txn for txn in txns if txn.fenced]
    zombies = []
    for txn in fenced:
        if txn.zombie_commit_acknowledged:
            zombies.append(f"{name(txn)}: the zombie's commit was acknowledged")
        for value, at in txn.zombie_acks.items():
            zombies.append(f"{name(txn)}: the zombie's {value!r} was acknowledged at {at}")
        for value in txn.zombie_values:
            for t, p, o in visible.get(value, []):
                zombies.append(f"{name(txn)}: the zombie's {value!r} is handed at {t}[{p}] offset {o}")
        zombies += [f"{name(txn)}: the zombie's {s.value!r} read at t={s.at:.2f}s"
                    for s in live if s.value in txn.zombie_values]

    control, aborted_found = [], 0
    for value, places in stored.items():
        if len(places) > 1:
            control.append(f"{value!r} stored {len(places)} times: {places}")
    for txn in txns:
        for value, at in list(txn.acks.items()) + list(txn.zombie_acks.items()):
            places = stored.get(value, [])
            if not places:
                control.append(f"{value!r} of {name(txn)} acknowledged at {at}, not in the log")
            elif at[1] is not None and places[0] != (txn.topic, at[0], at[1]):
                control.append(f"{value!r} of {name(txn)} acknowledged at {at}, stored at {places[0]}")
            elif value in hidden:
                aborted_found += 1
    if not aborted_found:
        control.append("no acknowledged record of an aborted transaction was found read_uncommitted: "
                       "read_committed_no_aborted had nothing to hide")

    return [
        Check("read_committed_no_aborted", not leaked, handed + len(live), _spread(leaked)),
        Check("committed_txn_visible_once", not missing and not alien, checked_once, _spread(alien + missing)),
        Check("txn_order", not order, handed, _spread(order)),
        Check("open_txn_invisible", not early, len(live), _spread(early)),
        Check("fenced_writes_invisible", not zombies, len(fenced), _spread(zombies)),
        Check("read_uncommitted_control", not control, aborted_found, _spread(control)),
    ]


def check_copy(copied: dict[int, list[tuple[int, bytes]]], committed_offsets: dict[int, int],
               input_partitions: int) -> Check:
    """copy_exactly_once: the consume-transform-produce member's copy topic, read
    read_committed after heal, holds in each partition p the copies of input records
    0, 1, ..., C-1 of input partition p, each once and in order, where C is the group's
    offset of p after heal: the output and the offsets were committed together or not at
    all. Fails when nothing was copied (the check would hold of an empty topic)."""
    wrong = []
    for p in range(input_partitions):
        got = []
        for offset, value in copied.get(p, []):
            parsed = parse_txn_value(value)
            source = value.decode(errors="replace")[1:].split(":")[:2]
            if parsed is None or parsed[0] != "copy" or source[0] != str(p):
                wrong.append(f"copy[{p}] offset {offset}: {value!r} is not a copy of input partition {p}")
                continue
            got.append(parsed[2])
        expected = list(range(committed_offsets.get(p, 0)))
        if got != expected:
            first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
            twice = len(got) - len(set(got))
            wrong.append(
                f"input partition {p}: committed offset {committed_offsets.get(p)}, {len(got)} copies "
                f"({twice} repeated, {len(set(expected) - set(got))} missing, {len(set(got) - set(expected))} "
                f"beyond it); first difference at copy {first}: got {got[first:first + 3]}, "
                f"expected {expected[first:first + 3]}"
            )
    total = sum(committed_offsets.values())
    if total == 0:
        wrong.append("the group committed no offset: nothing was copied")
    return Check("copy_exactly_once", not wrong, total, _spread(wrong))


def check_stable_offsets(observations: list[StableOffsets], settled: bool,
                         last: list[StableOffsets]) -> list[Check]:
    """What the leaders answered ListOffsets:

    - lso_at_most_high_watermark: the last stable offset a leader answered is not above
      the high watermark it answered next, and neither goes backwards while one node
      leads one partition under one leader epoch;
    - no_hanging_transaction: once the workload ended every transaction, every
      partition's last stable offset reaches its high watermark."""
    wrong = []
    latest: dict[tuple[int, str, int, int], StableOffsets] = {}
    for o in sorted(observations, key=lambda o: o.at):
        if o.lso > o.high_watermark:
            wrong.append(f"node {o.node} {o.topic}[{o.partition}] epoch {o.leader_epoch} at t={o.at:.2f}s: "
                         f"LSO {o.lso} above the high watermark {o.high_watermark}")
        key = (o.node, o.topic, o.partition, o.leader_epoch)
        before = latest.get(key)
        if before is not None and (o.lso < before.lso or o.high_watermark < before.high_watermark):
            wrong.append(f"node {o.node} {o.topic}[{o.partition}] epoch {o.leader_epoch}: LSO/HW "
                         f"{before.lso}/{before.high_watermark} at t={before.at:.2f}s, then "
                         f"{o.lso}/{o.high_watermark} at t={o.at:.2f}s")
        latest[key] = o
    hanging = [] if settled else [
        f"node {o.node} {o.topic}[{o.partition}]: LSO {o.lso}, high watermark {o.high_watermark}"
        for o in last if o.lso != o.high_watermark
    ] or ["no leader answered every partition"]
    return [
        Check("lso_at_most_high_watermark", not wrong, len(observations), _spread(wrong)),
        Check("no_hanging_transaction", not hanging, len(last), hanging[:20]),
    ]


def _spread(lines: list[str], keep: int = 12) -> list[str]:
    if len(lines) <= keep:
        return lines
    return lines[: keep // 2] + [f"... {len(lines) - keep} more ..."] + lines[-keep // 2:]


def batch_headers(partition_dir: Path, offsets: set[int]) -> dict[int, str]:
    """For the evidence of a duplicate: the record batch header (leader epoch, producer id,
    producer epoch, sequence) each of `offsets` was written with, from the segment files."""
    found: dict[int, str] = {}
    for segment in sorted(partition_dir.glob("*.log")):
        data, pos = segment.read_bytes(), 0
        while pos + 61 <= len(data) and len(found) < len(offsets):
            base, length, leader_epoch = struct.unpack_from(">qii", data, pos)
            last_delta = struct.unpack_from(">i", data, pos + 23)[0]
            pid, pepoch, base_seq = struct.unpack_from(">qhi", data, pos + 43)
            for o in offsets:
                if base <= o <= base + last_delta:
                    found[o] = (f"leader epoch {leader_epoch}, producer id {pid} epoch {pepoch} "
                                f"sequence {base_seq + (o - base)}")
            pos += 12 + length
    return found


def control_offsets(partition_dir: Path) -> set[int]:
    """The offsets of the control batches (transaction markers) in a partition's segment
    files."""
    found: set[int] = set()
    for segment in sorted(partition_dir.glob("*.log")):
        data, pos = segment.read_bytes(), 0
        while pos + 61 <= len(data):
            base, length = struct.unpack_from(">qi", data, pos)
            (attributes,) = struct.unpack_from(">h", data, pos + 21)
            (last_delta,) = struct.unpack_from(">i", data, pos + 23)
            if attributes & CONTROL_BATCH:
                found.update(range(base, base + last_delta + 1))
            pos += 12 + length
    return found


def explain_duplicates(check: Check, cluster: RillCluster, topic: str) -> None:
    """Adds each copy's batch header to a failed no_duplicate's evidence."""
    node = next(iter(cluster.nodes.values()))
    explained = []
    for line in check.evidence:
        copies = [tuple(int(x) for x in m) for m in re.findall(r"\((\d+), (\d+)\)", line)]
        parts = {p for p, _ in copies}
        if len(parts) != 1:
            explained.append(line)
            continue
        headers = batch_headers(node.data_dir / f"{topic}-{parts.pop()}", {o for _, o in copies})
        explained.append(line + "; " + "; ".join(f"offset {o}: {headers.get(o, '?')}" for _, o in copies))
    check.evidence = explained


def segment_digest(partition_dir: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    for segment in sorted(partition_dir.glob("*.log")):
        data = segment.read_bytes()
        digest.update(data)
        size += len(data)
    return size, digest.hexdigest()[:16]


def compare_replicas(cluster: RillCluster, topics: list[str]) -> Check:
    """Pauses all nodes together and compares each partition's segment bytes across them;
    tries again (after a second's running) while they differ, since a follower may be one
    fetch behind, and reports the last difference."""
    differing: list[str] = []
    compared = 0
    for _ in range(REPLICA_COMPARE_TRIES):
        for node in cluster.nodes.values():
            if node.is_running():
                os.killpg(node.pid, signal.SIGSTOP)
        try:
            views: dict[str, dict[int, tuple[int, str]]] = {}
            for node_id, node in cluster.nodes.items():
                for d in node.data_dir.iterdir():
                    if d.is_dir() and any(d.name.startswith(t + "-") for t in topics):
                        views.setdefault(d.name, {})[node_id] = segment_digest(d)
        finally:
            for node in cluster.nodes.values():
                if node.is_running():
                    os.killpg(node.pid, signal.SIGCONT)
        differing = [
            f"{name}: " + ", ".join(f"node {n} {size} bytes sha256 {h}" for n, (size, h) in sorted(v.items()))
            for name, v in sorted(views.items())
            if len(set(v.values())) > 1 or len(v) != len(cluster.nodes)
        ]
        compared = len(views)
        if not differing:
            break
        time.sleep(1.0)
    return Check("replicas_identical", not differing, compared, differing[:20])
