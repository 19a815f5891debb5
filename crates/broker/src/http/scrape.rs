//! What `/metrics` serves: the counters the hot paths keep (`crate::metrics`) and the
//! gauges read from state at scrape time (partition counts from the replica manager and
//! the image, consumer lag and group states from the group coordinator, the process from
//! `/proc/self`), encoded by prometheus-client as one custom collector.
//!
//! Cardinality is bounded: per-partition series (log end offset, under-replicated, lag per
//! group and partition) are served only while this broker hosts at most
//! `metrics.partition.series.max` partitions (default 1000; 0 turns them off); above that
//! the per-topic and per-broker series remain, and lag is served per group and topic.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use rill_protocol::generated::ApiKey;

use crate::config::BrokerConfig;
use crate::coordinator::group_coordinator::{GroupCall, GroupReply, GroupSnapshot};
use crate::error::BrokerError;
use crate::metrics::{self, process, HistogramSnapshot, TopicMetrics};
use crate::server::Broker;
use rill_metadata::{MetadataQuorum, QuorumDescription, ReplicaProgress};

/// The key that bounds per-partition series.
pub const PARTITION_SERIES_MAX_KEY: &str = "metrics.partition.series.max";

/// What the page includes, from the config at start.
#[derive(Debug, Clone)]
pub struct MetricsSettings {
    /// Per-partition series only while this broker hosts at most this many partitions.
    pub partition_series_max: usize,
}

impl MetricsSettings {
    pub fn from_config(config: &BrokerConfig) -> Result<Self, BrokerError> {
        Ok(Self {
            partition_series_max: config.parse(PARTITION_SERIES_MAX_KEY)?,
        })
    }
}

/// The group coordinator's view (empty when it does not answer in time, or at all: it
/// is shutting down).
pub(super) async fn group_snapshot(broker: &Broker) -> GroupSnapshot {
    // Bounded: a coordinator busy loading a partition must not hold a scrape for long;
    // the page is then served without the group series.
    let call = broker.groups.call(GroupCall::Snapshot);
    match tokio::time::timeout(GROUP_SNAPSHOT_TIMEOUT, call).await {
        Ok(Ok(GroupReply::Snapshot(s))) => s,
        _ => GroupSnapshot::default(),
    }
}

/// How long a scrape waits for the group coordinator's answer.
const GROUP_SNAPSHOT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// One partition as the scrape sees it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PartitionView {
    pub topic: String,
    pub partition: i32,
    pub leader_here: bool,
    pub replicas: usize,
    pub isr: usize,
    pub min_insync: usize,
    pub high_watermark: i64,
    pub log_end_offset: i64,
    pub log_start_offset: i64,
    /// Bytes in the partition's segment files, and how many segments it has.
    pub size_bytes: u64,
    pub segments: usize,
    /// A compacted log's dirty ratio, as the cleaner picks the dirtiest log by it.
    pub dirty_ratio: Option<f64>,
    /// A tiered log led here: its closed segments not yet in the remote tier, in bytes
    /// and in number (Kafka's `RemoteCopyLagBytes`, `RemoteCopyLagSegments`).
    pub remote_copy_lag: Option<(u64, usize)>,
    /// When led here: each follower's lag behind this log's end, in records and in
    /// milliseconds since it last had everything (`None`: never caught up in this
    /// leadership, or not fetched yet).
    pub followers: Vec<FollowerLag>,
}

/// One follower of a partition led here, as the leader sees it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct FollowerLag {
    pub replica: i32,
    pub records: i64,
    pub time_ms: Option<i64>,
}

/// The partition gauges of the replica manager, from the hosted partitions.
#[derive(Debug, Default, PartialEq)]
pub(super) struct PartitionCounts {
    pub partitions: u64,
    pub leaders: u64,
    pub under_replicated: u64,
    pub under_min_isr: u64,
    pub at_min_isr: u64,
}

/// Kafka's definitions (`Partition.scala`): under-replicated when this broker leads
/// and the ISR is smaller than the replica set; under min ISR when the ISR is below
/// `min.insync.replicas`; at min ISR when it equals it.
pub(super) fn partition_counts(views: &[PartitionView]) -> PartitionCounts {
    let mut c = PartitionCounts {
        partitions: views.len() as u64,
        ..Default::default()
    };
    for v in views.iter().filter(|v| v.leader_here) {
        c.leaders += 1;
        if v.isr < v.replicas {
            c.under_replicated += 1;
        }
        if v.isr < v.min_insync {
            c.under_min_isr += 1;
        }
        if v.isr == v.min_insync {
            c.at_min_isr += 1;
        }
    }
    c
}

/// One group's lag on one partition: the high watermark (what ListOffsets answers as the
/// latest offset, and what `kafka-consumer-groups.sh` shows as LOG-END-OFFSET) minus the
/// committed offset, never below zero.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Lag {
    pub group: String,
    pub topic: String,
    pub partition: i32,
    pub lag: i64,
}

/// The lag of every committed offset whose partition this broker hosts.
pub(super) fn lags(snapshot: &GroupSnapshot, views: &[PartitionView]) -> Vec<Lag> {
    let ends: BTreeMap<(&str, i32), i64> = views
        .iter()
        .map(|v| ((v.topic.as_str(), v.partition), v.high_watermark))
        .collect();
    snapshot
        .offsets
        .iter()
        .filter_map(|(group, topic, partition, committed)| {
            let end = ends.get(&(topic.as_str(), *partition))?;
            Some(Lag {
                group: group.clone(),
                topic: topic.clone(),
                partition: *partition,
                lag: (end - committed).max(0),
            })
        })
        .collect()
}

fn partition_views(broker: &Broker) -> Vec<PartitionView> {
    let image = broker.image();
    let mut min_insync_by_topic: BTreeMap<String, usize> = BTreeMap::new();
    let mut views = Vec::new();
    let now_ms = broker.replicas.now_ms();
    for (tp, partition) in broker.replicas.partitions() {
        let state = partition.state();
        let min_insync = *min_insync_by_topic
            .entry(tp.topic.clone())
            .or_insert_with(|| {
                broker
                    .topic_config_value(&image, &tp.topic, "min.insync.replicas")
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(1)
            });
        let Ok((
            high_watermark,
            log_end_offset,
            log_start_offset,
            size_bytes,
            segments,
            dirty_ratio,
            remote_copy_lag,
        )) = partition.with_log(|log| {
            (
                log.high_watermark(),
                log.log_end_offset(),
                log.log_start_offset(),
                log.size_bytes(),
                log.segment_count(),
                log.config()
                    .cleanup_policy
                    .is_compact()
                    .then(|| log.dirty_ratio(now_ms)),
                (log.config().remote_storage_enable && state.leader == broker.node_id)
                    .then(|| log.remote_copy_lag()),
            )
        })
        else {
            continue;
        };
        let followers = match partition.leader_state().as_ref() {
            Some(ls) => ls
                .replicas()
                .iter()
                .filter(|r| **r != broker.node_id)
                .filter_map(|r| ls.follower(*r).map(|f| (*r, f)))
                .map(|(replica, f)| FollowerLag {
                    replica,
                    // A follower not heard from in this leadership lags by everything.
                    records: (ls.log_end_offset() - f.log_end_offset.max(0)).max(0),
                    time_ms: f.last_caught_up_time_ms.map(|t| (now_ms - t).max(0)),
                })
                .collect(),
            None => Vec::new(),
        };
        views.push(PartitionView {
            topic: tp.topic,
            partition: tp.partition,
            leader_here: state.leader == broker.node_id,
            replicas: state.replicas.len(),
            isr: state.isr.len(),
            min_insync,
            high_watermark,
            log_end_offset,
            log_start_offset,
            size_bytes,
            segments,
            dirty_ratio,
            remote_copy_lag,
            followers,
        });
    }
    views
}

/// The cluster as this node's metadata image has it: Kafka's controller gauges
/// (`KafkaController`'s `GlobalTopicCount`, `GlobalPartitionCount`,
/// `OfflinePartitionsCount`, `PreferredReplicaImbalanceCount`, `FencedBrokerCount`,
/// `ActiveBrokerCount`), which Kafka serves on the active controller only and every node
/// serves here, and the metadata log's position (`raft-metrics`, `broker-metadata-metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ClusterView {
    pub topics: u64,
    pub partitions: u64,
    pub offline: u64,
    /// Partitions whose leader is not their first replica (the preferred one).
    pub preferred_imbalance: u64,
    pub fenced_brokers: u64,
    pub active_brokers: u64,
    /// The Raft term, and the leader (-1 when none is known).
    pub epoch: u64,
    pub leader: i64,
    /// The offset the next committed record gets (the metadata log's high watermark),
    /// and the last record this node's image applied (-1 before the first).
    pub high_watermark: i64,
    pub last_applied_offset: i64,
}

fn cluster_view(quorum: &MetadataQuorum) -> ClusterView {
    let image = quorum.image();
    let partitions = || image.topics.values().flat_map(|t| t.partitions.values());
    ClusterView {
        topics: image.topics.len() as u64,
        partitions: partitions().count() as u64,
        offline: partitions()
            .filter(|p| p.leader == rill_metadata::NO_LEADER)
            .count() as u64,
        preferred_imbalance: partitions()
            .filter(|p| {
                p.leader != rill_metadata::NO_LEADER && p.replicas.first() != Some(&p.leader)
            })
            .count() as u64,
        fenced_brokers: image.brokers.values().filter(|b| b.fenced).count() as u64,
        active_brokers: image.brokers.values().filter(|b| !b.fenced).count() as u64,
        epoch: quorum.controller_epoch(),
        leader: quorum.leader_id().map_or(-1, |l| l as i64),
        high_watermark: quorum.committed_offset(),
        last_applied_offset: image.next_offset - 1,
    }
}

/// The page, in the OpenMetrics text format.
pub(super) fn encode(
    broker: &Broker,
    settings: &MetricsSettings,
    groups: GroupSnapshot,
) -> Result<String, std::fmt::Error> {
    let views = partition_views(broker);
    let page = Page {
        broker: true,
        active_controller: broker.quorum.is_leader(),
        counts: partition_counts(&views),
        per_partition: views.len() <= settings.partition_series_max,
        lags: lags(&groups, &views),
        cluster: cluster_view(&broker.quorum),
        process: process::read(),
        now_ms: broker.replicas.now_ms(),
        views,
        groups,
        quorum: broker.quorum.describe_if_leader(),
        fetch_sessions: broker
            .fetch_sessions
            .lock()
            .map(|c| FetchSessionCounts {
                sessions: c.len() as u64,
                partitions: c.partitions() as u64,
                evictions: c.evictions(),
            })
            .unwrap_or_default(),
        log_dirs: {
            let failures = broker.replicas.log_dir_failure();
            broker
                .replicas
                .log_dirs()
                .into_iter()
                .enumerate()
                .map(|(i, d)| (d.path.display().to_string(), failures.is_offline(i)))
                .collect()
        },
    };
    render(page)
}

/// The page of a controller-only node: the process, the quorum, and the request
/// metrics (none: it serves no client).
pub(super) fn encode_controller(quorum: &MetadataQuorum) -> Result<String, std::fmt::Error> {
    render(Page {
        broker: false,
        active_controller: quorum.is_leader(),
        views: Vec::new(),
        counts: PartitionCounts::default(),
        per_partition: false,
        lags: Vec::new(),
        groups: GroupSnapshot::default(),
        cluster: cluster_view(quorum),
        process: process::read(),
        now_ms: wall_clock_ms(),
        quorum: quorum.describe_if_leader(),
        fetch_sessions: FetchSessionCounts::default(),
        log_dirs: Vec::new(),
    })
}

fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn render(page: Page) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(page));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
    Ok(out)
}

/// Everything read for one scrape; the collector encodes it.
#[derive(Debug)]
struct Page {
    /// A broker's page (a controller-only node has no partitions, groups or topics).
    broker: bool,
    /// This node is the active controller (the quorum's leader).
    active_controller: bool,
    views: Vec<PartitionView>,
    counts: PartitionCounts,
    per_partition: bool,
    lags: Vec<Lag>,
    groups: GroupSnapshot,
    cluster: ClusterView,
    process: process::ProcessStats,
    /// The wall clock at the scrape, in ms since the Unix epoch.
    now_ms: i64,
    /// Each quorum replica's progress, on the active controller only (the Raft leader is
    /// the one node that knows it).
    quorum: Option<QuorumDescription>,
    /// Each log directory of `log.dirs` and whether it failed (a broker's only).
    log_dirs: Vec<(String, bool)>,
    fetch_sessions: FetchSessionCounts,
}

/// The broker's incremental fetch sessions (KIP-227) at the scrape.
#[derive(Debug, Default)]
struct FetchSessionCounts {
    sessions: u64,
    partitions: u64,
    evictions: u64,
}

/// A counter value for the encoder.
fn load(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

/// A metric with no labels.
fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    e.encode_descriptor(name, help, None, MetricType::Counter)?
        .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&v, None)
}

fn gauge_i64(e: &mut DescriptorEncoder, name: &str, help: &str, v: i64) -> std::fmt::Result {
    e.encode_descriptor(name, help, None, MetricType::Gauge)?
        .encode_gauge(&v)
}

fn gauge_f64(e: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    e.encode_descriptor(name, help, None, MetricType::Gauge)?
        .encode_gauge(&v)
}

type Labels = Vec<(&'static str, String)>;

/// A per-partition gauge: its name, help, and how a partition's value is read.
type PartitionSeries = (&'static str, &'static str, fn(&PartitionView) -> i64);

/// A counter family: one series per label set.
fn counter_family(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Labels, u64)>,
) -> std::fmt::Result {
    let mut family = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, v) in series {
        family
            .encode_family(&labels)?
            .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&v, None)?;
    }
    Ok(())
}

fn gauge_family<V: prometheus_client::encoding::EncodeGaugeValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Labels, V)>,
) -> std::fmt::Result {
    let mut family = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, v) in series {
        family.encode_family(&labels)?.encode_gauge(&v)?;
    }
    Ok(())
}

fn histogram_family(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (Labels, HistogramSnapshot)>,
) -> std::fmt::Result {
    let mut family = e.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, h) in series {
        family
            .encode_family(&labels)?
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                h.sum_seconds,
                h.count,
                &h.buckets,
                None,
            )?;
    }
    Ok(())
}

/// The BrokerTopicMetrics counters: (name suffix, help, field).
/// Picks one counter of a topic's.
type TopicField = fn(&TopicMetrics) -> &AtomicU64;
/// Picks one phase of an API's request time.
type Phase = fn(&metrics::ApiMetrics) -> &metrics::Histogram;

const TOPIC_COUNTERS: &[(&str, &str, TopicField)] = &[
    (
        "bytes_in",
        "Record-batch bytes appended by clients (BytesInPerSec)",
        |t| &t.bytes_in,
    ),
    (
        "bytes_out",
        "Record bytes sent to consumers (BytesOutPerSec)",
        |t| &t.bytes_out,
    ),
    (
        "replication_bytes_out",
        "Record bytes sent to follower replicas (ReplicationBytesOutPerSec)",
        |t| &t.replication_bytes_out,
    ),
    (
        "replication_bytes_in",
        "Record bytes appended as a follower (ReplicationBytesInPerSec)",
        |t| &t.replication_bytes_in,
    ),
    (
        "messages_in",
        "Records appended by clients (MessagesInPerSec)",
        |t| &t.messages_in,
    ),
    (
        "total_produce_requests",
        "Produce requests, one per partition named (TotalProduceRequestsPerSec)",
        |t| &t.produce_requests,
    ),
    (
        "total_fetch_requests",
        "Fetch requests, one per partition named (TotalFetchRequestsPerSec)",
        |t| &t.fetch_requests,
    ),
    (
        "failed_produce_requests",
        "Produce partitions answered with an error (FailedProduceRequestsPerSec)",
        |t| &t.failed_produce_requests,
    ),
    (
        "failed_fetch_requests",
        "Fetch partitions answered with an error (FailedFetchRequestsPerSec)",
        |t| &t.failed_fetch_requests,
    ),
];

fn api_name(key: i16) -> String {
    ApiKey::from_i16(key).map_or_else(|| format!("api{key}"), |k| k.name().to_string())
}

/// A label value as the text format writes it: `\`, `"` and newlines escaped. The
/// encoder writes values as given, and a group id is any string a client chose: unescaped,
/// one could end the value and write series of its own.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Kafka's name for the code; a code without one keeps its number, so that two such
/// codes never make two series with one label set.
fn error_name(code: i16) -> String {
    rill_protocol::ErrorCode(code)
        .known_name()
        .map_or_else(|| format!("ERROR_{code}"), str::to_string)
}

impl Collector for Page {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let m = metrics::global();
        let controller = &m.controller;
        histogram_family(
            &mut e,
            "kafka_controller_controllereventmanager_event_queue_time_seconds",
            "How long controller events waited on the queue of this node's controller \
             loop (EventQueueTimeMs)",
            [(Labels::new(), controller.event_queue_time.snapshot())],
        )?;
        histogram_family(
            &mut e,
            "kafka_controller_controllereventmanager_event_queue_processing_time_seconds",
            "How long controller events took to decide and commit on this node \
             (EventQueueProcessingTimeMs)",
            [(Labels::new(), controller.event_processing_time.snapshot())],
        )?;
        counter(
            &mut e,
            "kafka_controller_kafkacontroller_new_active_controllers",
            "Times this node became the active controller (NewActiveControllersCount)",
            load(&controller.new_active_controllers),
        )?;
        counter(
            &mut e,
            "kafka_controller_controllerstats_leader_elections",
            "Partition leader elections this node committed as the active controller \
             (LeaderElectionRateAndTimeMs)",
            load(&controller.leader_elections),
        )?;
        counter(
            &mut e,
            "kafka_controller_controllerstats_unclean_leader_elections",
            "Of them, leaders chosen outside the ISR (UncleanLeaderElectionsPerSec)",
            load(&controller.unclean_leader_elections),
        )?;
        gauge_i64(
            &mut e,
            "kafka_controller_kafkacontroller_active_controller_count",
            "1 on the active controller (the metadata quorum's leader), else 0 \
             (ActiveControllerCount)",
            i64::from(self.active_controller),
        )?;
        let c = &self.cluster;
        let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let cluster: [(&str, &str, i64); 10] = [
            (
                "kafka_controller_kafkacontroller_global_topic_count",
                "Topics in this node's metadata image (GlobalTopicCount)",
                to_i64(c.topics),
            ),
            (
                "kafka_controller_kafkacontroller_global_partition_count",
                "Partitions in this node's metadata image (GlobalPartitionCount)",
                to_i64(c.partitions),
            ),
            (
                "kafka_controller_kafkacontroller_offline_partitions_count",
                "Partitions without a leader in this node's metadata image \
                 (OfflinePartitionsCount)",
                to_i64(c.offline),
            ),
            (
                "kafka_controller_kafkacontroller_preferred_replica_imbalance_count",
                "Partitions whose leader is not their preferred (first) replica \
                 (PreferredReplicaImbalanceCount)",
                to_i64(c.preferred_imbalance),
            ),
            (
                "kafka_controller_kafkacontroller_fenced_broker_count",
                "Registered brokers that are fenced (FencedBrokerCount)",
                to_i64(c.fenced_brokers),
            ),
            (
                "kafka_controller_kafkacontroller_active_broker_count",
                "Registered brokers that are not fenced (ActiveBrokerCount)",
                to_i64(c.active_brokers),
            ),
            (
                "kafka_server_raft_metrics_current_epoch",
                "The metadata quorum's Raft term (raft-metrics current-epoch)",
                to_i64(c.epoch),
            ),
            (
                "kafka_server_raft_metrics_current_leader",
                "The metadata quorum's leader this node knows of, -1 when none \
                 (raft-metrics current-leader)",
                c.leader,
            ),
            (
                "kafka_server_raft_metrics_high_watermark",
                "The offset the next committed metadata record gets \
                 (raft-metrics high-watermark)",
                c.high_watermark,
            ),
            (
                "kafka_server_broker_metadata_metrics_last_applied_record_offset",
                "The last metadata record this node's image applied \
                 (broker-metadata-metrics last-applied-record-offset)",
                c.last_applied_offset,
            ),
        ];
        for (name, help, v) in cluster {
            gauge_i64(&mut e, name, help, v)?;
        }
        if let Some(q) = &self.quorum {
            let leader_end = q
                .voters
                .iter()
                .find(|r| r.replica_id == q.leader_id)
                .map_or(-1, |r| r.log_end_offset);
            let replicas = || {
                let voters = q.voters.iter().map(|r| (r, "voter"));
                voters.chain(q.observers.iter().map(|r| (r, "observer")))
            };
            let labels = |r: &ReplicaProgress, role: &'static str| {
                vec![
                    ("replica", r.replica_id.to_string()),
                    ("role", role.to_string()),
                ]
            };
            gauge_family(
                &mut e,
                "kafka_server_raft_metrics_replica_log_end_offset",
                "Each metadata quorum replica's log end as the active controller (the Raft \
                 leader) last heard it; -1 when unknown (DescribeQuorum LogEndOffset)",
                replicas().map(|(r, role)| (labels(r, role), r.log_end_offset)),
            )?;
            gauge_family(
                &mut e,
                "kafka_server_raft_metrics_replica_lag",
                "Metadata records each quorum replica is behind the active controller's log end",
                replicas()
                    .filter(|(r, _)| r.log_end_offset >= 0)
                    .map(|(r, role)| (labels(r, role), (leader_end - r.log_end_offset).max(0))),
            )?;
            gauge_family(
                &mut e,
                "kafka_server_raft_metrics_replica_last_fetch_age_seconds",
                "Seconds since each quorum follower last answered the active controller's \
                 replication (DescribeQuorum LastFetchTimestamp)",
                replicas()
                    .filter(|(r, _)| r.last_fetch_timestamp >= 0)
                    .map(|(r, role)| {
                        let age = (self.now_ms - r.last_fetch_timestamp).max(0);
                        (labels(r, role), age as f64 / 1e3)
                    }),
            )?;
        }
        if self.broker {
            let topics = m.topics.topics();
            for (suffix, help, field) in TOPIC_COUNTERS {
                counter(
                    &mut e,
                    &format!("kafka_server_brokertopicmetrics_{suffix}"),
                    help,
                    load(field(&m.topics.all)),
                )?;
                counter_family(
                    &mut e,
                    &format!("kafka_server_brokertopicmetrics_topic_{suffix}"),
                    help,
                    topics
                        .iter()
                        .map(|(name, t)| (vec![("topic", escape(name))], load(field(t)))),
                )?;
            }
        }
        let served: Vec<(i16, &metrics::ApiMetrics)> = m.requests.served().collect();
        let by_api = |(k, _): &(i16, &metrics::ApiMetrics)| vec![("request", api_name(*k))];
        counter_family(
            &mut e,
            "kafka_network_requestmetrics_requests",
            "Requests served, by API (RequestsPerSec)",
            served.iter().map(|s| (by_api(s), load(&s.1.requests))),
        )?;
        counter_family(
            &mut e,
            "kafka_network_requestmetrics_errors",
            "Error codes in responses, by API and error (ErrorsPerSec): every error code a \
             response holds, one per partition, topic or resource it names",
            m.requests.errors().into_iter().map(|(api, code, n)| {
                (
                    vec![("request", api_name(api)), ("error", error_name(code))],
                    n,
                )
            }),
        )?;
        let phases: [(&str, &str, Phase); 7] = [
            (
                "kafka_network_requestmetrics_request_queue_time_seconds",
                "Time waiting for a request slot, queued.max.requests (RequestQueueTimeMs)",
                |a| &a.request_queue,
            ),
            (
                "kafka_network_requestmetrics_local_time_seconds",
                "Time in the handler before it parks or ends (LocalTimeMs)",
                |a| &a.local,
            ),
            (
                "kafka_network_requestmetrics_remote_time_seconds",
                "Time parked in a purgatory: acks=all, long-polling fetch (RemoteTimeMs)",
                |a| &a.remote,
            ),
            (
                "kafka_network_requestmetrics_response_queue_time_seconds",
                "Time from the handler's answer to the start of its write: a quota's hold \
                 (ResponseQueueTimeMs)",
                |a| &a.response_queue,
            ),
            (
                "kafka_network_requestmetrics_response_send_time_seconds",
                "Time writing the response to the socket (ResponseSendTimeMs)",
                |a| &a.send,
            ),
            (
                "kafka_network_requestmetrics_total_time_seconds",
                "Time from the whole request read to the response written (TotalTimeMs)",
                |a| &a.total,
            ),
            (
                "kafka_network_requestmetrics_throttle_time_seconds",
                "The client quota throttle each response carried, zero when none \
                 (ThrottleTimeMs)",
                |a| &a.throttle_time,
            ),
        ];
        for (name, help, phase) in phases {
            histogram_family(
                &mut e,
                name,
                help,
                served.iter().map(|s| (by_api(s), phase(s.1).snapshot())),
            )?;
        }

        let pool = &m.network;
        let used = pool.memory_pool_used_bytes.load(Ordering::Relaxed);
        gauge_i64(
            &mut e,
            "kafka_network_socketserver_memory_pool_used_bytes",
            "Bytes of queued.max.request.bytes that requests read and not yet handled hold \
             (SocketServer MemoryPoolUsed)",
            used,
        )?;
        gauge_i64(
            &mut e,
            "kafka_network_socketserver_memory_pool_available_bytes",
            "Bytes of queued.max.request.bytes free for requests to be read \
             (SocketServer MemoryPoolAvailable)",
            (pool.memory_pool_capacity_bytes.load(Ordering::Relaxed) - used).max(0),
        )?;
        counter(
            &mut e,
            "kafka_server_socketserver_successful_reauthentication",
            "SASL sessions renewed by a re-authentication on a live connection \
             (successful-reauthentication-total, KIP-368)",
            pool.successful_reauthentications.load(Ordering::Relaxed),
        )?;
        counter(
            &mut e,
            "kafka_server_socketserver_expired_connections_killed",
            "Connections closed because their SASL session ended without a \
             re-authentication (expired-connections-killed-count, KIP-368)",
            pool.expired_connections_killed.load(Ordering::Relaxed),
        )?;
        gauge_family(
            &mut e,
            "kafka_server_socketserver_connection_count",
            "Open client connections, by listener (socket-server-metrics connection-count)",
            m.connections
                .counts()
                .into_iter()
                .map(|(l, n)| (vec![("listener", escape(&l))], n)),
        )?;

        if self.broker {
            let c = &self.counts;
            let gauges: [(&str, &str, u64); 5] = [
                (
                    "kafka_server_replicamanager_partition_count",
                    "Partitions hosted on this broker (PartitionCount)",
                    c.partitions,
                ),
                (
                    "kafka_server_replicamanager_leader_count",
                    "Partitions this broker leads (LeaderCount)",
                    c.leaders,
                ),
                (
                    "kafka_server_replicamanager_under_replicated_partitions",
                    "Led partitions whose ISR is smaller than their replicas \
                     (UnderReplicatedPartitions)",
                    c.under_replicated,
                ),
                (
                    "kafka_server_replicamanager_under_min_isr_partition_count",
                    "Led partitions whose ISR is below min.insync.replicas (UnderMinIsrPartitionCount)",
                    c.under_min_isr,
                ),
                (
                    "kafka_server_replicamanager_at_min_isr_partition_count",
                    "Led partitions whose ISR is at min.insync.replicas (AtMinIsrPartitionCount)",
                    c.at_min_isr,
                ),
            ];
            let offline_dirs = self.log_dirs.iter().filter(|(_, off)| *off).count();
            gauge_i64(
                &mut e,
                "kafka_log_logmanager_offline_log_directory_count",
                "Log directories that failed (LogManager OfflineLogDirectoryCount)",
                i64::try_from(offline_dirs).unwrap_or(i64::MAX),
            )?;
            gauge_family(
                &mut e,
                "kafka_log_logmanager_log_directory_offline",
                "1 for a log directory that failed, else 0 (LogManager LogDirectoryOffline)",
                self.log_dirs
                    .iter()
                    .map(|(dir, off)| (vec![("log_directory", escape(dir))], i64::from(*off))),
            )?;
            for (name, help, v) in gauges {
                gauge_i64(&mut e, name, help, i64::try_from(v).unwrap_or(i64::MAX))?;
            }
            let f = &self.fetch_sessions;
            gauge_i64(
                &mut e,
                "kafka_server_fetchsessioncache_num_incremental_fetch_sessions",
                "Incremental fetch sessions open on this broker (NumIncrementalFetchSessions)",
                i64::try_from(f.sessions).unwrap_or(i64::MAX),
            )?;
            gauge_i64(
                &mut e,
                "kafka_server_fetchsessioncache_num_incremental_fetch_partitions_cached",
                "Partitions held by this broker's fetch sessions \
                 (NumIncrementalFetchPartitionsCached)",
                i64::try_from(f.partitions).unwrap_or(i64::MAX),
            )?;
            counter(
                &mut e,
                "kafka_server_fetchsessioncache_incremental_fetch_session_evictions",
                "Fetch sessions evicted to make room for new ones \
                 (IncrementalFetchSessionEvictionsPerSec)",
                f.evictions,
            )?;
            counter(
                &mut e,
                "kafka_server_replicamanager_isr_shrinks",
                "ISR shrinks of partitions led here, as the controller accepted them \
                 (IsrShrinksPerSec)",
                load(&m.replication.isr_shrinks),
            )?;
            counter(
                &mut e,
                "kafka_server_replicamanager_isr_expands",
                "ISR expansions of partitions led here (IsrExpandsPerSec)",
                load(&m.replication.isr_expands),
            )?;
            let r = &m.replication;
            let fetcher_counters: [(&str, &str, &AtomicU64); 4] = [
                (
                    "kafka_server_fetcherstats_requests",
                    "Fetch and epoch-validation requests this broker's followers sent to \
                     leaders (FetcherStats RequestsPerSec)",
                    &r.fetcher_requests,
                ),
                (
                    "kafka_server_fetcherstats_connect_failures",
                    "Follower dials to a leader that failed: unreachable, or the TLS or SASL \
                     login refused",
                    &r.fetcher_connect_failures,
                ),
                (
                    "kafka_server_fetcherstats_request_failures",
                    "Follower requests that failed as a whole: connection lost, timed out or \
                     unreadable answer",
                    &r.fetcher_request_failures,
                ),
                (
                    "kafka_server_fetcherstats_append_failures",
                    "Fetched records the follower's log refused to append",
                    &r.fetcher_append_failures,
                ),
            ];
            for (name, help, c) in fetcher_counters {
                counter(&mut e, name, help, load(c))?;
            }
            counter_family(
                &mut e,
                "kafka_server_fetcherstats_partition_errors",
                "Partition errors in leaders' answers to this broker's followers, by error",
                r.fetcher_partition_errors()
                    .into_iter()
                    .map(|(code, n)| (vec![("error", error_name(code))], n)),
            )?;
            let cleaner = &m.cleaner;
            let cleaner_counters: [(&str, &str, &AtomicU64); 5] = [
                (
                    "kafka_log_logcleaner_cleans",
                    "Cleans of compacted logs applied",
                    &cleaner.cleans,
                ),
                (
                    "kafka_log_logcleaner_bytes_read",
                    "Bytes the cleans read",
                    &cleaner.bytes_read,
                ),
                (
                    "kafka_log_logcleaner_bytes_written",
                    "Bytes the cleans wrote",
                    &cleaner.bytes_written,
                ),
                (
                    "kafka_log_logcleaner_aborted_records_removed",
                    "Records of aborted transactions the cleans removed",
                    &cleaner.aborted_records_removed,
                ),
                (
                    "kafka_log_logcleaner_markers_removed",
                    "Transaction markers the cleans removed",
                    &cleaner.markers_removed,
                ),
            ];
            for (name, help, c) in cleaner_counters {
                counter(&mut e, name, help, load(c))?;
            }
            histogram_family(
                &mut e,
                "kafka_log_logflushstats_produce_fsync_wait_seconds",
                "How long each produce request waited for the fsync flush.messages or \
                 flush.ms asked for, its own or a group commit's (LogFlushStats \
                 LogFlushRateAndTimeMs times each log flush)",
                [(Vec::new(), m.flush.produce_fsync_wait.snapshot())],
            )?;
            histogram_family(
                &mut e,
                "kafka_log_logflushstats_log_flush_seconds",
                "Each log flush: a group commit's fsync (flush.messages, flush.ms) or a \
                 segment roll's, the old segment with its indexes, producer snapshot and \
                 directory (LogFlushStats LogFlushRateAndTimeMs)",
                [(Vec::new(), m.flush.log_flush.snapshot())],
            )?;
            let r = &m.remote_log;
            let remote_counters: [(&str, &str, &AtomicU64); 9] = [
                (
                    "kafka_server_brokertopicmetrics_remote_copy_requests",
                    "Segments copied to the remote tier (RemoteCopyRequestsPerSec)",
                    &r.copy_requests,
                ),
                (
                    "kafka_server_brokertopicmetrics_remote_copy_bytes",
                    "Bytes copied to the remote tier (RemoteCopyBytesPerSec)",
                    &r.copy_bytes,
                ),
                (
                    "kafka_server_brokertopicmetrics_remote_copy_errors",
                    "Copies to the remote tier that failed (RemoteCopyErrorsPerSec)",
                    &r.copy_errors,
                ),
                (
                    "kafka_server_brokertopicmetrics_remote_fetch_requests",
                    "Reads served from the remote tier (RemoteFetchRequestsPerSec)",
                    &r.fetch_requests,
                ),
                (
                    "kafka_server_brokertopicmetrics_remote_fetch_bytes",
                    "Record bytes read from the remote tier (RemoteFetchBytesPerSec)",
                    &r.fetch_bytes,
                ),
                (
                    "kafka_server_brokertopicmetrics_remote_fetch_errors",
                    "Reads from the remote tier that failed (RemoteFetchErrorsPerSec)",
                    &r.fetch_errors,
                ),
                (
                    "kafka_server_brokertopicmetrics_remote_delete_requests",
                    "Remote segments deleted by retention (RemoteDeleteRequestsPerSec)",
                    &r.deleted_segments,
                ),
                (
                    "kafka_server_brokertopicmetrics_remote_delete_errors",
                    "Deletions of remote segments that failed (RemoteDeleteErrorsPerSec)",
                    &r.delete_errors,
                ),
                (
                    "rill_remote_log_task_failures",
                    "Passes of a partition's remote log task that failed and back off (the \
                     store or the controller unreachable, leadership moved)",
                    &r.task_failures,
                ),
            ];
            for (name, help, c) in remote_counters {
                counter(&mut e, name, help, load(c))?;
            }
            let (lag_bytes, lag_segments) = self
                .views
                .iter()
                .filter_map(|v| v.remote_copy_lag)
                .fold((0u64, 0usize), |(b, n), (vb, vn)| (b + vb, n + vn));
            gauge_i64(
                &mut e,
                "kafka_server_brokertopicmetrics_remote_copy_lag_bytes",
                "Bytes of the closed segments of tiered partitions led here not yet copied to \
                 the remote tier (RemoteCopyLagBytes)",
                i64::try_from(lag_bytes).unwrap_or(i64::MAX),
            )?;
            gauge_i64(
                &mut e,
                "kafka_server_brokertopicmetrics_remote_copy_lag_segments",
                "Closed segments of tiered partitions led here not yet copied to the remote \
                 tier (RemoteCopyLagSegments)",
                i64::try_from(lag_segments).unwrap_or(i64::MAX),
            )?;
            let cache_counters: [(&str, &str, &AtomicU64); 3] = [
                (
                    "rill_remote_log_cache_hits",
                    "Remote reads whose segment was in the local cache",
                    &r.cache_hits,
                ),
                (
                    "rill_remote_log_cache_misses",
                    "Remote reads that fetched their segment into the local cache",
                    &r.cache_misses,
                ),
                (
                    "rill_remote_log_cache_fetched_bytes",
                    "Bytes fetched from the remote tier into the local cache",
                    &r.download_bytes,
                ),
            ];
            for (name, help, c) in cache_counters {
                counter(&mut e, name, help, load(c))?;
            }
            gauge_i64(
                &mut e,
                "rill_remote_log_cache_bytes",
                "Bytes the local cache of remote segments holds (at most \
                 remote.log.reader.cache.size.bytes)",
                i64::try_from(load(&r.cache_bytes)).unwrap_or(i64::MAX),
            )?;
            counter(
                &mut e,
                "kafka_log_retention_deleted_segments",
                "Segments retention deleted (retention.ms, retention.bytes, or below a log \
                 start offset DeleteRecords moved)",
                load(&m.retention.deleted_segments),
            )?;
            counter(
                &mut e,
                "kafka_log_retention_deleted_bytes",
                "Bytes of the segments retention deleted",
                load(&m.retention.deleted_bytes),
            )?;
            gauge_f64(
                &mut e,
                "kafka_log_logcleaner_max_clean_time_seconds",
                "How long the last clean's rewrite took (LogCleaner max-clean-time-secs)",
                load(&cleaner.last_clean_us) as f64 / 1e6,
            )?;
            gauge_f64(
                &mut e,
                "kafka_log_logcleaner_cleaner_recopy_percent",
                "Bytes the last clean wrote per 100 it read (LogCleaner cleaner-recopy-percent)",
                load(&cleaner.last_recopy_permille) as f64 / 10.0,
            )?;
            let max_dirty = self
                .views
                .iter()
                .filter_map(|v| v.dirty_ratio)
                .fold(0.0f64, f64::max);
            gauge_f64(
                &mut e,
                "kafka_log_logcleanermanager_max_dirty_percent",
                "The highest dirty ratio of the compacted logs hosted here, in percent \
                 (LogCleanerManager max-dirty-percent)",
                max_dirty * 100.0,
            )?;
            let last_run = cleaner.last_run_end_ms.load(Ordering::Relaxed);
            if last_run > 0 {
                gauge_f64(
                    &mut e,
                    "kafka_log_logcleanermanager_time_since_last_run_seconds",
                    "Seconds since the cleaner last finished a round of cleans \
                     (LogCleanerManager time-since-last-run-ms)",
                    (self.now_ms - last_run).max(0) as f64 / 1e3,
                )?;
            }
            gauge_i64(
                &mut e,
                "kafka_server_replicamanager_follower_max_lag_records",
                "The largest lag in records of any follower of a partition led here, behind the \
                 leader's log end (Rill's; Kafka's ReplicaFetcherManager MaxLag is the followers' \
                 own view)",
                self.views
                    .iter()
                    .flat_map(|v| v.followers.iter().map(|f| f.records))
                    .max()
                    .unwrap_or(0),
            )?;
            if self.per_partition {
                gauge_family(
                    &mut e,
                    "kafka_server_replica_follower_lag_records",
                    "Records a follower of a partition led here is behind the leader's log end",
                    self.views.iter().flat_map(|v| {
                        v.followers.iter().map(|f| {
                            (
                                vec![
                                    ("topic", escape(&v.topic)),
                                    ("partition", v.partition.to_string()),
                                    ("replica", f.replica.to_string()),
                                ],
                                f.records,
                            )
                        })
                    }),
                )?;
                let mut family = e.encode_descriptor(
                    "kafka_server_replica_follower_lag_seconds",
                    "Seconds since a follower of a partition led here last had all the leader had \
                     (absent until it first catches up in this leadership)",
                    None,
                    MetricType::Gauge,
                )?;
                for v in &self.views {
                    for f in &v.followers {
                        if let Some(ms) = f.time_ms {
                            let labels: Labels = vec![
                                ("topic", escape(&v.topic)),
                                ("partition", v.partition.to_string()),
                                ("replica", f.replica.to_string()),
                            ];
                            family
                                .encode_family(&labels)?
                                .encode_gauge(&(ms as f64 / 1000.0))?;
                        }
                    }
                }
                let labels = |v: &PartitionView| -> Labels {
                    vec![
                        ("topic", escape(&v.topic)),
                        ("partition", v.partition.to_string()),
                    ]
                };
                let log_series: [PartitionSeries; 4] = [
                    (
                        "kafka_log_log_end_offset",
                        "Log end offset of each hosted partition (Log LogEndOffset)",
                        |v| v.log_end_offset,
                    ),
                    (
                        "kafka_log_log_start_offset",
                        "Log start offset of each hosted partition (Log LogStartOffset)",
                        |v| v.log_start_offset,
                    ),
                    (
                        "kafka_log_log_size_bytes",
                        "Bytes in each hosted partition's segment files (Log Size)",
                        |v| i64::try_from(v.size_bytes).unwrap_or(i64::MAX),
                    ),
                    (
                        "kafka_log_log_num_log_segments",
                        "Segments of each hosted partition (Log NumLogSegments)",
                        |v| v.segments as i64,
                    ),
                ];
                for (name, help, value) in log_series {
                    gauge_family(
                        &mut e,
                        name,
                        help,
                        self.views.iter().map(|v| (labels(v), value(v))),
                    )?;
                }
                gauge_family(
                    &mut e,
                    "kafka_cluster_partition_under_replicated",
                    "1 when this broker leads the partition and its ISR is smaller than its \
                     replicas (Partition UnderReplicated)",
                    self.views.iter().filter(|v| v.leader_here).map(|v| {
                        (
                            vec![
                                ("topic", escape(&v.topic)),
                                ("partition", v.partition.to_string()),
                            ],
                            i64::from(v.isr < v.replicas),
                        )
                    }),
                )?;
            }

            // Groups: states, rebalances, lag.
            let mut by_state: BTreeMap<&str, i64> = [
                "Empty",
                "PreparingRebalance",
                "CompletingRebalance",
                "Stable",
                "Dead",
            ]
            .into_iter()
            .map(|s| (s, 0))
            .collect();
            for (_, state) in &self.groups.groups {
                *by_state.entry(state.as_str()).or_insert(0) += 1;
            }
            gauge_family(
                &mut e,
                "kafka_server_group_coordinator_metrics_classic_group_count",
                "Classic groups this broker coordinates, by state (classic-group-count)",
                by_state
                    .into_iter()
                    .map(|(s, n)| (vec![("state", s.to_string())], n)),
            )?;
            gauge_family(
                &mut e,
                "kafka_consumergroup_members",
                "Members of each group this broker coordinates (kafka_exporter's \
                 kafka_consumergroup_members)",
                self.groups.members.iter().map(|(g, n)| {
                    (
                        vec![("group", escape(g))],
                        i64::try_from(*n).unwrap_or(i64::MAX),
                    )
                }),
            )?;
            let mut by_state: BTreeMap<&str, i64> =
                ["Empty", "Assigning", "Reconciling", "Stable", "Dead"]
                    .into_iter()
                    .map(|s| (s, 0))
                    .collect();
            for (_, state) in &self.groups.consumer_groups {
                *by_state.entry(state.as_str()).or_insert(0) += 1;
            }
            gauge_family(
                &mut e,
                "kafka_server_group_coordinator_metrics_consumer_group_count",
                "Consumer groups (KIP-848) this broker coordinates, by state \
                 (consumer-group-count)",
                by_state
                    .into_iter()
                    .map(|(s, n)| (vec![("state", s.to_string())], n)),
            )?;
            let mut by_state: BTreeMap<&str, i64> = ["Empty", "Stable", "Dead"]
                .into_iter()
                .map(|s| (s, 0))
                .collect();
            for (_, state) in &self.groups.share_groups {
                *by_state.entry(state.as_str()).or_insert(0) += 1;
            }
            gauge_family(
                &mut e,
                "kafka_server_group_coordinator_metrics_share_group_count",
                "Share groups (KIP-932) this broker coordinates, by state (share-group-count)",
                by_state
                    .into_iter()
                    .map(|(s, n)| (vec![("state", s.to_string())], n)),
            )?;
            counter(
                &mut e,
                "kafka_server_group_coordinator_metrics_classic_group_completed_rebalance",
                "Generations the groups coordinated here went through \
                 (classic-group-completed-rebalance-count)",
                load(&m.groups.completed_rebalances),
            )?;
            let mut per_topic: BTreeMap<(&str, &str), i64> = BTreeMap::new();
            for l in &self.lags {
                *per_topic.entry((&l.group, &l.topic)).or_insert(0) += l.lag;
            }
            gauge_family(
                &mut e,
                "kafka_consumergroup_lag_sum",
                "Consumer lag of a group over a topic's partitions hosted here: high watermark \
                 minus committed offset",
                per_topic
                    .into_iter()
                    .map(|((g, t), lag)| (vec![("group", escape(g)), ("topic", escape(t))], lag)),
            )?;
            if self.per_partition {
                gauge_family(
                    &mut e,
                    "kafka_consumergroup_lag",
                    "Consumer lag of a group on a partition hosted here: high watermark minus \
                     committed offset",
                    self.lags.iter().map(|l| {
                        (
                            vec![
                                ("group", escape(&l.group)),
                                ("topic", escape(&l.topic)),
                                ("partition", l.partition.to_string()),
                            ],
                            l.lag,
                        )
                    }),
                )?;
            }
        }
        let p = &self.process;
        if let Some(v) = p.cpu_seconds {
            e.encode_descriptor(
                "process_cpu_seconds",
                "User and system CPU time of the process",
                None,
                MetricType::Counter,
            )?
            .encode_counter::<prometheus_client::encoding::NoLabelSet, _, u64>(&v, None)?;
        }
        for (name, help, v) in [
            (
                "process_resident_memory_bytes",
                "Resident memory of the process",
                p.resident_memory_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory of the process",
                p.virtual_memory_bytes,
            ),
            ("process_open_fds", "Open file descriptors", p.open_fds),
            (
                "process_max_fds",
                "Soft limit of open file descriptors",
                p.max_fds,
            ),
            ("process_threads", "Threads of the process", p.threads),
        ] {
            if let Some(v) = v {
                gauge_i64(&mut e, name, help, i64::try_from(v).unwrap_or(i64::MAX))?;
            }
        }
        if let Some(v) = p.start_time_seconds {
            gauge_f64(
                &mut e,
                "process_start_time_seconds",
                "Start time of the process since the epoch",
                v,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(topic: &str, partition: i32, leader_here: bool, isr: usize, hw: i64) -> PartitionView {
        PartitionView {
            topic: topic.into(),
            partition,
            leader_here,
            replicas: 3,
            isr,
            min_insync: 2,
            high_watermark: hw,
            log_end_offset: hw + 1,
            log_start_offset: 7,
            size_bytes: 4096,
            segments: 2,
            dirty_ratio: Some(0.25),
            remote_copy_lag: None,
            followers: Vec::new(),
        }
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("plain-group.1"), "plain-group.1");
        assert_eq!(escape("a\"} 1\nfake 2"), "a\\\"} 1\\nfake 2");
        assert_eq!(escape("back\\slash"), "back\\\\slash");
    }

    #[test]
    fn error_labels_are_distinct_for_codes_without_a_name() {
        assert_eq!(error_name(6), "NOT_LEADER_OR_FOLLOWER");
        assert_eq!(error_name(150), "ERROR_150");
        assert_ne!(error_name(150), error_name(151));
    }

    #[test]
    fn partition_counts_follow_kafkas_definitions() {
        let views = [
            view("a", 0, true, 3, 10),  // in sync
            view("a", 1, true, 2, 10),  // under-replicated, at min ISR
            view("a", 2, true, 1, 10),  // under-replicated, under min ISR
            view("b", 0, false, 1, 10), // a follower: counts only as hosted
        ];
        assert_eq!(
            partition_counts(&views),
            PartitionCounts {
                partitions: 4,
                leaders: 3,
                under_replicated: 2,
                under_min_isr: 1,
                at_min_isr: 1,
            }
        );
    }

    #[test]
    fn lag_is_the_high_watermark_minus_the_committed_offset() {
        let views = [view("t", 0, true, 3, 300), view("t", 1, true, 3, 200)];
        let snapshot = GroupSnapshot {
            groups: vec![("g".into(), "Empty".into())],
            consumer_groups: Vec::new(),
            share_groups: Vec::new(),
            offsets: vec![
                ("g".into(), "t".into(), 0, 120),
                // Committed past the high watermark (a truncated log): no negative lag.
                ("g".into(), "t".into(), 1, 250),
                // A partition not hosted here has no lag served here.
                ("g".into(), "elsewhere".into(), 0, 5),
            ],
            members: Vec::new(),
        };
        let lags = lags(&snapshot, &views);
        assert_eq!(
            lags,
            vec![
                Lag {
                    group: "g".into(),
                    topic: "t".into(),
                    partition: 0,
                    lag: 180
                },
                Lag {
                    group: "g".into(),
                    topic: "t".into(),
                    partition: 1,
                    lag: 0
                },
            ]
        );
    }

    fn page(per_partition: bool) -> String {
        let mut views = vec![view("t", 0, true, 2, 300)];
        views[0].followers = vec![
            FollowerLag {
                replica: 2,
                records: 0,
                time_ms: Some(1500),
            },
            FollowerLag {
                replica: 3,
                records: 42,
                time_ms: None,
            },
        ];
        let groups = GroupSnapshot {
            groups: vec![("g".into(), "Stable".into())],
            consumer_groups: vec![("c".into(), "Reconciling".into())],
            share_groups: vec![("s".into(), "Stable".into())],
            offsets: vec![("g".into(), "t".into(), 0, 100)],
            members: vec![("g".into(), 3)],
        };
        let page = Page {
            broker: true,
            active_controller: true,
            counts: partition_counts(&views),
            per_partition,
            lags: lags(&groups, &views),
            cluster: ClusterView {
                topics: 2,
                partitions: 5,
                offline: 1,
                preferred_imbalance: 1,
                fenced_brokers: 1,
                active_brokers: 2,
                epoch: 4,
                leader: 3,
                high_watermark: 120,
                last_applied_offset: 119,
            },
            process: process::ProcessStats {
                cpu_seconds: Some(1.5),
                ..Default::default()
            },
            now_ms: 1_000_000,
            views,
            groups,
            log_dirs: vec![("/d0".into(), false), ("/d1".into(), true)],
            fetch_sessions: FetchSessionCounts {
                sessions: 2,
                partitions: 7,
                evictions: 1,
            },
            quorum: Some(QuorumDescription {
                leader_id: 1,
                leader_epoch: 4,
                high_watermark: 120,
                voters: vec![
                    ReplicaProgress {
                        replica_id: 1,
                        log_end_offset: 121,
                        last_fetch_timestamp: -1,
                        last_caught_up_timestamp: 1_000_000,
                    },
                    ReplicaProgress {
                        replica_id: 2,
                        log_end_offset: 101,
                        last_fetch_timestamp: 997_500,
                        last_caught_up_timestamp: 990_000,
                    },
                ],
                observers: vec![ReplicaProgress {
                    replica_id: 4,
                    log_end_offset: -1,
                    last_fetch_timestamp: -1,
                    last_caught_up_timestamp: -1,
                }],
            }),
        };
        let mut registry = Registry::default();
        registry.register_collector(Box::new(page));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn the_page_holds_the_gauges_and_bounds_per_partition_series() {
        let full = page(true);
        for line in [
            "kafka_server_replicamanager_under_replicated_partitions 1",
            "kafka_log_logmanager_offline_log_directory_count 1",
            "kafka_server_fetchsessioncache_num_incremental_fetch_sessions 2",
            "kafka_server_fetchsessioncache_num_incremental_fetch_partitions_cached 7",
            "kafka_server_fetchsessioncache_incremental_fetch_session_evictions_total 1",
            "kafka_log_logmanager_log_directory_offline{log_directory=\"/d1\"} 1",
            "kafka_log_logmanager_log_directory_offline{log_directory=\"/d0\"} 0",
            "kafka_server_replicamanager_at_min_isr_partition_count 1",
            "kafka_controller_kafkacontroller_offline_partitions_count 1",
            "kafka_log_log_end_offset{topic=\"t\",partition=\"0\"} 301",
            "kafka_log_log_start_offset{topic=\"t\",partition=\"0\"} 7",
            "kafka_log_log_size_bytes{topic=\"t\",partition=\"0\"} 4096",
            "kafka_log_log_num_log_segments{topic=\"t\",partition=\"0\"} 2",
            "kafka_controller_kafkacontroller_global_topic_count 2",
            "kafka_controller_kafkacontroller_global_partition_count 5",
            "kafka_controller_kafkacontroller_preferred_replica_imbalance_count 1",
            "kafka_controller_kafkacontroller_fenced_broker_count 1",
            "kafka_controller_kafkacontroller_active_broker_count 2",
            "kafka_server_raft_metrics_current_epoch 4",
            "kafka_server_raft_metrics_current_leader 3",
            "kafka_server_raft_metrics_high_watermark 120",
            "kafka_server_broker_metadata_metrics_last_applied_record_offset 119",
            "kafka_server_raft_metrics_replica_log_end_offset{replica=\"2\",role=\"voter\"} 101",
            "kafka_server_raft_metrics_replica_log_end_offset{replica=\"4\",role=\"observer\"} -1",
            "kafka_server_raft_metrics_replica_lag{replica=\"1\",role=\"voter\"} 0",
            "kafka_server_raft_metrics_replica_lag{replica=\"2\",role=\"voter\"} 20",
            "kafka_server_raft_metrics_replica_last_fetch_age_seconds{replica=\"2\",role=\"voter\"} 2.5",
            "kafka_log_logcleanermanager_max_dirty_percent 25.0",
            "kafka_cluster_partition_under_replicated{topic=\"t\",partition=\"0\"} 1",
            "kafka_consumergroup_lag{group=\"g\",topic=\"t\",partition=\"0\"} 200",
            "kafka_consumergroup_lag_sum{group=\"g\",topic=\"t\"} 200",
            "kafka_consumergroup_members{group=\"g\"} 3",
            "kafka_server_group_coordinator_metrics_classic_group_count{state=\"Stable\"} 1",
            "kafka_server_group_coordinator_metrics_classic_group_count{state=\"Empty\"} 0",
            "kafka_server_group_coordinator_metrics_consumer_group_count{state=\"Reconciling\"} 1",
            "kafka_server_group_coordinator_metrics_share_group_count{state=\"Stable\"} 1",
            "kafka_server_group_coordinator_metrics_share_group_count{state=\"Empty\"} 0",
            "kafka_server_group_coordinator_metrics_consumer_group_count{state=\"Stable\"} 0",
            "process_cpu_seconds_total 1.5",
            "kafka_server_replicamanager_follower_max_lag_records 42",
            "kafka_controller_kafkacontroller_active_controller_count 1",
            "kafka_server_replica_follower_lag_records{topic=\"t\",partition=\"0\",replica=\"3\"} 42",
            "kafka_server_replica_follower_lag_seconds{topic=\"t\",partition=\"0\",replica=\"2\"} 1.5",
        ] {
            assert!(
                full.lines().any(|l| l == line),
                "{line} missing from\n{full}"
            );
        }
        assert!(full.ends_with("# EOF\n"));
        let bounded = page(false);
        assert!(!bounded.contains("kafka_log_log_end_offset{"));
        assert!(!bounded.contains("kafka_log_log_size_bytes{"));
        assert!(!bounded.contains("kafka_consumergroup_lag{"));
        assert!(!bounded.contains("kafka_server_replica_follower_lag_records{"));
        assert!(!full.contains("replica=\"3\"} 0.")); // never caught up: no time series
        assert!(bounded.contains("kafka_consumergroup_lag_sum{group=\"g\",topic=\"t\"} 200"));
    }
}
