//! `cargo xtask test`: the whole test run, from formatting to end-to-end.
//!
//! Steps, in order (each stops the run when it fails):
//!
//! 1. `cargo fmt --all -- --check`, `cargo clippy --workspace --all-targets -- -D warnings`,
//!    then Kafka 4.2.2's jars that the codegen freshness test reads the share-group specs
//!    from (fetched into the local Maven repository when missing, with Java and Maven from
//!    apt on a clean machine), then `cargo test --workspace --no-fail-fast` (the Rust half;
//!    skipped by `--e2e-only`).
//! 2. `cargo build -p rill`, unless `RILL_BIN` names a binary already.
//! 3. A Python venv at `target/e2e-venv` with the pinned clients of
//!    `tests/e2e/requirements.txt` (made once, reinstalled when the pins change),
//!    `kcat` from Debian's packages when it is not on `PATH`, Debian's `chromium` and
//!    `chromium-driver` for the console's browser tests likewise, and librdkafka's
//!    `rdkafka_performance` built against the venv's librdkafka (`rdkafka_performance.rs`;
//!    reused while its pins hold).
//! 4. `pytest tests/e2e` with the venv's interpreter; arguments after `--` go to pytest
//!    (`cargo xtask test --e2e-only -- -k produce`). Steps 2-4 are skipped by `--rust-only`.
//! 5. The compat families of `tests/compat/` in quick mode (`compat.rs`: Kafka's Java
//!    client and tools, the differential harness against Apache Kafka, Go clients), their
//!    counts added to the tally; skipped when pytest arguments name a subset.
//! 6. Every `cargo fuzz` target of the decoders for `RILL_FUZZ_SECONDS` (15) seconds when
//!    a nightly toolchain is present (`fuzz/run.sh`, built with fuzz's dev profile unless
//!    `FUZZ_PROFILE` says otherwise; the pre-authentication targets, which build the
//!    broker, with `FUZZ_BROKER=1`).
//!
//! The last line printed is a tally in the plain `N passed, N failed, N skipped` form, so
//! that a reader (or CI) sees at once what ran; the exit code is non-zero on any failure.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};

use crate::{compat, rdkafka_performance};

const USAGE: &str = "usage: cargo xtask test [--rust-only | --e2e-only] [-- <pytest args>]";

/// Where the end-to-end venv lives, relative to the workspace root. Not under
/// `CARGO_TARGET_DIR`: the venv is Python's, and engineers with private target dirs share it.
const VENV_DIR: &str = "target/e2e-venv";
/// The pins the venv is made from; a copy inside the venv marks it as up to date.
const REQUIREMENTS: &str = "tests/e2e/requirements.txt";
const VENV_STAMP: &str = "rill-requirements.txt";

pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let options = Options::parse(args)?;
    let started = Instant::now();
    let mut tally = Tally::default();
    let outcome = run_steps(root, &options, &mut tally);
    let elapsed = started.elapsed().as_secs();
    let duration = format!("{}m{:02}s", elapsed / 60, elapsed % 60);
    println!();
    match outcome {
        Ok(()) => {
            println!("xtask test: OK ({}) in {duration}", options.scope());
            println!("xtask: {tally}");
            Ok(())
        }
        Err(error) => {
            // Printed here rather than returned so that the tally stays the last line.
            eprintln!("error: {error:#}");
            println!(
                "xtask test: FAILED ({}) in {duration}: {error}",
                options.scope()
            );
            println!("xtask: {tally}");
            std::process::exit(1);
        }
    }
}

fn run_steps(root: &Path, options: &Options, tally: &mut Tally) -> anyhow::Result<()> {
    let cargo = cargo_program();
    if options.rust {
        step(
            root,
            &cargo,
            &["fmt", "--all", "--", "--check"],
            "cargo fmt --check",
        )?;
        let clippy = [
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ];
        step(root, &cargo, &clippy, "cargo clippy")?;
        spec_jars()?;
        cargo_test(root, &cargo, tally)?;
    }
    if options.e2e {
        let rill_bin = rill_binary(root, &cargo)?;
        let python = ensure_venv(root)?;
        let kcat = ensure_kcat()?;
        let chromium = ensure_chromium()?;
        let rdkafka_performance = rdkafka_performance::ensure(root, &python)?;
        let tools = Tools {
            kcat,
            chromium,
            rdkafka_performance,
        };
        pytest(
            root,
            &python,
            &rill_bin,
            &tools,
            &options.pytest_args,
            tally,
        )?;
        if options.pytest_args.is_empty() {
            banner("compat families (quick)");
            let started = Instant::now();
            let (counts, failed) = compat::quick(root, &rill_bin, &python)?;
            println!("    (compat: {:.1}s)", started.elapsed().as_secs_f64());
            // Known failures count like pytest's xfails: as passed.
            tally.passed += counts.passed + counts.known;
            tally.failed += counts.failed;
            tally.skipped += counts.skipped;
            if !failed.is_empty() {
                bail!("compat families failed: {}", failed.join(", "));
            }
        } else {
            println!(
                "\ncompat: skipped (pytest arguments given; `cargo xtask compat --quick` runs it)"
            );
        }
    }
    if options.rust {
        fuzz(root)?;
    }
    Ok(())
}

/// The jars `cargo xtask codegen` reads the share-group specs from, in the local Maven
/// repository before `cargo test` runs the freshness test (which would fetch them too, but
/// cannot install Maven). Java and Maven come from apt here when a jar is missing and they
/// are too, as for the compat families later.
fn spec_jars() -> anyhow::Result<()> {
    if crate::codegen::spec_jars_present()? {
        return Ok(());
    }
    banner("Kafka's spec jars (codegen)");
    compat::ensure_java();
    let jars = crate::codegen::ensure_spec_jars()?;
    for jar in jars {
        println!("    {}", jar.display());
    }
    Ok(())
}

/// Seconds each fuzz target runs for in the test command (`RILL_FUZZ_SECONDS`, 0 skips):
/// short, to catch a decoder that regressed on the committed seeds and what a few seconds
/// of mutation find; long runs are `fuzz/run.sh` by hand.
const FUZZ_SECONDS_DEFAULT: u64 = 15;

/// Runs every fuzz target briefly; `fuzz/run.sh` skips with a message when no nightly
/// toolchain is present.
fn fuzz(root: &Path) -> anyhow::Result<()> {
    let seconds = env_number("RILL_FUZZ_SECONDS", FUZZ_SECONDS_DEFAULT)?;
    if seconds == 0 {
        println!("fuzz: skipped (RILL_FUZZ_SECONDS=0)");
        return Ok(());
    }
    banner(&format!("fuzz/run.sh {seconds}"));
    let started = Instant::now();
    let mut command = Command::new("bash");
    command
        .arg(root.join("fuzz/run.sh"))
        .arg(seconds.to_string())
        .current_dir(root);
    // A short run is better served by the cheaper build (fuzz/Cargo.toml says why).
    if std::env::var_os("FUZZ_PROFILE").is_none() {
        command.env("FUZZ_PROFILE", "dev");
    }
    // The pre-authentication targets build rill-broker for fuzzing, minutes on two
    // cores: by hand (`fuzz/run.sh`) or with `FUZZ_BROKER=1 cargo xtask test`.
    if std::env::var_os("FUZZ_BROKER").is_none() {
        command.env("FUZZ_BROKER", "0");
    }
    let status = command.status().context("could not start fuzz/run.sh")?;
    println!("    (fuzz: {:.1}s)", started.elapsed().as_secs_f64());
    if !status.success() {
        bail!("a fuzz target found a crash ({status}); see fuzz/artifacts/");
    }
    Ok(())
}

/// What the command line asked for.
struct Options {
    rust: bool,
    e2e: bool,
    pytest_args: Vec<String>,
}

impl Options {
    fn parse(args: &[String]) -> anyhow::Result<Options> {
        let mut options = Options {
            rust: true,
            e2e: true,
            pytest_args: Vec::new(),
        };
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            match arg.as_str() {
                "--rust-only" => options.e2e = false,
                "--e2e-only" => options.rust = false,
                "--" => {
                    options.pytest_args.extend(rest.by_ref().cloned());
                }
                "-h" | "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown argument {other:?}\n{USAGE}"),
            }
        }
        if !options.rust && !options.e2e {
            bail!("--rust-only and --e2e-only exclude each other\n{USAGE}");
        }
        if !options.pytest_args.is_empty() && !options.e2e {
            bail!("pytest arguments given with --rust-only\n{USAGE}");
        }
        Ok(options)
    }

    fn scope(&self) -> &'static str {
        match (self.rust, self.e2e) {
            (true, true) => "rust + e2e",
            (true, false) => "rust only",
            _ => "e2e only",
        }
    }
}

/// Test counts over every runner, printed as the closing line.
#[derive(Default)]
struct Tally {
    passed: u64,
    failed: u64,
    skipped: u64,
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )
    }
}

/// The cargo that runs us (set by `cargo run`), so that the toolchain stays the same.
pub(crate) fn cargo_program() -> OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| OsString::from("cargo"))
}

/// Cargo's target directory: `CARGO_TARGET_DIR` when set (relative to the root), else
/// `target/`.
fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => root.join(dir),
        _ => root.join("target"),
    }
}

pub(crate) fn banner(what: &str) {
    println!("\n==> {what}");
}

/// Runs a cargo command to completion with inherited output, failing the run when it fails.
fn step(root: &Path, cargo: &OsString, args: &[&str], name: &str) -> anyhow::Result<()> {
    banner(&format!("cargo {}", args.join(" ")));
    let started = Instant::now();
    let status = Command::new(cargo)
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("could not start {name}"))?;
    println!("    ({name}: {:.1}s)", started.elapsed().as_secs_f64());
    if !status.success() {
        bail!("{name} failed ({status})");
    }
    Ok(())
}

/// Runs a command with its stdout echoed line by line and handed to `on_line`, stderr
/// inherited. Returns the exit status.
fn run_teed(
    mut command: Command,
    mut on_line: impl FnMut(&str),
) -> anyhow::Result<std::process::ExitStatus> {
    let mut child = command
        .stdout(Stdio::piped())
        .spawn()
        .context("could not start process")?;
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line = line.context("reading child output")?;
            println!("{line}");
            on_line(&line);
        }
    }
    child.wait().context("waiting for child")
}

fn cargo_test(root: &Path, cargo: &OsString, tally: &mut Tally) -> anyhow::Result<()> {
    banner("cargo test --workspace --no-fail-fast");
    let started = Instant::now();
    let mut command = Command::new(cargo);
    command
        .args(["test", "--workspace", "--no-fail-fast"])
        .current_dir(root);
    let mut counts = Tally::default();
    let status = run_teed(command, |line| {
        if let Some(result) = CargoTestResult::parse(line) {
            counts.passed += result.passed;
            counts.failed += result.failed;
            counts.skipped += result.ignored;
        }
    })?;
    println!(
        "    (cargo test: {:.1}s; {counts})",
        started.elapsed().as_secs_f64()
    );
    tally.passed += counts.passed;
    tally.failed += counts.failed;
    tally.skipped += counts.skipped;
    if !status.success() {
        bail!("cargo test failed ({status})");
    }
    Ok(())
}

/// One `test result: ok. 5 passed; 0 failed; 1 ignored; ...` line of libtest.
#[derive(Debug, PartialEq)]
struct CargoTestResult {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl CargoTestResult {
    fn parse(line: &str) -> Option<CargoTestResult> {
        let rest = line.trim().strip_prefix("test result: ")?;
        let (_verdict, counts) = rest.split_once(". ")?;
        let mut result = CargoTestResult {
            passed: 0,
            failed: 0,
            ignored: 0,
        };
        for item in counts.split("; ") {
            let mut words = item.split_whitespace();
            let (Some(number), Some(word)) = (words.next(), words.next()) else {
                continue;
            };
            let Ok(number) = number.parse::<u64>() else {
                continue;
            };
            match word {
                "passed" => result.passed = number,
                "failed" => result.failed = number,
                "ignored" => result.ignored = number,
                _ => {}
            }
        }
        Some(result)
    }
}

/// The `rill` binary the end-to-end tests drive: `RILL_BIN` when set, else a fresh
/// `cargo build -p rill`.
pub(crate) fn rill_binary(root: &Path, cargo: &OsString) -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("RILL_BIN").filter(|bin| !bin.is_empty()) {
        let bin = root.join(bin);
        banner(&format!("using RILL_BIN={}", bin.display()));
        if !bin.is_file() {
            bail!("RILL_BIN={} is not a file", bin.display());
        }
        return Ok(bin);
    }
    step(root, cargo, &["build", "-p", "rill"], "cargo build -p rill")?;
    let bin = target_dir(root).join("debug").join("rill");
    if !bin.is_file() {
        bail!(
            "cargo build -p rill succeeded but {} is missing",
            bin.display()
        );
    }
    Ok(bin)
}

/// Makes (or reuses) the venv and returns its interpreter.
pub(crate) fn ensure_venv(root: &Path) -> anyhow::Result<PathBuf> {
    banner(&format!("python venv at {VENV_DIR}"));
    let venv = root.join(VENV_DIR);
    let python = venv.join("bin").join("python");
    let requirements_path = root.join(REQUIREMENTS);
    let requirements = std::fs::read_to_string(&requirements_path)
        .with_context(|| format!("reading {}", requirements_path.display()))?;
    let stamp = venv.join(VENV_STAMP);

    let up_to_date = std::fs::read_to_string(&stamp).is_ok_and(|pins| pins == requirements)
        && quiet(Command::new(&python).args([
            "-c",
            "import pytest, confluent_kafka, kafka, prometheus_client",
        ]));
    if up_to_date {
        println!("    reusing {} (pins unchanged)", venv.display());
        return Ok(python);
    }

    // A venv whose interpreter no longer runs (the base Python moved) is made anew.
    if venv.exists() && !quiet(Command::new(&python).arg("--version")) {
        println!("    {} is broken; recreating it", venv.display());
        std::fs::remove_dir_all(&venv).with_context(|| format!("removing {}", venv.display()))?;
    }
    if !python.exists() {
        let base = base_python()?;
        println!("    creating venv with {}", base.to_string_lossy());
        let create = || {
            Command::new(&base)
                .args([OsString::from("-m"), "venv".into(), venv.clone().into()])
                .status()
        };
        let mut created = create().is_ok_and(|status| status.success());
        if !created && apt_usable() {
            // Debian's python3 ships `venv` without ensurepip until python3-venv is installed.
            println!("    venv failed; installing python3-venv");
            if apt_install("python3-venv") {
                let _ = std::fs::remove_dir_all(&venv);
                created = create().is_ok_and(|status| status.success());
            }
        }
        if !created {
            bail!(
                "could not create a venv at {} with {}",
                venv.display(),
                base.to_string_lossy()
            );
        }
    }

    println!("    installing {}", requirements_path.display());
    let install = |python: &Path| {
        Command::new(python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "-q",
                "-r",
            ])
            .arg(&requirements_path)
            .status()
            .is_ok_and(|status| status.success())
    };
    // One retry: a registry hiccup should not fail a whole CI run.
    if !install(&python) && !install(&python) {
        bail!("pip install -r {} failed", requirements_path.display());
    }
    std::fs::write(&stamp, &requirements)
        .with_context(|| format!("writing {}", stamp.display()))?;
    Ok(python)
}

/// The interpreter to make the venv from: `RILL_PYTHON`, else `python3.11`, else `python3`.
fn base_python() -> anyhow::Result<OsString> {
    if let Some(python) = std::env::var_os("RILL_PYTHON").filter(|python| !python.is_empty()) {
        return Ok(python);
    }
    for candidate in ["python3.11", "python3"] {
        if find_on_path(candidate).is_some() {
            return Ok(OsString::from(candidate));
        }
    }
    bail!("no python3 on PATH (set RILL_PYTHON to an interpreter)")
}

/// Finds `kcat` on `PATH`, installing Debian's package when it is missing and apt is
/// usable. `None` means the kcat tests will skip; on CI (`CI` set) that is an error.
fn ensure_kcat() -> anyhow::Result<Option<PathBuf>> {
    banner("kcat");
    if let Some(kcat) = find_on_path("kcat") {
        println!("    found {}", kcat.display());
        return Ok(Some(kcat));
    }
    if apt_usable() {
        println!("    kcat not on PATH; installing it with apt-get");
        if apt_install("kcat") {
            if let Some(kcat) = find_on_path("kcat") {
                println!("    installed {}", kcat.display());
                return Ok(Some(kcat));
            }
        }
    }
    if on_ci() {
        bail!("kcat is not installed and apt-get could not install it (the kcat tests must run on CI)");
    }
    println!("    WARNING: kcat is unavailable (no root apt-get); the kcat tests will be SKIPPED");
    Ok(None)
}

/// Finds Debian's `chromium` and `chromedriver` (package `chromium-driver`) on `PATH`,
/// installing both when either is missing and apt is usable: the console's browser tests
/// (`tests/e2e/test_console.py`) drive them. `None` makes those tests skip; on CI it is
/// an error.
fn ensure_chromium() -> anyhow::Result<Option<(PathBuf, PathBuf)>> {
    banner("chromium");
    let found = || Some((find_on_path("chromium")?, find_on_path("chromedriver")?));
    if let Some((browser, driver)) = found() {
        println!("    found {} and {}", browser.display(), driver.display());
        return Ok(Some((browser, driver)));
    }
    if apt_usable() {
        println!("    chromium or chromedriver not on PATH; installing them with apt-get");
        let started = Instant::now();
        if apt_install("chromium") && apt_install("chromium-driver") {
            if let Some((browser, driver)) = found() {
                println!(
                    "    installed {} and {} in {:.0}s",
                    browser.display(),
                    driver.display(),
                    started.elapsed().as_secs_f64()
                );
                return Ok(Some((browser, driver)));
            }
        }
    }
    if on_ci() {
        bail!(
            "chromium and chromium-driver are not installed and apt-get could not install \
             them (the console's browser tests must run on CI)"
        );
    }
    println!(
        "    WARNING: chromium is unavailable (no root apt-get); the console's browser tests \
         will be SKIPPED"
    );
    Ok(None)
}

pub(crate) fn on_ci() -> bool {
    std::env::var_os("CI").is_some_and(|ci| !ci.is_empty() && ci != "false" && ci != "0")
}

/// apt-get exists and we are root (it needs root to install).
pub(crate) fn apt_usable() -> bool {
    find_on_path("apt-get").is_some()
        && Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
}

/// `apt-get update` (package lists may be absent on a fresh machine), then install.
pub(crate) fn apt_install(package: &str) -> bool {
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|status| status.success())
    };
    apt(&["update", "-qq"]) && apt(&["install", "-y", "-qq", "--no-install-recommends", package])
}

/// Runs a command with its output discarded; true when it exits 0.
fn quiet(command: &mut Command) -> bool {
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

pub(crate) fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| {
            std::fs::metadata(candidate).is_ok_and(|meta| {
                use std::os::unix::fs::PermissionsExt;
                meta.is_file() && meta.permissions().mode() & 0o111 != 0
            })
        })
}

/// The third-party tools found or built for the end-to-end tests; `None` makes their tests
/// skip (the steps that find them fail on CI instead).
struct Tools {
    kcat: Option<PathBuf>,
    /// `chromium` and `chromedriver`.
    chromium: Option<(PathBuf, PathBuf)>,
    rdkafka_performance: Option<PathBuf>,
}

fn pytest(
    root: &Path,
    python: &Path,
    rill_bin: &Path,
    tools: &Tools,
    extra: &[String],
    tally: &mut Tally,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut command = Command::new(python);
    command.args(["-m", "pytest"]);
    let names_a_path = names_a_test_path(root, extra);
    if !names_a_path {
        command.arg("tests/e2e");
    }
    let shown = if names_a_path { "" } else { " tests/e2e" };
    // The whole suite runs on workers: its tests mostly wait (for elections, sessions,
    // timeouts: about a tenth of two cores busy when run one at a time). A file's tests
    // stay on one worker, which keeps module fixtures (the S3 server) to one start.
    // Arguments mean a developer choosing tests, who gets them one at a time.
    // `RILL_E2E_WORKERS`: how many; 1 runs the suite in one process.
    let workers = env_number("RILL_E2E_WORKERS", E2E_WORKERS_DEFAULT)?;
    let parallel = if extra.is_empty() && workers > 1 {
        let n = workers.to_string();
        command.args(["-n", n.as_str(), "--dist", "loadfile"]);
        format!(" -n {workers}")
    } else {
        String::new()
    };
    banner(&format!("pytest{shown}{parallel} {}", extra.join(" ")));
    command
        .args(extra)
        .current_dir(root)
        .env("RILL_BIN", rill_bin)
        // Live output through our pipe, and no bytecode files in the source tree.
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1");
    if let Some(kcat) = &tools.kcat {
        command.env("KCAT", kcat);
    }
    if let Some(rdkafka_performance) = &tools.rdkafka_performance {
        command.env("RDKAFKA_PERFORMANCE", rdkafka_performance);
    }
    if let Some((browser, driver)) = &tools.chromium {
        command.env("CHROMIUM", browser);
        command.env("CHROMEDRIVER", driver);
    }
    if on_ci() {
        command.env("RILL_E2E_REQUIRE_KCAT", "1");
        command.env("RILL_E2E_REQUIRE_CHROMIUM", "1");
        command.env("RILL_E2E_REQUIRE_RDKAFKA_PERFORMANCE", "1");
    }
    let mut summary = None;
    let status = run_teed(command, |line| {
        if let Some(counts) = PytestSummary::parse(line) {
            summary = Some(counts);
        }
    })?;
    println!("    (pytest: {:.1}s)", started.elapsed().as_secs_f64());
    if let Some(summary) = &summary {
        tally.passed += summary.passed;
        tally.failed += summary.failed;
        tally.skipped += summary.skipped;
    }
    match status.code() {
        Some(0) => Ok(()),
        // pytest's "no tests collected": a filter that matched nothing is not a pass.
        Some(5) => bail!("pytest collected no tests (check the -k/path arguments)"),
        _ => bail!("pytest failed ({status})"),
    }
}

/// A whole number from the environment variable `name`, or `default` when it is unset.
fn env_number<T: std::str::FromStr>(name: &str, default: T) -> anyhow::Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| anyhow::anyhow!("{name} must be a whole number, not {v:?}")),
        Err(_) => Ok(default),
    }
}

/// Two: the suite is wait-bound, and on the two cores CI has a third worker would
/// start to make the CPU-heavy tests (chaos, kill -9 loops) contend.
const E2E_WORKERS_DEFAULT: usize = 2;

/// Whether the pytest arguments name tests by path (`tests/e2e/test_kcat.py::test_x`);
/// without one, the whole suite under `tests/e2e` is collected.
fn names_a_test_path(root: &Path, extra: &[String]) -> bool {
    extra.iter().any(|arg| {
        let path = arg.split("::").next().unwrap_or(arg);
        let looks_like_path = path.ends_with(".py") || path.starts_with("tests/");
        !arg.starts_with('-') && looks_like_path && root.join(path).exists()
    })
}

/// pytest's closing line, e.g. `==== 2 failed, 10 passed, 1 skipped in 12.3s ====`.
#[derive(Debug, PartialEq, Default)]
struct PytestSummary {
    passed: u64,
    failed: u64,
    skipped: u64,
}

impl PytestSummary {
    fn parse(line: &str) -> Option<PytestSummary> {
        let line = line.trim().trim_matches('=').trim();
        let (counts, _duration) = line.rsplit_once(" in ")?;
        let mut summary = PytestSummary::default();
        for item in counts.split(", ") {
            let (number, word) = item.trim().split_once(' ')?;
            let number = number.parse::<u64>().ok()?;
            match word {
                "passed" | "xfailed" => summary.passed += number,
                "failed" | "error" | "errors" | "xpassed" => summary.failed += number,
                "skipped" => summary.skipped += number,
                "deselected" | "warning" | "warnings" | "rerun" | "reruns" => {}
                _ => return None,
            }
        }
        Some(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| arg.to_string()).collect()
    }

    #[test]
    fn options_pass_everything_after_double_dash_to_pytest() {
        let options =
            Options::parse(&strings(&["--e2e-only", "--", "-k", "produce", "-x"])).unwrap();
        assert!(!options.rust);
        assert!(options.e2e);
        assert_eq!(options.pytest_args, strings(&["-k", "produce", "-x"]));
        assert!(Options::parse(&strings(&["--rust-only", "--e2e-only"])).is_err());
        assert!(Options::parse(&strings(&["--bogus"])).is_err());
        assert!(Options::parse(&strings(&["--rust-only", "--", "-x"])).is_err());
    }

    #[test]
    fn test_paths_replace_the_suite_path_but_filters_do_not() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let named = |args: &[&str]| names_a_test_path(root, &strings(args));
        assert!(named(&["tests/e2e/test_harness.py"]));
        assert!(named(&[
            "-x",
            "tests/e2e/test_harness.py::test_free_port_is_bindable"
        ]));
        assert!(!named(&["-k", "tests"]));
        assert!(!named(&["-k", "produce", "-x"]));
        assert!(!named(&["tests/e2e/no_such_file.py"]));
    }

    #[test]
    fn parses_libtest_result_lines() {
        let line = "test result: FAILED. 12 passed; 2 failed; 3 ignored; 0 measured; 0 filtered out; finished in 0.21s";
        assert_eq!(
            CargoTestResult::parse(line),
            Some(CargoTestResult {
                passed: 12,
                failed: 2,
                ignored: 3
            })
        );
        assert_eq!(CargoTestResult::parse("running 3 tests"), None);
    }

    #[test]
    fn parses_pytest_summary_lines() {
        let line = "======= 2 failed, 10 passed, 1 skipped, 3 warnings in 12.34s (0:00:12) =======";
        assert_eq!(
            PytestSummary::parse(line),
            Some(PytestSummary {
                passed: 10,
                failed: 2,
                skipped: 1
            })
        );
        assert_eq!(
            PytestSummary::parse("1 passed, 1 error in 0.01s"),
            Some(PytestSummary {
                passed: 1,
                failed: 1,
                skipped: 0
            })
        );
        assert_eq!(
            PytestSummary::parse("== test session starts in here =="),
            None
        );
        assert_eq!(
            PytestSummary::parse("tests/e2e/test_kcat.py::test_x PASSED"),
            None
        );
    }
}
