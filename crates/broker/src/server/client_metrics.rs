//! Client metrics subscriptions (KIP-714): the CLIENT_METRICS config resources
//! (`kafka-client-metrics --alter|--describe|--delete|--list`), each naming which metrics
//! clients that match it should push and how often. They are kept in the metadata log
//! like group configs, validated as Kafka's `ClientMetricsConfigs` validates them, and
//! listed by ListConfigResources (Kafka 4.0's ListClientMetricsResources).
//!
//! Rill does not receive the pushes yet: Kafka offers GetTelemetrySubscriptions and
//! PushTelemetry only when a telemetry receiver plugin is configured, and Rill has none,
//! so clients never send them; the subscriptions are what an operator's scripts manage.

use std::collections::BTreeMap;

use rill_protocol::generated::describe_configs_response::DescribeConfigsResourceResult;
use rill_protocol::ErrorCode;

use rill_metadata::{MetadataImage, RESOURCE_CLIENT_METRICS};

use crate::config::ConfigSource;

/// The metrics to push (prefixes of metric names; `*` for all).
pub const METRICS: &str = "metrics";
/// The push interval.
pub const INTERVAL_MS: &str = "interval.ms";
/// Which clients the subscription applies to: `selector=regex` pairs.
pub const MATCH: &str = "match";

/// Every config of a subscription: its name and whether it is a list.
pub const CONFIGS: &[(&str, bool)] = &[(METRICS, true), (INTERVAL_MS, false), (MATCH, true)];

/// The client properties a `match` entry may select on.
const MATCH_SELECTORS: &[&str] = &[
    "client_instance_id",
    "client_id",
    "client_software_name",
    "client_software_version",
    "client_source_address",
    "client_source_port",
];

const MIN_INTERVAL_MS: i64 = 100;
const MAX_INTERVAL_MS: i64 = 3_600_000;

type ConfigError = (ErrorCode, String);

/// Whether `name` is a subscription config that holds a list (APPEND and SUBTRACT apply),
/// or `None` when it is not a subscription config at all.
pub fn is_list(name: &str) -> Option<bool> {
    CONFIGS.iter().find(|(n, _)| *n == name).map(|(_, l)| *l)
}

/// The entries of a list config as Kafka's `ConfigDef` parses a LIST: split at commas,
/// trimmed, an empty value being the empty list.
fn list_items(value: &str) -> Vec<&str> {
    if value.trim().is_empty() {
        return Vec::new();
    }
    value.split(',').map(str::trim).collect()
}

/// Checks a subscription's whole set of configs (Kafka's `ClientMetricsConfigs.validate`):
/// a name, known keys, an interval within 100 ms and an hour, and match entries that each
/// name one selector and compile as a pattern.
///
/// Patterns compile with the `regex` crate, which lacks Java's look-around and
/// back-references: such a pattern Kafka takes is refused here.
pub fn validate(name: &str, configs: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err((
            ErrorCode::INVALID_REQUEST,
            "Subscription name can't be empty".to_string(),
        ));
    }
    for key in configs.keys() {
        if is_list(key).is_none() {
            return Err((
                ErrorCode::INVALID_REQUEST,
                format!("Unknown client metrics configuration: {key}"),
            ));
        }
    }
    if let Some(value) = configs.get(INTERVAL_MS) {
        let interval: i64 = value.trim().parse::<i32>().map(i64::from).map_err(|_| {
            (
                ErrorCode::INVALID_CONFIG,
                format!(
                    "Invalid value {value} for configuration {INTERVAL_MS}: Not a number of type INT"
                ),
            )
        })?;
        if !(MIN_INTERVAL_MS..=MAX_INTERVAL_MS).contains(&interval) {
            return Err((
                ErrorCode::INVALID_REQUEST,
                format!(
                    "Invalid value {interval} for {INTERVAL_MS}, interval must be between \
                     {MIN_INTERVAL_MS} and {MAX_INTERVAL_MS} (1 hour)"
                ),
            ));
        }
    }
    if let Some(value) = configs.get(MATCH) {
        for pattern in list_items(value) {
            check_match(pattern)?;
        }
    }
    Ok(())
}

/// One `selector=regex` entry. Like Java's `split("=")`, trailing empty parts are
/// dropped, so `client_id=` has no pattern and is refused, as Kafka refuses it.
fn check_match(pattern: &str) -> Result<(), ConfigError> {
    let illegal = || {
        (
            ErrorCode::INVALID_CONFIG,
            format!("Illegal client matching pattern: {pattern}"),
        )
    };
    let mut parts: Vec<&str> = pattern.split('=').collect();
    while parts.last().is_some_and(|p| p.is_empty()) {
        parts.pop();
    }
    let [selector, regex] = parts.as_slice() else {
        return Err(illegal());
    };
    if !MATCH_SELECTORS.contains(&selector.trim()) {
        return Err(illegal());
    }
    regex::Regex::new(regex.trim()).map_err(|_| illegal())?;
    Ok(())
}

/// DescribeConfigs of a subscription: the entries it sets, and no others, as Kafka lists
/// them (a subscription that does not exist has none).
pub fn describe(
    image: &MetadataImage,
    name: &str,
) -> Result<Vec<DescribeConfigsResourceResult>, ConfigError> {
    if name.is_empty() {
        return Err((
            ErrorCode::INVALID_REQUEST,
            "Client metrics subscription name must not be empty".to_string(),
        ));
    }
    let Some(entries) = image
        .configs
        .get(&(RESOURCE_CLIENT_METRICS, name.to_string()))
    else {
        return Ok(Vec::new());
    };
    Ok(entries
        .iter()
        .map(|(k, v)| DescribeConfigsResourceResult {
            name: k.clone(),
            value: Some(v.clone()),
            config_source: ConfigSource::ClientMetricsConfig as i8,
            ..Default::default()
        })
        .collect())
}

/// The name of every subscription.
pub fn names(image: &MetadataImage) -> impl Iterator<Item = &str> {
    image
        .configs
        .keys()
        .filter(|(resource_type, _)| *resource_type == RESOURCE_CLIENT_METRICS)
        .map(|(_, name)| name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configs(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn code(name: &str, pairs: &[(&str, &str)]) -> ErrorCode {
        match validate(name, &configs(pairs)) {
            Ok(()) => ErrorCode::NONE,
            Err((code, _)) => code,
        }
    }

    #[test]
    fn a_whole_subscription_is_valid() {
        let ok = [
            (
                METRICS,
                "org.apache.kafka.producer., org.apache.kafka.consumer.fetch",
            ),
            (INTERVAL_MS, "1000"),
            (
                MATCH,
                r"client_software_name=kafka.python, client_software_version=1\.2\..*",
            ),
        ];
        assert_eq!(code("sub", &ok), ErrorCode::NONE);
        assert_eq!(code("sub", &[(METRICS, "*")]), ErrorCode::NONE);
        assert_eq!(code("sub", &[(MATCH, "")]), ErrorCode::NONE);
    }

    #[test]
    fn names_keys_and_intervals_are_checked_as_kafka_checks_them() {
        assert_eq!(code("", &[(METRICS, "*")]), ErrorCode::INVALID_REQUEST);
        assert_eq!(code("s", &[("metric", "*")]), ErrorCode::INVALID_REQUEST);
        assert_eq!(
            code("s", &[(INTERVAL_MS, "99")]),
            ErrorCode::INVALID_REQUEST
        );
        assert_eq!(code("s", &[(INTERVAL_MS, "100")]), ErrorCode::NONE);
        assert_eq!(code("s", &[(INTERVAL_MS, "3600000")]), ErrorCode::NONE);
        assert_eq!(
            code("s", &[(INTERVAL_MS, "3600001")]),
            ErrorCode::INVALID_REQUEST
        );
        assert_eq!(
            code("s", &[(INTERVAL_MS, "soon")]),
            ErrorCode::INVALID_CONFIG
        );
    }

    #[test]
    fn match_entries_need_one_known_selector_and_a_pattern() {
        for bad in [
            "client_id",
            "client_id=",
            "client_id=a=b",
            "=x",
            "user=alice",
            "client_id=(unclosed",
            // Java's split drops trailing empty parts: one part, refused.
            "client_id==",
        ] {
            assert_eq!(
                code("s", &[(MATCH, bad)]),
                ErrorCode::INVALID_CONFIG,
                "{bad}"
            );
        }
        for good in ["client_id=rill-.*", " client_source_port = 9\\d+ "] {
            assert_eq!(code("s", &[(MATCH, good)]), ErrorCode::NONE, "{good}");
        }
    }
}
