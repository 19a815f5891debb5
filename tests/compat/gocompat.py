"""What the Go client families (`franz-go/run`, `sarama/run`) share: a Go toolchain whose
caches live under `$RILL_COMPAT_CACHE`, a pinned module from Go's module proxy copied out
of the read-only module cache, a compiled test binary run under `go tool test2json`, and
the contract's result file (see `tests/compat/README.md`).

A test binary that dies (a panic, `-test.timeout`) takes every test that was still running
with it; the tests it never started are run again in a new process, a bounded number of
times, so one crash costs the tests it hit and not the rest of the suite.

Known failures come from a committed file, one `TestName  reason` per line: such a test
failing does not fail the run, a new failure does, and a known failure that passes is
reported so that the list shrinks.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

COMPAT_DIR = Path(__file__).resolve().parent
WORKSPACE_ROOT = COMPAT_DIR.parents[1]
# `rill_harness` is the e2e suite's server harness; the runners reuse it.
sys.path.insert(0, str(WORKSPACE_ROOT / "tests" / "e2e"))

from rill_harness import _die_with_parent  # noqa: E402

# A crashed test binary is restarted on the tests it had not started; each restart needs
# a crash first, so this bounds the restarts of a suite that crashes over and over.
MAX_BINARY_RESTARTS = 6
# How much of a failed test's output its reason quotes.
REASON_LINES = 12
REASON_CHARS = 1500


class CompatError(RuntimeError):
    """The runner could not get as far as running tests (toolchain, download, build)."""


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


@dataclass
class Contract:
    """The environment `cargo xtask compat` hands a runner."""

    family: str
    rill_bin: Path
    mode: str
    out: Path
    cache: Path

    @classmethod
    def from_env(cls, family: str) -> "Contract":
        mode = os.environ.get("RILL_COMPAT_MODE", "quick")
        if mode not in ("quick", "full"):
            raise CompatError(f"RILL_COMPAT_MODE must be quick or full, not {mode!r}")
        rill_bin = os.environ.get("RILL_BIN") or str(WORKSPACE_ROOT / "target" / "debug" / "rill")
        out = os.environ.get("RILL_COMPAT_OUT") or str(
            WORKSPACE_ROOT / "target" / "compat" / f"{family}.json"
        )
        cache = os.environ.get("RILL_COMPAT_CACHE") or str(WORKSPACE_ROOT / "target" / "compat-cache")
        contract = cls(family, Path(rill_bin).resolve(), mode, Path(out), Path(cache).resolve())
        if not contract.rill_bin.is_file():
            raise CompatError(f"rill binary not found at {contract.rill_bin} (set RILL_BIN)")
        contract.cache.mkdir(parents=True, exist_ok=True)
        contract.out.parent.mkdir(parents=True, exist_ok=True)
        # The harness reads the binary from the environment.
        os.environ["RILL_BIN"] = str(contract.rill_bin)
        return contract


class GoToolchain:
    """The machine's `go`, with GOPATH, GOMODCACHE and GOCACHE under the compat cache so
    that a clean machine needs nothing but the module proxy and a re-run is warm."""

    def __init__(self, cache: Path):
        go = shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").is_file() else None)
        if go is None:
            raise CompatError("no `go` on PATH or at /usr/local/go/bin/go")
        self.go = go
        self.root = cache / "go"
        self.env = dict(os.environ)
        self.env.update(
            {
                "GOPATH": str(self.root / "path"),
                "GOMODCACHE": str(self.root / "modcache"),
                "GOCACHE": str(self.root / "build"),
                # The pinned module's go.mod decides the dependencies; a go.sum line that
                # the module lacks for a test-only dependency is added, not refused.
                "GOFLAGS": "-mod=mod -buildvcs=false",
                # Never fetch another toolchain: only the module proxy is reachable.
                "GOTOOLCHAIN": "local",
                "CGO_ENABLED": "0",
            }
        )
        for key in ("GOPATH", "GOMODCACHE", "GOCACHE"):
            Path(self.env[key]).mkdir(parents=True, exist_ok=True)

    def version(self) -> str:
        return self.run(["version"], capture=True).strip()

    def run(self, args: list[str], cwd: Path | None = None, capture: bool = False, timeout_s: float = 1200) -> str:
        proc = subprocess.run(
            [self.go, *args],
            cwd=cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
        )
        if proc.returncode != 0:
            raise CompatError(f"`go {' '.join(args)}` failed ({proc.returncode}):\n{proc.stdout[-4000:]}")
        return proc.stdout if capture else ""

    def module_source(self, module: str, version: str) -> Path:
        """A writable copy of `module@version` under the cache (made once)."""
        safe = module.replace("/", "_")
        dest = self.root / "src" / f"{safe}@{version}"
        if (dest / "go.mod").is_file():
            return dest
        info = json.loads(self.run(["mod", "download", "-json", f"{module}@{version}"], capture=True))
        if info.get("Error"):
            raise CompatError(f"go mod download {module}@{version}: {info['Error']}")
        partial = dest.with_name(dest.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(info["Dir"], partial)
        for path in [partial, *partial.rglob("*")]:
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | 0o200)
        partial.rename(dest)
        return dest

    def install_tool(self, package_at_version: str, name: str) -> Path:
        """`go install pkg@version` into the cache's bin directory, once."""
        bin_dir = self.root / "bin"
        version = package_at_version.rsplit("@", 1)[1]
        dest = bin_dir / f"{name}-{version}"
        if dest.is_file():
            return dest
        tmp_bin = bin_dir / "install.tmp"
        shutil.rmtree(tmp_bin, ignore_errors=True)
        tmp_bin.mkdir(parents=True)
        env = dict(self.env, GOBIN=str(tmp_bin))
        proc = subprocess.run(
            [self.go, "install", package_at_version], env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200,
        )
        built = list(tmp_bin.iterdir())
        if proc.returncode != 0 or len(built) != 1:
            raise CompatError(f"go install {package_at_version} failed:\n{proc.stdout[-4000:]}")
        built[0].rename(dest)
        tmp_bin.rmdir()
        return dest

    def build_test_binary(self, src: Path, package: str, out: Path, tags: str = "") -> Path:
        """`go test -c`; the build cache makes a second build of the same source quick."""
        args = ["test", "-c", "-o", str(out)]
        if tags:
            args += ["-tags", tags]
        self.run([*args, package], cwd=src)
        return out

    def list_tests(self, binary: Path, cwd: Path, pattern: str = ".*") -> list[str]:
        out = subprocess.run(
            [str(binary), "-test.list", pattern],
            cwd=cwd,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=False,
        )
        if out.returncode != 0:
            raise CompatError(f"{binary} -test.list failed:\n{out.stderr[-2000:]}")
        return [line for line in out.stdout.splitlines() if re.match(r"^(Test|Example|Fuzz)\w*$", line)]


@dataclass
class TestRecord:
    name: str
    outcome: str = "not run"  # passed | failed | skipped | running | not run
    output: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def reason_excerpt(self) -> str:
        """The lines of the test's output that say why it failed or skipped."""
        lines = [l.rstrip("\n") for l in self.output if l.strip()]
        lines = [l for l in lines if not re.match(r"^\s*(=== (RUN|PAUSE|CONT)|--- (FAIL|SKIP|PASS)|PASS$|FAIL$)", l)]
        tiers = [
            r"^\s*(panic:|fatal error:)|test timed out|died (while|before)|never finished",
            r"_test\.go:\d+: .*(rror|fail|FAIL|unexpected|expected|!=|mismatch|invalid|unable|timeout)",
            r"_test\.go:\d+: (?!.*completed in)",
        ]
        picked = next((p for p in ([l for l in lines if re.search(t, l)] for t in tiers) if p), lines)
        text = " | ".join(s.strip() for s in picked[:REASON_LINES])
        return text[:REASON_CHARS] if text else "no output"


def read_known(path: Path) -> dict[str, str]:
    """`TestName  reason` lines; `#` starts a comment line."""
    known: dict[str, str] = {}
    if not path.is_file():
        return known
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) != 2:
            raise CompatError(f"{path}:{number}: want `TestName  reason`, got {raw!r}")
        known[parts[0]] = parts[1].strip()
    return known


def top_level_tests(files: list[Path]) -> list[str]:
    """The `func TestX(t *testing.T)` of `files`, but `TestMain`."""
    names = set()
    for path in files:
        names.update(re.findall(r"^func (Test\w+)\(\w+ \*testing\.T\)", path.read_text(), re.M))
    return sorted(names)


def tests_reaching(files: list[Path], seeds: list[str], words: list[str] = ()) -> list[str]:
    """The top-level tests in `files` that call one of `seeds` (directly or through other
    functions of those files) or mention one of `words`: in a package that mixes unit
    tests with tests against a live broker, the latter, found by name as Go's own call
    graph would (approximately: by identifier, not by type)."""
    bodies: dict[str, list[str]] = {}
    for path in files:
        for chunk in re.split(r"\n(?=func )", path.read_text()):
            m = re.match(r"func (?:\([^)]*\)\s*)?(\w+)\s*[\[(]", chunk)
            if m:
                bodies.setdefault(m.group(1), []).append(chunk[m.end():])
    reaching = set(seeds)
    grew = bool(reaching)
    while grew:
        calls = re.compile(r"\b(" + "|".join(map(re.escape, sorted(reaching))) + r")\(")
        grew = False
        for name, texts in bodies.items():
            if name not in reaching and any(calls.search(t) for t in texts):
                reaching.add(name)
                grew = True
    mentions = re.compile(r"\b(" + "|".join(map(re.escape, words)) + r")\b") if words else None
    return sorted(
        name
        for name, texts in bodies.items()
        if re.fullmatch(r"Test\w+", name)
        and name != "TestMain"
        and (name in reaching or (mentions is not None and any(mentions.search(t) for t in texts)))
    )


# A known failure gets this long (a hang is what most of them do against rill); should it
# start to pass, its time is far above what these tests take against Kafka.
KNOWN_FAILURE_TIMEOUT_S = 30


def only_named(names: list[str]) -> list[str]:
    """`names` cut down to those `RILL_GO_TESTS` lists (comma-separated), when it is set:
    to rerun a test or two by hand (`RILL_GO_TESTS=TestTxnEtl RILL_COMPAT_MODE=full`)
    without the whole family. A name the family lacks is an error, not a silent no-op."""
    wanted = [n.strip() for n in os.environ.get("RILL_GO_TESTS", "").split(",") if n.strip()]
    if not wanted:
        return names
    missing = [n for n in wanted if n not in names]
    if missing:
        raise CompatError(f"RILL_GO_TESTS names tests this mode does not run: {missing}")
    log(f"RILL_GO_TESTS: running {len(wanted)} of {len(names)} tests")
    return wanted


def _anchored(names: list[str]) -> str:
    return "^(" + "|".join(re.escape(n) for n in names) + ")$"


def run_test_binary(
    go: GoToolchain,
    binary: Path,
    package: str,
    cwd: Path,
    names: list[str],
    env: dict[str, str],
    timeout_s: float,
    extra_args: list[str] | None = None,
    log_path: Path | None = None,
    per_test_timeout_s: float | None = None,
    timeouts_s: dict[str, float] | None = None,
) -> dict[str, TestRecord]:
    """Runs `names` (top-level tests) and returns what became of each.

    `timeout_s` bounds the whole suite: each process gets what is left of it as its
    `-test.timeout`, and a test still running when it fires is failed as timed out.
    With `per_test_timeout_s`, each test runs alone in a process of its own with that
    limit (or its own in `timeouts_s`), so that a test that hangs costs its own limit and
    blames no other test."""
    records = {n: TestRecord(n) for n in names}
    deadline = time.monotonic() + timeout_s
    restarts = 0
    log_file = open(log_path, "a") if log_path else None
    try:
        for name in names if per_test_timeout_s else []:
            limit_s = (timeouts_s or {}).get(name, per_test_timeout_s)
            left_s = min(limit_s, deadline - time.monotonic())
            if left_s < 5:
                break
            crash = _run_once(go, binary, package, cwd, [name], records, env, left_s, extra_args or [], log_file)
            rec = records[name]
            if crash is not None and rec.outcome in ("running", "not run"):
                rec.outcome = "failed"
                rec.output.append(f"the test binary died while this test ran: {crash}")
        while not per_test_timeout_s:
            pending = [n for n in names if records[n].outcome == "not run"]
            left_s = deadline - time.monotonic()
            if not pending or left_s < 5:
                break
            crash = _run_once(go, binary, package, cwd, pending, records, env, left_s, extra_args or [], log_file)
            if crash is None:
                break
            if all(records[n].outcome == "not run" for n in pending):
                # It died before its first test (a TestMain that panics): it would again.
                for n in pending:
                    records[n].outcome = "failed"
                    records[n].output.append(f"the test binary died before any test started: {crash}")
                break
            for rec in records.values():
                if rec.outcome == "running":
                    rec.outcome = "failed"
                    rec.output.append(f"the test binary died while this test ran: {crash}")
            restarts += 1
            if restarts > MAX_BINARY_RESTARTS:
                break
            log(f"test binary died ({crash}); restarting it on the tests it had not started")
    finally:
        if log_file:
            log_file.close()
    for rec in records.values():
        if rec.outcome in ("not run", "running"):
            rec.outcome = "failed"
            rec.output.append("never finished: the suite's time limit or restart limit ran out first")
    return records


def _run_once(
    go: GoToolchain,
    binary: Path,
    package: str,
    cwd: Path,
    pending: list[str],
    records: dict[str, TestRecord],
    env: dict[str, str],
    left_s: float,
    extra_args: list[str],
    log_file,
) -> str | None:
    """One test process; returns None when it ended normally, else what killed it."""
    timeout = max(5, int(left_s) - 3)
    cmd = [
        go.go, "tool", "test2json", "-t", "-p", package,
        str(binary), "-test.v=test2json", "-test.run", _anchored(pending),
        f"-test.timeout={timeout}s", *extra_args,
    ]
    full_env = dict(go.env)
    full_env.update(env)
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=full_env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=_die_with_parent,
    )
    tail: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                tail = (tail + [line.rstrip()])[-40:]
                if log_file:
                    log_file.write(line)
                continue
            action = event.get("Action")
            test = event.get("Test")
            output = event.get("Output", "")
            if log_file and output:
                log_file.write(output if not test else f"{test}: {output}")
            if output:
                tail = (tail + [output.rstrip()])[-40:]
            if test is None:
                continue
            top = test.split("/", 1)[0]
            rec = records.get(top)
            if rec is None:
                continue
            if action == "output" and len(rec.output) < 4000:
                rec.output.append(output)
            elif "/" in test:
                continue
            elif action == "run":
                rec.outcome = "running"
            elif action in ("pass", "fail", "skip"):
                rec.outcome = {"pass": "passed", "fail": "failed", "skip": "skipped"}[action]
                rec.seconds = float(event.get("Elapsed") or 0.0)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    still_running = [r for r in records.values() if r.outcome == "running"]
    if not still_running and code in (0, 1):
        return None
    why = [l for l in tail if re.search(r"panic|timed out|fatal error|signal", l)]
    return (" | ".join(why[:3]) or f"exit status {code}")[:REASON_CHARS]


def summarize(
    contract: Contract,
    records: dict[str, TestRecord],
    known: dict[str, str],
    seconds: float,
    notes: list[str] | None = None,
) -> int:
    """Writes the result file, prints a summary, and returns the runner's exit status."""
    results = []
    unexpected, fixed = [], []
    for name in sorted(records):
        rec = records[name]
        entry: dict[str, str] = {"name": name, "outcome": rec.outcome}
        if rec.outcome == "failed":
            if name in known:
                entry["reason"] = f"known: {known[name]} (this run: {rec.reason_excerpt()})"
            else:
                entry["reason"] = f"NEW failure: {rec.reason_excerpt()}"
                unexpected.append(name)
        elif rec.outcome == "skipped":
            entry["reason"] = rec.reason_excerpt()
        elif name in known:
            entry["reason"] = f"listed as a known failure ({known[name]}) but passed: take it off the list"
            fixed.append(name)
        results.append(entry)
    counts = {k: sum(1 for r in results if r["outcome"] == k) for k in ("passed", "failed", "skipped")}
    doc = {"family": contract.family, **counts, "seconds": round(seconds, 1), "results": results}
    if notes:
        doc["notes"] = notes
    contract.out.write_text(json.dumps(doc, indent=2) + "\n")
    log(
        f"{contract.family} ({contract.mode}): {counts['passed']} passed, {counts['failed']} failed "
        f"({len(unexpected)} new), {counts['skipped']} skipped in {seconds:.1f} s -> {contract.out}"
    )
    for entry in results:
        if entry["outcome"] != "passed":
            log(f"  {entry['outcome']:7} {entry['name']}: {entry.get('reason', '')[:300]}")
    for name in fixed:
        log(f"  FIXED?  {name} passed but is listed as a known failure")
    return 1 if unexpected else 0


def main_guard(family: str, body) -> None:
    """Runs a runner's body; a setup failure still leaves a result file that says why."""
    # SIGTERM (a time limit above us) unwinds like an exception, so that every `finally`
    # stops the servers and test processes this runner started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    contract = None
    try:
        contract = Contract.from_env(family)
        sys.exit(body(contract, started))
    except (CompatError, AssertionError, subprocess.TimeoutExpired, OSError) as error:
        log(f"{family}: setup failed: {error}")
        out = Path(os.environ.get("RILL_COMPAT_OUT") or WORKSPACE_ROOT / "target" / "compat" / f"{family}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "family": family, "passed": 0, "failed": 1, "skipped": 0,
            "seconds": round(time.monotonic() - started, 1),
            "results": [{"name": "setup", "outcome": "failed", "reason": str(error)[:REASON_CHARS]}],
        }
        out.write_text(json.dumps(doc, indent=2) + "\n")
        sys.exit(2)
