//! `rill consume TOPIC`: print records, in a group or from chosen partitions.
//!
//! In a group (`--group`) the consumer subscribes and commits the offsets of the records
//! it printed, after each batch, so that `--max-messages N` leaves the group exactly N
//! records further (records fetched but not printed are not committed). Without a group
//! it reads every partition (or `--partition`) from `--offset`, `--from-beginning`, or
//! the end.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use rill_client::{
    Admin, AutoOffsetReset, Consumer, ConsumerConfig, ConsumerRecord, OffsetSpec, TopicPartition,
};
use serde_json::json;

use super::Common;

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The value alone.
    Value,
    /// Partition, offset, timestamp, key and value, tab-separated.
    Full,
}

#[derive(Args, Debug)]
pub struct ConsumeArgs {
    pub topic: String,
    /// Consumer group to join (offsets are committed to it).
    #[arg(long, short = 'g')]
    pub group: Option<String>,
    /// Start from the earliest offset when there is no committed one.
    #[arg(long)]
    pub from_beginning: bool,
    /// Exit after this many records.
    #[arg(long, short = 'n')]
    pub max_messages: Option<u64>,
    /// Read only this partition (no group).
    #[arg(long, short = 'p')]
    pub partition: Option<i32>,
    /// Start offset: a number, earliest or latest (no group).
    #[arg(long, short = 'o')]
    pub offset: Option<String>,
    /// How to print each record (with --output table).
    #[arg(long, value_enum, default_value_t = Format::Value)]
    pub format: Format,
    /// Exit when no record arrived for this long.
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// Partition assignment strategy in a group (range, roundrobin, sticky, cooperative-sticky).
    #[arg(long, default_value = "range")]
    pub assignor: String,
    /// The group protocol: classic, or consumer (KIP-848: the coordinator assigns, with
    /// the --remote-assignor it names, uniform or range).
    #[arg(long, default_value = "classic")]
    pub group_protocol: String,
    /// With --group-protocol consumer: the coordinator's assignor (uniform or range).
    #[arg(long)]
    pub remote_assignor: Option<String>,
}

pub async fn run(common: &Common, args: ConsumeArgs) -> anyhow::Result<()> {
    let mut config = ConsumerConfig::new(common.client()?).enable_auto_commit(false);
    config.auto_offset_reset = if args.from_beginning {
        AutoOffsetReset::Earliest
    } else {
        AutoOffsetReset::Latest
    };
    config.assignors = args
        .assignor
        .split(',')
        .map(str::parse)
        .collect::<Result<Vec<_>, _>>()?;
    config.group_protocol = args.group_protocol.parse()?;
    config.group_remote_assignor = args.remote_assignor.clone();
    if let Some(g) = &args.group {
        if args.partition.is_some() || args.offset.is_some() {
            anyhow::bail!("--partition and --offset read without a group; drop --group");
        }
        config = config.group_id(g.clone());
    }
    let mut consumer = Consumer::new(config)?;
    if args.group.is_some() {
        consumer.subscribe(&[args.topic.as_str()])?;
    } else {
        let admin = Admin::new(common.client()?)?;
        let partitions = match args.partition {
            Some(p) => vec![TopicPartition::new(&args.topic, p)],
            None => admin.partitions_of(&args.topic).await?,
        };
        consumer.assign(&partitions)?;
        let start =
            match args.offset.as_deref() {
                None if args.from_beginning => Start::Spec(OffsetSpec::Earliest),
                None | Some("latest" | "end") => Start::Spec(OffsetSpec::Latest),
                Some("earliest" | "beginning") => Start::Spec(OffsetSpec::Earliest),
                Some(n) => Start::Offset(n.parse().map_err(|_| {
                    anyhow::anyhow!("--offset must be a number, earliest or latest")
                })?),
            };
        match start {
            Start::Spec(spec) => consumer.seek_to(&partitions, spec).await?,
            Start::Offset(o) => {
                for tp in &partitions {
                    consumer.seek(tp, o)?;
                }
            }
        }
    }
    let result = consume(common, &args, &mut consumer).await;
    let closed = consumer.close().await;
    result?;
    closed?;
    Ok(())
}

enum Start {
    Spec(OffsetSpec),
    Offset(i64),
}

async fn consume(
    common: &Common,
    args: &ConsumeArgs,
    consumer: &mut Consumer,
) -> anyhow::Result<()> {
    let mut printed: u64 = 0;
    let max = args.max_messages.unwrap_or(u64::MAX);
    let idle = args.timeout_ms.map(Duration::from_millis);
    let mut last_record = Instant::now();
    let stdout = std::io::stdout();
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    // Partitions with records fetched but not printed (the batch --max-messages cut):
    // their position is ahead of what was consumed.
    let mut unprinted: BTreeSet<TopicPartition> = BTreeSet::new();
    while printed < max {
        let records = tokio::select! {
            r = consumer.poll(Duration::from_millis(500)) => r?,
            _ = &mut ctrl_c => break,
        };
        if records.is_empty() {
            if idle.is_some_and(|d| last_record.elapsed() >= d) {
                break;
            }
            continue;
        }
        last_record = Instant::now();
        let take = usize::try_from(max - printed)
            .unwrap_or(usize::MAX)
            .min(records.len());
        let mut out = stdout.lock();
        let mut commit: BTreeMap<TopicPartition, i64> = BTreeMap::new();
        for r in &records[..take] {
            write_record(&mut out, common, args.format, r)?;
            commit.insert(
                TopicPartition::new(r.topic.clone(), r.partition),
                r.offset + 1,
            );
        }
        out.flush()?;
        drop(out);
        for r in &records[take..] {
            unprinted.insert(TopicPartition::new(r.topic.clone(), r.partition));
        }
        printed += take as u64;
        if args.group.is_some() {
            // Auto-commit is off: only printed records count as consumed (the loop ends
            // right after a batch cut short by --max-messages).
            consumer.commit_offsets(&commit).await?;
        }
    }
    if args.group.is_some() {
        // Every other assigned partition is consumed up to its position, including the
        // ones that had nothing to read, so that `rill group describe` shows them all.
        let rest: BTreeMap<TopicPartition, i64> = consumer
            .assignment()
            .into_iter()
            .filter(|tp| !unprinted.contains(tp))
            .filter_map(|tp| consumer.position(&tp).map(|o| (tp, o)))
            .collect();
        consumer.commit_offsets(&rest).await?;
    }
    Ok(())
}

fn text(b: &Option<bytes::Bytes>) -> String {
    b.as_ref()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_else(|| "null".into())
}

fn write_record(
    out: &mut impl Write,
    common: &Common,
    format: Format,
    r: &ConsumerRecord,
) -> std::io::Result<()> {
    if common.json() {
        let headers: serde_json::Map<String, serde_json::Value> = r
            .headers
            .iter()
            .map(|h| {
                (
                    h.key.clone(),
                    json!(h
                        .value
                        .as_ref()
                        .map(|v| String::from_utf8_lossy(v).into_owned())),
                )
            })
            .collect();
        let line = json!({
            "topic": r.topic, "partition": r.partition, "offset": r.offset, "timestamp": r.timestamp,
            "key": r.key.as_ref().map(|k| String::from_utf8_lossy(k).into_owned()),
            "value": r.value.as_ref().map(|v| String::from_utf8_lossy(v).into_owned()),
            "headers": headers,
        });
        return writeln!(out, "{line}");
    }
    match format {
        Format::Value => writeln!(out, "{}", text(&r.value)),
        Format::Full => writeln!(
            out,
            "{}\t{}\t{}\t{}\t{}",
            r.partition,
            r.offset,
            r.timestamp,
            text(&r.key),
            text(&r.value)
        ),
    }
}
