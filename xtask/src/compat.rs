//! `cargo xtask compat`: third-party client families against real `rill` servers, one
//! summary table per run (`tests/compat/README.md` is the contract).
//!
//! A family is a directory `tests/compat/<family>/` with an executable `run` (bash, or
//! Python started with the e2e venv's interpreter when its first line names python). It is
//! called with `RILL_BIN`, `RILL_COMPAT_MODE` (`quick` or `full`), `RILL_COMPAT_OUT` (the
//! JSON report it must write), `RILL_COMPAT_CACHE` (`target/compat-cache`, kept between
//! runs) and `RILL_PYTHON`, starts its own servers on free loopback ports, and exits 0 when
//! every test it requires passed. Failures it knows about (`"known": true`, or a reason that
//! starts with "known"/"expected") are listed with their reasons and counted like pytest's
//! xfails; anything else failed, a missing report, or a non-zero exit fails the family.
//!
//! `cargo xtask test` runs every family in quick mode after pytest (`quick`); `cargo xtask
//! compat [--family NAME]... [--quick]` runs them in full mode by default.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Deserialize;

use crate::test::{apt_install, apt_usable, banner, cargo_program, ensure_venv, find_on_path};

const USAGE: &str = "usage: cargo xtask compat [--family NAME]... [--quick] [--list]";
const COMPAT_DIR: &str = "tests/compat";
/// Downloads (Maven's local repository, built programs) and run directories; under the
/// workspace's `target/` like the e2e venv, so engineers with private target dirs share it.
const CACHE_DIR: &str = "target/compat-cache";
/// A family that runs longer than this is killed (its process group) and fails: quick mode
/// is meant to take seconds, full mode minutes.
const QUICK_LIMIT: Duration = Duration::from_secs(15 * 60);
const FULL_LIMIT: Duration = Duration::from_secs(90 * 60);

#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Mode {
    Quick,
    Full,
}

impl Mode {
    fn as_str(self) -> &'static str {
        match self {
            Mode::Quick => "quick",
            Mode::Full => "full",
        }
    }
}

/// Counts over every family, added to `cargo xtask test`'s tally.
#[derive(Default, Debug, PartialEq)]
pub(crate) struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub known: u64,
    pub skipped: u64,
}

/// The report a runner writes (fields beyond these are ignored).
#[derive(Deserialize, Debug)]
struct Report {
    #[serde(default)]
    results: Vec<TestResult>,
}

#[derive(Deserialize, Debug, Clone)]
struct TestResult {
    name: String,
    outcome: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    known: bool,
}

impl TestResult {
    fn is_known_failure(&self) -> bool {
        let reason = self.reason.trim_start().to_ascii_lowercase();
        self.outcome == "failed"
            && (self.known || reason.starts_with("known") || reason.starts_with("expected"))
    }
}

/// One family's outcome as xtask judges it.
struct FamilyOutcome {
    family: String,
    counts: Counts,
    seconds: f64,
    /// Failures, known failures and skips, with their reasons, for the list after the table.
    notes: Vec<TestResult>,
}

impl FamilyOutcome {
    fn ok(&self) -> bool {
        self.counts.failed == 0
    }
}

pub fn run(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let mut families = Vec::new();
    let mut mode = Mode::Full;
    let mut list = false;
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--family" => families.push(rest.next().context("--family needs a NAME")?.clone()),
            "--quick" => mode = Mode::Quick,
            "--list" => list = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    let available = discover(root)?;
    if list {
        available.iter().for_each(|family| println!("{family}"));
        return Ok(());
    }
    for family in &families {
        if !available.contains(family) {
            bail!(
                "no family {family:?} under {COMPAT_DIR} (have: {})",
                available.join(", ")
            );
        }
    }
    let selected = if families.is_empty() {
        available
    } else {
        families
    };
    let rill_bin = crate::test::rill_binary(root, &cargo_program())?;
    let python = ensure_venv(root)?;
    let started = Instant::now();
    let outcomes = run_families(root, &selected, mode, &rill_bin, &python)?;
    let total = print_summary(&outcomes, mode);
    let elapsed = started.elapsed().as_secs();
    println!(
        "xtask compat ({}) in {}m{:02}s",
        mode.as_str(),
        elapsed / 60,
        elapsed % 60
    );
    println!(
        "compat: {} passed, {} failed, {} skipped",
        total.passed + total.known,
        total.failed,
        total.skipped
    );
    if total.failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// `cargo xtask librdkafka-suite [--quick] [NUMBER]...`: the `librdkafka` family alone, in
/// full mode unless `--quick`, limited to the given test numbers (`0011 0030`) when any
/// are given; the runner reads them from `RILL_LIBRDKAFKA_TESTS`.
pub fn librdkafka_suite(root: &Path, args: &[String]) -> anyhow::Result<()> {
    let mut compat_args = vec!["--family".to_string(), "librdkafka".to_string()];
    let mut numbers = Vec::new();
    for arg in args {
        match arg.as_str() {
            "--quick" => compat_args.push(arg.clone()),
            "-h" | "--help" => {
                println!("usage: cargo xtask librdkafka-suite [--quick] [NUMBER]...");
                return Ok(());
            }
            number if number.len() == 4 && number.bytes().all(|b| b.is_ascii_digit()) => {
                numbers.push(number.to_string())
            }
            other => bail!("{other:?} is not a test number (four digits, e.g. 0011)"),
        }
    }
    if !numbers.is_empty() {
        // Read by the runner, which this process starts (xtask runs single-threaded here).
        std::env::set_var("RILL_LIBRDKAFKA_TESTS", numbers.join(","));
    }
    run(root, &compat_args)
}

/// The quick step of `cargo xtask test`: every family in quick mode. Returns the counts
/// for the tally and the names of the families that failed (after printing the table).
pub(crate) fn quick(
    root: &Path,
    rill_bin: &Path,
    python: &Path,
) -> anyhow::Result<(Counts, Vec<String>)> {
    let families = discover(root)?;
    let outcomes = run_families(root, &families, Mode::Quick, rill_bin, python)?;
    let total = print_summary(&outcomes, Mode::Quick);
    let failed = outcomes
        .iter()
        .filter(|outcome| !outcome.ok())
        .map(|outcome| outcome.family.clone())
        .collect();
    Ok((total, failed))
}

/// Family names: the directories of `tests/compat` that hold an executable `run`.
fn discover(root: &Path) -> anyhow::Result<Vec<String>> {
    let dir = root.join(COMPAT_DIR);
    let mut families = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        if entry.path().join("run").is_file() {
            families.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    families.sort();
    Ok(families)
}

fn run_families(
    root: &Path,
    families: &[String],
    mode: Mode,
    rill_bin: &Path,
    python: &Path,
) -> anyhow::Result<Vec<FamilyOutcome>> {
    let cache = root.join(CACHE_DIR);
    std::fs::create_dir_all(cache.join("reports"))
        .with_context(|| format!("creating {}", cache.display()))?;
    ensure_java();
    let mut outcomes = Vec::new();
    for family in families {
        outcomes.push(run_family(root, family, mode, rill_bin, python, &cache)?);
    }
    Ok(outcomes)
}

/// Java 17 and Maven for the JVM families: the project's machines have them; a fresh
/// Debian machine gets them from apt when we are root. When they cannot be had, the JVM
/// families report a failed `prerequisites` test (never a silent skip). `cargo xtask test`
/// calls it early too when the codegen's spec jars must be fetched.
pub(crate) fn ensure_java() {
    let missing = || {
        ["java", "javac", "mvn"]
            .iter()
            .any(|tool| find_on_path(tool).is_none())
    };
    if !missing() {
        return;
    }
    banner("Java 17 and Maven");
    if apt_usable() {
        println!(
            "    java/javac/mvn missing; installing openjdk-17-jdk-headless and maven with apt-get"
        );
        let _ = apt_install("openjdk-17-jdk-headless") && apt_install("maven");
    }
    if missing() {
        println!("    WARNING: java/javac/mvn unavailable; the Java families will FAIL their prerequisites");
    }
}

fn run_family(
    root: &Path,
    family: &str,
    mode: Mode,
    rill_bin: &Path,
    python: &Path,
    cache: &Path,
) -> anyhow::Result<FamilyOutcome> {
    let runner = root.join(COMPAT_DIR).join(family).join("run");
    banner(&format!("compat {family} ({})", mode.as_str()));
    let out = cache.join("reports").join(format!("{family}.json"));
    let _ = std::fs::remove_file(&out);
    let mut command = if is_python(&runner) {
        let mut command = Command::new(python);
        command.arg(&runner);
        command
    } else {
        Command::new(&runner)
    };
    command
        .current_dir(root)
        .env("RILL_BIN", rill_bin)
        .env("RILL_COMPAT_MODE", mode.as_str())
        .env("RILL_COMPAT_OUT", &out)
        .env("RILL_COMPAT_CACHE", cache)
        .env("RILL_PYTHON", python)
        .env("PYTHONUNBUFFERED", "1")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        // Its own process group, so that a runner over its time limit is stopped whole.
        .process_group(0);
    let limit = match mode {
        Mode::Quick => QUICK_LIMIT,
        Mode::Full => FULL_LIMIT,
    };
    let started = Instant::now();
    let status =
        wait_with_limit(command, limit).with_context(|| format!("running {}", runner.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    let report = std::fs::read_to_string(&out)
        .map_err(|error| format!("wrote no report at {} ({error})", out.display()))
        .and_then(|text| {
            serde_json::from_str::<Report>(&text)
                .map_err(|error| format!("wrote an unreadable report ({error})"))
        });
    let outcome = judge(family, status, report, seconds);
    println!(
        "    ({family}: {seconds:.1}s; {} passed, {} failed, {} known, {} skipped)",
        outcome.counts.passed, outcome.counts.failed, outcome.counts.known, outcome.counts.skipped
    );
    Ok(outcome)
}

/// How a runner ended: its exit code, or why it has none.
#[derive(Debug)]
enum Ended {
    Exited(Option<i32>),
    TimedOut(Duration),
}

fn wait_with_limit(mut command: Command, limit: Duration) -> anyhow::Result<Ended> {
    let mut child = command.spawn().context("could not start the runner")?;
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Ended::Exited(status.code()));
        }
        if started.elapsed() > limit {
            // The group: the runner and whatever it started (java tools, clients).
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Ended::TimedOut(limit));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn judge(
    family: &str,
    ended: Ended,
    report: Result<Report, String>,
    seconds: f64,
) -> FamilyOutcome {
    let mut counts = Counts::default();
    let mut notes = Vec::new();
    let results = match &report {
        Ok(report) => report.results.clone(),
        Err(_) => Vec::new(),
    };
    for result in results {
        match result.outcome.as_str() {
            "passed" => counts.passed += 1,
            "skipped" => {
                counts.skipped += 1;
                notes.push(result);
            }
            "failed" if result.is_known_failure() => {
                counts.known += 1;
                notes.push(result);
            }
            _ => {
                counts.failed += 1;
                notes.push(result);
            }
        }
    }
    let mut runner_failures = Vec::new();
    if let Err(reason) = &report {
        runner_failures.push(reason.clone());
    } else if counts.passed + counts.failed + counts.known + counts.skipped == 0 {
        runner_failures.push("reported no tests".to_string());
    }
    match ended {
        Ended::Exited(Some(0)) => {}
        Ended::Exited(code) if counts.failed == 0 && runner_failures.is_empty() => {
            runner_failures.push(format!("exited {code:?} although no failure was reported"))
        }
        Ended::Exited(_) => {}
        Ended::TimedOut(limit) => {
            runner_failures.push(format!("killed after {}s", limit.as_secs()))
        }
    }
    for reason in runner_failures {
        counts.failed += 1;
        notes.push(TestResult {
            name: "(runner)".to_string(),
            outcome: "failed".to_string(),
            reason,
            known: false,
        });
    }
    FamilyOutcome {
        family: family.to_string(),
        counts,
        seconds,
        notes,
    }
}

fn is_python(runner: &Path) -> bool {
    std::fs::read_to_string(runner)
        .ok()
        .and_then(|text| text.lines().next().map(|line| line.contains("python")))
        .unwrap_or(false)
}

/// The table, then every failure, known failure and skip with its reason; returns the sum.
fn print_summary(outcomes: &[FamilyOutcome], mode: Mode) -> Counts {
    let mut total = Counts::default();
    let mut total_seconds = 0.0;
    println!("\ncompat summary ({} mode)", mode.as_str());
    let width = outcomes
        .iter()
        .map(|o| o.family.len())
        .max()
        .unwrap_or(6)
        .max(6);
    println!(
        "  {:width$}  {:>6}  {:>6}  {:>5}  {:>7}  {:>7}",
        "family", "passed", "failed", "known", "skipped", "seconds"
    );
    for outcome in outcomes {
        let c = &outcome.counts;
        println!(
            "  {:width$}  {:>6}  {:>6}  {:>5}  {:>7}  {:>7.1}",
            outcome.family, c.passed, c.failed, c.known, c.skipped, outcome.seconds
        );
        total.passed += c.passed;
        total.failed += c.failed;
        total.known += c.known;
        total.skipped += c.skipped;
        total_seconds += outcome.seconds;
    }
    println!(
        "  {:width$}  {:>6}  {:>6}  {:>5}  {:>7}  {:>7.1}",
        "total", total.passed, total.failed, total.known, total.skipped, total_seconds
    );
    for outcome in outcomes {
        for note in &outcome.notes {
            let kind = if note.outcome == "failed" && note.is_known_failure() {
                "KNOWN"
            } else {
                &note.outcome.to_ascii_uppercase()
            };
            let reason: String = note.reason.lines().take(3).collect::<Vec<_>>().join(" | ");
            let reason: String = reason.chars().take(400).collect();
            println!("  {kind:7} {} / {}: {reason}", outcome.family, note.name);
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(name: &str, outcome: &str, reason: &str, known: bool) -> TestResult {
        TestResult {
            name: name.to_string(),
            outcome: outcome.to_string(),
            reason: reason.to_string(),
            known,
        }
    }

    fn report(results: Vec<TestResult>) -> Result<Report, String> {
        Ok(Report { results })
    }

    #[test]
    fn known_failures_count_apart_and_do_not_fail_the_family() {
        let outcome = judge(
            "f",
            Ended::Exited(Some(0)),
            report(vec![
                result("a", "passed", "", false),
                result("b", "failed", "issue #19", true),
                result("c", "failed", "Known: issue #16", false),
                result("d", "skipped", "needs kerberos", false),
            ]),
            1.0,
        );
        assert_eq!(
            outcome.counts,
            Counts {
                passed: 1,
                failed: 0,
                known: 2,
                skipped: 1
            }
        );
        assert!(outcome.ok());
        assert_eq!(outcome.notes.len(), 3);
    }

    #[test]
    fn an_unknown_failure_fails_even_when_the_runner_exits_zero() {
        let outcome = judge(
            "f",
            Ended::Exited(Some(0)),
            report(vec![result("a", "failed", "boom", false)]),
            1.0,
        );
        assert_eq!(outcome.counts.failed, 1);
        assert!(!outcome.ok());
    }

    #[test]
    fn a_missing_report_an_empty_one_a_bad_exit_or_a_timeout_fail() {
        let missing = judge("f", Ended::Exited(Some(0)), Err("no report".into()), 1.0);
        assert!(!missing.ok());
        let empty = judge("f", Ended::Exited(Some(0)), report(vec![]), 1.0);
        assert!(!empty.ok());
        let passed = vec![result("a", "passed", "", false)];
        let bad_exit = judge("f", Ended::Exited(Some(3)), report(passed.clone()), 1.0);
        assert_eq!(bad_exit.counts.failed, 1);
        let killed = judge("f", Ended::Exited(None), report(passed.clone()), 1.0);
        assert!(!killed.ok());
        let timed_out = judge("f", Ended::TimedOut(QUICK_LIMIT), report(passed), 1.0);
        assert!(!timed_out.ok());
    }

    #[test]
    fn every_family_directory_has_an_executable_runner() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let families = discover(root).unwrap();
        assert!(
            families.contains(&"java-client".to_string()),
            "{families:?}"
        );
        for family in families {
            let runner = root.join(COMPAT_DIR).join(&family).join("run");
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&runner).unwrap().permissions().mode();
            assert!(mode & 0o111 != 0, "{} is not executable", runner.display());
        }
    }
}
