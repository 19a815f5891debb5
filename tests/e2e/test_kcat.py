"""kcat (the command-line client, on Debian's librdkafka) against rill: produce keyed lines
with -P -K:, read them back with -C -e -o beginning, list the topic with -L."""

import subprocess

from kafka_helpers import create_topic, unique_topic

LINES = 500
TIMEOUT_S = 60


def run_kcat(kcat, args, stdin=None):
    result = subprocess.run(
        [kcat, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert result.returncode == 0, (
        f"kcat {' '.join(args)} exited with {result.returncode}\n"
        f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}"
    )
    return result.stdout


def test_kcat_produce_consume_list(rill, kcat):
    topic = unique_topic("kcat")
    # One partition, so that reading back gives exactly the order of writing.
    create_topic(rill.bootstrap, topic, 1)

    lines = [f"key-{i}:value {i} with spaces" for i in range(LINES)]
    run_kcat(kcat, ["-b", rill.bootstrap, "-t", topic, "-P", "-K:"], stdin="\n".join(lines) + "\n")

    out = run_kcat(
        kcat,
        ["-b", rill.bootstrap, "-t", topic, "-C", "-e", "-o", "beginning", "-f", "%o|%k|%s\n"],
    )
    expected = [f"{i}|key-{i}|value {i} with spaces" for i in range(LINES)]
    assert out.splitlines() == expected

    listing = run_kcat(kcat, ["-b", rill.bootstrap, "-L", "-t", topic])
    assert f'topic "{topic}" with 1 partitions:' in listing, listing
    assert f"at {rill.bootstrap}" in listing, listing
    assert "partition 0, leader" in listing, listing
