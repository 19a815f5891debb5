//! The integration tests' harness: a real `rill server` on a free loopback port with its
//! own data directory, killed and removed however the test ends.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const RILL: &str = env!("CARGO_BIN_EXE_rill");

/// Kills the server however the test ends.
struct ServerGuard(Child);

impl Drop for ServerGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A data directory removed at the end (no dev-dependency for one directory).
pub struct TempDir(pub std::path::PathBuf);

impl TempDir {
    pub fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let path = std::env::temp_dir().join(format!("rill-it-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `rill server` on a free loopback port with its own data directory.
pub struct Server {
    pub bootstrap: String,
    overrides: Vec<String>,
    guard: ServerGuard,
    dir: TempDir,
}

/// The server, with broker settings (`key=value`) on top of the defaults.
pub fn start_server(overrides: &[&str]) -> Server {
    let dir = TempDir::new();
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let overrides: Vec<String> = overrides.iter().map(|o| (*o).to_owned()).collect();
    let guard = spawn(&bootstrap, &dir, &overrides);
    Server {
        bootstrap,
        overrides,
        guard,
        dir,
    }
}

impl Server {
    /// `kill -9` and start again on the same port and data directory.
    #[allow(dead_code, reason = "not every test binary restarts its server")]
    pub fn restart(&mut self) {
        let _ = self.guard.0.kill();
        let _ = self.guard.0.wait();
        self.guard = spawn(&self.bootstrap, &self.dir, &self.overrides);
    }
}

fn spawn(bootstrap: &str, dir: &TempDir, overrides: &[String]) -> ServerGuard {
    let mut guard = ServerGuard(
        Command::new(RILL)
            .args(["server", "--listen", bootstrap, "--data-dir"])
            .arg(&dir.0)
            .args(["--override", "group.initial.rebalance.delay.ms=0"])
            // Off: tests run in parallel and would all take the default 9644.
            .args(["--override", "http.listeners="])
            .args(overrides.iter().flat_map(|o| ["--override", o.as_str()]))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Ready is the `rill listening on` line, printed once the controller has unfenced
    // the broker; the port accepts connections earlier, when a CreateTopics still finds
    // no available broker (INVALID_REPLICATION_FACTOR).
    let stdout = guard.0.stdout.take().unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if line.starts_with("rill listening on") {
                let _ = ready_tx.send(());
            }
        }
    });
    ready_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("server did not start");
    guard
}

/// `rill <args> -b <bootstrap> --output json`, which must succeed; its JSON.
pub fn rill_json(bootstrap: &str, args: &[&str]) -> serde_json::Value {
    let out = Command::new(RILL)
        .args(args)
        .args(["-b", bootstrap, "--output", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rill {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.trim()).unwrap()
}
