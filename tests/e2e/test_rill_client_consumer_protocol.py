"""`rill consume --group-protocol consumer`: rill's own client in a KIP-848 group (issue
#20), beside a confluent-kafka member of the same group.

Two `rill consume` processes and one confluent-kafka consumer join one consumer-protocol
group on a four-partition topic; the coordinator spreads the partitions over the three;
records written afterwards are each read once, by the member that owns their partition,
and rill's members commit with their member epoch (OffsetCommit v9). When the rill
members exit, their leave heartbeats hand every partition to the remaining member.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid

from confluent_kafka import Producer

from kafka_helpers import create_topic, unique_topic, wait_for
from rill_harness import rill_binary
from test_consumer_protocol import CONSUMER_OVERRIDES, Member

RECORDS = 400
PARTITIONS = 4


def describe(bootstrap: str, group: str) -> dict | None:
    out = subprocess.run(
        [str(rill_binary()), "group", "describe", group, "-b", bootstrap, "--output", "json"],
        capture_output=True, text=True, timeout=30,
    )
    if out.returncode != 0:
        return None
    described = json.loads(out.stdout)
    return described[0] if described else None


def test_rill_members_share_a_group_with_a_confluent_member_and_leave_cleanly(rill_factory):
    rill = rill_factory(overrides=CONSUMER_OVERRIDES)
    topic = unique_topic("kip848-rill")
    create_topic(rill.bootstrap, topic, PARTITIONS)
    group = f"g848-rill-{uuid.uuid4().hex[:8]}"
    command = [
        str(rill_binary()), "consume", topic, "-b", rill.bootstrap, "--group", group,
        "--group-protocol", "consumer", "--remote-assignor", "range", "--from-beginning",
        "--timeout-ms", "12000",
    ]
    rill_members = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True) for _ in range(2)]
    confluent = Member(rill.bootstrap, group, [topic])
    try:
        def spread():
            d = describe(rill.bootstrap, group)
            if not d or d.get("state") != "Stable" or len(d["members"]) != 3:
                return None
            owned = [sorted(p for a in m["assignment"] for p in a["partitions"])
                     for m in d["members"]]
            if sorted(p for o in owned for p in o) != list(range(PARTITIONS)):
                return None
            if any(not o for o in owned) or len(confluent.assignment()) == 0:
                return None
            return d

        d = wait_for(spread, 60, "the four partitions spread over the three members")
        # The group's assignor is the one most members asked for in their heartbeats
        # (`group.remote.assignor`): range, which only the rill members named; the
        # broker's default is uniform. So they are consumer-protocol members.
        assert d["type"] == "consumer" and d["assignor"] == "range"
        assert all(m["member_epoch"] == d["assignment_epoch"] for m in d["members"])

        producer = Producer({"bootstrap.servers": rill.bootstrap, "linger.ms": 5})
        for i in range(RECORDS):
            producer.produce(topic, value=b"r%d" % i, partition=i % PARTITIONS)
        assert producer.flush(30) == 0

        outputs = []
        for p in rill_members:
            out, err = p.communicate(timeout=90)
            assert p.returncode == 0, err[-2000:]
            outputs.append([line for line in out.splitlines() if line.startswith("r")])
        # The rill members left (epoch -1 heartbeats): their partitions went to the one
        # left, which reads every record the rill members did not.
        wait_for(lambda: len(confluent.assignment()) == PARTITIONS, 30,
                 "every partition with the remaining member")
        wait_for(lambda: len(confluent.seen()) + sum(map(len, outputs)) >= RECORDS, 30,
                 "every record read")
        values_by_rill = [v for out in outputs for v in out]
        assert all(outputs), "each rill member read the records of its partitions"
        time.sleep(1)  # a duplicate, had there been one, would show by now
        read = len(values_by_rill) + len(confluent.seen())
        assert read == RECORDS, f"{read} records read for {RECORDS} written (duplicates?)"
        # What the rill members read they committed with their epochs: the group's
        # committed offsets cover every record (the confluent member commits its own).
        def all_committed():
            d = describe(rill.bootstrap, group)
            rows = (d or {}).get("partitions", [])
            return len(rows) == PARTITIONS and all(r["lag"] == 0 for r in rows) and d
        wait_for(all_committed, 30, "no lag left in the group")
    finally:
        for p in rill_members:
            if p.poll() is None:
                p.kill()
                p.wait()
        confluent.close()
