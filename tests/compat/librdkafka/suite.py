"""librdkafka's own integration test suite (its `tests/` directory): the pinned sources,
the build of librdkafka and of the suite's `test-runner` into the compat cache, the list
of tests read from the runner's table in `tests/test.c`, and one run of the runner.

Where the sources come from. Issue #19 asks for the suite at librdkafka 2.14 or newer.
The newest `rdkafka-sys` on crates.io (4.10.0) vendors 2.12.1, so it is not used here; the
npm package `@confluentinc/kafka-javascript` 1.10.1 vendors librdkafka 2.15.1 whole
(`deps/librdkafka/`, its `tests/` included). `npm pack` fetches that tarball from the npm
registry, and its sha256 is checked against the pin below before anything is unpacked.

The build. librdkafka's own `./configure` and Makefiles, at `-O0` and without debug
symbols (a clean build is dominated by compiling; the tests do network waits, not
computation), without GSSAPI (no Kerberos here) and without libcurl (only OIDC, which
needs an identity provider, uses it). Only the static libraries and `test-runner` are
made, so the runner carries its librdkafka inside. zstd and RapidJSON are picked up when
their headers are installed (`libzstd-dev`, `rapidjson-dev`; installed with apt-get when
missing and we are root): without zstd the compression tests lose a codec, without
RapidJSON four tests skip themselves. A stamp (pin, flags, what was found) beside the
build makes a second run reuse it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import compat_lib

PACKAGE = "@confluentinc/kafka-javascript"
PACKAGE_VERSION = "1.10.1"
# sha256 of `confluentinc-kafka-javascript-1.10.1.tgz` as the npm registry serves it.
PACKAGE_SHA256 = "ada7d703bb1d3237e2292bfabf438d663b6160c9f1ac2a2406b5dc4257c81b66"
LIBRDKAFKA_VERSION = "2.15.1"
TARBALL = f"confluentinc-kafka-javascript-{PACKAGE_VERSION}.tgz"
SOURCE_PREFIX = "package/deps/librdkafka"

CONFIGURE_FLAGS = [
    "--disable-optimization",
    "--disable-debug-symbols",
    "--disable-gssapi",
    "--disable-curl",
]
# Headers that switch features on when present, and the Debian packages that hold them.
OPTIONAL_HEADERS = {
    "zstd": ("/usr/include/zstd.h", "libzstd-dev"),
    "rapidjson": ("/usr/include/rapidjson/document.h", "rapidjson-dev"),
}
BUILD_TIMEOUT_S = 1800


class BuildError(RuntimeError):
    """The sources could not be had or the build failed."""


class ToolMissing(BuildError):
    """A tool the build needs (npm, a C compiler, make) is not installed."""


def log(message: str) -> None:
    print(f"librdkafka: {message}", flush=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _run(command: list[str], cwd: Path, what: str, env: dict | None = None) -> None:
    result = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=BUILD_TIMEOUT_S,
    )
    if result.returncode != 0:
        raise BuildError(f"{what} failed ({result.returncode}):\n{result.stdout[-4000:]}")


def _apt_usable() -> bool:
    return shutil.which("apt-get") is not None and os.geteuid() == 0


def _apt_install(packages: list[str]) -> bool:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": env}
    if subprocess.run(install, **quiet).returncode == 0:
        return True
    # The package lists may be absent on a fresh machine.
    subprocess.run(["apt-get", "update", "-qq"], **quiet)
    return subprocess.run(install, **quiet).returncode == 0


def optional_features() -> dict[str, bool]:
    """Which optional headers are present, installing the missing ones when we can."""
    missing = [pkg for header, pkg in OPTIONAL_HEADERS.values() if not Path(header).is_file()]
    if missing and _apt_usable():
        log(f"installing {' '.join(missing)} with apt-get")
        if not _apt_install(missing):
            log(f"WARNING: apt-get could not install {' '.join(missing)}")
    found = {name: Path(header).is_file() for name, (header, _) in OPTIONAL_HEADERS.items()}
    for name, present in found.items():
        if not present:
            log(f"WARNING: building without {name} ({OPTIONAL_HEADERS[name][1]} is not installed)")
    return found


def _download(directory: Path) -> Path:
    """The pinned tarball, fetched by `npm pack` unless a verified copy is there."""
    tarball = directory / TARBALL
    if tarball.is_file() and _sha256(tarball) == PACKAGE_SHA256:
        return tarball
    npm = shutil.which("npm")
    if npm is None:
        raise ToolMissing("npm is not installed (it fetches the librdkafka sources; apt-get install npm)")
    partial = directory / "download.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    log(f"fetching {PACKAGE}@{PACKAGE_VERSION} (librdkafka {LIBRDKAFKA_VERSION}) with npm pack")
    result = subprocess.run(
        [npm, "pack", f"{PACKAGE}@{PACKAGE_VERSION}", "--pack-destination", str(partial),
         "--silent"],
        capture_output=True, text=True, timeout=600,
    )
    fetched = partial / TARBALL
    if result.returncode != 0 or not fetched.is_file():
        raise BuildError(f"npm pack failed ({result.returncode}): {(result.stdout + result.stderr)[-2000:]}")
    actual = _sha256(fetched)
    if actual != PACKAGE_SHA256:
        raise BuildError(f"{TARBALL} has sha256 {actual}, expected the pinned {PACKAGE_SHA256}")
    fetched.replace(tarball)
    shutil.rmtree(partial, ignore_errors=True)
    return tarball


@dataclass
class Build:
    """A built suite: `root` is librdkafka's source tree, `runner` its `tests/test-runner`."""

    root: Path
    seconds: float
    reused: bool

    @property
    def tests_dir(self) -> Path:
        return self.root / "tests"

    @property
    def runner(self) -> Path:
        return self.tests_dir / "test-runner"


def _stamp(features: dict[str, bool]) -> str:
    compiler = subprocess.run(["cc", "--version"], capture_output=True, text=True).stdout
    return json.dumps(
        {
            "package": f"{PACKAGE}@{PACKAGE_VERSION}",
            "sha256": PACKAGE_SHA256,
            "configure": CONFIGURE_FLAGS,
            "features": features,
            "cc": compiler.splitlines()[0] if compiler else "",
        },
        sort_keys=True,
    )


def build(cache: Path) -> Build:
    """Builds (or reuses) librdkafka and `test-runner` under `cache/librdkafka/`."""
    base = cache / "librdkafka"
    started = time.monotonic()
    with compat_lib.exclusive(base / ".lock"):
        features = optional_features()
        stamp = _stamp(features)
        root = base / LIBRDKAFKA_VERSION
        stamp_path = root / "rill-stamp.json"
        if (root / "tests" / "test-runner").is_file() and stamp_path.is_file() \
                and stamp_path.read_text() == stamp:
            return Build(root, time.monotonic() - started, reused=True)
        for tool in ("cc", "c++", "make", "tar"):
            if shutil.which(tool) is None:
                raise ToolMissing(f"`{tool}` is not installed (apt-get install build-essential)")
        tarball = _download(base)
        partial = base / f"{LIBRDKAFKA_VERSION}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        _run(["tar", "-xzf", str(tarball), "-C", str(partial), "--strip-components=3",
              SOURCE_PREFIX], base, "unpacking the sources")
        jobs = str(max(1, os.cpu_count() or 1))
        log(f"building librdkafka {LIBRDKAFKA_VERSION} and its test-runner ({' '.join(CONFIGURE_FLAGS)})")
        _run(["./configure", *CONFIGURE_FLAGS], partial, "./configure")
        _run(["make", "-j", jobs, "-C", "src", "librdkafka.a"], partial, "make librdkafka.a")
        _run(["make", "-j", jobs, "-C", "src-cpp", "librdkafka++.a"], partial, "make librdkafka++.a")
        _run(["make", "-j", jobs, "-C", "tests", "test-runner"], partial, "make test-runner")
        (partial / "rill-stamp.json").write_text(stamp)
        shutil.rmtree(root, ignore_errors=True)
        partial.rename(root)
        return Build(root, time.monotonic() - started, reused=False)


# ---------------------------------------------------------------------------------------
# The runner's table of tests.

FLAG_LOCAL = "TEST_F_LOCAL"
FLAG_MANUAL = "TEST_F_MANUAL"
FLAG_KNOWN_ISSUE = "TEST_F_KNOWN_ISSUE"
# TEST_BRKVER_TOPIC_ADMINAPI in test.h: the Admin API's topic calls, Kafka 0.10.2.
NAMED_VERSIONS = {"TEST_BRKVER_TOPIC_ADMINAPI": (0, 10, 2, 0)}


@dataclass
class TestCase:
    name: str
    flags: set[str] = field(default_factory=set)
    min_version: tuple[int, int, int, int] = (0, 0, 0, 0)
    scenarios: tuple[str, ...] = ("default",)

    @property
    def number(self) -> str:
        return self.name[:4]

    @property
    def is_broker_test(self) -> bool:
        """Run against a broker: not local (no broker), manual, or on a mock cluster."""
        return not (self.flags & {FLAG_LOCAL, FLAG_MANUAL}) and "mock" not in self.name


def _split_arguments(text: str) -> list[str]:
    """Splits a macro's arguments at the commas outside parentheses."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        depth += char == "("
        depth -= char == ")"
        current.append(char)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def read_tests(tests_dir: Path) -> list[TestCase]:
    """The `tests[]` table of `test.c`: every `_TEST(name, flags, ...)` entry."""
    source = (tests_dir / "test.c").read_text()
    start = source.find("struct test tests[] = {")
    if start < 0:
        raise BuildError("test.c has no `struct test tests[]` table")
    source = re.sub(r"/\*.*?\*/", "", source[start:], flags=re.S)
    cases = []
    for match in re.finditer(r"\b_TEST\(", source):
        depth, end = 1, match.end()
        while depth and end < len(source):
            depth += source[end] == "("
            depth -= source[end] == ")"
            end += 1
        args = _split_arguments(source[match.end():end - 1])
        case = TestCase(name=args[0])
        case.flags = set(re.findall(r"TEST_F_\w+", args[1])) if len(args) > 1 else set()
        for arg in args[2:]:
            version = re.fullmatch(r"TEST_BRKVER\((\d+),\s*(\d+),\s*(\d+),\s*(\d+)\)", arg)
            if version:
                case.min_version = tuple(int(v) for v in version.groups())
            elif arg in NAMED_VERSIONS:
                case.min_version = NAMED_VERSIONS[arg]
            scenario = re.fullmatch(r'\.scenario\s*=\s*"([^"]*)"', arg)
            if scenario:
                case.scenarios = tuple(scenario.group(1).split(","))
        cases.append(case)
    if len(cases) < 100:
        raise BuildError(f"read only {len(cases)} tests from test.c: has its table changed?")
    return cases


# ---------------------------------------------------------------------------------------
# One run of the runner.

ANSI = re.compile(r"\x1b\[[0-9;]*m|\x1b\(B")
SUMMARY_LINE = re.compile(
    r"^\|\s*(?P<name>\d{4}_\w+)\s*\|\s*(?P<state>PASSED|FAILED|SKIPPED|RUNNING|DNS)\s*\|"
    r"\s*(?P<seconds>[\d.]+)s\s*\|\s*(?P<reason>.*)$"
)


@dataclass
class Outcome:
    name: str
    state: str  # PASSED, FAILED, SKIPPED, or as the runner printed it
    reason: str
    seconds: float


def parse_summary(output: str) -> dict[str, Outcome]:
    """The runner's closing table: one `| name | STATE | 1.234s | reason` line per test."""
    outcomes = {}
    for line in ANSI.sub("", output).splitlines():
        match = SUMMARY_LINE.match(line.strip())
        if match:
            outcomes[match["name"]] = Outcome(
                match["name"], match["state"], match["reason"].strip(), float(match["seconds"])
            )
    return outcomes


@dataclass
class RunResult:
    outcomes: dict[str, Outcome]
    returncode: int | None  # None: killed at its time limit
    seconds: float
    log: Path


def run_number(
    build: Build,
    number: str,
    scenario: str,
    env: dict[str, str],
    args: list[str],
    log_path: Path,
    timeout_s: float,
) -> RunResult:
    """Runs the tests of one number (`TESTS=<number>`) in a runner process of their own,
    so that a crash or a hang costs only them; the output goes to `log_path`."""
    started = time.monotonic()
    full_env = {**os.environ, **env, "TESTS": number, "TEST_SCENARIO": scenario}
    with open(log_path, "w") as out:
        # Line-buffered stdout: the closing table is printed with printf just before the
        # runner asserts that no librdkafka thread is left, and an abort there (after a
        # failed test leaked its client) would lose a fully buffered table.
        process = subprocess.Popen(
            ["stdbuf", "-oL", str(build.runner), *args],
            cwd=build.tests_dir,
            env=full_env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode: int | None = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            returncode = None
    output = log_path.read_text(errors="replace")
    return RunResult(parse_summary(output), returncode, time.monotonic() - started, log_path)


def tail(path: Path, lines: int = 15) -> str:
    text = ANSI.sub("", path.read_text(errors="replace"))
    return "\n".join(text.splitlines()[-lines:])
