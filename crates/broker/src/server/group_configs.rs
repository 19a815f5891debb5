//! Configs of a GROUP resource (Kafka's `GroupConfig`, resource type 32): per-group
//! overrides of the group coordinator's session timeouts, heartbeat intervals and share
//! and streams settings, set with IncrementalAlterConfigs and read with DescribeConfigs
//! (`kafka-configs --entity-type groups`). They are stored in the metadata log like topic
//! configs, and a group need not exist to have them.
//!
//! Each has the broker key `group.<name>` as its default where Kafka has one, and each
//! value must lie within the broker's bounds (`group.consumer.min.session.timeout.ms` …),
//! with the session timeout above the heartbeat interval, as Kafka validates them.

use std::collections::BTreeMap;

use rill_metadata::MetadataImage;
use rill_protocol::ErrorCode;

use crate::config::{self, BrokerConfig, ConfigSource, ConfigType};

/// One group config: its name, type, the broker key that supplies its default (or none)
/// and Kafka's default.
pub struct GroupConfigDef {
    pub name: &'static str,
    pub config_type: ConfigType,
    pub broker_key: Option<&'static str>,
    pub default: &'static str,
    pub doc: &'static str,
}

const fn def(
    name: &'static str,
    config_type: ConfigType,
    broker_key: Option<&'static str>,
    default: &'static str,
    doc: &'static str,
) -> GroupConfigDef {
    GroupConfigDef {
        name,
        config_type,
        broker_key,
        default,
        doc,
    }
}

/// Kafka 4.1's group configs, in its order.
pub static GROUP_CONFIGS: &[GroupConfigDef] = &[
    def(
        "consumer.session.timeout.ms",
        ConfigType::Int,
        Some("group.consumer.session.timeout.ms"),
        "45000",
        "the session timeout of the group's members (consumer protocol)",
    ),
    def(
        "consumer.heartbeat.interval.ms",
        ConfigType::Int,
        Some("group.consumer.heartbeat.interval.ms"),
        "5000",
        "the heartbeat interval given to the group's members (consumer protocol)",
    ),
    def(
        "share.session.timeout.ms",
        ConfigType::Int,
        Some("group.share.session.timeout.ms"),
        "45000",
        "the session timeout of a share group's members",
    ),
    def(
        "share.heartbeat.interval.ms",
        ConfigType::Int,
        Some("group.share.heartbeat.interval.ms"),
        "5000",
        "the heartbeat interval given to a share group's members",
    ),
    def(
        "share.record.lock.duration.ms",
        ConfigType::Int,
        Some("group.share.record.lock.duration.ms"),
        "30000",
        "how long a share group's member holds a delivered record",
    ),
    def(
        "share.auto.offset.reset",
        ConfigType::String,
        None,
        "latest",
        "where a share group starts a partition: latest, earliest or by_duration:<ISO-8601>",
    ),
    def(
        "share.isolation.level",
        ConfigType::String,
        None,
        "read_uncommitted",
        "which records a share group delivers: read_uncommitted or read_committed",
    ),
    def(
        "streams.session.timeout.ms",
        ConfigType::Int,
        Some("group.streams.session.timeout.ms"),
        "45000",
        "the session timeout of a streams group's members",
    ),
    def(
        "streams.heartbeat.interval.ms",
        ConfigType::Int,
        Some("group.streams.heartbeat.interval.ms"),
        "5000",
        "the heartbeat interval given to a streams group's members",
    ),
    def(
        "streams.num.standby.replicas",
        ConfigType::Int,
        Some("group.streams.num.standby.replicas"),
        "0",
        "standby replicas of a streams group's state stores",
    ),
];

/// The broker keys the values are checked against: (group config, lower bound key,
/// upper bound key).
const BOUNDS: &[(&str, &str, &str)] = &[
    (
        "consumer.session.timeout.ms",
        "group.consumer.min.session.timeout.ms",
        "group.consumer.max.session.timeout.ms",
    ),
    (
        "consumer.heartbeat.interval.ms",
        "group.consumer.min.heartbeat.interval.ms",
        "group.consumer.max.heartbeat.interval.ms",
    ),
    (
        "share.session.timeout.ms",
        "group.share.min.session.timeout.ms",
        "group.share.max.session.timeout.ms",
    ),
    (
        "share.heartbeat.interval.ms",
        "group.share.min.heartbeat.interval.ms",
        "group.share.max.heartbeat.interval.ms",
    ),
    (
        "share.record.lock.duration.ms",
        "group.share.min.record.lock.duration.ms",
        "group.share.max.record.lock.duration.ms",
    ),
    (
        "streams.session.timeout.ms",
        "group.streams.min.session.timeout.ms",
        "group.streams.max.session.timeout.ms",
    ),
    (
        "streams.heartbeat.interval.ms",
        "group.streams.min.heartbeat.interval.ms",
        "group.streams.max.heartbeat.interval.ms",
    ),
];

/// Session timeouts that must exceed their heartbeat interval.
const SESSION_OVER_HEARTBEAT: &[(&str, &str)] = &[
    (
        "consumer.session.timeout.ms",
        "consumer.heartbeat.interval.ms",
    ),
    ("share.session.timeout.ms", "share.heartbeat.interval.ms"),
    (
        "streams.session.timeout.ms",
        "streams.heartbeat.interval.ms",
    ),
];

fn definition(name: &str) -> Option<&'static GroupConfigDef> {
    GROUP_CONFIGS.iter().find(|d| d.name == name)
}

/// A group config's effective value, as the one level DescribeConfigs shows (Kafka's
/// `ConfigHelper.createGroupConfigEntry`): the group's own override (GROUP_CONFIG), else
/// the default — the broker key's value where there is one, at whatever level the broker
/// has it, but described as DEFAULT_CONFIG under the group config's own name, since a
/// group config has no broker synonyms.
pub fn levels(
    d: &GroupConfigDef,
    static_config: &BrokerConfig,
    image: &MetadataImage,
    node_id: i32,
    overrides: Option<&BTreeMap<String, String>>,
) -> Vec<(String, String, ConfigSource)> {
    if let Some(v) = overrides.and_then(|o| o.get(d.name)) {
        return vec![(d.name.to_string(), v.clone(), ConfigSource::GroupConfig)];
    }
    let default = d
        .broker_key
        .and_then(|key| {
            config::broker_config_synonyms(static_config, image, node_id, key)
                .into_iter()
                .next()
        })
        .map_or_else(|| d.default.to_string(), |(v, _)| v);
    vec![(d.name.to_string(), default, ConfigSource::DefaultConfig)]
}

fn int_of(name: &str, value: &str) -> Result<i64, (ErrorCode, String)> {
    value.trim().parse::<i32>().map(i64::from).map_err(|_| {
        (
            ErrorCode::INVALID_CONFIG,
            format!("Invalid value {value} for configuration {name}: Not a number of type INT"),
        )
    })
}

/// Checks a group's whole set of overrides against the broker's bounds (Kafka's
/// `GroupConfig.validate`): known names, values of the right type and range, and each
/// session timeout above its heartbeat interval once defaults fill the rest.
pub fn validate(
    overrides: &BTreeMap<String, String>,
    static_config: &BrokerConfig,
    image: &MetadataImage,
    node_id: i32,
) -> Result<(), (ErrorCode, String)> {
    let invalid = |m: String| (ErrorCode::INVALID_CONFIG, m);
    for (name, value) in overrides {
        let d = definition(name)
            .ok_or_else(|| invalid(format!("Unknown group config name: {name}")))?;
        match d.name {
            "share.auto.offset.reset" => {
                let ok = value == "latest"
                    || value == "earliest"
                    || value
                        .strip_prefix("by_duration:")
                        .is_some_and(|p| p.starts_with('P') && p.len() > 1);
                if !ok {
                    return Err(invalid(format!(
                        "Invalid value {value} for configuration {name}: must be latest, \
                         earliest or by_duration:<ISO-8601 duration>"
                    )));
                }
            }
            "share.isolation.level" => {
                if value != "read_committed" && value != "read_uncommitted" {
                    return Err(invalid(format!(
                        "Invalid value {value} for configuration {name}: String must be one \
                         of: read_committed, read_uncommitted"
                    )));
                }
            }
            _ => {
                let v = int_of(name, value)?;
                let least = match d.name {
                    "share.record.lock.duration.ms" => 1000,
                    "streams.num.standby.replicas" => 0,
                    _ => 1,
                };
                if v < least {
                    return Err(invalid(format!(
                        "Invalid value {v} for configuration {name}: Value must be at least {least}"
                    )));
                }
            }
        }
    }
    let effective = |name: &str| -> Result<i64, (ErrorCode, String)> {
        let d = definition(name).ok_or_else(|| invalid(format!("no group config {name}")))?;
        let (_, value, _) = levels(d, static_config, image, node_id, Some(overrides))
            .into_iter()
            .next()
            .unwrap_or_else(|| {
                (
                    name.to_string(),
                    d.default.to_string(),
                    ConfigSource::DefaultConfig,
                )
            });
        int_of(name, &value)
    };
    let broker = |key: &str| -> i64 {
        config::broker_config_synonyms(static_config, image, node_id, key)
            .first()
            .and_then(|(v, _)| v.trim().parse().ok())
            .unwrap_or(0)
    };
    for (name, min_key, max_key) in BOUNDS {
        if !overrides.contains_key(*name) {
            continue;
        }
        let v = effective(name)?;
        if v < broker(min_key) {
            return Err(invalid(format!(
                "{name} must be greater than or equal to {min_key}"
            )));
        }
        if v > broker(max_key) {
            return Err(invalid(format!(
                "{name} must be less than or equal to {max_key}"
            )));
        }
    }
    if let Some(v) = overrides.get("streams.num.standby.replicas") {
        if int_of("streams.num.standby.replicas", v)? > broker("group.streams.max.standby.replicas")
        {
            return Err(invalid(
                "streams.num.standby.replicas must be less than or equal to \
                 group.streams.max.standby.replicas"
                    .to_string(),
            ));
        }
    }
    for (session, heartbeat) in SESSION_OVER_HEARTBEAT {
        if (overrides.contains_key(*session) || overrides.contains_key(*heartbeat))
            && effective(session)? <= effective(heartbeat)?
        {
            return Err(invalid(format!(
                "{session} must be greater than {heartbeat}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn described(
        name: &str,
        static_config: &BrokerConfig,
        image: &MetadataImage,
        overrides: Option<&BTreeMap<String, String>>,
    ) -> Vec<(String, String, ConfigSource)> {
        let d = definition(name).unwrap();
        levels(d, static_config, image, 1, overrides)
    }

    #[test]
    fn a_default_from_the_broker_is_described_as_the_group_configs_default() {
        let mut static_config = BrokerConfig::default();
        static_config.set("group.share.heartbeat.interval.ms", "1000");
        static_config.set("group.consumer.session.timeout.ms", "50000");
        let image = MetadataImage::default();
        let default = |value: &str, name: &str| {
            vec![(
                name.to_string(),
                value.to_string(),
                ConfigSource::DefaultConfig,
            )]
        };
        // Kafka 4.1 describes these as DEFAULT_CONFIG with the broker's value, and no
        // broker synonyms.
        assert_eq!(
            described("share.heartbeat.interval.ms", &static_config, &image, None),
            default("1000", "share.heartbeat.interval.ms")
        );
        assert_eq!(
            described("consumer.session.timeout.ms", &static_config, &image, None),
            default("50000", "consumer.session.timeout.ms")
        );
        assert_eq!(
            described(
                "share.record.lock.duration.ms",
                &static_config,
                &image,
                None
            ),
            default("30000", "share.record.lock.duration.ms")
        );
        assert_eq!(
            described("share.auto.offset.reset", &static_config, &image, None),
            default("latest", "share.auto.offset.reset")
        );
        let overrides = BTreeMap::from([(
            "share.heartbeat.interval.ms".to_string(),
            "2000".to_string(),
        )]);
        assert_eq!(
            described(
                "share.heartbeat.interval.ms",
                &static_config,
                &image,
                Some(&overrides)
            ),
            vec![(
                "share.heartbeat.interval.ms".to_string(),
                "2000".to_string(),
                ConfigSource::GroupConfig
            )]
        );
    }
}
