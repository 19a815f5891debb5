//! `rill produce TOPIC`: one record per line of stdin.

use std::collections::VecDeque;
use std::time::Duration;

use clap::Args;
use rill_client::records::CompressionType;
use rill_client::{Acks, DeliveryFuture, Producer, ProducerConfig, ProducerRecord};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{parse_kv, print_json, Common};

/// Deliveries awaited at most this far behind the newest line, so that memory stays
/// bounded however long stdin is.
const MAX_OUTSTANDING: usize = 20_000;

#[derive(Args, Debug)]
pub struct ProduceArgs {
    pub topic: String,
    /// Split each line at the first occurrence of this into key and value.
    #[arg(long)]
    pub key_separator: Option<String>,
    /// Header added to every record, as key=value; repeatable.
    #[arg(long = "header", short = 'H', value_name = "KEY=VALUE")]
    pub headers: Vec<String>,
    /// Write every record to this partition.
    #[arg(long, short = 'p')]
    pub partition: Option<i32>,
    /// none, gzip, snappy, lz4 or zstd.
    #[arg(long, default_value = "none")]
    pub compression: String,
    /// 0, 1 or all.
    #[arg(long, default_value = "all")]
    pub acks: String,
    /// linger.ms.
    #[arg(long, default_value_t = 5)]
    pub linger_ms: u64,
    /// batch.size in bytes.
    #[arg(long, default_value_t = 16384)]
    pub batch_size: usize,
}

pub fn parse_compression(s: &str) -> anyhow::Result<CompressionType> {
    Ok(match s {
        "none" => CompressionType::None,
        "gzip" => CompressionType::Gzip,
        "snappy" => CompressionType::Snappy,
        "lz4" => CompressionType::Lz4,
        "zstd" => CompressionType::Zstd,
        other => anyhow::bail!("unknown compression {other:?} (none, gzip, snappy, lz4, zstd)"),
    })
}

pub async fn run(common: &Common, args: ProduceArgs) -> anyhow::Result<()> {
    let acks: Acks = args.acks.parse()?;
    let config = ProducerConfig::new(common.client()?)
        .compression(parse_compression(&args.compression)?)
        .acks(acks)
        .linger(Duration::from_millis(args.linger_ms))
        .batch_size(args.batch_size);
    let producer = Producer::new(config)?;
    let headers: Vec<(String, String)> = args
        .headers
        .iter()
        .map(|h| parse_kv(h))
        .collect::<anyhow::Result<_>>()?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut outstanding: VecDeque<DeliveryFuture> = VecDeque::new();
    let mut count: u64 = 0;
    let result: anyhow::Result<()> = async {
        while let Some(line) = lines.next_line().await? {
            let mut record = match args
                .key_separator
                .as_deref()
                .and_then(|sep| line.split_once(sep))
            {
                Some((k, v)) => ProducerRecord::new(&args.topic, v.to_string()).key(k.to_string()),
                None => ProducerRecord::new(&args.topic, line),
            };
            if let Some(p) = args.partition {
                record = record.partition(p);
            }
            for (k, v) in &headers {
                record = record.header(k.clone(), v.clone());
            }
            outstanding.push_back(producer.send(record).await?);
            count += 1;
            if outstanding.len() >= MAX_OUTSTANDING {
                if let Some(d) = outstanding.pop_front() {
                    d.await?;
                }
            }
        }
        producer.flush().await?;
        while let Some(d) = outstanding.pop_front() {
            d.await?;
        }
        Ok(())
    }
    .await;
    let closed = producer.close().await;
    result?;
    closed?;
    if common.json() {
        print_json(&json!({ "topic": args.topic, "produced": count }));
    }
    Ok(())
}
