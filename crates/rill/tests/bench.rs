//! `rill bench` against a real `rill server`: `produce` and `consume` report every record
//! and positive rates, `e2e` a produce-to-consume latency with nothing missing, `txn` both
//! producers, the commit latencies and both isolation levels' reads; and `limits` (no
//! server) four positive ceilings.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test harness: a failure is a test failure

mod support;

use std::process::Command;

use support::{rill_json, start_server, TempDir, RILL};

fn bench(bootstrap: &str, args: &[&str]) -> serde_json::Value {
    let args: Vec<&str> = std::iter::once("bench")
        .chain(args.iter().copied())
        .collect();
    rill_json(bootstrap, &args)
}

#[test]
fn bench_produce_then_consume() {
    let server = start_server(&[]);
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
    let server = start_server(&[]);
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
    let server = start_server(&[]);
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
