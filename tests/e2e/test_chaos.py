"""The fault-injection suite's short run (issue #14, item 5), part of `cargo xtask test`.

One run of `chaos.py --scenario ci --transactional` (about two minutes): a three-node
cluster in network namespaces, idempotent acks=all producers and a committing two-member
group, transactional producers (committing, aborting, one in twelve fenced by a
successor), a consume-transform-produce member and a read_committed reader; the group's
coordinator partitioned from its peers first, then seeded random faults (kill -9,
SIGSTOP, partitions, aimed at a node, the group's coordinator or a transaction
coordinator; disk full in the long runs, see `CI_FAULTS`). Each invariant the checker
holds the run to is a test of its own, so that a failure names the invariant and shows
its evidence, the seed and the schedule. `RILL_CHAOS_SEED` replays a seed;
`RILL_CHAOS_SECONDS` lengthens the schedule; `RILL_CHAOS_TRANSACTIONAL=0` leaves the
transactional workload out (longer runs: `cargo xtask chaos --minutes N`).

`offsets_never_backwards` and `offsets_fetched_were_committed` are the checks that found
issue #14's bug 1 (OffsetFetch served an offset commit before its `__consumer_offsets`
append was replicated, so a coordinator cut off from its peers served commits that were
never replicated, and the next coordinator answered older ones): they failed on every
run before the fix, and pass since.

The checker's own tests (no broker) feed it histories with a lost record, a duplicate,
an offset acknowledged twice, out-of-order sequences, offsets that go backwards, an
aborted or a fenced producer's record read_committed, a committed one missing or
repeated, a record read before its commit was asked for, a read_uncommitted control
with nothing aborted in it, a copy that is not exactly once and an LSO above the high
watermark, and require it to fail on each: a check that cannot fail would pass every run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import chaos_checker
import chaos_txn
import chaos_workload

CHAOS = Path(__file__).with_name("chaos.py")
RUN_TIMEOUT_S = 280  # under pytest-timeout's 300 s (pytest.ini)
# Disk-full faults are left to the long runs (`cargo xtask chaos`, or RILL_CHAOS_FAULTS
# here) until the duplicate they exposed once is understood: seed 103757731 stored an
# idempotent producer's record twice (the second copy under a bumped producer epoch,
# sequence 0) around disk-full restarts of two nodes; the replay passed. It is a real
# bug, recorded in issue #14's notes, and the short run must not fail CI at random on it.
# Slow disks and clock jumps are left to the long runs too: in a 75 s schedule they would
# crowd out the faults that found bugs here, and strace attached to a node makes it a slow
# node as much as a slow disk on a loaded 2-core machine. That they act at all (a jump
# moves the broker's clock, strace holds each append) is checked on every CI run by
# test_chaos_faults.py.
CI_FAULTS = "kill,pause,partition"


@pytest.fixture(scope="module")
def chaos_run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("chaos")
    report_path = workdir / "report.json"
    command = [
        sys.executable,
        str(CHAOS),
        "--scenario", "ci",
        "--seconds", os.environ.get("RILL_CHAOS_SECONDS", "75"),
        "--workdir", str(workdir / "cluster"),
        "--report", str(report_path),
        "--faults", os.environ.get("RILL_CHAOS_FAULTS", CI_FAULTS),
    ]
    if os.environ.get("RILL_CHAOS_TRANSACTIONAL", "1") != "0":
        command.append("--transactional")
    if os.environ.get("RILL_CHAOS_SEED"):
        command += ["--seed", os.environ["RILL_CHAOS_SEED"]]
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    output = done.stdout + done.stderr
    print(output)  # the seed, the schedule and every check, in the report of the first test
    if not report_path.exists():
        pytest.fail(f"chaos run wrote no report (exit {done.returncode}):\n{output}", pytrace=False)
    return json.loads(report_path.read_text()), output


def _outcome(chaos_run, name: str):
    report, output = chaos_run
    check = report["checks"][name]
    assert check["checked"] > 0, f"{name} checked nothing: the run did not exercise it\n{output}"
    assert check["ok"], f"{name} failed (seed {report['seed']}):\n" + "\n".join(check["evidence"]) + f"\n\n{output}"


def test_chaos_run_injected_faults(chaos_run):
    report, output = chaos_run
    assert not report.get("problems"), f"{report['problems']}\n{output}"
    assert report["acknowledged"] > 1000, output
    assert report["commits_acknowledged"] > 10, output
    assert report["faults_injected"] >= 3, output
    first = report["faults"][0]
    partitions_skipped = any(s.startswith("partition") for s in report["skipped"])
    if not partitions_skipped:
        assert first["kind"] == "partition" and first["target"] == "coordinator" and first["node"], output
    if "transactional" in report:
        txns = report["transactional"]["transactions"]
        assert txns["committed"] > 10 and txns["aborted"] > 5, output
        assert report["transactional"]["fenced"] > 0 and report["transactional"]["copy_committed"] > 0, output


@pytest.mark.parametrize(
    "check",
    [
        "no_lost_ack",
        "no_duplicate",
        "no_offset_two_records",
        "producer_order",
        "acks_without_offset_implicit",
        "replicas_identical",
        "acked_commit_visible",
    ],
)
def test_chaos_invariant(chaos_run, check):
    _outcome(chaos_run, check)


TXN_CHECKS = [
    "read_committed_no_aborted",
    "committed_txn_visible_once",
    "txn_order",
    "open_txn_invisible",
    "fenced_writes_invisible",
    "read_uncommitted_control",
    "copy_exactly_once",
    "lso_at_most_high_watermark",
    "no_hanging_transaction",
]


@pytest.mark.parametrize("check", TXN_CHECKS)
def test_chaos_transactions(chaos_run, check):
    report, _output = chaos_run
    if "transactional" not in report:
        pytest.skip("RILL_CHAOS_TRANSACTIONAL=0: no transactional workload in this run")
    _outcome(chaos_run, check)


@pytest.mark.parametrize("check", ["offsets_never_backwards", "offsets_fetched_were_committed"])
def test_chaos_offsets_bug_1(chaos_run, check):
    report, _output = chaos_run
    if any(s.startswith("partition") for s in report["skipped"]):
        pytest.skip("partitions skipped (no network namespaces): bug 1 needs one")
    _outcome(chaos_run, check)


# ---------------------------------------------------------------------------------------
# The checker itself, on made-up histories.


def _ack(pid, seq, p, o):
    return chaos_workload.Ack(pid, seq, p, o)


def _by_name(checks):
    return {c.name: c for c in checks}


def test_checker_passes_a_clean_history():
    acks = [_ack(0, 0, 0, 0), _ack(0, 1, 0, 1), _ack(1, 0, 0, 2)]
    log = {0: {0: b"p0-0", 1: b"p0-1", 2: b"p1-0", 3: b"p1-1"}}
    assert all(c.ok for c in chaos_checker.check_records(acks, log))


def test_checker_finds_lost_duplicated_moved_and_reordered_records():
    acks = [_ack(0, 0, 0, 0), _ack(0, 1, 0, 1), _ack(0, 2, 0, 2), _ack(1, 0, 0, 2)]
    log = {0: {0: b"p0-0", 1: b"p0-3", 2: b"p0-2", 3: b"p0-0"}}
    checks = _by_name(chaos_checker.check_records(acks, log))
    assert not checks["no_lost_ack"].ok  # p0-1 and p1-0 missing
    assert not checks["no_duplicate"].ok  # p0-0 twice
    assert not checks["no_offset_two_records"].ok  # offset 2 acknowledged for p0-2 and p1-0
    assert not checks["producer_order"].ok  # p0-2 after p0-3


def _offsets(session, attempts=None, final=None, history=None, everyone=()):
    return _by_name(chaos_checker.check_offsets(session, list(everyone), attempts or {}, final or {}, history, []))


def test_checker_takes_an_acknowledgement_without_an_offset_as_stored_anywhere_in_its_partition():
    log = {0: {0: b"p0-0", 1: b"p0-1"}, 1: {0: b"p0-2"}}
    assert all(c.ok for c in chaos_checker.check_records([_ack(0, 0, 0, None), _ack(0, 1, 0, None)], log))
    assert not _by_name(chaos_checker.check_records([_ack(0, 3, 0, None)], log))["no_lost_ack"].ok
    assert not _by_name(chaos_checker.check_records([_ack(0, 2, 0, None)], log))["no_lost_ack"].ok


def test_checker_finds_an_acknowledgement_without_an_offset_librdkafka_does_not_explain():
    acks = [_ack(0, 0, 0, 0), _ack(0, 1, 0, None), _ack(0, 2, 0, None)]
    assert chaos_checker.check_acks_without_offset(acks, 2).ok
    assert not chaos_checker.check_acks_without_offset(acks, 1).ok
    assert chaos_checker.check_acks_without_offset(acks[:1], 0).ok


def test_checker_finds_offsets_going_backwards():
    obs = [
        chaos_workload.Observation(1, 1.0, 1.1, {0: 10}, "g"),
        chaos_workload.Observation(1, 2.0, 2.1, {0: 20}, "g"),
        chaos_workload.Observation(2, 3.0, 3.1, {0: 15}, "g"),
    ]
    history = {("g", 0): {10, 15, 20}}
    checks = _offsets(obs, final={"g": {0: 20}}, history=history)
    assert not checks["offsets_never_backwards"].ok
    assert "node 1 answered 20" in checks["offsets_never_backwards"].evidence[0]
    assert checks["offsets_fetched_were_committed"].ok
    # The offset after heal below what was once answered is the same failure.
    assert not _offsets(obs[:2], final={"g": {0: 15}}, history=history)["offsets_never_backwards"].ok
    assert _offsets(obs[:2], final={"g": {0: 20}}, history=history)["offsets_never_backwards"].ok


def test_checker_finds_an_answer_that_was_never_committed():
    session = [chaos_workload.Observation(3, 1.0, 1.1, {0: 10}, "g")]
    zombie = [chaos_workload.Observation(3, 2.0, 2.1, {0: 12}, "g")]
    history = {("g", 0): {10, 11}}
    assert _offsets(session, history=history)["offsets_fetched_were_committed"].ok
    checks = _offsets(session, history=history, everyone=zombie)
    assert not checks["offsets_fetched_were_committed"].ok
    assert "node 3 answered 12" in checks["offsets_fetched_were_committed"].evidence[0]
    # A compacted log cannot vouch for anything: the check says so rather than pass.
    assert not _offsets(session, history=None)["offsets_fetched_were_committed"].ok


def test_checker_finds_an_acknowledged_commit_unseen():
    acked = {"g": [chaos_workload.CommitAttempt(-1, 0, 30, 1.0, 1.5, True)]}
    obs = [chaos_workload.Observation(2, 2.0, 2.1, {0: 25}, "g")]
    history = {("g", 0): {25, 30}}
    assert not _offsets(obs, acked, history=history)["acked_commit_visible"].ok
    assert not _offsets([], acked, final={"g": {0: 25}}, history=history)["acked_commit_visible"].ok
    unacked = {"g": [chaos_workload.CommitAttempt(-1, 0, 30, 1.0, 1.5, False, "timed out")]}
    assert _offsets(obs, unacked, final={"g": {0: 25}}, history=history)["acked_commit_visible"].ok


def test_committed_history_reads_offset_commit_records():
    import struct

    def key(group, topic, partition):
        s = lambda t: struct.pack(">h", len(t)) + t.encode()  # noqa: E731
        return struct.pack(">h", 1) + s(group) + s(topic) + struct.pack(">i", partition)

    value = lambda offset: struct.pack(">hq", 3, offset) + b"rest"  # noqa: E731
    records = {0: {0: (key("g", "t", 0), value(5)), 1: (b"\x00\x02group", b"meta"), 2: (key("g", "t", 0), value(9))}}
    assert chaos_checker.committed_history(records, "t") == {("g", 0): {5, 9}}
    assert chaos_checker.committed_history(records, "other") == {}
    assert chaos_checker.committed_history({0: {0: records[0][0], 2: records[0][2]}}, "t") is None  # a gap
    # ...unless a transaction marker, which consumers are never handed, holds that offset.
    assert chaos_checker.committed_history({0: {0: records[0][0], 2: records[0][2]}}, "t", {0: {1}}) == {
        ("g", 0): {5, 9}}


# The transactional checks, on a made-up history: t0's transaction 0 committed across
# two partitions, 1 aborted, 2 fenced halfway (the zombie wrote z0-2-1 after it); t1's
# transaction 0 of unknown outcome (its commit was asked for, then its producer failed),
# found aborted after heal.
def _txn_history():
    T = "txn"
    txns = [
        chaos_txn.Txn("t0", 0, T, [b"t0-0-0", b"t0-0-1"], [0, 1], "committed", 1.0,
                      acks={b"t0-0-0": (0, 0), b"t0-0-1": (1, 0)}),
        chaos_txn.Txn("t0", 1, T, [b"t0-1-0"], [0], "aborted", acks={b"t0-1-0": (0, 1)}),
        chaos_txn.Txn("t0", 2, T, [b"t0-2-0"], [1], "aborted", acks={b"t0-2-0": (1, 1)},
                      fenced=True, zombie_values=[b"z0-2-1"]),
        chaos_txn.Txn("t1", 0, T, [b"t1-0-0", b"t1-0-1"], [0, 1], "unknown", 2.0,
                      acks={b"t1-0-0": (0, 3), b"t1-0-1": (1, 3)}),
    ]
    committed = {T: {0: [(0, b"t0-0-0")], 1: [(0, b"t0-0-1")]}}
    uncommitted = {T: {0: [(0, b"t0-0-0"), (1, b"t0-1-0"), (3, b"t1-0-0")],
                       1: [(0, b"t0-0-1"), (1, b"t0-2-0"), (3, b"t1-0-1")]}}
    live = [chaos_txn.Seen(T, 0, 0, b"t0-0-0", 1.5)]
    return txns, committed, uncommitted, live


def _txn_checks(txns, committed, uncommitted, live):
    return _by_name(chaos_checker.check_transactions(txns, committed, uncommitted, live))


def test_checker_passes_a_clean_transactional_history():
    checks = _txn_checks(*_txn_history())
    assert all(c.ok for c in checks.values()), [c for c in checks.values() if not c.ok]
    assert checks["fenced_writes_invisible"].checked == 1
    assert checks["read_uncommitted_control"].checked == 2  # t0-1-0 and t0-2-0


def test_checker_finds_an_aborted_record_read_committed():
    txns, committed, uncommitted, live = _txn_history()
    committed["txn"][0].append((1, b"t0-1-0"))
    assert not _txn_checks(txns, committed, uncommitted, live)["read_committed_no_aborted"].ok
    txns, committed, uncommitted, live = _txn_history()
    live.append(chaos_txn.Seen("txn", 1, 1, b"t0-2-0", 3.0))
    assert not _txn_checks(txns, committed, uncommitted, live)["read_committed_no_aborted"].ok


def test_checker_finds_a_committed_record_missing_repeated_or_moved():
    txns, committed, uncommitted, live = _txn_history()
    del committed["txn"][1][0]
    assert not _txn_checks(txns, committed, uncommitted, live)["committed_txn_visible_once"].ok
    txns, committed, uncommitted, live = _txn_history()
    committed["txn"][0].append((2, b"t0-0-0"))
    assert not _txn_checks(txns, committed, uncommitted, live)["committed_txn_visible_once"].ok
    txns, committed, uncommitted, live = _txn_history()
    txns[0].acks[b"t0-0-1"] = (1, 7)
    assert not _txn_checks(txns, committed, uncommitted, live)["committed_txn_visible_once"].ok


def test_checker_finds_a_transaction_of_unknown_outcome_partly_visible():
    txns, committed, uncommitted, live = _txn_history()
    committed["txn"][0].append((3, b"t1-0-0"))
    assert not _txn_checks(txns, committed, uncommitted, live)["committed_txn_visible_once"].ok
    committed["txn"][1].append((3, b"t1-0-1"))  # whole: it committed
    assert _txn_checks(txns, committed, uncommitted, live)["committed_txn_visible_once"].ok


def test_checker_finds_a_producer_out_of_order():
    txns = [chaos_txn.Txn("t0", 0, "txn", [b"t0-0-0", b"t0-0-1"], [0, 0], "committed", 1.0)]
    good = {"txn": {0: [(0, b"t0-0-0"), (1, b"t0-0-1")]}}
    bad = {"txn": {0: [(0, b"t0-0-1"), (1, b"t0-0-0")]}}
    assert _txn_checks(txns, good, good, [])["txn_order"].ok
    checks = _txn_checks(txns, bad, bad, [])
    assert not checks["txn_order"].ok and checks["committed_txn_visible_once"].ok


def test_checker_finds_a_record_read_before_its_commit_was_asked_for():
    txns, committed, uncommitted, live = _txn_history()
    live[0].at = 0.5  # t0's transaction 0 asked to commit at 1.0
    assert not _txn_checks(txns, committed, uncommitted, live)["open_txn_invisible"].ok


def test_checker_finds_a_fenced_producers_write_acknowledged_or_visible():
    for spoil in ("ack", "visible", "commit"):
        txns, committed, uncommitted, live = _txn_history()
        if spoil == "ack":
            txns[2].zombie_acks[b"z0-2-1"] = (0, 2)
            uncommitted["txn"][0].append((2, b"z0-2-1"))
        elif spoil == "visible":
            committed["txn"][0].append((2, b"z0-2-1"))
        else:
            txns[2].zombie_commit_acknowledged = True
        assert not _txn_checks(txns, committed, uncommitted, live)["fenced_writes_invisible"].ok, spoil


def test_checker_control_needs_the_aborted_records_in_the_log():
    txns, committed, uncommitted, live = _txn_history()
    uncommitted["txn"][0].remove((1, b"t0-1-0"))
    assert not _txn_checks(txns, committed, uncommitted, live)["read_uncommitted_control"].ok
    # Nothing aborted was acknowledged: read_committed_no_aborted would hold vacuously.
    txns, committed, uncommitted, live = _txn_history()
    txns[1].acks.clear()
    txns[2].acks.clear()
    checks = _txn_checks(txns, committed, uncommitted, live)
    assert checks["read_committed_no_aborted"].ok and not checks["read_uncommitted_control"].ok


def test_checker_finds_a_copy_not_exactly_once():
    good = {0: [(0, b"c0:0:0"), (1, b"c0:1:0")], 1: [(0, b"c1:0:1")]}
    assert chaos_checker.check_copy(good, {0: 2, 1: 1}, 2).ok
    assert not chaos_checker.check_copy(good, {0: 3, 1: 1}, 2).ok  # a copy missing
    assert not chaos_checker.check_copy(good, {0: 1, 1: 1}, 2).ok  # beyond the offset
    repeated = {0: good[0] + [(2, b"c0:1:2")], 1: good[1]}
    assert not chaos_checker.check_copy(repeated, {0: 2, 1: 1}, 2).ok
    misplaced = {0: good[0] + [(2, b"c1:2:2")], 1: good[1]}
    assert not chaos_checker.check_copy(misplaced, {0: 2, 1: 1}, 2).ok
    assert not chaos_checker.check_copy({}, {}, 2).ok  # nothing copied


def test_checker_finds_an_lso_above_the_high_watermark_or_going_back():
    def seen(lso, hw, at, epoch=1, node=1):
        return chaos_txn.StableOffsets(node, "txn", 0, epoch, lso, hw, at)

    done = [seen(9, 9, 9.0)]
    fine = [seen(3, 5, 1.0), seen(4, 6, 2.0), seen(1, 2, 3.0, epoch=2)]
    checks = _by_name(chaos_checker.check_stable_offsets(fine, True, done))
    assert checks["lso_at_most_high_watermark"].ok and checks["no_hanging_transaction"].ok
    for bad in ([seen(6, 5, 1.0)], [seen(4, 6, 1.0), seen(3, 6, 2.0)], [seen(4, 6, 1.0), seen(4, 5, 2.0)]):
        assert not _by_name(chaos_checker.check_stable_offsets(bad, True, done))["lso_at_most_high_watermark"].ok
    assert not _by_name(chaos_checker.check_stable_offsets(fine, False, [seen(3, 9, 9.0)]))[
        "no_hanging_transaction"].ok


def test_a_transactional_call_that_never_returns_abandons_its_producer(monkeypatch):
    """librdkafka's send_offsets_to_transaction can block forever (its issues #5456 and
    #5511): the workload takes such a call as its producer's fatal failure, within
    TXN_CALL_WEDGED_S, instead of waiting past the run's timeout; a call that returns, or
    raises in time, is unchanged."""
    import threading

    monkeypatch.setattr(chaos_txn, "TXN_CALL_WEDGED_S", 0.2)
    release = threading.Event()
    errors: list[str] = []
    started = time.monotonic()
    outcome = chaos_txn.attempt(lambda _t: release.wait(30), "copy send_offsets", errors)
    waited = time.monotonic() - started
    release.set()
    assert outcome == chaos_txn.Outcome.FATAL
    assert waited < 5, waited
    assert len(errors) == 1 and "did not return" in errors[0] and "copy send_offsets" in errors[0]

    timeouts: list[float] = []
    assert chaos_txn.attempt(timeouts.append, "commit", errors) == chaos_txn.Outcome.OK
    assert timeouts == [chaos_txn.TXN_CALL_TIMEOUT_S]

    def broken(_t):
        raise SystemError("LogRecord returned a result with an exception set")

    assert chaos_txn.attempt(broken, "abort", errors) == chaos_txn.Outcome.FATAL
    assert errors[-1] == "abort: LogRecord returned a result with an exception set"
