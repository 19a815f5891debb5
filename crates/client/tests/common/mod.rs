//! Spawns a real `rill server` on a free loopback port for the integration tests.
//!
//! The binary comes from `RILL_BIN`, else `target/debug/rill` (or `target/*/debug/rill`)
//! in the workspace; building it is the caller's job. When none exists the tests print
//! why and pass without running, so that `cargo test -p rill-client` alone stays green.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct RillServer {
    pub child: Child,
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl RillServer {
    /// Starts a server, or returns `None` (after saying why) when no binary is found.
    pub fn start() -> Option<Self> {
        Self::start_with(&[])
    }

    pub fn start_with(overrides: &[&str]) -> Option<Self> {
        let Some(bin) = find_binary() else {
            eprintln!("SKIPPED: no rill binary (set RILL_BIN or run `cargo build -p rill`)");
            return None;
        };
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(&bin);
        cmd.args(["server", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(dir.path())
            .args(["--override", "group.initial.rebalance.delay.ms=0"])
            // Off: tests run in parallel and would all take the default 9644.
            .args(["--override", "http.listeners="]);
        for o in overrides {
            cmd.args(["--override", o]);
        }
        let mut child = cmd
            .env(
                "RILL_LOG",
                std::env::var("RILL_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            while let Some(Ok(line)) = lines.next() {
                if let Some(rest) = line.strip_prefix("rill listening on ") {
                    let addr = rest
                        .split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_string();
                    let _ = tx.send(addr);
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("rill server did not print its ready line");
        Some(Self {
            child,
            addr,
            _dir: dir,
        })
    }

    pub fn pid(&self) -> String {
        self.child.id().to_string()
    }

    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill").args([sig, &self.pid()]).status();
    }

    /// SIGSTOP, then waits until every thread of the server is stopped: `kill` returns
    /// once the signal is queued, and a thread running on another core may still answer
    /// a request in the meantime.
    pub fn stop(&self) {
        self.signal("-STOP");
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let task_dir = format!("/proc/{}/task", self.pid());
        while std::time::Instant::now() < deadline {
            let all_stopped = std::fs::read_dir(&task_dir)
                .map(|entries| {
                    entries.flatten().all(|e| {
                        std::fs::read_to_string(e.path().join("stat"))
                            .ok()
                            .and_then(|s| {
                                s.rsplit_once(')')
                                    .map(|(_, rest)| rest.trim_start().starts_with('T'))
                            })
                            .unwrap_or(true)
                    })
                })
                .unwrap_or(true);
            if all_stopped {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for RillServer {
    fn drop(&mut self) {
        self.signal("-CONT");
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn find_binary() -> Option<PathBuf> {
    if let Ok(bin) = std::env::var("RILL_BIN") {
        let p = PathBuf::from(bin);
        return p.exists().then_some(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"));
    [target.join("debug/rill"), root.join("target/debug/rill")]
        .into_iter()
        .find(|p| p.exists())
}
