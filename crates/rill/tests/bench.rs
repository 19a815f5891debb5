//! `rill bench` against a real `rill server`: `produce` and `consume` report every record
//! and positive rates, `e2e` a produce-to-consume latency with nothing missing, `txn` both
//! producers, the commit latencies and both isolation levels' reads; and `limits` (no
//! server) four positive ceilings.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test harness: a failure is a test failure

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const RILL: &str = env!("CARGO_BIN_EXE_rill");

/// Kills the server however the test ends.
struct ServerGuard(Child);

impl Drop for ServerGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A data directory removed at the end (no dev-dependency for one directory).
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let path =
            std::env::temp_dir().join(format!("rill-bench-test-{}-{nanos}", std::process::id()));
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

fn bench(bootstrap: &str, args: &[&str]) -> serde_json::Value {
    let out = Command::new(RILL)
        .arg("bench")
        .args(args)
        .args(["-b", bootstrap, "--output", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rill bench {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.trim()).unwrap()
}

/// A `rill server` on a free loopback port with its own data directory.
struct Server {
    bootstrap: String,
    _guard: ServerGuard,
    _dir: TempDir,
}

fn start_server() -> Server {
    let dir = TempDir::new();
    let port = free_port();
    let bootstrap = format!("127.0.0.1:{port}");
    let mut guard = ServerGuard(
        Command::new(RILL)
            .args(["server", "--listen", &bootstrap, "--data-dir"])
            .arg(&dir.0)
            .args(["--override", "group.initial.rebalance.delay.ms=0"])
            // Off: tests run in parallel and would all take the default 9644.
            .args(["--override", "http.listeners="])
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
    Server {
        bootstrap,
        _guard: guard,
        _dir: dir,
    }
}

#[test]
fn bench_produce_then_consume() {
    let server = start_server();
    let bootstrap = &server.bootstrap;

    let produced = bench(
        bootstrap,
        &[
            "produce",
            "--topic",
            "bench",
            "--records",
            "2000",
            "--record-size",
            "100",
            "--acks",
            "1",
        ],
    );
    assert_eq!(produced["records"], 2000, "{produced}");
    assert!(produced["records_per_sec"].as_f64().unwrap() > 0.0);
    assert!(produced["mb_per_sec"].as_f64().unwrap() > 0.0);
    assert!(produced["latency_ms"]["max"].as_f64().unwrap() > 0.0);
    assert!(
        produced["latency_ms"]["p50"].as_f64().unwrap()
            <= produced["latency_ms"]["max"].as_f64().unwrap()
    );
    assert_histogram(&produced, 2000);
    assert!(
        produced["client_cpu_s"].as_f64().unwrap() > 0.0,
        "{produced}"
    );
    assert!(
        produced["client_cpu_s_per_gb"].as_f64().unwrap() > 0.0,
        "{produced}"
    );

    let consumed = bench(
        bootstrap,
        &["consume", "--topic", "bench", "--records", "2000"],
    );
    assert_eq!(consumed["records"], 2000, "{consumed}");
    assert_eq!(consumed["bytes"], 200_000, "{consumed}");
    assert!(consumed["records_per_sec"].as_f64().unwrap() > 0.0);
    assert!(consumed["mb_per_sec"].as_f64().unwrap() > 0.0);
    assert!(
        consumed["client_cpu_s"].as_f64().unwrap() > 0.0,
        "{consumed}"
    );
}

#[test]
fn bench_e2e_reports_latency_and_nothing_missing() {
    let server = start_server();
    let e2e = bench(
        &server.bootstrap,
        &[
            "e2e",
            "--topic",
            "e2e",
            "--rate",
            "200",
            "--duration",
            "2",
            "--record-size",
            "100",
        ],
    );
    assert_eq!(e2e["records_scheduled"], 400, "{e2e}");
    assert_eq!(e2e["records_sent"], 400, "{e2e}");
    assert_eq!(e2e["records_received"], 400, "{e2e}");
    assert_eq!(e2e["missing"], 0, "{e2e}");
    assert_eq!(e2e["duplicates"], 0, "{e2e}");
    assert_eq!(e2e["records_failed"], 0, "{e2e}");
    assert!(e2e["records_per_sec"].as_f64().unwrap() > 0.0, "{e2e}");
    let latency = &e2e["latency_ms"];
    let (p50, p99, max) = (
        latency["p50"].as_f64().unwrap(),
        latency["p99"].as_f64().unwrap(),
        latency["max"].as_f64().unwrap(),
    );
    assert!(max > 0.0, "{e2e}");
    assert!(p50 <= p99 && p99 <= max, "{e2e}");
    assert!(e2e["send_lag_ms"]["max"].as_f64().unwrap() >= 0.0, "{e2e}");
    assert_histogram(&e2e, 400);
}

/// The end-of-run histogram: percentiles ascending to 100, values and counts never
/// falling, and the last row counting every record at the reported maximum.
fn assert_histogram(report: &serde_json::Value, records: u64) {
    let rows = report["latency_histogram"].as_array().unwrap();
    assert!(rows.len() >= 5, "{report}");
    let field = |row: &serde_json::Value, name: &str| row[name].as_f64().unwrap();
    for pair in rows.windows(2) {
        assert!(
            field(&pair[0], "percentile") < field(&pair[1], "percentile"),
            "{report}"
        );
        assert!(field(&pair[0], "ms") <= field(&pair[1], "ms"), "{report}");
        assert!(
            field(&pair[0], "count") <= field(&pair[1], "count"),
            "{report}"
        );
    }
    let last = rows.last().unwrap();
    assert_eq!(field(last, "percentile"), 100.0, "{report}");
    assert_eq!(last["count"], records, "{report}");
    assert_eq!(
        field(last, "ms"),
        report["latency_ms"]["max"].as_f64().unwrap()
    );
    let median = &rows[0];
    assert_eq!(field(median, "percentile"), 50.0, "{report}");
    assert!(field(median, "count") >= records as f64 / 2.0, "{report}");
}

#[test]
fn bench_limits_reports_four_positive_figures() {
    let dir = TempDir::new();
    let out = Command::new(RILL)
        .args([
            "bench",
            "limits",
            "--seconds",
            "0.2",
            "--output",
            "json",
            "--data-dir",
        ])
        .arg(&dir.0)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rill bench limits failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let limits: serde_json::Value =
        serde_json::from_str(String::from_utf8(out.stdout).unwrap().trim()).unwrap();
    for key in [
        "loopback_tcp_mb_per_sec",
        "disk_write_mb_per_sec",
        "disk_write_fdatasync_mb_per_sec",
        "memcpy_gb_per_sec",
    ] {
        assert!(limits[key].as_f64().unwrap() > 0.0, "{key}: {limits}");
    }
    // The scratch file is removed.
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0);
}

#[test]
fn bench_txn_compares_transactions_with_idempotence() {
    let server = start_server();
    let txn = bench(
        &server.bootstrap,
        &[
            "txn",
            "--topic",
            "txn",
            "--records",
            "3000",
            "--record-size",
            "100",
            "--commit-interval-ms",
            "1",
            "--partitions",
            "2",
        ],
    );
    for phase in [
        "idempotent",
        "transactional",
        "read_uncommitted",
        "read_committed",
    ] {
        assert!(
            txn[phase]["records_per_sec"].as_f64().unwrap() > 0.0,
            "{phase}: {txn}"
        );
    }
    // Every record of the committed transactions is read at both isolation levels, twice.
    assert_eq!(txn["read_uncommitted"]["records"], 6000, "{txn}");
    assert_eq!(txn["read_committed"]["records"], 6000, "{txn}");
    // A commit every millisecond: more than the final one.
    let commits = txn["commits"]["count"].as_u64().unwrap();
    assert!(commits > 1, "{txn}");
    let latency = &txn["commits"]["latency_ms"];
    let (p50, max) = (
        latency["p50"].as_f64().unwrap(),
        latency["max"].as_f64().unwrap(),
    );
    assert!(0.0 < p50 && p50 <= max, "{txn}");
    assert!(
        txn["transactional_fraction_of_idempotent"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(
        txn["read_committed_fraction_of_read_uncommitted"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert_histogram(&txn["commits"], commits);
}
