"""The JVM side of the compat suite: Apache Kafka's jars and our Java programs, cached.

- `classpath()` resolves `java/pom.xml` (Kafka 4.1.x: broker, tools, Streams, client,
  Connect's file connectors, MirrorMaker 2, log4j2) with Maven into a local repository
  under the cache and returns the runtime classpath. The result is stamped with the pom's
  hash, so a re-run with the same pom starts no Maven at all (and needs no network).
- `programs()` compiles `java/src/main/java` with `javac` against that classpath, once per
  content hash of the sources and the pom.
- `java_command()` is the command line for a main class on both.

The cache is `$RILL_COMPAT_CACHE` (xtask passes `target/compat-cache`), else that directory
under the workspace root. Missing `java` or `mvn` raise `JvmError`: a family that needs them
reports it (`compat_lib.prerequisites_missing`: a failure on CI), never skips silently.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import compat_lib

COMPAT_DIR = Path(__file__).resolve().parent
WORKSPACE_ROOT = COMPAT_DIR.parents[1]
JAVA_DIR = COMPAT_DIR / "java"
POM = JAVA_DIR / "pom.xml"
SOURCES = JAVA_DIR / "src" / "main" / "java"
LOG4J2_CONFIG = JAVA_DIR / "log4j2.properties"
# Kafka 4.x brokers and tools need Java 17.
JAVA_MAJOR_MIN = 17
# A cold fetch of every jar takes ~45 s here; this bounds a hung registry.
MAVEN_TIMEOUT_S = 900


class JvmError(RuntimeError):
    """java/mvn missing or too old, the Maven fetch failed, or the programs did not compile."""


def cache_dir() -> Path:
    configured = os.environ.get("RILL_COMPAT_CACHE")
    cache = Path(configured) if configured else WORKSPACE_ROOT / "target" / "compat-cache"
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise JvmError(
            f"`{name}` is not on PATH: the Java compat families need Java {JAVA_MAJOR_MIN}+ and "
            "Maven (Debian: apt-get install openjdk-17-jdk-headless maven; `cargo xtask "
            "compat` installs them when it runs as root)"
        )
    return path


def check_java() -> str:
    """The `java -version` line, after checking that java, javac and mvn exist."""
    java = _tool("java")
    _tool("javac")
    _tool("mvn")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    text = out.stderr + out.stdout
    match = re.search(r'version "(\d+)', text)
    if match is None or int(match.group(1)) < JAVA_MAJOR_MIN:
        raise JvmError(f"Java {JAVA_MAJOR_MIN}+ is needed, found: {text.strip()[:200]}")
    return text.splitlines()[0] if text else "java"


def _locked(cache: Path):
    """One fetch or compile at a time per cache (runners or pytest workers may overlap)."""
    return compat_lib.exclusive(cache / ".jvm.lock")


def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(str(path.relative_to(JAVA_DIR)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def classpath(log=print) -> list[str]:
    """Kafka's runtime classpath (jar paths), fetched with Maven on first use."""
    check_java()
    cache = cache_dir()
    out_dir = cache / "java"
    out_dir.mkdir(parents=True, exist_ok=True)
    listing = out_dir / "classpath.txt"
    stamp = out_dir / "classpath.stamp"
    digest = _digest([POM])
    with _locked(cache):
        if stamp.exists() and stamp.read_text() == digest and listing.exists():
            jars = listing.read_text().strip().split(":")
            if jars and all(Path(jar).is_file() for jar in jars):
                return jars
        log(f"jvm: fetching Kafka's jars with Maven into {cache / 'm2'}")
        started = time.monotonic()
        command = [
            _tool("mvn"),
            "-B",
            "-q",
            f"-Dmaven.repo.local={cache / 'm2'}",
            "-f",
            str(POM),
            "dependency:build-classpath",
            f"-Dmdep.outputFile={listing}",
            "-Dmdep.includeScope=runtime",
        ]
        for attempt in range(2):  # one retry: a registry hiccup should not fail a run
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=MAVEN_TIMEOUT_S
            )
            if result.returncode == 0:
                break
            if attempt == 1:
                raise JvmError(
                    "mvn dependency:build-classpath failed:\n"
                    + (result.stdout + result.stderr)[-4000:]
                )
        stamp.write_text(digest)
        log(f"jvm: Maven fetch took {time.monotonic() - started:.1f}s")
        return listing.read_text().strip().split(":")


def programs(log=print) -> Path:
    """The classes directory of our Java programs, compiled once per source hash."""
    jars = classpath(log)
    cache = cache_dir()
    sources = sorted(SOURCES.rglob("*.java"))
    digest = _digest([POM, *sources])
    classes = cache / "java" / f"classes-{digest}"
    with _locked(cache):
        if (classes / ".compiled").exists():
            return classes
        for old in (cache / "java").glob("classes-*"):
            shutil.rmtree(old, ignore_errors=True)
        classes.mkdir(parents=True)
        started = time.monotonic()
        result = subprocess.run(
            [
                _tool("javac"),
                "--release",
                "17",
                "-Xlint:-options",
                "-cp",
                ":".join(jars),
                "-d",
                str(classes),
                *map(str, sources),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode != 0:
            shutil.rmtree(classes, ignore_errors=True)
            raise JvmError("javac failed:\n" + (result.stdout + result.stderr)[-6000:])
        (classes / ".compiled").write_text(digest)
        log(f"jvm: compiled {len(sources)} Java sources in {time.monotonic() - started:.1f}s")
        return classes


def java_command(
    main_class: str,
    args: list[str],
    *,
    heap_mb: int = 256,
    with_programs: bool = False,
    jvm_args: list[str] | None = None,
    log=print,
) -> list[str]:
    """`java ... main_class args` on Kafka's classpath (and ours), quiet log4j2 on stderr."""
    jars = classpath(log)
    entries = ([str(programs(log))] if with_programs else []) + jars
    return [
        _tool("java"),
        f"-Xmx{heap_mb}m",
        # Short-lived tools: C1 only and the serial collector start fastest on 2 cores.
        "-XX:TieredStopAtLevel=1",
        "-XX:+UseSerialGC",
        f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
        *(jvm_args or []),
        "-cp",
        ":".join(entries),
        main_class,
        *args,
    ]
