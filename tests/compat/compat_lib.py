"""What every Python runner of the compat suite shares: the environment xtask passes
(`RILL_BIN`, `RILL_COMPAT_MODE`, `RILL_COMPAT_OUT`, `RILL_COMPAT_CACHE`), a rill server on
a free loopback port, the list of known failures, and the JSON report (see README.md).

Known failures are strict, like the e2e suite's strict xfails: a known failure is reported
as `"outcome": "failed", "known": true` with its issue in the reason and does not fail the
family; a test on the list that passes is a failure ("remove it from the list"), so the list
never outlives the gap it names.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from pathlib import Path

COMPAT_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(COMPAT_DIR.parent / "e2e"))

from rill_harness import RillServer, free_port  # noqa: E402


def mode() -> str:
    value = os.environ.get("RILL_COMPAT_MODE", "full")
    if value not in ("quick", "full"):
        raise SystemExit(f"RILL_COMPAT_MODE must be quick or full, not {value!r}")
    return value


# Run directories kept per family (servers' data and logs, for a post-mortem).
RUNS_KEPT = 3


def workdir(family: str) -> Path:
    """A fresh directory for this run's servers under the cache; older runs of the family
    beyond the last few are removed."""
    base = Path(os.environ.get("RILL_COMPAT_CACHE") or COMPAT_DIR.parents[1] / "target" / "compat-cache")
    runs = base / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    previous = sorted(runs.glob(f"{family}-*"), key=lambda path: path.stat().st_mtime)
    for old in previous[: max(0, len(previous) - (RUNS_KEPT - 1))]:
        shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{family}-", dir=runs))


# Kafka's authorizer, open where no ACL says otherwise: clients that send no credentials
# (User:ANONYMOUS) may do anything, and the ACL APIs work. The families that check ACLs run
# Rill and the reference Kafka alike with it, so that every request of theirs also goes
# through the authorizer.
OPEN_AUTHORIZER = {
    "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
    "allow.everyone.if.no.acl.found": "true",
}

# Delegation tokens on, and the SCRAM mechanisms a token logs in with (Kafka's server side
# of SCRAM needs its JAAS line per listener and mechanism; Rill's ignores it).
TOKENS = {
    "delegation.token.secret.key": "compat-delegation-token-secret",
    "sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512",
    "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config":
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
    "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config":
        "org.apache.kafka.common.security.scram.ScramLoginModule required;",
}

# Share-group heartbeats every second rather than every 5 s (Kafka's and Rill's
# group.share.min.heartbeat.interval.ms and default), on both brokers of a family that runs
# share consumers, so that a consumer is assigned its partitions a second or two after it
# joins.
SHARE_HEARTBEATS = {
    "group.share.heartbeat.interval.ms": "1000",
    "group.share.min.heartbeat.interval.ms": "1000",
}


def with_sasl_listener(overrides: dict[str, str], port: int,
                       controller_port: int | None = None) -> str:
    """Adds a SASL_PLAINTEXT listener beside the PLAINTEXT one on `port` to a broker's
    `overrides` (Rill's, or Kafka's with its controller listener); returns its address."""
    sasl_port = free_port()
    listeners = f"PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
    if controller_port is not None:
        overrides["advertised.listeners"] = listeners
        listeners += f",CONTROLLER://127.0.0.1:{controller_port}"
        overrides["listener.security.protocol.map"] = (
            "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT"
        )
    overrides["listeners"] = listeners
    return f"127.0.0.1:{sasl_port}"


@contextmanager
def exclusive(lock_file: Path):
    """Holds an exclusive lock on `lock_file` (made if missing): one fetch or build at a
    time per cache, since runners, and pytest workers, may overlap."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def start_rill(directory: Path, overrides: dict[str, str] | None = None) -> RillServer:
    return RillServer(directory, overrides=overrides).start()


class Report:
    """Results of one family, written as the JSON file xtask reads."""

    def __init__(self, family: str) -> None:
        self.family = family
        self.started = time.monotonic()
        self.results: list[dict] = []

    def add(self, name: str, outcome: str, reason: str = "", seconds: float | None = None) -> None:
        assert outcome in ("passed", "failed", "skipped"), outcome
        result = {"name": name, "outcome": outcome}
        if reason:
            result["reason"] = reason
        if seconds is not None:
            result["seconds"] = round(seconds, 2)
        self.results.append(result)
        line = f"{self.family}: {outcome.upper():7} {name}"
        print(line + (f" ({reason.splitlines()[0][:200]})" if reason and outcome != "passed" else ""),
              flush=True)

    def run(self, name: str, check, *args) -> None:
        """Runs `check(*args)`; an exception is a failure with its message as the reason."""
        started = time.monotonic()
        try:
            check(*args)
        except Exception as error:  # noqa: BLE001 - every error is a failed check
            detail = "".join(traceback.format_exception_only(type(error), error)).strip()
            self.add(name, "failed", detail[:2000], time.monotonic() - started)
        else:
            self.add(name, "passed", seconds=time.monotonic() - started)

    def apply_known(self, known: dict[str, str]) -> None:
        """Marks the failures on the list as known; a listed test that passed now fails."""
        for result in self.results:
            reason = known.get(result["name"])
            if reason is None:
                continue
            if result["outcome"] == "failed":
                result["known"] = True
                result["reason"] = f"known: {reason} -- observed: {result.get('reason', '')}"
            elif result["outcome"] == "passed":
                result["outcome"] = "failed"
                result["reason"] = (
                    f"listed as a known failure ({reason}) but passed: remove it from the list"
                )

    def unexpected_failures(self) -> list[dict]:
        return [r for r in self.results if r["outcome"] == "failed" and not r.get("known")]

    def write(self) -> int:
        """Writes `RILL_COMPAT_OUT` (when set) and returns the exit status for the runner."""
        counts = {o: sum(r["outcome"] == o for r in self.results) for o in ("passed", "failed", "skipped")}
        document = {
            "family": self.family,
            **counts,
            "known": sum(bool(r.get("known")) for r in self.results),
            "seconds": round(time.monotonic() - self.started, 1),
            "results": self.results,
        }
        out = os.environ.get("RILL_COMPAT_OUT")
        if out:
            Path(out).write_text(json.dumps(document, indent=1) + "\n")
        unexpected = self.unexpected_failures()
        print(
            f"{self.family}: {counts['passed']} passed, {counts['failed']} failed "
            f"({document['known']} known), {counts['skipped']} skipped in {document['seconds']}s",
            flush=True,
        )
        return 1 if unexpected or not self.results else 0


def run_java_checks(
    report: Report, main_class: str, args: list[str], checks: list[str], prefix: str = ""
) -> None:
    """Runs one of our Java suites (`java/src/main/java/rill/compat`), which print a
    `RESULT {json}` line per check, and adds each to the report under `prefix`; a suite that
    dies or leaves a check unreported adds a failed `<prefix>suite` result."""
    import subprocess

    import jvm

    command = jvm.java_command(main_class, [*args, *checks], with_programs=True, heap_mb=384)
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    seen = set()
    for line in result.stdout.splitlines():
        if line.startswith("RESULT "):
            item = json.loads(line[len("RESULT "):])
            seen.add(item["name"])
            report.add(prefix + item["name"], item["outcome"], item.get("reason", ""), item.get("seconds"))
    missing = [name for name in checks if name not in seen]
    if result.returncode < 0 or missing or not seen:
        report.add(
            prefix + "suite",
            "failed",
            f"{main_class} exited {result.returncode} without reporting {missing or 'anything'}\n"
            + result.stderr[-3000:],
        )


def java_check_names(main_class: str) -> list[str]:
    """The names of a Java suite's checks, in its order (its `--list`)."""
    import subprocess

    import jvm

    command = jvm.java_command(main_class, ["127.0.0.1:1", "--list"], with_programs=True)
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    names = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if not names:
        raise RuntimeError(f"{main_class} --list named no checks:\n{result.stderr[-2000:]}")
    return names


def prerequisites_missing(report: Report, error: Exception) -> int:
    """Java, Maven or the jars could not be had: a failure on CI (`CI` set), where
    `cargo xtask` installs them, and a loud skip on a developer's machine, as kcat's tests do."""
    reason = f"Java, Maven or the Kafka jars are unavailable: {error}"
    on_ci = os.environ.get("CI", "") not in ("", "0", "false")
    if not on_ci:
        print(f"{report.family}: WARNING: {reason}; SKIPPED (this fails on CI)", flush=True)
    report.add("prerequisites", "failed" if on_ci else "skipped", reason)
    return report.write()
