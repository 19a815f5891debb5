//! `rill bench limits`: the machine's own ceilings, measured in this process the way the
//! broker would meet them, so that every other `rill bench` result can be read as a
//! fraction of what the machine can do in the same run.
//!
//! Four figures, each measured for `--seconds`:
//! - loopback TCP: one tokio task writes 256 KiB chunks to another over 127.0.0.1, the
//!   path a producer on the same host takes to the broker (bytes read, per second);
//! - sequential writes of 1 MiB chunks to a file in the data directory, once buffered
//!   (the page cache's speed, which an acks=1 produce without flushing meets) and once with
//!   `fdatasync` after every chunk (the disk's, which `flush.messages=1` meets);
//! - memcpy between two 64 MiB buffers, larger than any cache (bytes copied, per second).
//!
//! The scratch file is appended to up to 256 MiB and then truncated and written again, so a
//! run never fills a small disk, and it is removed at the end.

use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::random_pool;
use crate::cli::{print_json, Common};

/// Size of each write, to the socket and to the file.
const TCP_CHUNK_BYTES: usize = 256 << 10;
const FILE_CHUNK_BYTES: usize = 1 << 20;
/// The scratch file is truncated when it reaches this size.
const FILE_BYTES_MAX: u64 = 256 << 20;
/// Each memcpy buffer; larger than the last-level cache of any machine we run on.
const MEMCPY_BYTES: usize = 64 << 20;

#[derive(Args, Debug)]
pub struct LimitsBench {
    /// Directory to write the scratch file in (the broker's data directory).
    #[arg(long, default_value = "./rill-data")]
    pub data_dir: PathBuf,
    /// Seconds for each of the four measurements.
    #[arg(long, default_value_t = 1.5)]
    pub seconds: f64,
}

pub async fn run(common: &Common, args: LimitsBench) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.seconds.is_finite() && args.seconds > 0.0 && args.seconds <= 60.0,
        "--seconds must be in (0, 60]"
    );
    let each = Duration::from_secs_f64(args.seconds);
    let loopback = loopback_tcp(each).await.context("loopback TCP")?;
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    let scratch = args
        .data_dir
        .join(format!("rill-bench-limits-{}.tmp", std::process::id()));
    let disk = {
        let scratch = scratch.clone();
        tokio::task::spawn_blocking(move || -> anyhow::Result<(f64, f64)> {
            let buffered = file_write(&scratch, each, false);
            let synced = file_write(&scratch, each, true);
            let _ = std::fs::remove_file(&scratch);
            Ok((buffered?, synced?))
        })
        .await?
    };
    let (disk_buffered, disk_fdatasync) =
        disk.with_context(|| format!("writing {}", scratch.display()))?;
    let memcpy = tokio::task::spawn_blocking(move || memcpy(each)).await?;

    let mb = |bytes_per_sec: f64| bytes_per_sec / 1e6;
    if common.json() {
        print_json(&json!({
            "seconds_each": args.seconds,
            "data_dir": args.data_dir.display().to_string(),
            "loopback_tcp_mb_per_sec": mb(loopback),
            "disk_write_mb_per_sec": mb(disk_buffered),
            "disk_write_fdatasync_mb_per_sec": mb(disk_fdatasync),
            "memcpy_gb_per_sec": memcpy / 1e9,
        }));
    } else {
        println!(
            "loopback TCP {:.0} MB/s; writes to {} {:.0} MB/s buffered, {:.0} MB/s with \
             fdatasync per MiB; memcpy {:.2} GB/s ({:.1} s each)",
            mb(loopback),
            args.data_dir.display(),
            mb(disk_buffered),
            mb(disk_fdatasync),
            memcpy / 1e9,
            args.seconds
        );
    }
    Ok(())
}

/// Bytes per second that one task writes and another reads over a loopback connection.
async fn loopback_tcp(each: Duration) -> anyhow::Result<f64> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let reader = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await?;
        let mut buf = vec![0u8; TCP_CHUNK_BYTES];
        let mut total = 0u64;
        loop {
            let n = socket.read(&mut buf).await?;
            if n == 0 {
                return anyhow::Ok(total);
            }
            total += n as u64;
        }
    });
    let mut writer = tokio::net::TcpStream::connect(addr).await?;
    writer.set_nodelay(true)?;
    let chunk = random_pool(TCP_CHUNK_BYTES);
    let started = Instant::now();
    while started.elapsed() < each {
        writer.write_all(&chunk).await?;
    }
    writer.shutdown().await?;
    drop(writer);
    // The reader is done when it has read everything written, so the time includes the
    // last bytes in flight.
    let total = reader.await??;
    Ok(total as f64 / started.elapsed().as_secs_f64().max(1e-9))
}

/// Bytes per second appended to `path` in 1 MiB writes, with `fdatasync` after each
/// write when `sync`.
fn file_write(path: &Path, each: Duration, sync: bool) -> anyhow::Result<f64> {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)?;
    let chunk = random_pool(FILE_CHUNK_BYTES);
    let started = Instant::now();
    let (mut total, mut len) = (0u64, 0u64);
    while started.elapsed() < each {
        if len + FILE_CHUNK_BYTES as u64 > FILE_BYTES_MAX {
            // Keeps the scratch file bounded; appending again from empty is what a
            // rolled segment does, so the pattern stays sequential.
            file.set_len(0)?;
            file.rewind()?;
            len = 0;
        }
        file.write_all(&chunk)?;
        if sync {
            file.sync_data()?;
        }
        total += FILE_CHUNK_BYTES as u64;
        len += FILE_CHUNK_BYTES as u64;
    }
    Ok(total as f64 / started.elapsed().as_secs_f64().max(1e-9))
}

/// Bytes per second copied between two buffers too large for any cache.
fn memcpy(each: Duration) -> f64 {
    let src = vec![0x5au8; MEMCPY_BYTES];
    let mut dst = vec![0u8; MEMCPY_BYTES];
    // Touch the destination once so that page faults are not part of the figure.
    dst.copy_from_slice(&src);
    let started = Instant::now();
    let mut total = 0u64;
    while started.elapsed() < each {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
        total += MEMCPY_BYTES as u64;
    }
    total as f64 / started.elapsed().as_secs_f64().max(1e-9)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcpy_is_positive() {
        assert!(memcpy(Duration::from_millis(20)) > 0.0);
    }

    #[test]
    fn file_write_bounded_and_positive() {
        let path =
            std::env::temp_dir().join(format!("rill-bench-limits-unit-{}.tmp", std::process::id()));
        let rate = file_write(&path, Duration::from_millis(20), true);
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        let _ = std::fs::remove_file(&path);
        assert!(rate.is_ok_and(|r| r > 0.0));
        assert!(len <= FILE_BYTES_MAX);
    }
}
