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

/// Kafka's `ConfigType` as DescribeConfigs v3+ reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    Boolean = 1,
    String = 2,
    Int = 3,
    Long = 5,
    Double = 6,
    List = 7,
}

/// Kafka's `ConfigSource` on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    DynamicTopicConfig = 1,
    StaticBrokerConfig = 4,
    DefaultConfig = 5,
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
        "compression.type",
        ConfigType::String,
        "compression.type",
        "producer",
        "codec the broker stores batches with; producer keeps the producer's",
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
        "index.interval.bytes",
        ConfigType::Int,
        "log.index.interval.bytes",
        "4096",
        "bytes between offset index entries",
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
        "9223372036854775807",
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
        return Err(format!("unknown topic config name: {name}"));
    };
    let ok = match d.config_type {
        ConfigType::Boolean => matches!(value, "true" | "false"),
        ConfigType::Int => value.trim().parse::<i32>().is_ok(),
        ConfigType::Long => value.trim().parse::<i64>().is_ok(),
        ConfigType::Double => value.trim().parse::<f64>().is_ok(),
        ConfigType::String | ConfigType::List => true,
    };
    if !ok {
        return Err(format!("invalid value {value} for configuration {name}"));
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

/// The broker's configuration: every key as Kafka names it, with typed accessors.
#[derive(Debug, Clone, Default)]
pub struct BrokerConfig {
    /// Keys set in the file or by overrides. Absent keys take their defaults.
    props: BTreeMap<String, String>,
}

/// Broker keys with their defaults, as DescribeConfigs on the broker resource lists them.
pub static BROKER_DEFAULTS: &[(&str, &str)] = &[
    ("auto.create.topics.enable", "true"),
    ("broker.id.generation.enable", "true"),
    ("connections.max.idle.ms", "600000"),
    ("default.replication.factor", "1"),
    ("group.initial.rebalance.delay.ms", "3000"),
    ("group.max.session.timeout.ms", "1800000"),
    ("group.max.size", "2147483647"),
    ("group.min.session.timeout.ms", "6000"),
    ("listeners", "PLAINTEXT://127.0.0.1:9092"),
    ("log.cleaner.backoff.ms", "15000"),
    ("log.dirs", "./rill-data"),
    ("log.retention.check.interval.ms", "300000"),
    ("max.connections", "2147483647"),
    ("max.connections.per.ip", "2147483647"),
    ("node.id", "1"),
    ("num.partitions", "1"),
    ("offsets.retention.minutes", "10080"),
    ("offsets.topic.num.partitions", "50"),
    ("offsets.topic.replication.factor", "1"),
    ("process.roles", "broker,controller"),
    ("queued.max.request.bytes", "104857600"),
    ("queued.max.requests", "500"),
    ("sasl.server.max.receive.size", "524288"),
    ("socket.request.max.bytes", "104857600"),
];

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

    fn parse<T: std::str::FromStr>(&self, key: &str) -> Result<T, BrokerError> {
        let raw = self.get(key).unwrap_or_default();
        raw.trim()
            .parse()
            .map_err(|_| BrokerError::Config(format!("{key}: cannot parse {raw:?}")))
    }

    pub fn node_id(&self) -> Result<i32, BrokerError> {
        self.parse("node.id")
    }

    /// The address to listen on, from `listeners` (`PLAINTEXT://host:port` or `host:port`).
    pub fn listen_addr(&self) -> Result<SocketAddr, BrokerError> {
        let raw = self.get("listeners").unwrap_or_default();
        let first = raw.split(',').next().unwrap_or_default().trim();
        let hostport = first.split_once("://").map_or(first, |(_, rest)| rest);
        let hostport = hostport.replace("localhost", "127.0.0.1");
        hostport
            .parse()
            .map_err(|_| BrokerError::Config(format!("listeners: cannot parse {raw:?}")))
    }

    pub fn data_dir(&self) -> PathBuf {
        let raw = self.get("log.dirs").unwrap_or("./rill-data");
        PathBuf::from(raw.split(',').next().unwrap_or(raw).trim())
    }

    pub fn auto_create_topics(&self) -> bool {
        self.get("auto.create.topics.enable") == Some("true")
    }

    pub fn num_partitions(&self) -> Result<i32, BrokerError> {
        self.parse("num.partitions")
    }

    pub fn default_replication_factor(&self) -> Result<i16, BrokerError> {
        self.parse("default.replication.factor")
    }

    pub fn socket_request_max_bytes(&self) -> Result<usize, BrokerError> {
        self.parse("socket.request.max.bytes")
    }

    /// Intervals of the background log maintenance.
    pub fn log_manager_config(&self) -> Result<crate::log_manager::LogManagerConfig, BrokerError> {
        let retention: u64 = self.parse("log.retention.check.interval.ms")?;
        let backoff: u64 = self.parse("log.cleaner.backoff.ms")?;
        Ok(crate::log_manager::LogManagerConfig {
            retention_check_interval: std::time::Duration::from_millis(retention.max(10)),
            cleaner_backoff: std::time::Duration::from_millis(backoff.max(10)),
        })
    }

    /// The group coordinator's settings from `group.*` and `offsets.*` keys.
    pub fn group_config(&self) -> Result<rill_group::GroupConfig, BrokerError> {
        let defaults = rill_group::GroupConfig::default();
        let partitions: i32 = self.parse("offsets.topic.num.partitions")?;
        if !(1..=1000).contains(&partitions) {
            return Err(BrokerError::Config(
                "offsets.topic.num.partitions must be between 1 and 1000".into(),
            ));
        }
        Ok(rill_group::GroupConfig {
            offsets_topic_num_partitions: partitions,
            group_min_session_timeout_ms: self.parse("group.min.session.timeout.ms")?,
            group_max_session_timeout_ms: self.parse("group.max.session.timeout.ms")?,
            group_initial_rebalance_delay_ms: self.parse("group.initial.rebalance.delay.ms")?,
            group_max_size: self.parse("group.max.size")?,
            offsets_retention_minutes: self.parse("offsets.retention.minutes")?,
            ..defaults
        })
    }

    /// Checks every key this build reads, so that a typo fails at start-up, not later.
    pub fn validate(&self) -> Result<(), BrokerError> {
        self.node_id()?;
        self.listen_addr()?;
        self.num_partitions()?;
        self.default_replication_factor()?;
        self.socket_request_max_bytes()?;
        self.group_config()?;
        self.log_manager_config()?;
        crate::network::ConnectionLimits::from_config(self)?;
        for d in TOPIC_CONFIGS {
            if let Some(v) = self.props.get(d.broker_key) {
                validate_topic_config(d.name, v).map_err(BrokerError::Config)?;
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
    use super::*;

    #[test]
    fn defaults_give_a_single_node_on_9092() {
        let c = BrokerConfig::default();
        c.validate().unwrap();
        assert_eq!(c.listen_addr().unwrap().to_string(), "127.0.0.1:9092");
        assert_eq!(c.data_dir(), PathBuf::from("./rill-data"));
        assert_eq!(c.get("log.retention.ms"), Some("604800000"));
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
}
