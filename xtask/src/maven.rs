//! Artifacts of Maven Central in the local Maven repository: where a jar lives there, and
//! `mvn dependency:get` to fetch it when it is missing.
//!
//! The code generator reads the share-group family of Kafka's message specs out of Kafka's
//! published jars (`codegen.rs` says which and why). A developer's machine usually has them
//! already; a clean CI machine gets them here, with the Maven that `cargo xtask test`
//! installs (Debian's `maven`) before anything needs them. Nothing is fetched when the jar is
//! present, so a machine that has the jars needs neither Maven nor the network.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::test::find_on_path;

/// One `mvn dependency:get` may take this long (a cold Maven downloads its dependency
/// plugin first, some seconds here); beyond it a hung registry fails the run.
const FETCH_LIMIT: Duration = Duration::from_secs(10 * 60);

/// A jar on Maven Central, by its coordinates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Artifact {
    pub group: &'static str,
    pub artifact: &'static str,
    pub version: &'static str,
}

impl Artifact {
    /// `group:artifact:version`, as `mvn dependency:get -Dartifact=` takes it.
    pub fn coordinates(&self) -> String {
        format!("{}:{}:{}", self.group, self.artifact, self.version)
    }

    /// `kafka-clients-4.2.2.jar`.
    pub fn jar_name(&self) -> String {
        format!("{}-{}.jar", self.artifact, self.version)
    }

    /// Where Maven keeps the jar under the local repository `repo`.
    pub fn path_in(&self, repo: &Path) -> PathBuf {
        let mut path = repo.to_path_buf();
        path.extend(self.group.split('.'));
        path.push(self.artifact);
        path.push(self.version);
        path.push(self.jar_name());
        path
    }

    /// The command that puts the jar into `repo`.
    fn fetch_command(&self, repo: &Path) -> Vec<String> {
        vec![
            "-B".into(),
            "-q".into(),
            format!("-Dmaven.repo.local={}", repo.display()),
            "dependency:get".into(),
            "-Dtransitive=false".into(),
            format!("-Dartifact={}", self.coordinates()),
        ]
    }
}

/// Maven's default local repository, `~/.m2/repository`. Every fetch here names it with
/// `-Dmaven.repo.local`, so a `settings.xml` that moves the repository elsewhere cannot make
/// us look in one place and fetch into another.
pub fn local_repository() -> anyhow::Result<PathBuf> {
    let home = std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .context("HOME is not set: cannot find the local Maven repository (~/.m2/repository)")?;
    Ok(PathBuf::from(home).join(".m2").join("repository"))
}

/// Whether every artifact's jar is in the local repository.
pub fn all_present(artifacts: &[Artifact]) -> anyhow::Result<bool> {
    let repo = local_repository()?;
    Ok(artifacts.iter().all(|a| a.path_in(&repo).is_file()))
}

/// Makes sure every artifact's jar is in the local repository, fetching the missing ones
/// with `mvn dependency:get` (one retry: a registry hiccup should not fail a run), and
/// returns their paths in the order given. Fails with the command to run when `mvn` is not
/// on `PATH`.
pub fn ensure(artifacts: &[Artifact]) -> anyhow::Result<Vec<PathBuf>> {
    // Tests of one process (the freshness test and the jar test) may ask at once: one mvn
    // at a time, and the second finds the jar the first fetched.
    static FETCHING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = FETCHING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let repo = local_repository()?;
    let mut paths = Vec::with_capacity(artifacts.len());
    for artifact in artifacts {
        let path = artifact.path_in(&repo);
        if !path.is_file() {
            fetch(artifact, &repo)?;
            if !path.is_file() {
                bail!(
                    "`mvn {}` succeeded but {} is not there",
                    artifact.fetch_command(&repo).join(" "),
                    path.display()
                );
            }
        }
        paths.push(path);
    }
    Ok(paths)
}

fn fetch(artifact: &Artifact, repo: &Path) -> anyhow::Result<()> {
    let args = artifact.fetch_command(repo);
    let Some(mvn) = find_on_path("mvn") else {
        bail!(
            "{} is not in the local Maven repository ({}) and `mvn` is not on PATH: install \
             Maven and Java 17 (Debian: apt-get install maven openjdk-17-jdk-headless; \
             `cargo xtask test` does it when run as root), then run `mvn {}`",
            artifact.jar_name(),
            repo.display(),
            args.join(" ")
        );
    };
    eprintln!(
        "maven: fetching {} into {}",
        artifact.coordinates(),
        repo.display()
    );
    let mut last = String::new();
    for _attempt in 0..2 {
        let mut command = Command::new(&mvn);
        command
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match run_with_limit(command, FETCH_LIMIT)? {
            Ok(()) => return Ok(()),
            Err(output) => last = output,
        }
    }
    bail!(
        "`mvn {}` failed twice; its output:\n{}",
        args.join(" "),
        tail(&last, 4000)
    )
}

/// Runs `command` for at most `limit`; `Err(output)` when it fails or runs too long.
fn run_with_limit(mut command: Command, limit: Duration) -> anyhow::Result<Result<(), String>> {
    let mut child = command.spawn().context("could not start mvn")?;
    // Maven's output is small with -q; read it on threads so a full pipe cannot stall it.
    let out = child.stdout.take().map(read_on_thread);
    let err = child.stderr.take().map(read_on_thread);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut output = String::new();
    for handle in [out, err].into_iter().flatten() {
        output.push_str(&handle.join().unwrap_or_default());
    }
    Ok(match status {
        Some(s) if s.success() => Ok(()),
        Some(s) => Err(format!("({s})\n{output}")),
        None => Err(format!("(killed after {}s)\n{output}", limit.as_secs())),
    })
}

fn read_on_thread<R: std::io::Read + Send + 'static>(
    mut from: R,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = from.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

fn tail(text: &str, chars: usize) -> &str {
    let skip = text.chars().count().saturating_sub(chars);
    text.char_indices()
        .nth(skip)
        .map_or(text, |(at, _)| &text[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jar_paths_follow_maven_layout() {
        let a = Artifact {
            group: "org.apache.kafka",
            artifact: "kafka-clients",
            version: "4.2.2",
        };
        assert_eq!(a.coordinates(), "org.apache.kafka:kafka-clients:4.2.2");
        assert_eq!(
            a.path_in(Path::new("/r")),
            Path::new("/r/org/apache/kafka/kafka-clients/4.2.2/kafka-clients-4.2.2.jar")
        );
    }

    #[test]
    fn tail_keeps_the_end() {
        assert_eq!(tail("abcdef", 2), "ef");
        assert_eq!(tail("ab", 5), "ab");
    }
}
