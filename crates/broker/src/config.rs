//! Broker and topic configuration, under Kafka's names.
//!
//! The broker reads a TOML file whose keys are Kafka's (`log.dirs`, `num.partitions`, …)
//! plus `--override key=value` pairs; every key has a default so that `rill server` with
//! no arguments starts a working single-node cluster. Topic configs (`retention.ms`,
//! `cleanup.policy`, …) default to the broker's matching `log.*` key, as in Kafka, and are
//! described with their types and sources through DescribeConfigs.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::error::BrokerError;

/// The listener name of the controller quorum in `listeners`.
pub const CONTROLLER_LISTENER: &str = "CONTROLLER";

/// Kafka's `SecurityProtocol`: what a listener speaks, with the id brokers register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub const ALL: [SecurityProtocol; 4] = [
        SecurityProtocol::Plaintext,
        SecurityProtocol::Ssl,
        SecurityProtocol::SaslPlaintext,
        SecurityProtocol::SaslSsl,
    ];

    /// The id in `RegisterBrokerRecord` and `BrokerRegistrationRequest` (Kafka's).
    pub fn id(self) -> i16 {
        match self {
            SecurityProtocol::Plaintext => 0,
            SecurityProtocol::Ssl => 1,
            SecurityProtocol::SaslPlaintext => 2,
            SecurityProtocol::SaslSsl => 3,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        let raw = raw.trim();
        Self::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(raw))
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn uses_sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

/// One client listener of `listeners`: its name, the address to bind and what it speaks
/// (from `listener.security.protocol.map`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerConfig {
    pub name: String,
    pub addr: SocketAddr,
    pub protocol: SecurityProtocol,
}

/// What `process.roles` asks this node to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessRoles {
    pub broker: bool,
    pub controller: bool,
}

/// Kafka's `ConfigType` as DescribeConfigs v3+ reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    Boolean = 1,
    String = 2,
    Int = 3,
    Long = 5,
    Double = 6,
    List = 7,
    Password = 9,
}

/// Kafka's `ConfigSource` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    DynamicTopicConfig = 1,
    /// Set for one broker through the metadata log (resource name = its id).
    DynamicBrokerConfig = 2,
    /// Set for every broker through the metadata log (resource name = "").
    DynamicDefaultBrokerConfig = 3,
    StaticBrokerConfig = 4,
    DefaultConfig = 5,
    /// A client metrics subscription's config (KIP-714).
    ClientMetricsConfig = 7,
    /// A GROUP resource's own config (`kafka-configs --entity-type groups`).
    GroupConfig = 8,
}

/// One topic-level config: its name, type, the broker key that supplies its default, and
/// Kafka's default when the broker key is not set either.
pub struct TopicConfigDef {
    pub name: &'static str,
    pub config_type: ConfigType,
    pub broker_key: &'static str,
    pub default: &'static str,
    pub doc: &'static str,
}

const fn def(
    name: &'static str,
    config_type: ConfigType,
    broker_key: &'static str,
    default: &'static str,
    doc: &'static str,
) -> TopicConfigDef {
    TopicConfigDef {
        name,
        config_type,
        broker_key,
        default,
        doc,
    }
}

/// The `broker_key` of a topic config that no broker key supplies a default for.
pub const NO_BROKER_KEY: &str = "";

/// Every topic config Rill knows, sorted by name (DescribeConfigs lists them in this order).
pub static TOPIC_CONFIGS: &[TopicConfigDef] = &[
    def(
        "cleanup.policy",
        ConfigType::List,
        "log.cleanup.policy",
        "delete",
        "delete or compact, or both",
    ),
    def(
        "compression.gzip.level",
        ConfigType::Int,
        "compression.gzip.level",
        "-1",
        "gzip level (1-9, -1 for the codec's default) when the broker compresses",
    ),
    def(
        "compression.lz4.level",
        ConfigType::Int,
        "compression.lz4.level",
        "9",
        "lz4 level (1-17) when the broker compresses; Rill's lz4 encoder has one level",
    ),
    def(
        "compression.type",
        ConfigType::String,
        "compression.type",
        "producer",
        "codec the broker stores batches with; producer keeps the producer's",
    ),
    def(
        "compression.zstd.level",
        ConfigType::Int,
        "compression.zstd.level",
        "3",
        "zstd level (-131072 to 22) when the broker compresses",
    ),
    def(
        "delete.retention.ms",
        ConfigType::Long,
        "log.cleaner.delete.retention.ms",
        "86400000",
        "how long tombstones are kept on compacted topics",
    ),
    def(
        "file.delete.delay.ms",
        ConfigType::Long,
        "log.segment.delete.delay.ms",
        "60000",
        "delay before a deleted segment's file is removed",
    ),
    def(
        "flush.messages",
        ConfigType::Long,
        "log.flush.interval.messages",
        "9223372036854775807",
        "fsync after this many messages",
    ),
    def(
        "flush.ms",
        ConfigType::Long,
        "log.flush.interval.ms",
        "9223372036854775807",
        "fsync after this much time",
    ),
    def(
        "follower.replication.throttled.replicas",
        ConfigType::List,
        NO_BROKER_KEY,
        "",
        "replicas whose fetches from the leader the replication throttle covers (partition:broker,... or *)",
    ),
    def(
        "index.interval.bytes",
        ConfigType::Int,
        "log.index.interval.bytes",
        "4096",
        "bytes between offset index entries",
    ),
    def(
        "leader.replication.throttled.replicas",
        ConfigType::List,
        NO_BROKER_KEY,
        "",
        "replicas whose leaders' sends the replication throttle covers (partition:broker,... or *)",
    ),
    def(
        "local.retention.bytes",
        ConfigType::Long,
        "log.local.retention.bytes",
        "-2",
        "largest size of a tiered partition's local part (-2: retention.bytes)",
    ),
    def(
        "local.retention.ms",
        ConfigType::Long,
        "log.local.retention.ms",
        "-2",
        "age after which a tiered partition's segments leave local disk (-2: retention.ms)",
    ),
    def(
        "max.compaction.lag.ms",
        ConfigType::Long,
        "log.cleaner.max.compaction.lag.ms",
        "9223372036854775807",
        "longest a record may stay uncompacted",
    ),
    def(
        "max.message.bytes",
        ConfigType::Int,
        "message.max.bytes",
        "1048588",
        "largest record batch the topic accepts",
    ),
    def(
        "message.timestamp.after.max.ms",
        ConfigType::Long,
        "log.message.timestamp.after.max.ms",
        "3600000",
        "how far in the future a CreateTime timestamp may be",
    ),
    def(
        "message.timestamp.before.max.ms",
        ConfigType::Long,
        "log.message.timestamp.before.max.ms",
        "9223372036854775807",
        "how far in the past a CreateTime timestamp may be",
    ),
    def(
        "message.timestamp.type",
        ConfigType::String,
        "log.message.timestamp.type",
        "CreateTime",
        "CreateTime or LogAppendTime",
    ),
    def(
        "min.cleanable.dirty.ratio",
        ConfigType::Double,
        "log.cleaner.min.cleanable.ratio",
        "0.5",
        "dirty ratio that makes a log eligible for cleaning",
    ),
    def(
        "min.compaction.lag.ms",
        ConfigType::Long,
        "log.cleaner.min.compaction.lag.ms",
        "0",
        "shortest time a record stays uncompacted",
    ),
    def(
        "min.insync.replicas",
        ConfigType::Int,
        "min.insync.replicas",
        "1",
        "replicas that must acknowledge an acks=all write",
    ),
    def(
        "preallocate",
        ConfigType::Boolean,
        "log.preallocate",
        "false",
        "preallocate segment files",
    ),
    def(
        "remote.log.copy.disable",
        ConfigType::Boolean,
        NO_BROKER_KEY,
        "false",
        "stop copying segments to the remote tier, which stays readable",
    ),
    def(
        "remote.log.delete.on.disable",
        ConfigType::Boolean,
        NO_BROKER_KEY,
        "false",
        "delete the remote data when remote.storage.enable is turned off",
    ),
    def(
        "remote.storage.enable",
        ConfigType::Boolean,
        NO_BROKER_KEY,
        "false",
        "copy closed segments to the remote tier (KIP-405)",
    ),
    def(
        "retention.bytes",
        ConfigType::Long,
        "log.retention.bytes",
        "-1",
        "largest size of a partition before old segments are deleted",
    ),
    def(
        "retention.ms",
        ConfigType::Long,
        "log.retention.ms",
        "604800000",
        "age after which old segments are deleted",
    ),
    def(
        "segment.bytes",
        ConfigType::Int,
        "log.segment.bytes",
        "1073741824",
        "size at which a segment is rolled",
    ),
    def(
        "segment.index.bytes",
        ConfigType::Int,
        "log.index.size.max.bytes",
        "10485760",
        "largest size of an offset index",
    ),
    def(
        "segment.jitter.ms",
        ConfigType::Long,
        "log.roll.jitter.ms",
        "0",
        "random jitter subtracted from segment.ms",
    ),
    def(
        "segment.ms",
        ConfigType::Long,
        "log.roll.ms",
        "604800000",
        "age at which a segment is rolled",
    ),
    def(
        "unclean.leader.election.enable",
        ConfigType::Boolean,
        "unclean.leader.election.enable",
        "false",
        "whether an out-of-sync replica may become leader",
    ),
];

pub fn topic_config_def(name: &str) -> Option<&'static TopicConfigDef> {
    TOPIC_CONFIGS.iter().find(|d| d.name == name)
}

/// Checks a value against a config's type and Kafka's allowed values.
pub fn validate_topic_config(name: &str, value: &str) -> Result<(), String> {
    let Some(d) = topic_config_def(name) else {
        return Err(format!("Unknown topic config name: {name}"));
    };
    let ok = match d.config_type {
        ConfigType::Boolean => matches!(value, "true" | "false"),
        ConfigType::Int => value.trim().parse::<i32>().is_ok(),
        ConfigType::Long => value.trim().parse::<i64>().is_ok(),
        ConfigType::Double => value.trim().parse::<f64>().is_ok(),
        ConfigType::String | ConfigType::List | ConfigType::Password => true,
    };
    if !ok {
        let expected = match d.config_type {
            ConfigType::Boolean => "true or false",
            ConfigType::Int => "an integer from -2147483648 to 2147483647",
            ConfigType::Long => "an integer from -9223372036854775808 to 9223372036854775807",
            ConfigType::Double => "a number",
            ConfigType::String | ConfigType::List | ConfigType::Password => "text",
        };
        return Err(format!(
            "invalid value {value} for configuration {name}: must be {expected}"
        ));
    }
    let allowed: &[&str] = match name {
        "cleanup.policy" => {
            let all = value
                .split(',')
                .map(str::trim)
                .all(|p| matches!(p, "delete" | "compact"));
            if !all || value.trim().is_empty() {
                return Err(format!(
                    "invalid value {value} for configuration {name}: must be delete and/or compact"
                ));
            }
            return Ok(());
        }
        "compression.type" => &["producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"],
        "message.timestamp.type" => &["CreateTime", "LogAppendTime"],
        "leader.replication.throttled.replicas" | "follower.replication.throttled.replicas" => {
            return validate_throttled_replicas(name, value);
        }
        "local.retention.ms" | "local.retention.bytes" => {
            return match value.trim().parse::<i64>() {
                Ok(v) if v >= -2 => Ok(()),
                _ => Err(format!(
                    "invalid value {value} for configuration {name}: Value must be at least -2"
                )),
            };
        }
        "compression.gzip.level" | "compression.lz4.level" | "compression.zstd.level" => {
            let (low, high) = compression_level_range(name);
            return match value.trim().parse::<i32>() {
                Ok(v) if (low..=high).contains(&v) || (name == "compression.gzip.level" && v == -1) => Ok(()),
                _ => Err(format!(
                    "invalid value {value} for configuration {name}: must be from {low} to {high}{}",
                    if name == "compression.gzip.level" { ", or -1" } else { "" }
                )),
            };
        }
        _ => return Ok(()),
    };
    if allowed.contains(&value) {
        Ok(())
    } else {
        Err(format!(
            "invalid value {value} for configuration {name}: allowed {}",
            allowed.join(", ")
        ))
    }
}

/// Kafka's checks of a topic's tiered-storage configs against each other
/// (`LogConfig.validateTopicLogConfigValues`): `value` is a config's effective value after
/// the change (the topic's override, else the broker's default), `was_enabled` whether
/// `remote.storage.enable` was on before it, `system_enabled` the broker's
/// `remote.log.storage.system.enable`.
pub fn validate_remote_log_configs(
    value: &dyn Fn(&str) -> String,
    was_enabled: bool,
    system_enabled: bool,
) -> Result<(), String> {
    let long = |name: &str| value(name).trim().parse::<i64>().unwrap_or(-1);
    let flag = |name: &str| value(name).trim().eq_ignore_ascii_case("true");
    if !flag("remote.storage.enable") {
        if was_enabled && !flag("remote.log.delete.on.disable") {
            return Err(
                "It is invalid to disable remote storage without deleting remote data. \
                If you want to keep the remote data and turn to read only, please set \
                `remote.storage.enable=true,remote.log.copy.disable=true`. If you want to \
                disable remote storage and delete all remote data, please set \
                `remote.storage.enable=false,remote.log.delete.on.disable=true`."
                    .into(),
            );
        }
        return Ok(());
    }
    if !system_enabled {
        return Err(
            "Tiered Storage functionality is disabled in the broker. Topic cannot be \
            configured with remote log storage."
                .into(),
        );
    }
    if value("cleanup.policy")
        .to_ascii_lowercase()
        .contains("compact")
    {
        return Err("Remote log storage is unsupported for the compacted topics".into());
    }
    for (total, local) in [
        ("retention.bytes", "local.retention.bytes"),
        ("retention.ms", "local.retention.ms"),
    ] {
        let (total_v, local_v) = (long(total), long(local));
        let bounded = if total == "retention.bytes" {
            total_v > -1
        } else {
            total_v != -1
        };
        if bounded && local_v != -2 {
            if local_v == -1 {
                return Err(format!(
                    "Invalid value -1 for configuration {local}: Value must not be -1 as {total} value is set as {total_v}."
                ));
            }
            if local_v > total_v {
                return Err(format!(
                    "Invalid value {local_v} for configuration {local}: Value must not be more than {total} property value: {total_v}"
                ));
            }
        }
    }
    if flag("remote.log.copy.disable") {
        for (total, local) in [
            ("retention.bytes", "local.retention.bytes"),
            ("retention.ms", "local.retention.ms"),
        ] {
            let local_v = long(local);
            if local_v != -2 && local_v != long(total) {
                return Err(format!(
                    "When `remote.log.copy.disable` is set to true, the `{local}` and `{total}` \
                     must be set to the identical value because there will be no more logs \
                     copied to the remote storage."
                ));
            }
        }
    }
    Ok(())
}

/// KIP-390's range for `compression.<codec>.level`.
fn compression_level_range(name: &str) -> (i32, i32) {
    match name {
        "compression.gzip.level" => (1, 9),
        "compression.lz4.level" => (1, 17),
        _ => (-131_072, 22),
    }
}

/// Kafka's `ThrottledReplicaListValidator`: `*`, or a list of `partition:broker` pairs.
fn validate_throttled_replicas(name: &str, value: &str) -> Result<(), String> {
    let value = value.trim();
    if value.is_empty() || value == "*" {
        return Ok(());
    }
    let pair = |p: &str| {
        let mut it = p.trim().split(':');
        matches!(
            (it.next(), it.next(), it.next()),
            (Some(a), Some(b), None) if a.trim().parse::<u32>().is_ok() && b.trim().parse::<u32>().is_ok()
        )
    };
    if value.split(',').all(pair) {
        Ok(())
    } else {
        Err(format!(
            "invalid value {value} for configuration {name}: must be the literal '*' or a list of replicas in the form [PartitionId]:[BrokerId],[PartitionId]:[BrokerId],..."
        ))
    }
}

/// Whether a broker key may be changed at run time through IncrementalAlterConfigs /
/// AlterConfigs on the BROKER resource (Kafka's `DynamicBrokerConfig.AllDynamicConfigs`):
/// the broker keys that supply topic defaults (`log.retention.ms`, `log.segment.bytes`,
/// `compression.type`, `message.max.bytes`, `min.insync.replicas`, `log.cleaner.*` topic
/// defaults, …), every topic log without an override being reconfigured when one
/// changes; and the keys of [`DYNAMIC_BROKER_KEYS`].
pub fn is_dynamic_broker_config(key: &str) -> bool {
    topic_config_for_broker_key(key).is_some()
        || dynamic_broker_key(key).is_some()
        || listener_tls_key(key).is_some()
}

/// The keys of Kafka's `SslConfigs.RECONFIGURABLE_CONFIGS` that Rill reads: set on one
/// broker as `listener.name.<listener>.<key>`, they replace that listener's key,
/// certificates or trusted CAs for the connections it accepts from then on (Kafka's
/// dynamic keystore update, KIP-226). Kafka takes them per broker only, and with the
/// listener's prefix only.
pub const RECONFIGURABLE_TLS_KEYS: [&str; 5] = [
    "ssl.keystore.type",
    "ssl.keystore.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.truststore.location",
];

/// The listener (lower case, as written) and the key of a dynamic TLS key
/// `listener.name.<listener>.<key>` (see [`RECONFIGURABLE_TLS_KEYS`]).
pub fn listener_tls_key(key: &str) -> Option<(&str, &str)> {
    let (listener, k) = key.strip_prefix("listener.name.")?.split_once('.')?;
    RECONFIGURABLE_TLS_KEYS
        .contains(&k)
        .then_some((listener, k))
}

/// Whether `key` is one of the dynamic broker keys that are no topic's default.
pub fn is_dynamic_broker_only(key: &str) -> bool {
    dynamic_broker_key(key).is_some()
}

/// The entry of [`DYNAMIC_BROKER_KEYS`] for `key`.
pub fn dynamic_broker_key(key: &str) -> Option<&'static DynamicBrokerKey> {
    DYNAMIC_BROKER_KEYS.iter().find(|d| d.name == key)
}

/// What Rill does with a dynamic broker key's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DynamicUse {
    /// Read again each time it is used, so a change applies at once.
    Live,
    /// Accepted, checked and described as Kafka does, so that Kafka's tools and the
    /// scripts written for them can set it; it sizes or tunes something Rill does not
    /// have (one of Kafka's thread pools, a Kerberos login), so it changes nothing.
    NoEffect,
}

/// How a value of a dynamic broker key is checked, after Kafka's `ConfigDef` types and
/// validators and its reconfigurables' own checks.
#[derive(Debug, Clone, Copy)]
enum Check {
    /// A whole number of at least this.
    AtLeast(i64),
    /// A number above zero.
    Positive,
    /// Any number.
    Number,
    /// Kafka's `DynamicThreadPool` (and the network threads): at least 1, and within
    /// half and double of this broker's current value.
    ThreadCount,
    /// Kafka's log cleaner: at least 1, and at most double the current value.
    CleanerThreads,
    /// `max.connections.per.ip.overrides`: `host:count` entries, comma separated.
    PerIpOverrides,
    /// Any text.
    Text,
    /// `true` or `false`, in any case (Java's `Boolean` config parsing).
    Boolean,
    /// One of Kafka's `SslConfigs.RECONFIGURABLE_CONFIGS` without a listener prefix:
    /// Kafka takes them per listener only (`listener.name.<l>.<key>`), and so does Rill.
    /// Checked only when set dynamically (the static config's own key is the broker's
    /// TLS setting).
    ListenerPrefixOnly,
    /// A Java class name: Rill loads no class, so only the classes Kafka ships that Rill
    /// does the work of (its default) are taken, when set dynamically; any other is "not
    /// found", as Kafka answers for a class it cannot load.
    KafkaClasses(&'static [&'static str]),
    /// Dynamic in Kafka, refused here with the reason (checked only when set
    /// dynamically).
    Refused(&'static str),
}

/// A broker key that is no topic's default yet changes at run time, as Kafka lists it.
#[derive(Debug)]
pub struct DynamicBrokerKey {
    pub name: &'static str,
    pub config_type: ConfigType,
    check: Check,
    pub usage: DynamicUse,
}

const fn dynamic(
    name: &'static str,
    config_type: ConfigType,
    check: Check,
    usage: DynamicUse,
) -> DynamicBrokerKey {
    DynamicBrokerKey {
        name,
        config_type,
        check,
        usage,
    }
}

/// The dynamic broker keys that are no topic's default. Live ones: Kafka's
/// `DynamicConnectionQuota` keys, which the listener reads for every connection it
/// accepts (connections already open stay open when a limit is lowered), and the log
/// cleaner's keys of Kafka's `LogCleaner.ReconfigurableConfigs` that Rill has, which the
/// cleaner reads for every clean and every wait, the replication throttles, which
/// a follower's fetch reads on the leader and the metadata publisher hands the fetchers,
/// `producer.id.expiration.ms`, which every producer expiration check reads,
/// `transaction.partition.verification.enable`, which every image applied reads, and
/// `num.network.threads`, which the listener looks for every second. The rest size
/// Kafka's other thread pools (tokio schedules Rill's tasks on one pool sized by the
/// machine), the cleaner's
/// I/O buffers (Rill's cleaner reads through the page cache and sizes its offset map by
/// `log.cleaner.dedupe.buffer.size` alone) and Kafka's Kerberos and SASL login (Rill has
/// no GSSAPI, and no SASL login of its own to refresh).
pub static DYNAMIC_BROKER_KEYS: &[DynamicBrokerKey] = &[
    dynamic(
        "max.connections",
        ConfigType::Int,
        Check::AtLeast(0),
        DynamicUse::Live,
    ),
    dynamic(
        "max.connections.per.ip",
        ConfigType::Int,
        Check::AtLeast(0),
        DynamicUse::Live,
    ),
    dynamic(
        "max.connection.creation.rate",
        ConfigType::Int,
        Check::AtLeast(0),
        DynamicUse::Live,
    ),
    dynamic(
        "max.connections.per.ip.overrides",
        ConfigType::String,
        Check::PerIpOverrides,
        DynamicUse::Live,
    ),
    dynamic(
        "log.cleaner.io.max.bytes.per.second",
        ConfigType::Double,
        Check::Positive,
        DynamicUse::Live,
    ),
    dynamic(
        "log.cleaner.dedupe.buffer.size",
        ConfigType::Long,
        Check::AtLeast(MIN_DEDUPE_BUFFER_BYTES),
        DynamicUse::Live,
    ),
    dynamic(
        "log.cleaner.backoff.ms",
        ConfigType::Long,
        Check::AtLeast(0),
        DynamicUse::Live,
    ),
    dynamic(
        "transaction.partition.verification.enable",
        ConfigType::Boolean,
        Check::Boolean,
        DynamicUse::Live,
    ),
    dynamic(
        "producer.id.expiration.ms",
        ConfigType::Int,
        Check::AtLeast(1),
        DynamicUse::Live,
    ),
    dynamic(
        "leader.replication.throttled.rate",
        ConfigType::Long,
        Check::AtLeast(0),
        DynamicUse::Live,
    ),
    dynamic(
        "follower.replication.throttled.rate",
        ConfigType::Long,
        Check::AtLeast(0),
        DynamicUse::Live,
    ),
    dynamic(
        "replica.alter.log.dirs.io.max.bytes.per.second",
        ConfigType::Long,
        Check::AtLeast(0),
        DynamicUse::Live,
    ),
    dynamic(
        "log.cleaner.threads",
        ConfigType::Int,
        Check::CleanerThreads,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "log.cleaner.io.buffer.size",
        ConfigType::Int,
        Check::AtLeast(0),
        DynamicUse::NoEffect,
    ),
    dynamic(
        "log.cleaner.io.buffer.load.factor",
        ConfigType::Double,
        Check::Number,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "background.threads",
        ConfigType::Int,
        Check::ThreadCount,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "num.io.threads",
        ConfigType::Int,
        Check::ThreadCount,
        DynamicUse::NoEffect,
    ),
    // Looked for every second: the network threads grow or shrink to it
    // (`network::threads`).
    dynamic(
        "num.network.threads",
        ConfigType::Int,
        Check::ThreadCount,
        DynamicUse::Live,
    ),
    dynamic(
        "num.recovery.threads.per.data.dir",
        ConfigType::Int,
        Check::ThreadCount,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "num.replica.fetchers",
        ConfigType::Int,
        Check::ThreadCount,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "sasl.kerberos.kinit.cmd",
        ConfigType::String,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "sasl.kerberos.min.time.before.relogin",
        ConfigType::Long,
        Check::Number,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "sasl.kerberos.principal.to.local.rules",
        ConfigType::List,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "sasl.kerberos.service.name",
        ConfigType::String,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "sasl.kerberos.ticket.renew.jitter",
        ConfigType::Double,
        Check::Number,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "sasl.kerberos.ticket.renew.window.factor",
        ConfigType::Double,
        Check::Number,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "sasl.login.refresh.buffer.seconds",
        ConfigType::Int,
        Check::Number,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "sasl.login.refresh.min.period.seconds",
        ConfigType::Int,
        Check::Number,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "sasl.login.refresh.window.factor",
        ConfigType::Double,
        Check::Number,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "sasl.login.refresh.window.jitter",
        ConfigType::Double,
        Check::Number,
        DynamicUse::NoEffect,
    ),
    // The rest of Kafka 4.1's dynamic broker keys (`KAFKA_DYNAMIC_BROKER_KEYS`). Listener
    // security keys without a listener prefix (Kafka's `DynamicListenerConfig`): Kafka
    // takes them and applies them to listeners added later, never to the running ones;
    // Rill adds no listener at run time, so they change nothing here either.
    dynamic(
        "sasl.enabled.mechanisms",
        ConfigType::List,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "sasl.jaas.config",
        ConfigType::Password,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "sasl.mechanism.inter.broker.protocol",
        ConfigType::String,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.cipher.suites",
        ConfigType::List,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.client.auth",
        ConfigType::String,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.enabled.protocols",
        ConfigType::List,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.endpoint.identification.algorithm",
        ConfigType::String,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.keymanager.algorithm",
        ConfigType::String,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.protocol",
        ConfigType::String,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.provider",
        ConfigType::String,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.secure.random.implementation",
        ConfigType::String,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.trustmanager.algorithm",
        ConfigType::String,
        Check::Text,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.engine.factory.class",
        ConfigType::String,
        Check::KafkaClasses(&[]),
        DynamicUse::NoEffect,
    ),
    // Kafka's `SslConfigs.RECONFIGURABLE_CONFIGS`: per listener only.
    dynamic(
        "ssl.key.password",
        ConfigType::Password,
        Check::ListenerPrefixOnly,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.keystore.certificate.chain",
        ConfigType::Password,
        Check::ListenerPrefixOnly,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.keystore.key",
        ConfigType::Password,
        Check::ListenerPrefixOnly,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.keystore.location",
        ConfigType::String,
        Check::ListenerPrefixOnly,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.keystore.password",
        ConfigType::Password,
        Check::ListenerPrefixOnly,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.keystore.type",
        ConfigType::String,
        Check::ListenerPrefixOnly,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.truststore.certificates",
        ConfigType::Password,
        Check::ListenerPrefixOnly,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.truststore.location",
        ConfigType::String,
        Check::ListenerPrefixOnly,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.truststore.password",
        ConfigType::Password,
        Check::ListenerPrefixOnly,
        DynamicUse::NoEffect,
    ),
    dynamic(
        "ssl.truststore.type",
        ConfigType::String,
        Check::ListenerPrefixOnly,
        DynamicUse::NoEffect,
    ),
    // Kafka adds and removes listeners at run time; Rill binds its listeners at start.
    dynamic(
        "listeners",
        ConfigType::List,
        Check::Refused(LISTENERS_AT_START),
        DynamicUse::NoEffect,
    ),
    dynamic(
        "listener.security.protocol.map",
        ConfigType::String,
        Check::Refused(LISTENERS_AT_START),
        DynamicUse::NoEffect,
    ),
    // Classes: Rill's own metrics (`/metrics`) and principals stand where Kafka's
    // defaults would.
    dynamic(
        "metric.reporters",
        ConfigType::List,
        Check::KafkaClasses(&["org.apache.kafka.common.metrics.JmxReporter"]),
        DynamicUse::NoEffect,
    ),
    dynamic(
        "principal.builder.class",
        ConfigType::String,
        Check::KafkaClasses(&[
            "org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder",
        ]),
        DynamicUse::NoEffect,
    ),
    // Tiered storage's (issue #22): Kafka takes them whether remote storage is on or
    // not; Rill has none yet.
    dynamic(
        "log.local.retention.bytes",
        ConfigType::Long,
        Check::AtLeast(-2),
        DynamicUse::NoEffect,
    ),
    dynamic(
        "log.local.retention.ms",
        ConfigType::Long,
        Check::AtLeast(-2),
        DynamicUse::NoEffect,
    ),
    dynamic(
        "remote.fetch.max.wait.ms",
        ConfigType::Int,
        Check::AtLeast(1),
        DynamicUse::NoEffect,
    ),
    dynamic(
        "remote.list.offsets.request.timeout.ms",
        ConfigType::Long,
        Check::AtLeast(1),
        DynamicUse::NoEffect,
    ),
    dynamic(
        "remote.log.index.file.cache.total.size.bytes",
        ConfigType::Long,
        Check::AtLeast(1),
        DynamicUse::NoEffect,
    ),
    dynamic(
        "remote.log.manager.copier.thread.pool.size",
        ConfigType::Int,
        Check::AtLeast(1),
        DynamicUse::NoEffect,
    ),
    dynamic(
        "remote.log.manager.copy.max.bytes.per.second",
        ConfigType::Long,
        Check::AtLeast(1),
        DynamicUse::NoEffect,
    ),
    dynamic(
        "remote.log.manager.expiration.thread.pool.size",
        ConfigType::Int,
        Check::AtLeast(1),
        DynamicUse::NoEffect,
    ),
    dynamic(
        "remote.log.manager.fetch.max.bytes.per.second",
        ConfigType::Long,
        Check::AtLeast(1),
        DynamicUse::NoEffect,
    ),
    dynamic(
        "remote.log.reader.threads",
        ConfigType::Int,
        Check::AtLeast(1),
        DynamicUse::NoEffect,
    ),
];

/// Why `listeners` and `listener.security.protocol.map` are refused at run time.
const LISTENERS_AT_START: &str = "Rill opens its listeners at start only: change them in \
     the broker's config file and restart it";

/// Every broker key Kafka 4.1.2 describes as changeable at run time (`read_only` false in
/// its DescribeConfigs of a broker; `DynamicBrokerConfig.AllDynamicConfigs`), from the
/// reference broker of `tests/compat` (its kafka-diff scenario `broker_configs` compares
/// the two brokers' flags for these keys). Each is dynamic in Rill too
/// ([`is_dynamic_broker_config`], a test checks): applied live, or taken and described as
/// Kafka describes it where it tunes something Rill does not have (`DynamicUse`), or —
/// `listeners` and `listener.security.protocol.map` alone — refused with the reason.
pub const KAFKA_DYNAMIC_BROKER_KEYS: &[&str] = &[
    "background.threads",
    "compression.gzip.level",
    "compression.lz4.level",
    "compression.type",
    "compression.zstd.level",
    "listener.security.protocol.map",
    "listeners",
    "log.cleaner.backoff.ms",
    "log.cleaner.dedupe.buffer.size",
    "log.cleaner.delete.retention.ms",
    "log.cleaner.io.buffer.load.factor",
    "log.cleaner.io.buffer.size",
    "log.cleaner.io.max.bytes.per.second",
    "log.cleaner.max.compaction.lag.ms",
    "log.cleaner.min.cleanable.ratio",
    "log.cleaner.min.compaction.lag.ms",
    "log.cleaner.threads",
    "log.cleanup.policy",
    "log.flush.interval.messages",
    "log.flush.interval.ms",
    "log.index.interval.bytes",
    "log.index.size.max.bytes",
    "log.local.retention.bytes",
    "log.local.retention.ms",
    "log.message.timestamp.after.max.ms",
    "log.message.timestamp.before.max.ms",
    "log.message.timestamp.type",
    "log.preallocate",
    "log.retention.bytes",
    "log.retention.ms",
    "log.roll.jitter.ms",
    "log.roll.ms",
    "log.segment.bytes",
    "log.segment.delete.delay.ms",
    "max.connection.creation.rate",
    "max.connections",
    "max.connections.per.ip",
    "max.connections.per.ip.overrides",
    "message.max.bytes",
    "metric.reporters",
    "min.insync.replicas",
    "num.io.threads",
    "num.network.threads",
    "num.recovery.threads.per.data.dir",
    "num.replica.fetchers",
    "principal.builder.class",
    "producer.id.expiration.ms",
    "remote.fetch.max.wait.ms",
    "remote.list.offsets.request.timeout.ms",
    "remote.log.index.file.cache.total.size.bytes",
    "remote.log.manager.copier.thread.pool.size",
    "remote.log.manager.copy.max.bytes.per.second",
    "remote.log.manager.expiration.thread.pool.size",
    "remote.log.manager.fetch.max.bytes.per.second",
    "remote.log.reader.threads",
    "sasl.enabled.mechanisms",
    "sasl.jaas.config",
    "sasl.kerberos.kinit.cmd",
    "sasl.kerberos.min.time.before.relogin",
    "sasl.kerberos.principal.to.local.rules",
    "sasl.kerberos.service.name",
    "sasl.kerberos.ticket.renew.jitter",
    "sasl.kerberos.ticket.renew.window.factor",
    "sasl.login.refresh.buffer.seconds",
    "sasl.login.refresh.min.period.seconds",
    "sasl.login.refresh.window.factor",
    "sasl.login.refresh.window.jitter",
    "sasl.mechanism.inter.broker.protocol",
    "ssl.cipher.suites",
    "ssl.client.auth",
    "ssl.enabled.protocols",
    "ssl.endpoint.identification.algorithm",
    "ssl.engine.factory.class",
    "ssl.key.password",
    "ssl.keymanager.algorithm",
    "ssl.keystore.certificate.chain",
    "ssl.keystore.key",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.keystore.type",
    "ssl.protocol",
    "ssl.provider",
    "ssl.secure.random.implementation",
    "ssl.trustmanager.algorithm",
    "ssl.truststore.certificates",
    "ssl.truststore.location",
    "ssl.truststore.password",
    "ssl.truststore.type",
    "transaction.partition.verification.enable",
    "unclean.leader.election.enable",
];

/// Kafka's `log.cleaner.io.max.bytes.per.second` default, `Double.MaxValue` as Java
/// prints it: no bound.
pub const CLEANER_IO_UNBOUNDED: &str = "1.7976931348623157E308";

/// The topic config a broker key supplies the default of, if any.
pub fn topic_config_for_broker_key(key: &str) -> Option<&'static TopicConfigDef> {
    TOPIC_CONFIGS
        .iter()
        .find(|d| d.broker_key == key && key != NO_BROKER_KEY)
}

/// Checks a value for a dynamic broker key on its own: its type and bounds (those of the
/// topic config it is the default of, if it is one), with Kafka's messages. See
/// [`validate_broker_change_of`] for the checks against the current value.
pub fn validate_broker_config(key: &str, value: &str) -> Result<(), String> {
    let invalid = |why: &str| format!("Invalid value {value} for configuration {key}: {why}");
    if listener_tls_key(key).is_some() {
        // Checked as a whole, by loading what the listener's keys name (see
        // `network::security::check_tls_change`).
        return Ok(());
    }
    let Some(d) = dynamic_broker_key(key) else {
        let Some(d) = topic_config_for_broker_key(key) else {
            return Err(format!("Cannot update these configs dynamically: {key}"));
        };
        return validate_topic_config(d.name, value).map_err(|m| m.replace(d.name, key));
    };
    let v = value.trim();
    let whole = || match d.config_type {
        ConfigType::Int => v
            .parse::<i32>()
            .map(i64::from)
            .map_err(|_| invalid("Not a number of type INT")),
        _ => v
            .parse::<i64>()
            .map_err(|_| invalid("Not a number of type LONG")),
    };
    // Java's Double.parseDouble takes the default's "1.7976931348623157E308"; so does
    // Rust's f64 parser.
    let number = || {
        v.parse::<f64>()
            .ok()
            .filter(|x| !x.is_nan())
            .ok_or_else(|| invalid("Not a number of type DOUBLE"))
    };
    match d.check {
        Check::AtLeast(min) => {
            if whole()? < min {
                return Err(invalid(&format!("Value must be at least {min}")));
            }
        }
        // Zero would stop the cleaner forever.
        Check::Positive => {
            if number()? <= 0.0 {
                return Err(invalid("Value must be a number above 0"));
            }
        }
        Check::Number if d.config_type == ConfigType::Double => {
            number()?;
        }
        Check::Number => {
            whole()?;
        }
        Check::ThreadCount | Check::CleanerThreads => {
            if whole()? < 1 {
                return Err(invalid("Value must be at least 1"));
            }
        }
        Check::PerIpOverrides => {
            parse_per_ip_overrides(v).map_err(|e| invalid(&e))?;
        }
        // Refusals of a dynamic update only (`refuse_dynamic_update`).
        Check::Text | Check::ListenerPrefixOnly | Check::KafkaClasses(_) | Check::Refused(_) => {}
        Check::Boolean => {
            if !v.eq_ignore_ascii_case("true") && !v.eq_ignore_ascii_case("false") {
                return Err(invalid("Expected value to be either true or false"));
            }
        }
    }
    Ok(())
}

/// The checks of a dynamic broker key's new value that depend on the value it replaces
/// (this broker's current one), as Kafka's reconfigurables make them: a thread pool may
/// shrink to half or grow to double at most, the cleaner's threads grow to double.
pub fn validate_broker_change_of(
    key: &str,
    value: &str,
    current: Option<&str>,
) -> Result<(), String> {
    validate_broker_config(key, value)?;
    refuse_dynamic_update(key, value)?;
    let (Some(d), Ok(new), Some(Ok(old))) = (
        dynamic_broker_key(key),
        value.trim().parse::<i64>(),
        current.map(|c| c.trim().parse::<i64>()),
    ) else {
        return Ok(());
    };
    if new == old {
        return Ok(());
    }
    match d.check {
        Check::ThreadCount if new < old / 2 => Err(format!(
            "Dynamic thread count update validation failed for {key}={value}, value should be at least half the current value {old}"
        )),
        Check::ThreadCount if new > old.saturating_mul(2) => Err(format!(
            "Dynamic thread count update validation failed for {key}={value}, value should not be greater than double the current value {old}"
        )),
        Check::CleanerThreads if new > old.saturating_mul(2) => Err(format!(
            "Log cleaner threads cannot be increased to more than double the current value {old}"
        )),
        _ => Ok(()),
    }
}

/// What a dynamic update may not set, whatever the value's form: the checks a static
/// config does not make (see [`Check::ListenerPrefixOnly`], [`Check::KafkaClasses`],
/// [`Check::Refused`]), with Kafka's messages where Kafka refuses too.
fn refuse_dynamic_update(key: &str, value: &str) -> Result<(), String> {
    let Some(d) = dynamic_broker_key(key) else {
        return Ok(());
    };
    match d.check {
        Check::ListenerPrefixOnly => Err(format!(
            "These security configs can be dynamically updated only per-listener using the \
             listener prefix: HashSet({key})"
        )),
        Check::KafkaClasses(known) => {
            let unknown = value
                .split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .find(|c| !known.contains(c));
            match unknown {
                Some(class) => Err(format!(
                    "Invalid value {value} for configuration {key}: Class {class} could not be \
                     found."
                )),
                None => Ok(()),
            }
        }
        Check::Refused(why) => Err(format!("Cannot update {key} dynamically: {why}")),
        _ => Ok(()),
    }
}

/// `max.connections.per.ip.overrides` (`host:count,host:count`) as its entries; a host
/// is an IP address or a name the listener resolves.
pub fn parse_per_ip_overrides(value: &str) -> Result<Vec<(String, usize)>, String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|entry| {
            let (host, count) = entry
                .rsplit_once(':')
                .filter(|(h, _)| !h.trim().is_empty())
                .ok_or_else(|| format!("entry {entry:?} is not host:count"))?;
            let count = count.trim().parse::<usize>().map_err(|_| {
                format!("the count of {entry:?} is not a whole number of at least 0")
            })?;
            Ok((host.trim().to_string(), count))
        })
        .collect()
}

/// The smallest `log.cleaner.dedupe.buffer.size` accepted: Kafka asks for room for at
/// least one segment's keys; a 1 MiB map keeps each clean to a few segments at worst.
const MIN_DEDUPE_BUFFER_BYTES: i64 = 1 << 20;

/// The log cleaner's settings as they are now: this broker's dynamic value, then the
/// cluster-wide default, then the static config, then Kafka's default.
pub fn cleaner_config(
    static_config: &BrokerConfig,
    image: &rill_metadata::MetadataImage,
    node_id: i32,
) -> rill_storage::CleanerConfig {
    let defaults = rill_storage::CleanerConfig::default();
    let value = |key: &str| {
        broker_config_value(static_config, image, node_id, key)
            .map(|(v, _)| v)
            .filter(|v| validate_broker_config(key, v).is_ok())
    };
    rill_storage::CleanerConfig {
        io_max_bytes_per_second: value("log.cleaner.io.max.bytes.per.second")
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(defaults.io_max_bytes_per_second),
        dedupe_buffer_size: value("log.cleaner.dedupe.buffer.size")
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(defaults.dedupe_buffer_size),
        ..defaults
    }
}

/// A broker key's value at every level where it is set, highest precedence first, as
/// Kafka lists synonyms: this broker's dynamic value, the cluster-wide dynamic default,
/// the static file/override, then the built-in default. Dynamic values are only taken
/// for keys that are dynamic, as Kafka ignores other keys in broker `ConfigRecord`s.
pub fn broker_config_synonyms(
    static_config: &BrokerConfig,
    image: &rill_metadata::MetadataImage,
    node_id: i32,
    key: &str,
) -> Vec<(String, ConfigSource)> {
    let mut out = Vec::new();
    if is_dynamic_broker_config(key) {
        let dynamic = |name: String| {
            image
                .configs
                .get(&(rill_metadata::RESOURCE_BROKER, name))
                .and_then(|c| c.get(key))
                .cloned()
        };
        if let Some(v) = dynamic(node_id.to_string()) {
            out.push((v, ConfigSource::DynamicBrokerConfig));
        }
        if let Some(v) = dynamic(String::new()) {
            out.push((v, ConfigSource::DynamicDefaultBrokerConfig));
        }
    }
    if let Some(v) = static_config.static_value(key) {
        out.push((v, ConfigSource::StaticBrokerConfig));
    }
    let default = BROKER_DEFAULTS
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| *v)
        .or_else(|| topic_config_for_broker_key(key).map(|d| d.default));
    if let Some(v) = default {
        out.push((v.to_string(), ConfigSource::DefaultConfig));
    }
    out
}

/// A broker key's effective value and where it comes from (see
/// [`broker_config_synonyms`]).
pub fn broker_config_value(
    static_config: &BrokerConfig,
    image: &rill_metadata::MetadataImage,
    node_id: i32,
    key: &str,
) -> Option<(String, ConfigSource)> {
    broker_config_synonyms(static_config, image, node_id, key)
        .into_iter()
        .next()
}

/// A topic config's effective value: the topic's override, else the broker default it
/// inherits at its highest level (dynamic per-broker, dynamic cluster-wide, static,
/// built-in).
pub fn topic_config_value(
    static_config: &BrokerConfig,
    image: &rill_metadata::MetadataImage,
    node_id: i32,
    topic: &str,
    name: &str,
) -> Option<(String, ConfigSource)> {
    if let Some(v) = image.topic_config(topic, name) {
        return Some((v.to_string(), ConfigSource::DynamicTopicConfig));
    }
    let def = topic_config_def(name)?;
    if def.broker_key == NO_BROKER_KEY {
        return Some((def.default.to_string(), ConfigSource::DefaultConfig));
    }
    broker_config_value(static_config, image, node_id, def.broker_key)
}

/// The storage settings of a topic's logs on broker `node_id`.
pub fn log_config(
    static_config: &BrokerConfig,
    image: &rill_metadata::MetadataImage,
    node_id: i32,
    topic: &str,
) -> rill_storage::LogConfig {
    use rill_storage::{LogConfig, MessageTimestampType};
    let get = |name: &str| {
        topic_config_value(static_config, image, node_id, topic, name)
            .map(|(v, _)| v)
            .unwrap_or_default()
    };
    let int = |name: &str| get(name).trim().parse::<i64>().ok();
    let mut c = LogConfig::default();
    if let Some(v) = int("segment.bytes") {
        c.segment_bytes = v.max(1) as u64;
    }
    if let Some(v) = int("segment.ms") {
        c.segment_ms = v;
    }
    if let Some(v) = int("index.interval.bytes") {
        c.index_interval_bytes = v.max(1) as u64;
    }
    if let Some(v) = int("segment.index.bytes") {
        c.segment_index_bytes = v.max(8) as u64;
    }
    if let Some(v) = int("max.message.bytes") {
        c.max_message_bytes = v.max(0) as usize;
    }
    c.flush_messages = int("flush.messages")
        .filter(|v| *v != i64::MAX)
        .map(|v| v as u64);
    c.flush_ms = int("flush.ms").filter(|v| *v != i64::MAX);
    if let Some(v) = int("retention.ms") {
        c.retention_ms = v;
    }
    if let Some(v) = int("retention.bytes") {
        c.retention_bytes = v;
    }
    if let Ok(policy) = get("cleanup.policy").parse() {
        c.cleanup_policy = policy;
    }
    if let Some(v) = int("delete.retention.ms") {
        c.delete_retention_ms = v;
    }
    if let Ok(v) = get("min.cleanable.dirty.ratio").trim().parse::<f64>() {
        if v.is_finite() {
            c.min_cleanable_dirty_ratio = v.clamp(0.0, 1.0);
        }
    }
    if let Some(v) = int("min.compaction.lag.ms") {
        c.min_compaction_lag_ms = v;
    }
    if let Some(v) = int("max.compaction.lag.ms") {
        c.max_compaction_lag_ms = v;
    }
    c.remote_storage_enable = get("remote.storage.enable").trim() == "true";
    if let Some(v) = int("local.retention.ms") {
        c.local_retention_ms = v;
    }
    if let Some(v) = int("local.retention.bytes") {
        c.local_retention_bytes = v;
    }
    c.remote_log_copy_disable = get("remote.log.copy.disable").trim() == "true";
    c.remote_log_delete_on_disable = get("remote.log.delete.on.disable").trim() == "true";
    if get("message.timestamp.type") == "LogAppendTime" {
        c.message_timestamp_type = MessageTimestampType::LogAppendTime;
    }
    // Kafka 4.0 dropped `message.timestamp.difference.max.ms` (both bounds at once).
    if let Some(v) = int("message.timestamp.before.max.ms") {
        c.message_timestamp_before_max_ms = v.max(0);
    }
    if let Some(v) = int("message.timestamp.after.max.ms") {
        c.message_timestamp_after_max_ms = v.max(0);
    }
    if let Ok(v) = get("compression.type").parse() {
        c.compression_type = v;
    }
    let level = |name: &str| {
        let v = get(name).trim().parse::<i32>().ok()?;
        let (low, high) = compression_level_range(name);
        (low..=high).contains(&v).then_some(v)
    };
    c.compression_gzip_level = level("compression.gzip.level");
    c.compression_zstd_level = level("compression.zstd.level");
    c
}

/// The directory of the metadata log under `log.dirs` (Kafka's name for it): the quorum
/// writes it, and the replica manager and the metadata publisher leave it alone.
pub const METADATA_LOG_DIR: &str = "__cluster_metadata-0";

/// The broker's configuration: every key as Kafka names it, with typed accessors.
#[derive(Debug, Clone, Default)]
pub struct BrokerConfig {
    /// Keys set in the file or by overrides. Absent keys take their defaults.
    props: BTreeMap<String, String>,
}

/// Broker keys with their defaults, as DescribeConfigs on the broker resource lists them.
pub static BROKER_DEFAULTS: &[(&str, &str)] = &[
    ("authorizer.class.name", ""),
    ("auto.create.topics.enable", "true"),
    ("auto.leader.rebalance.enable", "true"),
    ("broker.heartbeat.interval.ms", "2000"),
    ("broker.id.generation.enable", "true"),
    ("broker.session.timeout.ms", "9000"),
    ("follower.replication.throttled.rate", "9223372036854775807"),
    ("config.strict", "false"),
    ("connection.failed.authentication.delay.ms", "100"),
    ("connections.max.idle.ms", "600000"),
    ("controlled.shutdown.enable", "true"),
    ("controller.quorum.election.timeout.ms", "1000"),
    ("controller.quorum.voters", ""),
    ("default.replication.factor", "1"),
    ("group.initial.rebalance.delay.ms", "3000"),
    ("group.max.session.timeout.ms", "1800000"),
    ("group.max.size", "2147483647"),
    ("group.min.session.timeout.ms", "6000"),
    // Rill's HTTP listener (/metrics, /health/*), like Redpanda's admin API port; empty
    // turns it off.
    ("http.listeners", "127.0.0.1:9644"),
    ("leader.imbalance.check.interval.seconds", "300"),
    ("leader.replication.throttled.rate", "9223372036854775807"),
    ("listeners", "PLAINTEXT://127.0.0.1:9092"),
    ("log.cleaner.backoff.ms", "15000"),
    ("producer.id.expiration.ms", "86400000"),
    ("transaction.partition.verification.enable", "true"),
    ("producer.id.expiration.check.interval.ms", "600000"),
    // Tiered storage (KIP-405, `remote_log`): Kafka's `RemoteLogManagerConfig` keys, the
    // S3-compatible store's own (`remote.log.storage.s3.*`, Rill's; Kafka leaves them to
    // its plug-in) and the size of the local cache of remote data (Rill's).
    ("remote.log.storage.system.enable", "false"),
    ("remote.log.manager.task.interval.ms", "30000"),
    ("remote.log.manager.task.retry.backoff.ms", "500"),
    ("remote.log.manager.task.retry.backoff.max.ms", "30000"),
    ("remote.log.reader.cache.size.bytes", "1073741824"),
    ("remote.log.manager.copy.cleanup.delay.ms", "60000"),
    ("remote.log.manager.copier.thread.pool.size", "10"),
    ("remote.log.storage.s3.prefix", ""),
    ("remote.log.storage.s3.region", "us-east-1"),
    // `text` or `json` (tracing-subscriber's JSON lines); `--log-format` sets it.
    ("log.format", "text"),
    ("log.cleaner.dedupe.buffer.size", "134217728"),
    ("log.cleaner.io.max.bytes.per.second", CLEANER_IO_UNBOUNDED),
    ("log.dirs", "./rill-data"),
    // Empty: the first of `log.dirs` (Kafka's default, null, means the same).
    ("metadata.log.dir", ""),
    ("log.retention.check.interval.ms", "300000"),
    ("max.connection.creation.rate", "2147483647"),
    ("max.connections", "2147483647"),
    ("max.connections.per.ip", "2147483647"),
    // Per-partition series on /metrics only while this broker hosts at most this many
    // partitions (bounds the page's cardinality); 0 turns them off.
    ("metrics.partition.series.max", "1000"),
    ("max.request.partition.size.limit", "2000"),
    // KIP-227: the incremental fetch sessions a broker keeps (`server::fetch_session`).
    ("max.incremental.fetch.session.cache.slots", "1000"),
    ("node.id", "1"),
    ("num.partitions", "1"),
    ("num.replica.fetchers", "1"),
    // The group coordinator's defaults and bounds for the GROUP resource's configs
    // (`server::group_configs`), Kafka 4.1's values.
    ("group.consumer.session.timeout.ms", "45000"),
    ("group.consumer.min.session.timeout.ms", "45000"),
    ("group.consumer.max.session.timeout.ms", "60000"),
    ("group.consumer.heartbeat.interval.ms", "5000"),
    ("group.consumer.min.heartbeat.interval.ms", "5000"),
    ("group.consumer.max.heartbeat.interval.ms", "15000"),
    // KIP-848's server-side assignors, by Kafka's class names (or their short names,
    // `uniform` and `range`); the first is the default.
    (
        "group.consumer.assignors",
        "org.apache.kafka.coordinator.group.assignor.UniformAssignor,org.apache.kafka.coordinator.group.assignor.RangeAssignor",
    ),
    ("group.consumer.max.size", "2147483647"),
    // KIP-848's online migration: `disabled`, `upgrade`, `downgrade` or `bidirectional`.
    ("group.consumer.migration.policy", "bidirectional"),
    // KIP-932: the most members a share group takes (GROUP_MAX_SIZE_REACHED beyond).
    ("group.share.max.size", "200"),
    ("group.share.session.timeout.ms", "45000"),
    ("group.share.min.session.timeout.ms", "45000"),
    ("group.share.max.session.timeout.ms", "60000"),
    ("group.share.heartbeat.interval.ms", "5000"),
    ("group.share.min.heartbeat.interval.ms", "5000"),
    ("group.share.max.heartbeat.interval.ms", "15000"),
    ("group.share.record.lock.duration.ms", "30000"),
    ("group.share.min.record.lock.duration.ms", "15000"),
    ("group.share.max.record.lock.duration.ms", "60000"),
    // Kafka 4.2's share-partition limits and the share sessions a broker keeps.
    ("group.share.delivery.count.limit", "5"),
    ("group.share.partition.max.record.locks", "2000"),
    ("group.share.max.share.sessions", "2000"),
    // KIP-932's share coordinator and its `__share_group_state` topic.
    ("share.coordinator.state.topic.num.partitions", "50"),
    ("share.coordinator.state.topic.replication.factor", "3"),
    ("share.coordinator.state.topic.min.isr", "2"),
    ("share.coordinator.state.topic.segment.bytes", "104857600"),
    ("share.coordinator.snapshot.update.records.per.snapshot", "500"),
    ("share.coordinator.cold.partition.snapshot.interval.ms", "300000"),
    ("share.coordinator.write.timeout.ms", "5000"),
    ("share.coordinator.state.topic.prune.interval.ms", "300000"),
    ("group.streams.session.timeout.ms", "45000"),
    ("group.streams.min.session.timeout.ms", "45000"),
    ("group.streams.max.session.timeout.ms", "60000"),
    ("group.streams.heartbeat.interval.ms", "5000"),
    ("group.streams.min.heartbeat.interval.ms", "5000"),
    ("group.streams.max.heartbeat.interval.ms", "15000"),
    ("group.streams.num.standby.replicas", "0"),
    ("group.streams.max.standby.replicas", "2"),
    ("offsets.commit.timeout.ms", "5000"),
    ("offsets.retention.minutes", "10080"),
    ("offsets.topic.num.partitions", "50"),
    ("offsets.topic.replication.factor", "3"),
    ("offsets.topic.segment.bytes", "104857600"),
    ("process.roles", "broker,controller"),
    ("queued.max.request.bytes", "104857600"),
    ("quota.window.num", "11"),
    ("quota.window.size.seconds", "1"),
    ("replication.quota.window.num", "11"),
    ("replication.quota.window.size.seconds", "1"),
    ("queued.max.requests", "500"),
    (
        "replica.alter.log.dirs.io.max.bytes.per.second",
        "9223372036854775807",
    ),
    ("replica.fetch.max.bytes", "1048576"),
    ("replica.fetch.wait.max.ms", "500"),
    ("replica.lag.time.max.ms", "10000"),
    ("sasl.server.max.receive.size", "524288"),
    ("connections.max.reauth.ms", "0"),
    ("delegation.token.expiry.check.interval.ms", "3600000"),
    ("delegation.token.expiry.time.ms", "86400000"),
    ("delegation.token.max.lifetime.ms", "604800000"),
    ("socket.request.max.bytes", "104857600"),
    (
        "transaction.abort.timed.out.transaction.cleanup.interval.ms",
        "10000",
    ),
    ("transaction.max.timeout.ms", "900000"),
    ("transaction.state.log.min.isr", "2"),
    ("transaction.state.log.num.partitions", "50"),
    ("transaction.state.log.replication.factor", "3"),
    ("transaction.state.log.segment.bytes", "104857600"),
    ("transactional.id.expiration.ms", "604800000"),
    ("background.threads", "10"),
    ("log.cleaner.io.buffer.load.factor", "0.9"),
    ("log.cleaner.io.buffer.size", "524288"),
    ("log.cleaner.threads", "1"),
    ("max.connections.per.ip.overrides", ""),
    ("num.io.threads", "8"),
    ("num.network.threads", "3"),
    ("num.recovery.threads.per.data.dir", "2"),
    ("sasl.kerberos.kinit.cmd", "/usr/bin/kinit"),
    ("sasl.kerberos.min.time.before.relogin", "60000"),
    ("sasl.kerberos.principal.to.local.rules", "DEFAULT"),
    ("sasl.kerberos.ticket.renew.jitter", "0.05"),
    ("sasl.kerberos.ticket.renew.window.factor", "0.8"),
    ("sasl.login.refresh.buffer.seconds", "300"),
    ("sasl.login.refresh.min.period.seconds", "60"),
    ("sasl.login.refresh.window.factor", "0.8"),
    ("sasl.login.refresh.window.jitter", "0.05"),
    // Kafka's defaults of the dynamic keys Rill takes but has no use for (see
    // `DYNAMIC_BROKER_KEYS`), so that DescribeConfigs shows what Kafka's does.
    ("log.local.retention.bytes", "-2"),
    ("log.local.retention.ms", "-2"),
    (
        "metric.reporters",
        "org.apache.kafka.common.metrics.JmxReporter",
    ),
    (
        "principal.builder.class",
        "org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder",
    ),
    ("remote.fetch.max.wait.ms", "500"),
    ("remote.list.offsets.request.timeout.ms", "30000"),
    ("remote.log.index.file.cache.total.size.bytes", "1073741824"),
    ("remote.log.manager.copier.thread.pool.size", "10"),
    (
        "remote.log.manager.copy.max.bytes.per.second",
        "9223372036854775807",
    ),
    ("remote.log.manager.expiration.thread.pool.size", "10"),
    (
        "remote.log.manager.fetch.max.bytes.per.second",
        "9223372036854775807",
    ),
    ("remote.log.reader.threads", "10"),
    ("ssl.cipher.suites", ""),
    ("ssl.enabled.protocols", "TLSv1.2,TLSv1.3"),
    ("ssl.endpoint.identification.algorithm", "https"),
    ("ssl.keymanager.algorithm", "SunX509"),
    ("ssl.protocol", "TLSv1.3"),
    ("ssl.trustmanager.algorithm", "PKIX"),
];

/// Broker keys Rill reads that have no default of their own (unset means "not given").
const KEYS_WITHOUT_DEFAULT: &[&str] = &[
    // The remote tier's store (see `remote_log::storage`): its bucket, an endpoint for
    // an S3-compatible store other than AWS's, and static credentials (else the
    // environment's, as the AWS SDKs find them).
    "remote.log.storage.s3.bucket",
    "remote.log.storage.s3.endpoint",
    "remote.log.storage.s3.access.key.id",
    "remote.log.storage.s3.secret.access.key",
    "advertised.listeners",
    // Delegation tokens are on when the key is set (see `server::delegation_tokens`);
    // `master` is its name before Kafka 2.5, still read.
    "delegation.token.master.key",
    "delegation.token.secret.key",
    // The listener the web console connects to (default: the first PLAINTEXT one).
    "console.listener.name",
    // Kafka's default is null (see `DYNAMIC_BROKER_KEYS`).
    "sasl.kerberos.service.name",
    "sasl.jaas.config",
    "ssl.engine.factory.class",
    "ssl.keystore.certificate.chain",
    "ssl.keystore.key",
    "ssl.keystore.password",
    "ssl.provider",
    "ssl.secure.random.implementation",
    "ssl.truststore.certificates",
    "ssl.truststore.password",
    // The authorizer's own keys (Kafka passes them to it; they are no KafkaConfig).
    "allow.everyone.if.no.acl.found",
    "broker.rack",
    "cluster.id",
    "controller.listener.names",
    // The HTTP listener's security (see `http::auth`): `none` or `basic`, unset meaning
    // `basic` when a client listener uses SASL; and its TLS.
    "http.authentication",
    "http.bearer.tokens.file",
    "http.ssl.certificate.location",
    "http.ssl.enabled",
    "http.ssl.key.location",
    "http.ssl.keystore.location",
    "inter.broker.listener.name",
    "listener.security.protocol.map",
    // Security (see `network::security`): TLS key material and client authentication,
    // SASL mechanisms and PLAIN users.
    "plain.sasl.jaas.config",
    "sasl.enabled.mechanisms",
    "sasl.plain.users.file",
    // OAUTHBEARER (see `network::oauthbearer`): the validator, its JWKS file and the
    // claims it checks; and KIP-368's session lifetime per mechanism
    // (`listener.name.<l>.<mechanism>.connections.max.reauth.ms`).
    "oauthbearer.sasl.jaas.config",
    "oauthbearer.sasl.server.callback.handler.class",
    "sasl.oauthbearer.jwks.endpoint.url",
    "sasl.oauthbearer.expected.audience",
    "sasl.oauthbearer.expected.issuer",
    "sasl.oauthbearer.clock.skew.seconds",
    "sasl.oauthbearer.sub.claim.name",
    "sasl.oauthbearer.scope.claim.name",
    "plain.connections.max.reauth.ms",
    "scram-sha-256.connections.max.reauth.ms",
    "scram-sha-512.connections.max.reauth.ms",
    "oauthbearer.connections.max.reauth.ms",
    // The inter-broker listener's client side (see `network::inter_broker`): the
    // mechanism (PLAIN unless set) and the broker's login, per mechanism as Kafka
    // spells it (`listener.name.<listener>.scram-sha-512.sasl.jaas.config`).
    "security.inter.broker.protocol",
    "sasl.mechanism.inter.broker.protocol",
    "sasl.mechanism.controller.protocol",
    "sasl.jaas.config",
    "scram-sha-256.sasl.jaas.config",
    "scram-sha-512.sasl.jaas.config",
    "ssl.endpoint.identification.algorithm",
    "ssl.certificate.location",
    "ssl.client.auth",
    "ssl.enabled.protocols",
    "ssl.key.location",
    "ssl.keystore.location",
    "ssl.keystore.type",
    "ssl.principal.mapping.rules",
    "ssl.truststore.location",
    "ssl.truststore.type",
    "super.users",
];

/// Kafka's coarser spellings of a millisecond key, highest precedence first after the
/// key itself, with their factor to milliseconds (Kafka's `log.retention.ms` >
/// `log.retention.minutes` > `log.retention.hours`, and likewise for segment rolls).
const UNIT_SYNONYMS: &[(&str, &[(&str, i64)])] = &[
    (
        "log.retention.ms",
        &[
            ("log.retention.minutes", 60_000),
            ("log.retention.hours", 3_600_000),
        ],
    ),
    ("log.roll.ms", &[("log.roll.hours", 3_600_000)]),
    (
        "log.roll.jitter.ms",
        &[("log.roll.jitter.hours", 3_600_000)],
    ),
];

/// Kafka broker keys Rill accepts and deliberately ignores, so that a `server.properties`
/// written for Kafka starts without a warning for each: they size socket buffers that
/// Rill leaves to the kernel (Kafka's thread-pool keys are dynamic, and so in
/// [`DYNAMIC_BROKER_KEYS`]). Keep this list
/// short and explicit: a key here is never warned about, so it must be one whose absence
/// of effect a user cannot be relying on.
pub static IGNORED_KAFKA_KEYS: &[&str] =
    &["socket.receive.buffer.bytes", "socket.send.buffer.bytes"];

/// A key set in the file or an override that Rill does not know: a typo, or a Kafka
/// setting Rill does not implement. Either way the setting does not apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownKey {
    pub key: String,
    /// The known key it most likely meant, when one is close enough.
    pub suggestion: Option<&'static str>,
}

impl std::fmt::Display for UnknownKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "`{}` is not a configuration Rill knows", self.key)?;
        match self.suggestion {
            Some(s) => write!(f, "; did you mean `{s}`?"),
            None => write!(f, "; it has no effect"),
        }
    }
}

/// Whether Rill reads `key` as a broker configuration (or accepts it on purpose, see
/// [`IGNORED_KAFKA_KEYS`]).
pub fn is_known_broker_key(key: &str) -> bool {
    // The console's client settings (`rill-client`'s names; it checks them itself).
    if key.starts_with("console.client.") {
        return true;
    }
    if let Some((_, inner)) = listener_scoped(key) {
        return known_broker_keys().any(|k| k == inner);
    }
    known_broker_keys().any(|k| k == key) || IGNORED_KAFKA_KEYS.contains(&key)
}

/// Whether a broker config holds a secret, whose value DescribeConfigs must not show
/// (Kafka's PASSWORD type: `is_sensitive`, no value). Kafka's password keys, at any
/// listener or mechanism prefix (`listener.name.<l>.`, `plain.sasl.jaas.config`), and,
/// as Kafka treats configs of unknown type, any key that names a password or a secret.
pub fn is_sensitive_broker_key(key: &str) -> bool {
    let key = listener_scoped(key).map_or(key, |(_, inner)| inner);
    const SECRETS: &[&str] = &[
        "ssl.keystore.key",
        "ssl.keystore.certificate.chain",
        "ssl.truststore.certificates",
        "delegation.token.master.key",
        "delegation.token.secret.key",
    ];
    key.ends_with("sasl.jaas.config")
        || key.contains("password")
        || key.contains("secret")
        || SECRETS.iter().any(|s| key.ends_with(s))
}

/// `listener.name.<listener>.<key>` (Kafka's per-listener override) as `(listener, key)`.
fn listener_scoped(key: &str) -> Option<(&str, &str)> {
    key.strip_prefix("listener.name.")?.split_once('.')
}

/// Every broker key Rill reads.
fn known_broker_keys() -> impl Iterator<Item = &'static str> {
    BROKER_DEFAULTS
        .iter()
        .map(|(k, _)| *k)
        .chain(
            TOPIC_CONFIGS
                .iter()
                .map(|d| d.broker_key)
                .filter(|k| *k != NO_BROKER_KEY),
        )
        .chain(KEYS_WITHOUT_DEFAULT.iter().copied())
        .chain(
            UNIT_SYNONYMS
                .iter()
                .flat_map(|(_, synonyms)| synonyms.iter().map(|(k, _)| *k)),
        )
}

/// The known broker key `key` most likely is a misspelling of: a topic config's name
/// given at the broker names the broker key that sets its default (`retention.ms` is
/// `log.retention.ms` there), else the nearest key by edit distance, when the distance
/// is small for the key's length (a third of it, at most three edits) so that an
/// unrelated key gets no suggestion rather than a random one.
pub fn suggest_broker_key(key: &str) -> Option<&'static str> {
    if let Some(d) = topic_config_def(key) {
        if d.broker_key != key && d.broker_key != NO_BROKER_KEY {
            return Some(d.broker_key);
        }
    }
    let limit = (key.chars().count() / 3).clamp(1, 3);
    known_broker_keys()
        .map(|k| (levenshtein(key, k), k))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, k)| k)
}

/// The number of single-character insertions, deletions and substitutions that turn
/// `a` into `b` (two rows of the classic dynamic programme).
fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    let mut current = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        current[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        std::mem::swap(&mut previous, &mut current);
    }
    previous[b.len()]
}

/// What a value must be to parse as `T`, for the messages of [`BrokerConfig::parse`].
fn expected_value<T>() -> String {
    let name = std::any::type_name::<T>();
    let range = |min: i128, max: i128| format!("an integer from {min} to {max}");
    match name {
        "i16" => range(i16::MIN.into(), i16::MAX.into()),
        "i32" => range(i32::MIN.into(), i32::MAX.into()),
        "i64" => range(i64::MIN.into(), i64::MAX.into()),
        "u16" => range(0, u16::MAX.into()),
        "u32" => range(0, u32::MAX.into()),
        "u64" => range(0, u64::MAX.into()),
        "usize" => range(0, usize::MAX as i128),
        "f64" | "f32" => "a number".to_string(),
        "bool" => "true or false".to_string(),
        other => format!("a {other}"),
    }
}

impl BrokerConfig {
    /// Parses a TOML file's text. Keys may be dotted strings (`"log.dirs" = "…"`) or TOML
    /// tables (`[log] dirs = "…"`); both flatten to Kafka's dotted names.
    pub fn from_toml(text: &str) -> Result<Self, BrokerError> {
        let value: toml::Table = text
            .parse()
            .map_err(|e| BrokerError::Config(format!("config file: {e}")))?;
        let mut props = BTreeMap::new();
        flatten("", &toml::Value::Table(value), &mut props);
        Ok(Self { props })
    }

    /// Applies one `key=value` override.
    pub fn set_override(&mut self, kv: &str) -> Result<(), BrokerError> {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(BrokerError::Config(format!(
                "override {kv:?} is not key=value"
            )));
        };
        self.set(k.trim(), v.trim());
        Ok(())
    }

    pub fn set(&mut self, key: &str, value: &str) {
        self.props.insert(key.to_string(), value.to_string());
    }

    /// The value of a key as set, else its broker default, else a topic config's default.
    /// A `.ms` key that Kafka also takes in coarser units (`log.retention.hours`) is read
    /// through [`BrokerConfig::static_value`] instead, which sees those too.
    pub fn get(&self, key: &str) -> Option<&str> {
        if let Some(v) = self.props.get(key) {
            return Some(v);
        }
        if let Some((_, v)) = BROKER_DEFAULTS.iter().find(|(k, _)| *k == key) {
            return Some(v);
        }
        TOPIC_CONFIGS
            .iter()
            .find(|d| d.broker_key == key)
            .map(|d| d.default)
    }

    pub fn is_set(&self, key: &str) -> bool {
        self.props.contains_key(key)
    }

    /// Keys explicitly set, for DescribeConfigs on the broker.
    pub fn explicit(&self) -> impl Iterator<Item = (&str, &str)> {
        self.props.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub(crate) fn parse<T: std::str::FromStr>(&self, key: &str) -> Result<T, BrokerError> {
        let raw = self.get(key).unwrap_or_default();
        raw.trim().parse().map_err(|_| {
            BrokerError::Config(format!(
                "{key}: invalid value {raw:?}: must be {}",
                expected_value::<T>()
            ))
        })
    }

    /// The value set for `key` in the file or overrides, else derived from one of its
    /// coarser Kafka spellings ([`UNIT_SYNONYMS`]: `log.retention.hours=24` sets
    /// `log.retention.ms` to 86400000); `None` when neither is set. A negative value
    /// stays -1, Kafka's "unbounded".
    pub fn static_value(&self, key: &str) -> Option<String> {
        if let Some(v) = self.props.get(key) {
            return Some(v.clone());
        }
        let (_, synonyms) = UNIT_SYNONYMS.iter().find(|(k, _)| *k == key)?;
        synonyms.iter().find_map(|(synonym, factor)| {
            let v: i64 = self.props.get(*synonym)?.trim().parse().ok()?;
            Some(if v < 0 { -1 } else { v.saturating_mul(*factor) }.to_string())
        })
    }

    /// The keys set in the file or by overrides that Rill does not know, each with the
    /// known key it most likely meant.
    pub fn unknown_keys(&self) -> Vec<UnknownKey> {
        self.props
            .keys()
            .filter(|k| !is_known_broker_key(k))
            .map(|k| UnknownKey {
                key: k.clone(),
                suggestion: suggest_broker_key(k),
            })
            .collect()
    }

    /// Logs a warning for every unknown key (Kafka's "was supplied but isn't a known
    /// config"); [`BrokerConfig::validate`] refuses them instead when `config.strict`.
    pub fn warn_unknown_keys(&self) {
        if self.strict().unwrap_or(false) {
            // `validate` names them in its refusal; a warning first would say "ignored".
            return;
        }
        for unknown in self.unknown_keys() {
            tracing::warn!("{unknown} (ignored; --strict-config refuses to start instead)");
        }
    }

    /// `config.strict` (`--strict-config`): an unknown key refuses the start.
    pub fn strict(&self) -> Result<bool, BrokerError> {
        self.parse("config.strict")
    }

    pub fn node_id(&self) -> Result<i32, BrokerError> {
        self.parse("node.id")
    }

    /// The entries of `listeners` as `(name, host:port)`; a bare `host:port` is PLAINTEXT.
    fn listeners(&self) -> Vec<(String, String)> {
        let raw = self.get("listeners").unwrap_or_default();
        raw.split(',')
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(|l| match l.split_once("://") {
                Some((name, rest)) => (name.to_ascii_uppercase(), rest.to_string()),
                None => ("PLAINTEXT".to_string(), l.to_string()),
            })
            .collect()
    }

    fn parse_addr(key: &str, hostport: &str) -> Result<SocketAddr, BrokerError> {
        let hostport = hostport.replace("localhost", "127.0.0.1");
        let hostport = if hostport.starts_with(':') {
            format!("0.0.0.0{hostport}")
        } else {
            hostport
        };
        hostport.parse().map_err(|_| {
            BrokerError::Config(format!(
                "{key}: invalid value {hostport:?}: must be HOST:PORT with a numeric IP \
                     address (or localhost) and a port from 0 to 65535"
            ))
        })
    }

    /// `http.listeners`: the HTTP listener's address (one `HOST:PORT`, an optional
    /// `http://` in front), `None` when the value is empty.
    pub fn http_listener(&self) -> Result<Option<SocketAddr>, BrokerError> {
        let raw = self.get("http.listeners").unwrap_or_default().trim();
        let raw = raw.strip_prefix("http://").unwrap_or(raw);
        if raw.is_empty() {
            return Ok(None);
        }
        if raw.contains(',') {
            return Err(BrokerError::Config(format!(
                "http.listeners: invalid value {raw:?}: one HOST:PORT (or empty for none)"
            )));
        }
        Self::parse_addr("http.listeners", raw).map(Some)
    }

    /// `controller.listener.names`: the listeners that serve the controller quorum, never
    /// clients (`CONTROLLER` unless set).
    fn controller_listener_names(&self) -> Vec<String> {
        let raw = self
            .props
            .get("controller.listener.names")
            .map_or(CONTROLLER_LISTENER, String::as_str);
        raw.split(',')
            .map(|n| n.trim().to_ascii_uppercase())
            .filter(|n| !n.is_empty())
            .collect()
    }

    /// `listener.security.protocol.map` (`NAME:PROTOCOL,…`). A listener named after a
    /// protocol (`SSL://…`) needs no entry, as with Kafka's default map.
    pub fn security_protocol_map(&self) -> Result<BTreeMap<String, SecurityProtocol>, BrokerError> {
        let mut map: BTreeMap<String, SecurityProtocol> = SecurityProtocol::ALL
            .iter()
            .map(|p| (p.name().to_string(), *p))
            .collect();
        let raw = self
            .get("listener.security.protocol.map")
            .unwrap_or_default();
        for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let parsed = entry.split_once(':').and_then(|(name, protocol)| {
                Some((
                    name.trim().to_ascii_uppercase(),
                    SecurityProtocol::parse(protocol)?,
                ))
            });
            let Some((name, protocol)) = parsed else {
                return Err(BrokerError::Config(format!(
                    "listener.security.protocol.map: invalid entry {entry:?}: must be \
                     NAME:PROTOCOL with PROTOCOL one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"
                )));
            };
            map.insert(name, protocol);
        }
        Ok(map)
    }

    /// The client listeners (every entry of `listeners` but the controller's), in order,
    /// each with its security protocol.
    pub fn client_listeners(&self) -> Result<Vec<ListenerConfig>, BrokerError> {
        let map = self.security_protocol_map()?;
        let controller = self.controller_listener_names();
        let mut out: Vec<ListenerConfig> = Vec::new();
        for (name, hostport) in self.listeners() {
            if controller.contains(&name) {
                continue;
            }
            if out.iter().any(|l| l.name == name) {
                return Err(BrokerError::Config(format!(
                    "listeners: the listener name {name} is used twice"
                )));
            }
            let protocol = *map.get(&name).ok_or_else(|| {
                BrokerError::Config(format!(
                    "listeners: no security protocol for listener {name}: add \
                     {name}:PROTOCOL to listener.security.protocol.map"
                ))
            })?;
            out.push(ListenerConfig {
                name,
                addr: Self::parse_addr("listeners", &hostport)?,
                protocol,
            });
        }
        if out.is_empty() {
            return Err(BrokerError::Config("listeners: no client listener".into()));
        }
        Ok(out)
    }

    /// The address clients connect to first: the first client listener's.
    pub fn listen_addr(&self) -> Result<SocketAddr, BrokerError> {
        let first = self.client_listeners()?;
        first
            .first()
            .map(|l| l.addr)
            .ok_or_else(|| BrokerError::Config("listeners: no client listener".into()))
    }

    /// The controller listener (`CONTROLLER://host:port` in `listeners`), where the Raft
    /// quorum and controller requests are served; `None` when not configured.
    pub fn controller_listen_addr(&self) -> Result<Option<SocketAddr>, BrokerError> {
        let controller = self.controller_listener_names();
        self.listeners()
            .into_iter()
            .find(|(name, _)| controller.contains(name))
            .map(|(_, hp)| Self::parse_addr("listeners", &hp))
            .transpose()
    }

    /// The controller listener as the quorum serves and dials it: the first of
    /// `controller.listener.names`, its address (port 0 when `listeners` has none: a
    /// broker-only node's observer port, or a single node's own quorum), and its protocol
    /// from `listener.security.protocol.map`. A name the map does not mention is
    /// PLAINTEXT, as before the controller listener could be anything else (Kafka refuses
    /// to start instead).
    pub fn controller_listener(&self) -> Result<ListenerConfig, BrokerError> {
        let name = self
            .controller_listener_names()
            .into_iter()
            .next()
            .unwrap_or_else(|| CONTROLLER_LISTENER.to_string());
        let protocol = self
            .security_protocol_map()?
            .get(&name)
            .copied()
            .unwrap_or(SecurityProtocol::Plaintext);
        let addr = self
            .controller_listen_addr()?
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        Ok(ListenerConfig {
            name,
            addr,
            protocol,
        })
    }

    /// `advertised.listeners` as `NAME -> (host, port)`; a bare `HOST:PORT` entry is the
    /// first client listener's.
    fn advertised_by_name(&self) -> Result<BTreeMap<String, (String, u16)>, BrokerError> {
        let mut out = BTreeMap::new();
        let Some(raw) = self.props.get("advertised.listeners") else {
            return Ok(out);
        };
        let first = self
            .client_listeners()?
            .first()
            .map(|l| l.name.clone())
            .unwrap_or_default();
        let bad = || {
            BrokerError::Config(format!(
                "advertised.listeners: invalid value {raw:?}: must be [NAME://]HOST:PORT,… \
                 with a port from 0 to 65535"
            ))
        };
        for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, hostport) = match entry.split_once("://") {
                Some((name, rest)) => (name.to_ascii_uppercase(), rest),
                None => (first.clone(), entry),
            };
            let (host, port) = hostport.rsplit_once(':').ok_or_else(bad)?;
            let port: u16 = port.parse().map_err(|_| bad())?;
            out.insert(name, (host.trim_matches(['[', ']']).to_string(), port));
        }
        Ok(out)
    }

    /// The host and port clients are told to use for the first client listener:
    /// its `advertised.listeners` entry, else `None` (the address bound).
    pub fn advertised_listener(&self) -> Result<Option<(String, u16)>, BrokerError> {
        let by_name = self.advertised_by_name()?;
        let first = self.client_listeners()?;
        let name = first.first().map(|l| l.name.as_str()).unwrap_or_default();
        Ok(by_name.get(name).cloned())
    }

    /// Every client listener's advertised endpoint, given the addresses actually bound
    /// (a port 0 resolved, `0.0.0.0` advertised as 127.0.0.1): `(listener, host, port)`.
    pub fn advertised_endpoints(
        &self,
        bound: &[(ListenerConfig, SocketAddr)],
    ) -> Result<Vec<(ListenerConfig, String, u16)>, BrokerError> {
        let by_name = self.advertised_by_name()?;
        for name in by_name.keys() {
            if !bound.iter().any(|(l, _)| &l.name == name) {
                return Err(BrokerError::Config(format!(
                    "advertised.listeners: {name} is not one of the listeners"
                )));
            }
        }
        Ok(bound
            .iter()
            .map(|(l, addr)| {
                let (host, port) = by_name.get(&l.name).cloned().unwrap_or_else(|| {
                    let ip = addr.ip();
                    let host = if ip.is_unspecified() {
                        "127.0.0.1".to_string()
                    } else {
                        ip.to_string()
                    };
                    (host, addr.port())
                });
                (l.clone(), host, port)
            })
            .collect())
    }

    /// `inter.broker.listener.name`: the listener brokers use to reach each other (the
    /// follower fetchers, the transaction marker sender), over any security protocol
    /// (see `network::inter_broker`). As in Kafka, `security.inter.broker.protocol`
    /// instead names the listener called after a protocol (`SASL_SSL`), and setting both
    /// is refused; with neither, the first PLAINTEXT client listener, else the first.
    pub fn inter_broker_listener_name(&self) -> Result<String, BrokerError> {
        let listeners = self.client_listeners()?;
        let by_protocol = self.props.get("security.inter.broker.protocol");
        if let Some(protocol) = by_protocol {
            if self.props.contains_key("inter.broker.listener.name") {
                return Err(BrokerError::Config(
                    "only one of inter.broker.listener.name and security.inter.broker.protocol \
                     may be set"
                        .into(),
                ));
            }
            let name = protocol.trim().to_ascii_uppercase();
            if SecurityProtocol::parse(&name).is_none() {
                return Err(BrokerError::Config(format!(
                    "security.inter.broker.protocol: invalid value {name:?}: must be one of \
                     PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"
                )));
            }
            return if listeners.iter().any(|l| l.name == name) {
                Ok(name)
            } else {
                Err(BrokerError::Config(format!(
                    "security.inter.broker.protocol: no listener is named {name}"
                )))
            };
        }
        match self.props.get("inter.broker.listener.name") {
            Some(name) => {
                let name = name.trim().to_ascii_uppercase();
                if listeners.iter().any(|l| l.name == name) {
                    Ok(name)
                } else {
                    Err(BrokerError::Config(format!(
                        "inter.broker.listener.name: {name} is not one of the listeners"
                    )))
                }
            }
            // Kafka's default, `security.inter.broker.protocol=PLAINTEXT`, where there is
            // such a listener.
            None => Ok(listeners
                .iter()
                .find(|l| l.protocol == SecurityProtocol::Plaintext)
                .or(listeners.first())
                .map(|l| l.name.clone())
                .unwrap_or_default()),
        }
    }

    /// A key as it applies to one listener: `listener.name.<listener>.<key>` (Kafka's
    /// per-listener override, the listener in lower case), else the key itself.
    pub fn listener_value(&self, listener: &str, key: &str) -> Option<&str> {
        let scoped = format!("listener.name.{}.{key}", listener.to_ascii_lowercase());
        self.props
            .get(&scoped)
            .map(String::as_str)
            .or_else(|| self.get(key))
    }

    /// `process.roles`: whether this node is a controller (a quorum voter), a broker, or
    /// both (the default).
    pub fn process_roles(&self) -> Result<ProcessRoles, BrokerError> {
        let raw = self.get("process.roles").unwrap_or_default();
        let mut roles = ProcessRoles {
            broker: false,
            controller: false,
        };
        for r in raw.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            match r {
                "broker" => roles.broker = true,
                "controller" => roles.controller = true,
                other => {
                    return Err(BrokerError::Config(format!(
                        "process.roles: unknown role {other:?} (use broker, controller or both)"
                    )))
                }
            }
        }
        if !roles.broker && !roles.controller {
            return Err(BrokerError::Config(
                "process.roles: name at least one of broker, controller".into(),
            ));
        }
        Ok(roles)
    }

    /// Checks `process.roles` against `controller.quorum.voters`: a node with the
    /// controller role is a voter, so its id must be listed; a broker-only node follows
    /// the quorum as an observer, so the voters must be given (it finds them there) and
    /// its id must not be among them.
    pub fn check_roles_against_voters(&self) -> Result<(), BrokerError> {
        let roles = self.process_roles()?;
        let node_id = self.node_id()?;
        let configured = !self
            .get("controller.quorum.voters")
            .unwrap_or_default()
            .trim()
            .is_empty();
        let voters = self.quorum_voters()?;
        let listed = u64::try_from(node_id).is_ok_and(|id| voters.contains_key(&id));
        let list = || {
            self.get("controller.quorum.voters")
                .unwrap_or_default()
                .trim()
                .to_string()
        };
        if roles.controller && !listed && !configured {
            return Err(BrokerError::Config(format!(
                "node.id {node_id} is not in controller.quorum.voters ({}): a node with the \
                 controller role must be one of the voters",
                list()
            )));
        }
        // A controller outside the voters the cluster started with joins it (KIP-853):
        // it follows the metadata log until AddRaftVoter (`kafka-metadata-quorum
        // add-controller`) makes it a voter; see `shared_server::start_quorum`.
        if !roles.controller {
            if !configured {
                return Err(BrokerError::Config(
                    "process.roles=broker needs controller.quorum.voters (--controller-quorum) \
                     to find the controllers"
                        .into(),
                ));
            }
            if listed {
                return Err(BrokerError::Config(format!(
                    "node.id {node_id} is in controller.quorum.voters ({}): a broker-only node \
                     (process.roles=broker) is not a voter; give it an id outside the voter \
                     list, or the controller role too",
                    list()
                )));
            }
        }
        Ok(())
    }

    /// Where a broker-only node listens for the metadata log that the active controller
    /// replicates to it: the controller listener when one is configured, else a free port
    /// on the client listener's address. Either must be an address the controllers can
    /// reach, since it is the one they are told.
    pub fn observer_listen_addr(&self) -> Result<SocketAddr, BrokerError> {
        let addr = match self.controller_listen_addr()? {
            Some(addr) => addr,
            None => SocketAddr::new(self.listen_addr()?.ip(), 0),
        };
        if addr.ip().is_unspecified() {
            return Err(BrokerError::Config(format!(
                "a broker-only node receives the metadata log on its controller listener, \
                 which must be an address the controllers can reach, not {}; set one with \
                 --controller-listen HOST:PORT (CONTROLLER://HOST:PORT in listeners)",
                addr.ip()
            )));
        }
        Ok(addr)
    }

    /// `controller.quorum.voters` (`1@host:port,2@host:port,…`); empty means a
    /// single-node quorum of this node alone, on the controller listener (or any free
    /// loopback port when none is configured).
    pub fn quorum_voters(&self) -> Result<BTreeMap<u64, SocketAddr>, BrokerError> {
        let raw = self.get("controller.quorum.voters").unwrap_or_default();
        let node_id = self.node_id()?;
        if raw.trim().is_empty() {
            let addr = self
                .controller_listen_addr()?
                .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
            let id = u64::try_from(node_id).map_err(|_| {
                BrokerError::Config(format!(
                    "node.id: invalid value {node_id}: must be from 0 to {}",
                    i32::MAX
                ))
            })?;
            return Ok(BTreeMap::from([(id, addr)]));
        }
        rill_metadata::parse_voters(raw).map_err(|e| BrokerError::Config(e.to_string()))
    }

    /// A duration key in milliseconds.
    pub fn duration_ms(&self, key: &str) -> Result<std::time::Duration, BrokerError> {
        let ms: u64 = self.parse(key)?;
        Ok(std::time::Duration::from_millis(ms))
    }

    /// The active controller's settings, from the broker keys Kafka's controller reads.
    pub fn controller_config(&self) -> Result<rill_metadata::ControllerConfig, BrokerError> {
        let defaults = rill_metadata::ControllerConfig::default();
        let imbalance_s: i64 = self.parse("leader.imbalance.check.interval.seconds")?;
        Ok(rill_metadata::ControllerConfig {
            broker_session_timeout_ms: self.parse("broker.session.timeout.ms")?,
            broker_id_generation_enable: self.get("broker.id.generation.enable") == Some("true"),
            num_partitions: self.num_partitions()?,
            default_replication_factor: self.default_replication_factor()?,
            unclean_leader_election_enable: self.get("unclean.leader.election.enable")
                == Some("true"),
            auto_leader_rebalance_enable: self.get("auto.leader.rebalance.enable") == Some("true"),
            leader_imbalance_check_interval_ms: imbalance_s.saturating_mul(1000),
            seed: u64::from_le_bytes(
                *uuid::Uuid::new_v4()
                    .as_bytes()
                    .first_chunk()
                    .unwrap_or(&[7; 8]),
            ),
            delegation_tokens: rill_metadata::delegation_tokens::DelegationTokenConfig {
                enabled: self.delegation_token_secret_key().is_some(),
                max_lifetime_ms: self.positive_ms("delegation.token.max.lifetime.ms")?,
                expiry_time_ms: self.positive_ms("delegation.token.expiry.time.ms")?,
                expiry_check_interval_ms: self
                    .positive_ms("delegation.token.expiry.check.interval.ms")?,
            },
            ..defaults
        })
    }

    /// `delegation.token.secret.key` (or its old name `delegation.token.master.key`),
    /// when set and not empty: delegation tokens are on, and their secrets are HMACs
    /// under this key, so every node must have the same one (as in Kafka).
    pub fn delegation_token_secret_key(&self) -> Option<&str> {
        ["delegation.token.secret.key", "delegation.token.master.key"]
            .into_iter()
            .filter_map(|k| self.get(k))
            .find(|v| !v.is_empty())
    }

    /// A duration in milliseconds that must be at least 1 (Kafka's `atLeast(1)`).
    fn positive_ms(&self, key: &str) -> Result<i64, BrokerError> {
        let ms: i64 = self.parse(key)?;
        if ms < 1 {
            return Err(BrokerError::Config(format!(
                "{key}: invalid value {ms}: must be at least 1"
            )));
        }
        Ok(ms)
    }

    /// The node's own directory: where `meta.properties` says who it is and the metadata
    /// log lives (Kafka's `metadata.log.dir`, by default the first of `log.dirs`).
    pub fn data_dir(&self) -> PathBuf {
        self.metadata_log_dir()
    }

    /// `log.dirs`: the log directories partitions are placed in (JBOD), in order.
    pub fn log_dirs(&self) -> Vec<PathBuf> {
        let raw = self.get("log.dirs").unwrap_or("./rill-data");
        let dirs: Vec<PathBuf> = raw
            .split(',')
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .collect();
        if dirs.is_empty() {
            vec![PathBuf::from("./rill-data")]
        } else {
            dirs
        }
    }

    /// `metadata.log.dir`, else the first of `log.dirs`.
    pub fn metadata_log_dir(&self) -> PathBuf {
        match self.get("metadata.log.dir").map(str::trim) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => self.log_dirs().swap_remove(0),
        }
    }

    /// Every directory the node writes and locks: `metadata.log.dir` first, then the
    /// other `log.dirs` in order.
    pub fn all_dirs(&self) -> Vec<PathBuf> {
        let metadata = self.metadata_log_dir();
        let mut dirs = vec![metadata.clone()];
        dirs.extend(self.log_dirs().into_iter().filter(|d| *d != metadata));
        dirs
    }

    /// The authorizer `authorizer.class.name` names, configured by `super.users` and
    /// `allow.everyone.if.no.acl.found`; `None` when the key is empty (Kafka's default:
    /// no authorization). Kafka's StandardAuthorizer is the only class there is; any other
    /// name is refused, as Kafka refuses a class it cannot load.
    pub fn authorizer(&self) -> Result<Option<rill_metadata::StandardAuthorizer>, BrokerError> {
        let class = self.get("authorizer.class.name").unwrap_or("").trim();
        if class.is_empty() {
            return Ok(None);
        }
        if class != rill_metadata::STANDARD_AUTHORIZER_CLASS {
            return Err(BrokerError::Config(format!(
                "authorizer.class.name: unknown authorizer `{class}` (the only one is {})",
                rill_metadata::STANDARD_AUTHORIZER_CLASS
            )));
        }
        let allow = match self.get("allow.everyone.if.no.acl.found").map(str::trim) {
            None | Some("") => false,
            Some(v) => v.eq_ignore_ascii_case("true"),
        };
        let super_users = self.get("super.users").unwrap_or("");
        rill_metadata::StandardAuthorizer::new(super_users, allow)
            .map(Some)
            .map_err(BrokerError::Config)
    }

    pub fn auto_create_topics(&self) -> bool {
        self.get("auto.create.topics.enable") == Some("true")
    }

    pub fn num_partitions(&self) -> Result<i32, BrokerError> {
        self.parse("num.partitions")
    }

    /// `max.incremental.fetch.session.cache.slots`: the fetch sessions (KIP-227) this
    /// broker keeps; 0 opens none.
    pub fn max_incremental_fetch_sessions(&self) -> Result<usize, BrokerError> {
        self.parse::<u32>("max.incremental.fetch.session.cache.slots")
            .map(|n| n as usize)
    }

    pub fn default_replication_factor(&self) -> Result<i16, BrokerError> {
        self.parse("default.replication.factor")
    }

    /// `quota.window.num` and `quota.window.size.seconds`: the samples client quotas are
    /// measured over, each at least 1 as Kafka's `atLeast(1)` checks.
    pub fn quota_windows(&self) -> Result<(u32, u64), BrokerError> {
        self.windows("quota.window")
    }

    /// `replication.quota.window.num` and `replication.quota.window.size.seconds`: the
    /// samples replication throttles are measured over.
    pub fn replication_quota_windows(&self) -> Result<(u32, u64), BrokerError> {
        self.windows("replication.quota.window")
    }

    fn windows(&self, prefix: &str) -> Result<(u32, u64), BrokerError> {
        let samples: u32 = self.parse(&format!("{prefix}.num"))?;
        let seconds: u64 = self.parse(&format!("{prefix}.size.seconds"))?;
        if samples < 1 || seconds < 1 {
            return Err(BrokerError::Config(format!(
                "{prefix}.num ({samples}) and {prefix}.size.seconds ({seconds}) must be at least 1"
            )));
        }
        Ok((samples, seconds))
    }

    pub fn socket_request_max_bytes(&self) -> Result<usize, BrokerError> {
        self.parse("socket.request.max.bytes")
    }

    /// The group coordinator's settings from `group.*` and `offsets.*` keys.
    pub fn group_config(&self) -> Result<rill_group::GroupConfig, BrokerError> {
        let defaults = rill_group::GroupConfig::default();
        let partitions: i32 = self.parse("offsets.topic.num.partitions")?;
        if !(1..=1000).contains(&partitions) {
            return Err(BrokerError::Config(format!(
                "offsets.topic.num.partitions: invalid value {partitions}: must be from 1 to 1000"
            )));
        }
        Ok(rill_group::GroupConfig {
            offsets_topic_num_partitions: partitions,
            group_min_session_timeout_ms: self.parse("group.min.session.timeout.ms")?,
            group_max_session_timeout_ms: self.parse("group.max.session.timeout.ms")?,
            group_initial_rebalance_delay_ms: self.parse("group.initial.rebalance.delay.ms")?,
            group_max_size: self.parse("group.max.size")?,
            offsets_retention_minutes: self.parse("offsets.retention.minutes")?,
            offsets_commit_timeout_ms: self.parse("offsets.commit.timeout.ms")?,
            consumer_group_assignors: self.consumer_group_assignors()?,
            consumer_group_max_size: self.parse("group.consumer.max.size")?,
            consumer_group_migration_policy: {
                let raw = self
                    .get("group.consumer.migration.policy")
                    .unwrap_or_default();
                raw.parse().map_err(|_| {
                    BrokerError::Config(format!(
                        "group.consumer.migration.policy: invalid value {raw:?}: must be one of \
                         disabled, upgrade, downgrade, bidirectional"
                    ))
                })?
            },
            consumer_group_session_timeout_ms: self.parse("group.consumer.session.timeout.ms")?,
            share_group_max_size: self.parse("group.share.max.size")?,
            share_group_session_timeout_ms: self.parse("group.share.session.timeout.ms")?,
            ..defaults
        })
    }

    /// `group.consumer.assignors` as the assignors' names: Kafka's class names
    /// (`org.apache.kafka.coordinator.group.assignor.UniformAssignor`) or the names
    /// clients ask for with `group.remote.assignor` (`uniform`, `range`).
    fn consumer_group_assignors(&self) -> Result<Vec<String>, BrokerError> {
        let raw = self.get("group.consumer.assignors").unwrap_or_default();
        let mut names = Vec::new();
        for item in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let short = item.rsplit('.').next().unwrap_or(item);
            let name = match short {
                "UniformAssignor" | "uniform" => "uniform",
                "RangeAssignor" | "range" => "range",
                other => {
                    return Err(BrokerError::Config(format!(
                        "group.consumer.assignors: unknown assignor {other:?}: Rill has \
                         uniform (UniformAssignor) and range (RangeAssignor)"
                    )))
                }
            };
            if !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
        if names.is_empty() {
            return Err(BrokerError::Config(
                "group.consumer.assignors: at least one assignor is needed".into(),
            ));
        }
        Ok(names)
    }

    /// The transaction coordinator's settings from `transaction.*` keys.
    pub fn transaction_config(&self) -> Result<rill_transaction::TransactionConfig, BrokerError> {
        let partitions: i32 = self.parse("transaction.state.log.num.partitions")?;
        if !(1..=1000).contains(&partitions) {
            return Err(BrokerError::Config(format!(
                "transaction.state.log.num.partitions: invalid value {partitions}: must be from 1 to 1000"
            )));
        }
        let positive = |key: &str| -> Result<i64, BrokerError> {
            let v: i64 = self.parse(key)?;
            if v <= 0 {
                return Err(BrokerError::Config(format!(
                    "{key}: must be positive, not {v}"
                )));
            }
            Ok(v)
        };
        let max_timeout = positive("transaction.max.timeout.ms")?;
        Ok(rill_transaction::TransactionConfig {
            transaction_state_log_num_partitions: partitions,
            transaction_max_timeout_ms: i32::try_from(max_timeout).unwrap_or(i32::MAX),
            transactional_id_expiration_ms: positive("transactional.id.expiration.ms")?,
            transaction_abort_timed_out_transaction_cleanup_interval_ms: positive(
                "transaction.abort.timed.out.transaction.cleanup.interval.ms",
            )?,
            concurrent_wait_ms: rill_transaction::DEFAULT_CONCURRENT_WAIT_MS,
        })
    }

    /// The share coordinator's settings from `share.coordinator.*` keys, its write
    /// timeout (`share.coordinator.write.timeout.ms`) and how often it prunes
    /// `__share_group_state` (`share.coordinator.state.topic.prune.interval.ms`).
    pub fn share_coordinator_config(
        &self,
    ) -> Result<
        (
            rill_share::ShareCoordinatorConfig,
            std::time::Duration,
            std::time::Duration,
        ),
        BrokerError,
    > {
        let partitions: i32 = self.parse("share.coordinator.state.topic.num.partitions")?;
        if !(1..=1000).contains(&partitions) {
            return Err(BrokerError::Config(format!(
                "share.coordinator.state.topic.num.partitions: invalid value {partitions}: must be from 1 to 1000"
            )));
        }
        let per_snapshot: i64 =
            self.parse("share.coordinator.snapshot.update.records.per.snapshot")?;
        let per_snapshot = u32::try_from(per_snapshot).map_err(|_| {
            BrokerError::Config(format!(
                "share.coordinator.snapshot.update.records.per.snapshot: invalid value {per_snapshot}: must be at least 0"
            ))
        })?;
        let positive = |key: &str| -> Result<i64, BrokerError> {
            let v: i64 = self.parse(key)?;
            if v <= 0 {
                return Err(BrokerError::Config(format!(
                    "{key}: must be positive, not {v}"
                )));
            }
            Ok(v)
        };
        let cold = positive("share.coordinator.cold.partition.snapshot.interval.ms")?;
        let write_timeout = positive("share.coordinator.write.timeout.ms")?;
        let prune_interval = positive("share.coordinator.state.topic.prune.interval.ms")?;
        Ok((
            rill_share::ShareCoordinatorConfig {
                state_topic_num_partitions: partitions,
                snapshot_update_records_per_snapshot: per_snapshot,
                cold_partition_snapshot_interval_ms: cold,
            },
            std::time::Duration::from_millis(u64::try_from(write_timeout).unwrap_or(5000)),
            std::time::Duration::from_millis(u64::try_from(prune_interval).unwrap_or(300_000)),
        ))
    }

    /// Checks every key this build reads, so that a bad value fails at start-up, not
    /// later; with `config.strict`, an unknown key fails too.
    pub fn validate(&self) -> Result<(), BrokerError> {
        if self.strict()? {
            let unknown = self.unknown_keys();
            if !unknown.is_empty() {
                let each: Vec<String> = unknown.iter().map(ToString::to_string).collect();
                return Err(BrokerError::Config(format!(
                    "{} (config.strict refuses unknown keys)",
                    each.join("; ")
                )));
            }
        }
        self.node_id()?;
        let dirs = self.log_dirs();
        for (i, d) in dirs.iter().enumerate() {
            if dirs[..i].contains(d) {
                return Err(BrokerError::Config(format!(
                    "log.dirs names {} twice",
                    d.display()
                )));
            }
        }
        let roles = self.process_roles()?;
        // A controller-only node opens no client listener, so it needs none.
        if roles.broker {
            self.listen_addr()?;
            self.advertised_listener()?;
            self.inter_broker_listener_name()?;
        }
        self.controller_listen_addr()?;
        self.quorum_voters()?;
        self.check_roles_against_voters()?;
        if roles.broker && !roles.controller {
            self.observer_listen_addr()?;
        }
        self.controller_config()?;
        for key in [
            "broker.heartbeat.interval.ms",
            "replica.lag.time.max.ms",
            "replica.fetch.wait.max.ms",
            "controller.quorum.election.timeout.ms",
        ] {
            self.duration_ms(key)?;
        }
        self.num_partitions()?;
        self.max_incremental_fetch_sessions()?;
        self.default_replication_factor()?;
        self.socket_request_max_bytes()?;
        self.group_config()?;
        self.transaction_config()?;
        self.share_coordinator_config()?;
        for d in DYNAMIC_BROKER_KEYS {
            if let Some(v) = self.props.get(d.name) {
                validate_broker_config(d.name, v).map_err(BrokerError::Config)?;
            }
        }
        if let Some(v) = self.props.get("offsets.topic.segment.bytes") {
            validate_topic_config("segment.bytes", v)
                .map_err(|e| BrokerError::Config(format!("offsets.topic.segment.bytes: {e}")))?;
        }
        for (_, synonyms) in UNIT_SYNONYMS {
            for (synonym, _) in *synonyms {
                if self.props.contains_key(*synonym) {
                    self.parse::<i64>(synonym)?;
                }
            }
        }
        for d in TOPIC_CONFIGS {
            if let Some(v) = self.static_value(d.broker_key) {
                validate_topic_config(d.name, &v)
                    .map_err(|e| BrokerError::Config(e.replace(d.name, d.broker_key)))?;
            }
        }
        Ok(())
    }
}

fn flatten(prefix: &str, value: &toml::Value, out: &mut BTreeMap<String, String>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        toml::Value::String(s) => {
            out.insert(prefix.to_string(), s.clone());
        }
        toml::Value::Array(items) => {
            let joined: Vec<String> = items
                .iter()
                .map(|i| match i {
                    toml::Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect();
            out.insert(prefix.to_string(), joined.join(","));
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn secrets_are_known_at_every_prefix() {
        use super::is_sensitive_broker_key as secret;
        for key in [
            "sasl.jaas.config",
            "plain.sasl.jaas.config",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config",
            "ssl.key.password",
            "listener.name.ssl.ssl.keystore.password",
            "ssl.truststore.password",
            "ssl.keystore.key",
            "http.ssl.key.password",
            "password.encoder.secret",
            "delegation.token.secret.key",
        ] {
            assert!(secret(key), "{key}");
        }
        for key in [
            "ssl.keystore.location",
            "sasl.enabled.mechanisms",
            "listener.name.ssl.ssl.client.auth",
            "num.partitions",
            "http.bearer.tokens.file",
        ] {
            assert!(!secret(key), "{key}");
        }
    }

    use super::*;

    #[test]
    fn http_listeners_is_one_address_or_off() {
        let mut c = BrokerConfig::default();
        assert_eq!(
            c.http_listener().unwrap(),
            Some("127.0.0.1:9644".parse().unwrap())
        );
        c.set("http.listeners", "");
        assert_eq!(c.http_listener().unwrap(), None);
        c.set("http.listeners", " http://localhost:0 ");
        assert_eq!(
            c.http_listener().unwrap(),
            Some("127.0.0.1:0".parse().unwrap())
        );
        c.set("http.listeners", "127.0.0.1:1,127.0.0.1:2");
        assert!(c.http_listener().is_err());
        c.set("http.listeners", "nowhere:80");
        let e = c.http_listener().unwrap_err().to_string();
        assert!(e.contains("http.listeners"), "{e}");
    }

    #[test]
    fn defaults_give_a_single_node_on_9092() {
        let c = BrokerConfig::default();
        c.validate().unwrap();
        assert_eq!(c.listen_addr().unwrap().to_string(), "127.0.0.1:9092");
        assert_eq!(c.data_dir(), PathBuf::from("./rill-data"));
        assert_eq!(c.get("log.retention.ms"), Some("604800000"));
    }

    #[test]
    fn several_log_dirs_and_the_metadata_log_dir() {
        let mut c = BrokerConfig::default();
        c.set("log.dirs", "/a, /b,/c");
        let dirs = |v: &[&str]| v.iter().map(PathBuf::from).collect::<Vec<_>>();
        assert_eq!(c.log_dirs(), dirs(&["/a", "/b", "/c"]));
        assert_eq!(c.metadata_log_dir(), PathBuf::from("/a"));
        assert_eq!(c.all_dirs(), dirs(&["/a", "/b", "/c"]));
        c.set("metadata.log.dir", "/m");
        assert_eq!(c.data_dir(), PathBuf::from("/m"));
        assert_eq!(c.all_dirs(), dirs(&["/m", "/a", "/b", "/c"]));
        c.set("metadata.log.dir", "/b");
        assert_eq!(c.all_dirs(), dirs(&["/b", "/a", "/c"]));
        c.validate().unwrap();
        c.set("log.dirs", "/a,/b,/a");
        assert!(c.validate().unwrap_err().to_string().contains("twice"));
    }

    #[test]
    fn an_unknown_key_is_named_with_the_known_key_it_likely_meant() {
        assert_eq!(levenshtein("log.retention.hour", "log.retention.hours"), 1);
        assert_eq!(levenshtein("", "abc"), 3);
        assert_eq!(levenshtein("kitten", "sitting"), 3);
        assert_eq!(
            suggest_broker_key("log.retention.hour"),
            Some("log.retention.hours")
        );
        assert_eq!(suggest_broker_key("log.dir"), Some("log.dirs"));
        assert_eq!(suggest_broker_key("num.partition"), Some("num.partitions"));
        // A topic config given at the broker names the broker key that is its default.
        assert_eq!(suggest_broker_key("retention.ms"), Some("log.retention.ms"));
        // Nothing close: no suggestion rather than a random key.
        assert_eq!(suggest_broker_key("bogus.key"), None);
        assert_eq!(suggest_broker_key("x"), None);

        let mut c =
            BrokerConfig::from_toml("\"log.retention.hour\" = 1\nnum.partitions = 2").unwrap();
        c.set_override("bogus.key=1").unwrap();
        c.set_override("num.io.threads=8").unwrap();
        assert_eq!(
            c.unknown_keys(),
            vec![
                UnknownKey {
                    key: "bogus.key".into(),
                    suggestion: None
                },
                UnknownKey {
                    key: "log.retention.hour".into(),
                    suggestion: Some("log.retention.hours")
                },
            ]
        );
        assert_eq!(
            c.unknown_keys()[1].to_string(),
            "`log.retention.hour` is not a configuration Rill knows; did you mean \
             `log.retention.hours`?"
        );
        // Warned, not refused, unless strict.
        c.validate().unwrap();
        c.set("config.strict", "true");
        let e = config_error(&c);
        assert!(
            e.contains("`bogus.key`") && e.contains("`log.retention.hour`"),
            "{e}"
        );
        c.set("config.strict", "yes");
        let e = config_error(&c);
        assert!(
            e.contains("config.strict") && e.contains("true or false"),
            "{e}"
        );
    }

    #[test]
    fn listeners_take_their_protocols_from_the_map_and_their_advertised_endpoints() {
        let mut c = BrokerConfig::default();
        c.set(
            "listeners",
            "PLAINTEXT://127.0.0.1:9092,INTERNAL://127.0.0.1:9093,SSL://0.0.0.0:9094,\
             CONTROLLER://127.0.0.1:9095",
        );
        c.set("listener.security.protocol.map", "INTERNAL:SASL_SSL");
        c.set("advertised.listeners", "SSL://broker.example:19094");
        let listeners = c.client_listeners().unwrap();
        let names: Vec<(&str, SecurityProtocol)> = listeners
            .iter()
            .map(|l| (l.name.as_str(), l.protocol))
            .collect();
        assert_eq!(
            names,
            [
                ("PLAINTEXT", SecurityProtocol::Plaintext),
                ("INTERNAL", SecurityProtocol::SaslSsl),
                ("SSL", SecurityProtocol::Ssl)
            ]
        );
        assert_eq!(c.listen_addr().unwrap().port(), 9092);
        assert_eq!(c.controller_listen_addr().unwrap().unwrap().port(), 9095);
        let bound: Vec<(ListenerConfig, SocketAddr)> =
            listeners.iter().map(|l| (l.clone(), l.addr)).collect();
        let advertised: Vec<(String, String, u16)> = c
            .advertised_endpoints(&bound)
            .unwrap()
            .into_iter()
            .map(|(l, h, p)| (l.name, h, p))
            .collect();
        assert_eq!(
            advertised,
            [
                ("PLAINTEXT".into(), "127.0.0.1".into(), 9092),
                ("INTERNAL".into(), "127.0.0.1".into(), 9093),
                ("SSL".into(), "broker.example".into(), 19094)
            ]
        );
        assert_eq!(c.inter_broker_listener_name().unwrap(), "PLAINTEXT");
        c.set("inter.broker.listener.name", "internal");
        assert_eq!(c.inter_broker_listener_name().unwrap(), "INTERNAL");
        c.set("inter.broker.listener.name", "NOPE");
        assert!(c.inter_broker_listener_name().is_err());
        c.set("security.inter.broker.protocol", "SSL");
        assert!(config_error_of(c.inter_broker_listener_name()).contains("only one"));
        c.props.remove("inter.broker.listener.name");
        assert_eq!(c.inter_broker_listener_name().unwrap(), "SSL");
        c.set("security.inter.broker.protocol", "SASL_SSL");
        assert!(config_error_of(c.inter_broker_listener_name()).contains("SASL_SSL"));
        assert!(is_known_broker_key(
            "listener.name.internal.scram-sha-512.sasl.jaas.config"
        ));
        // A name with no protocol, a listener named twice, a bad map entry: refused.
        c.set("listeners", "EXTERNAL://127.0.0.1:1");
        assert!(config_error_of(c.client_listeners()).contains("EXTERNAL"));
        c.set("listeners", "SSL://127.0.0.1:1,SSL://127.0.0.1:2");
        assert!(config_error_of(c.client_listeners()).contains("twice"));
        c.set("listener.security.protocol.map", "X:TLS");
        assert!(config_error_of(c.security_protocol_map()).contains("X:TLS"));
        // A bare advertised HOST:PORT is the first listener's, as before names.
        let mut c = BrokerConfig::default();
        c.set("advertised.listeners", "10.0.0.1:9999");
        assert_eq!(
            c.advertised_listener().unwrap(),
            Some(("10.0.0.1".to_string(), 9999))
        );
        assert!(is_known_broker_key(
            "listener.name.sasl_ssl.plain.sasl.jaas.config"
        ));
        assert!(is_known_broker_key("listener.name.ssl.ssl.client.auth"));
        assert!(!is_known_broker_key("listener.name.ssl.ssl.clinet.auth"));
    }

    fn config_error_of<T: std::fmt::Debug>(r: Result<T, BrokerError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn every_key_the_defaults_and_topic_configs_name_is_known() {
        for (k, _) in BROKER_DEFAULTS {
            assert!(is_known_broker_key(k), "{k}");
        }
        for d in TOPIC_CONFIGS
            .iter()
            .filter(|d| d.broker_key != NO_BROKER_KEY)
        {
            assert!(is_known_broker_key(d.broker_key), "{}", d.broker_key);
        }
        for k in [
            "advertised.listeners",
            "broker.rack",
            "cluster.id",
            "log.retention.hours",
        ] {
            assert!(is_known_broker_key(k), "{k}");
        }
    }

    #[test]
    fn retention_in_hours_or_minutes_is_kafkas_coarser_log_retention_ms() {
        let mut c = BrokerConfig::default();
        assert_eq!(c.static_value("log.retention.ms"), None);
        c.set("log.retention.hours", "24");
        assert_eq!(
            c.static_value("log.retention.ms").as_deref(),
            Some("86400000")
        );
        c.set("log.retention.minutes", "5");
        assert_eq!(
            c.static_value("log.retention.ms").as_deref(),
            Some("300000")
        );
        c.set("log.retention.ms", "1000");
        assert_eq!(c.static_value("log.retention.ms").as_deref(), Some("1000"));
        let image = rill_metadata::MetadataImage::new();
        assert_eq!(log_config(&c, &image, 1, "t").retention_ms, 1000);
        let mut c = BrokerConfig::default();
        c.set("log.retention.hours", "-1");
        assert_eq!(log_config(&c, &image, 1, "t").retention_ms, -1);
        c.set("log.roll.hours", "2");
        assert_eq!(log_config(&c, &image, 1, "t").segment_ms, 7_200_000);
        c.validate().unwrap();
        c.set("log.retention.hours", "a day");
        let e = config_error(&c);
        assert!(
            e.contains("log.retention.hours") && e.contains("\"a day\""),
            "{e}"
        );
    }

    #[test]
    fn a_bad_value_names_the_key_the_value_and_what_is_allowed() {
        let mut c = BrokerConfig::default();
        c.set("num.partitions", "many");
        let e = config_error(&c);
        assert!(
            e.contains("num.partitions")
                && e.contains("\"many\"")
                && e.contains("from -2147483648 to 2147483647"),
            "{e}"
        );
        let mut c = BrokerConfig::default();
        c.set("log.segment.bytes", "big");
        let e = config_error(&c);
        assert!(
            e.contains("log.segment.bytes") && e.contains("big") && e.contains("integer from"),
            "{e}"
        );
    }

    #[test]
    fn toml_tables_and_dotted_keys_flatten() {
        let c = BrokerConfig::from_toml(
            "\"node.id\" = 3\nlisteners = \"PLAINTEXT://127.0.0.1:19092\"\n[log]\ndirs = \"/tmp/x\"\n",
        )
        .unwrap();
        assert_eq!(c.node_id().unwrap(), 3);
        assert_eq!(c.listen_addr().unwrap().port(), 19092);
        assert_eq!(c.data_dir(), PathBuf::from("/tmp/x"));
    }

    #[test]
    fn topic_config_validation() {
        assert!(validate_topic_config("retention.ms", "1000").is_ok());
        assert!(validate_topic_config("retention.ms", "soon").is_err());
        assert!(validate_topic_config("cleanup.policy", "compact,delete").is_ok());
        assert!(validate_topic_config("cleanup.policy", "forever").is_err());
        assert!(validate_topic_config("no.such.config", "1").is_err());
        let sorted = TOPIC_CONFIGS.windows(2).all(|w| w[0].name < w[1].name);
        assert!(sorted, "TOPIC_CONFIGS must stay sorted");
    }

    #[test]
    fn tiered_storage_configs_are_checked_against_each_other_as_kafka_does() {
        assert!(validate_topic_config("local.retention.ms", "-2").is_ok());
        assert!(validate_topic_config("local.retention.bytes", "-3").is_err());
        let check = |pairs: &[(&str, &str)], was_enabled: bool, system: bool| {
            let map: BTreeMap<&str, &str> = pairs.iter().copied().collect();
            let value = |name: &str| {
                map.get(name)
                    .map(|v| v.to_string())
                    .or_else(|| topic_config_def(name).map(|d| d.default.to_string()))
                    .unwrap_or_default()
            };
            validate_remote_log_configs(&value, was_enabled, system)
        };
        let on = ("remote.storage.enable", "true");
        assert!(check(&[on], false, true).is_ok());
        // The broker must have tiered storage on.
        let e = check(&[on], false, false).unwrap_err();
        assert!(
            e.contains("Tiered Storage functionality is disabled"),
            "{e}"
        );
        // Not on a compacted topic.
        assert!(check(&[on, ("cleanup.policy", "compact,delete")], false, true).is_err());
        // The local tier within the whole log's bounds, and not unbounded inside a bound.
        let local = |k, v, total, t| check(&[on, (k, v), (total, t)], false, true);
        assert!(local("local.retention.bytes", "100", "retention.bytes", "200").is_ok());
        assert!(local("local.retention.bytes", "300", "retention.bytes", "200").is_err());
        assert!(local("local.retention.bytes", "-1", "retention.bytes", "200").is_err());
        assert!(local("local.retention.bytes", "300", "retention.bytes", "-1").is_ok());
        assert!(local("local.retention.ms", "-1", "retention.ms", "1000").is_err());
        assert!(local("local.retention.ms", "5000", "retention.ms", "1000").is_err());
        assert!(local("local.retention.ms", "-2", "retention.ms", "1000").is_ok());
        // Read-only remote tier: the local retention must be the whole log's.
        let copy_off = ("remote.log.copy.disable", "true");
        assert!(check(&[on, copy_off], false, true).is_ok());
        assert!(check(&[on, copy_off, ("local.retention.ms", "1000")], false, true).is_err());
        // Turning it off needs remote.log.delete.on.disable.
        assert!(check(&[], true, true).is_err());
        assert!(check(&[("remote.log.delete.on.disable", "true")], true, true).is_ok());
        assert!(check(&[], false, false).is_ok());
    }

    fn image_with(entries: &[((i8, &str), &str, &str)]) -> rill_metadata::MetadataImage {
        let mut image = rill_metadata::MetadataImage::default();
        for ((t, n), k, v) in entries {
            image
                .configs
                .entry((*t, n.to_string()))
                .or_default()
                .insert(k.to_string(), v.to_string());
        }
        image
    }

    #[test]
    fn broker_config_precedence_is_dynamic_broker_then_default_then_static_then_builtin() {
        use rill_metadata::{RESOURCE_BROKER as B, RESOURCE_TOPIC as T};
        let mut static_config = BrokerConfig::default();
        let key = "log.retention.ms";
        let source = |c: &BrokerConfig, image: &rill_metadata::MetadataImage| {
            broker_config_value(c, image, 1, key).unwrap()
        };
        let empty = rill_metadata::MetadataImage::default();
        assert_eq!(
            source(&static_config, &empty),
            ("604800000".into(), ConfigSource::DefaultConfig)
        );
        static_config.set(key, "1000");
        assert_eq!(
            source(&static_config, &empty),
            ("1000".into(), ConfigSource::StaticBrokerConfig)
        );
        let cluster = image_with(&[((B, ""), key, "2000")]);
        assert_eq!(
            source(&static_config, &cluster),
            ("2000".into(), ConfigSource::DynamicDefaultBrokerConfig)
        );
        let both = image_with(&[((B, ""), key, "2000"), ((B, "1"), key, "3000")]);
        assert_eq!(
            source(&static_config, &both),
            ("3000".into(), ConfigSource::DynamicBrokerConfig)
        );
        // Another broker's dynamic value is not ours.
        let other = image_with(&[((B, ""), key, "2000"), ((B, "2"), key, "3000")]);
        assert_eq!(source(&static_config, &other).0, "2000");
        // Synonyms list every level, highest first.
        let levels: Vec<ConfigSource> = broker_config_synonyms(&static_config, &both, 1, key)
            .into_iter()
            .map(|(_, s)| s)
            .collect();
        assert_eq!(
            levels,
            [
                ConfigSource::DynamicBrokerConfig,
                ConfigSource::DynamicDefaultBrokerConfig,
                ConfigSource::StaticBrokerConfig,
                ConfigSource::DefaultConfig
            ]
        );
        // A key that is not dynamic is never taken from the metadata log.
        let not_dynamic = image_with(&[((B, ""), "num.partitions", "9")]);
        assert_eq!(
            broker_config_value(&static_config, &not_dynamic, 1, "num.partitions").unwrap(),
            ("1".into(), ConfigSource::DefaultConfig)
        );
        // A topic override beats every broker level; without one the topic inherits.
        let topic = image_with(&[((B, "1"), key, "3000"), ((T, "t"), "retention.ms", "5")]);
        assert_eq!(
            topic_config_value(&static_config, &topic, 1, "t", "retention.ms").unwrap(),
            ("5".into(), ConfigSource::DynamicTopicConfig)
        );
        assert_eq!(
            topic_config_value(&static_config, &topic, 1, "u", "retention.ms").unwrap(),
            ("3000".into(), ConfigSource::DynamicBrokerConfig)
        );
        assert_eq!(
            log_config(&static_config, &topic, 1, "u").retention_ms,
            3000
        );
        assert_eq!(log_config(&static_config, &topic, 1, "t").retention_ms, 5);
    }

    #[test]
    fn log_config_reads_compression_and_timestamp_bounds() {
        use rill_metadata::RESOURCE_TOPIC as T;
        use rill_storage::BrokerCompressionType;
        let static_config = BrokerConfig::default();
        let c = log_config(
            &static_config,
            &rill_metadata::MetadataImage::default(),
            1,
            "t",
        );
        assert_eq!(c.compression_type, BrokerCompressionType::Producer);
        assert_eq!(c.message_timestamp_before_max_ms, i64::MAX);
        let image = image_with(&[
            ((T, "t"), "compression.type", "zstd"),
            ((T, "t"), "message.timestamp.before.max.ms", "3600000"),
            ((T, "t"), "compression.zstd.level", "19"),
            ((T, "t"), "compression.gzip.level", "12"),
        ]);
        let c = log_config(&static_config, &image, 1, "t");
        assert_eq!(c.compression_type, BrokerCompressionType::Zstd);
        assert_eq!(c.message_timestamp_before_max_ms, 3_600_000);
        // Kafka 4.0's default: an hour ahead at most.
        assert_eq!(c.message_timestamp_after_max_ms, 3_600_000);
        assert_eq!(c.compression_zstd_level, Some(19));
        // Out of range (refused when set; ignored if found in the log anyway).
        assert_eq!(c.compression_gzip_level, None);
    }

    #[test]
    fn replication_throttle_configs_are_accepted_as_kafka_validates_them() {
        for ok in ["", "*", "0:1", "0:1, 1:2,12:3"] {
            validate_topic_config("leader.replication.throttled.replicas", ok).unwrap();
            validate_topic_config("follower.replication.throttled.replicas", ok).unwrap();
        }
        for bad in ["0", "a:1", "0:1:2", "0:1,", "**"] {
            assert!(
                validate_topic_config("leader.replication.throttled.replicas", bad).is_err(),
                "{bad}"
            );
        }
        for key in [
            "leader.replication.throttled.rate",
            "follower.replication.throttled.rate",
            "replica.alter.log.dirs.io.max.bytes.per.second",
        ] {
            assert!(is_dynamic_broker_config(key), "{key}");
            validate_broker_config(key, "1048576").unwrap();
            assert!(validate_broker_config(key, "-1").is_err(), "{key}");
        }
        // A listener's TLS files are dynamic with the listener's prefix only, as in Kafka.
        assert_eq!(
            listener_tls_key("listener.name.ssl.ssl.keystore.location"),
            Some(("ssl", "ssl.keystore.location"))
        );
        assert!(is_dynamic_broker_config(
            "listener.name.internal.ssl.truststore.location"
        ));
        // Without the prefix Kafka describes them as dynamic but takes them per listener
        // only, and says so.
        assert!(
            validate_broker_change_of("ssl.keystore.location", "/k.pem", None)
                .unwrap_err()
                .contains("can be dynamically updated only per-listener using the listener prefix")
        );
        assert!(!is_dynamic_broker_config(
            "listener.name.ssl.ssl.client.auth"
        ));
        // No broker key supplies the throttled replicas' default.
        assert!(!is_dynamic_broker_config(NO_BROKER_KEY));
        assert!(!is_known_broker_key(NO_BROKER_KEY));
        assert_eq!(
            suggest_broker_key("leader.replication.throttled.replicas"),
            None
        );
        validate_topic_config("compression.zstd.level", "-5").unwrap();
        validate_topic_config("compression.gzip.level", "-1").unwrap();
        assert!(validate_topic_config("compression.gzip.level", "0").is_err());
        assert!(validate_topic_config("compression.lz4.level", "18").is_err());
    }

    #[test]
    fn dynamic_broker_keys_and_their_validation() {
        assert!(is_dynamic_broker_config("log.retention.ms"));
        assert!(is_dynamic_broker_config("compression.type"));
        assert!(is_dynamic_broker_config("min.insync.replicas"));
        assert!(is_dynamic_broker_config(
            "log.cleaner.min.compaction.lag.ms"
        ));
        assert!(!is_dynamic_broker_config("log.dirs"));
        assert!(!is_dynamic_broker_config("node.id"));
        assert!(validate_broker_config("log.retention.ms", "10").is_ok());
        let e = validate_broker_config("log.retention.ms", "soon").unwrap_err();
        assert!(e.contains("log.retention.ms"), "{e}");
        assert!(validate_broker_config("compression.type", "brotli").is_err());
        assert!(is_dynamic_broker_config(
            "log.cleaner.io.max.bytes.per.second"
        ));
        assert!(validate_broker_config("log.cleaner.io.max.bytes.per.second", "1048576").is_ok());
        assert!(validate_broker_config("log.cleaner.io.max.bytes.per.second", "5e6").is_ok());
        assert!(validate_broker_config(
            "log.cleaner.io.max.bytes.per.second",
            CLEANER_IO_UNBOUNDED
        )
        .is_ok());
        for bad in ["0", "-1", "NaN", "fast"] {
            assert!(
                validate_broker_config("log.cleaner.io.max.bytes.per.second", bad).is_err(),
                "{bad}"
            );
        }
        assert!(validate_broker_config("log.cleaner.dedupe.buffer.size", "134217728").is_ok());
        assert!(validate_broker_config("log.cleaner.dedupe.buffer.size", "1024").is_err());
        let c = BrokerConfig::default();
        let cleaner = cleaner_config(&c, &rill_metadata::MetadataImage::default(), 1);
        assert_eq!(cleaner.io_max_bytes_per_second, f64::MAX);
        assert_eq!(cleaner.dedupe_buffer_size, 134_217_728);
        let mut c = BrokerConfig::default();
        c.set("log.cleaner.io.max.bytes.per.second", "2000000");
        let cleaner = cleaner_config(&c, &rill_metadata::MetadataImage::default(), 1);
        assert_eq!(cleaner.io_max_bytes_per_second, 2e6);
        // Kafka adds listeners at run time; Rill refuses, and says why.
        assert!(
            validate_broker_change_of("listeners", "PLAINTEXT://127.0.0.1:1", None)
                .unwrap_err()
                .contains("Rill opens its listeners at start only")
        );
        assert!(validate_broker_config("log.dirs", "/x")
            .unwrap_err()
            .contains("Cannot update these configs dynamically"));
    }

    fn roles_config(roles: &str, node_id: i32, voters: &str) -> BrokerConfig {
        let mut c = BrokerConfig::default();
        c.set("process.roles", roles);
        c.set("node.id", &node_id.to_string());
        c.set("controller.quorum.voters", voters);
        c
    }

    fn config_error(c: &BrokerConfig) -> String {
        match c.validate() {
            Err(BrokerError::Config(m)) => m,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn process_roles_parse_every_combination() {
        let roles = |r: &str| roles_config(r, 1, "").process_roles();
        let both = ProcessRoles {
            broker: true,
            controller: true,
        };
        assert_eq!(roles("broker,controller").unwrap(), both);
        assert_eq!(roles(" controller , broker ").unwrap(), both);
        assert_eq!(
            roles("controller").unwrap(),
            ProcessRoles {
                broker: false,
                controller: true
            }
        );
        assert_eq!(
            roles("broker").unwrap(),
            ProcessRoles {
                broker: true,
                controller: false
            }
        );
        assert!(roles("").is_err());
        assert!(roles("broker,zookeeper").is_err());
        // The default is both, as before roles existed.
        assert_eq!(BrokerConfig::default().process_roles().unwrap(), both);
    }

    #[test]
    fn roles_are_checked_against_the_voters() {
        let voters = "1@127.0.0.1:9093,2@127.0.0.1:9094,3@127.0.0.1:9095";
        // Default: one combined node, its own quorum.
        BrokerConfig::default().validate().unwrap();
        roles_config("broker,controller", 2, voters)
            .validate()
            .unwrap();
        roles_config("controller", 3, voters).validate().unwrap();
        roles_config("broker", 4, voters).validate().unwrap();

        // A controller outside the voters joins the quorum to be added (KIP-853).
        roles_config("controller", 4, voters).validate().unwrap();
        roles_config("broker,controller", 4, voters)
            .validate()
            .unwrap();
        let m = config_error(&roles_config("broker", 2, voters));
        assert!(
            m.contains("node.id 2 is in controller.quorum.voters"),
            "{m}"
        );
        assert!(m.contains("broker-only"), "{m}");
        let m = config_error(&roles_config("broker", 4, ""));
        assert!(m.contains("needs controller.quorum.voters"), "{m}");
    }

    #[test]
    fn a_controller_only_node_needs_no_client_listener() {
        let mut c = roles_config("controller", 1, "1@127.0.0.1:9093");
        c.set("listeners", "CONTROLLER://127.0.0.1:9093");
        c.validate().unwrap();
        c.set("process.roles", "broker,controller");
        assert!(config_error(&c).contains("no client listener"));
    }

    #[test]
    fn a_broker_only_node_listens_for_the_log_where_controllers_can_reach_it() {
        let mut c = roles_config("broker", 4, "1@127.0.0.1:9093");
        c.set("listeners", "PLAINTEXT://127.0.0.2:9092");
        assert_eq!(
            c.observer_listen_addr().unwrap(),
            "127.0.0.2:0".parse::<SocketAddr>().unwrap()
        );
        c.set(
            "listeners",
            "PLAINTEXT://127.0.0.2:9092,CONTROLLER://127.0.0.3:9097",
        );
        assert_eq!(
            c.observer_listen_addr().unwrap(),
            "127.0.0.3:9097".parse::<SocketAddr>().unwrap()
        );
        c.set("listeners", "PLAINTEXT://0.0.0.0:9092");
        let m = config_error(&c);
        assert!(m.contains("--controller-listen"), "{m}");
    }
}
