//! Topic administration: CreateTopics, DeleteTopics and CreatePartitions.
//!
//! A topic change is persisted to the metadata store first and the partition logs are
//! opened (or deleted) after, so a crash in between leaves a topic whose missing logs are
//! created on the next start, never logs that no topic owns.

use std::collections::BTreeMap;

use rill_protocol::generated::create_partitions_request::CreatePartitionsRequest;
use rill_protocol::generated::create_partitions_response::{
    CreatePartitionsResponse, CreatePartitionsTopicResult,
};
use rill_protocol::generated::create_topics_request::CreateTopicsRequest;
use rill_protocol::generated::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult, CreateTopicsResponse,
};
use rill_protocol::generated::delete_topics_request::DeleteTopicsRequest;
use rill_protocol::generated::delete_topics_response::{
    DeletableTopicResult, DeleteTopicsResponse,
};
use rill_protocol::primitives::Uuid;
use rill_protocol::ErrorCode;
use rill_storage::TopicPartition;

use crate::config::{self, ConfigSource};
use crate::group_coordinator::OFFSETS_TOPIC;
use crate::metadata_store::{random_uuid, uuid_to_hex, TopicMeta};
use crate::Broker;

/// Kafka's limit on topic name length (so that partition directory names fit in 255).
const MAX_TOPIC_NAME_LEN: usize = 249;
/// A bound on partitions per topic, so that one request cannot make the broker open
/// millions of files.
pub const MAX_PARTITIONS_PER_TOPIC: i32 = 10_000;

type TopicError = (ErrorCode, String);

/// Kafka's topic name rules: 1-249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), TopicError> {
    let invalid = |why: String| Err((ErrorCode::INVALID_TOPIC_EXCEPTION, why));
    if name.is_empty() {
        return invalid("topic name is empty".into());
    }
    if name == "." || name == ".." {
        return invalid(format!("topic name cannot be {name:?}"));
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return invalid(format!(
            "topic name is longer than {MAX_TOPIC_NAME_LEN} characters"
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return invalid(format!(
            "topic name {name:?} contains characters other than ASCII alphanumerics, '.', '_' and '-'"
        ));
    }
    Ok(())
}

impl Broker {
    /// Creates a topic and opens its partition logs.
    pub fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        configs: BTreeMap<String, String>,
        validate_only: bool,
    ) -> Result<TopicMeta, TopicError> {
        validate_topic_name(name)?;
        if !(1..=MAX_PARTITIONS_PER_TOPIC).contains(&partitions) {
            return Err((
                ErrorCode::INVALID_PARTITIONS,
                format!("number of partitions must be between 1 and {MAX_PARTITIONS_PER_TOPIC}"),
            ));
        }
        if replication_factor < 1 {
            return Err((
                ErrorCode::INVALID_REPLICATION_FACTOR,
                "replication factor must be larger than 0".into(),
            ));
        }
        if replication_factor > 1 {
            return Err((
                ErrorCode::INVALID_REPLICATION_FACTOR,
                format!(
                    "replication factor: {replication_factor} larger than available brokers: 1"
                ),
            ));
        }
        for (k, v) in &configs {
            config::validate_topic_config(k, v).map_err(|m| (ErrorCode::INVALID_CONFIG, m))?;
        }
        let topic = TopicMeta {
            name: name.to_string(),
            id: uuid_to_hex(random_uuid()),
            partitions,
            replication_factor,
            configs,
            internal: name.starts_with("__"),
        };
        let mut store = self.metadata();
        let image = store.image();
        if image.topics.contains_key(name) {
            return Err((
                ErrorCode::TOPIC_ALREADY_EXISTS,
                format!("topic '{name}' already exists"),
            ));
        }
        // '.' and '_' collide in metric names, so Kafka refuses names that differ only there.
        let canonical = name.replace('.', "_");
        if let Some(other) = image
            .topics
            .keys()
            .find(|t| t.replace('.', "_") == canonical)
        {
            return Err((
                ErrorCode::INVALID_TOPIC_EXCEPTION,
                format!("topic '{name}' collides with existing topic '{other}'"),
            ));
        }
        if validate_only {
            return Ok(topic);
        }
        store
            .update(|img| img.topics.insert(name.to_string(), topic.clone()))
            .map_err(|e| (ErrorCode::KAFKA_STORAGE_ERROR, e.to_string()))?;
        drop(store);
        self.open_topic_partitions(&topic, 0)
            .map_err(|e| (ErrorCode::KAFKA_STORAGE_ERROR, e.to_string()))?;
        tracing::info!(topic = name, partitions, "created topic");
        Ok(topic)
    }

    pub(crate) fn handle_create_topics(
        &self,
        request: CreateTopicsRequest,
        version: i16,
    ) -> CreateTopicsResponse {
        let default_partitions = self.config.num_partitions().unwrap_or(1);
        let default_rf = self.config.default_replication_factor().unwrap_or(1);
        let topics = request
            .topics
            .into_iter()
            .map(|t| {
                let mut result = CreatableTopicResult {
                    name: t.name.clone(),
                    num_partitions: -1,
                    replication_factor: -1,
                    ..Default::default()
                };
                let created = if !t.assignments.is_empty() {
                    // Manual assignment: the partition count is the assignment's length.
                    let bad = t.assignments.iter().any(|a| a.broker_ids != [self.node_id]);
                    if bad || t.num_partitions != -1 || t.replication_factor != -1 {
                        Err((
                            ErrorCode::INVALID_REPLICA_ASSIGNMENT,
                            format!("replica assignment may only name broker {}", self.node_id),
                        ))
                    } else {
                        let n = t.assignments.len() as i32;
                        let configs = t
                            .configs
                            .iter()
                            .filter_map(|c| Some((c.name.clone(), c.value.clone()?)))
                            .collect();
                        self.create_topic(&t.name, n, 1, configs, request.validate_only)
                    }
                } else {
                    let partitions = if t.num_partitions == -1 {
                        default_partitions
                    } else {
                        t.num_partitions
                    };
                    let rf = if t.replication_factor == -1 {
                        default_rf
                    } else {
                        t.replication_factor
                    };
                    let configs = t
                        .configs
                        .iter()
                        .filter_map(|c| Some((c.name.clone(), c.value.clone()?)))
                        .collect();
                    self.create_topic(&t.name, partitions, rf, configs, request.validate_only)
                };
                match created {
                    Ok(topic) => {
                        result.topic_id = topic.topic_id();
                        result.num_partitions = topic.partitions;
                        result.replication_factor = topic.replication_factor;
                        if version >= 5 {
                            result.configs = Some(self.creatable_configs(&topic));
                        }
                    }
                    Err((code, message)) => {
                        result.error_code = code.code();
                        result.error_message = Some(message);
                    }
                }
                result
            })
            .collect();
        CreateTopicsResponse {
            topics,
            ..Default::default()
        }
    }

    fn creatable_configs(&self, topic: &TopicMeta) -> Vec<CreatableTopicConfigs> {
        config::TOPIC_CONFIGS
            .iter()
            .map(|d| {
                let source = if topic.configs.contains_key(d.name) {
                    ConfigSource::DynamicTopicConfig
                } else if self.config.is_set(d.broker_key) {
                    ConfigSource::StaticBrokerConfig
                } else {
                    ConfigSource::DefaultConfig
                };
                CreatableTopicConfigs {
                    name: d.name.to_string(),
                    value: self.topic_config_value(topic, d.name),
                    read_only: false,
                    config_source: source as i8,
                    is_sensitive: false,
                    ..Default::default()
                }
            })
            .collect()
    }

    /// Deletes a topic: forgets it in the metadata first, then removes its logs.
    pub fn delete_topic(&self, name: &str) -> Result<TopicMeta, ErrorCode> {
        if name == OFFSETS_TOPIC {
            // The group coordinator's state lives there; Kafka refuses this too.
            return Err(ErrorCode::INVALID_TOPIC_EXCEPTION);
        }
        let removed = {
            let mut store = self.metadata();
            if !store.image().topics.contains_key(name) {
                return Err(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION);
            }
            store
                .update(|img| img.topics.remove(name))
                .map_err(|_| ErrorCode::KAFKA_STORAGE_ERROR)?
        };
        let Some(topic) = removed else {
            return Err(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION);
        };
        for p in 0..topic.partitions {
            let tp = TopicPartition {
                topic: topic.name.clone(),
                partition: p,
            };
            if let Err(e) = self.replicas.delete_partition(&tp) {
                tracing::error!(%tp, error = %e, "deleting partition log failed");
            }
        }
        tracing::info!(topic = name, "deleted topic");
        Ok(topic)
    }

    pub(crate) fn handle_delete_topics(
        &self,
        request: DeleteTopicsRequest,
        version: i16,
    ) -> DeleteTopicsResponse {
        // v6 names topics by name or id; earlier versions by name only.
        let targets: Vec<(Option<String>, Uuid)> = if version >= 6 {
            request
                .topics
                .into_iter()
                .map(|t| (t.name, t.topic_id))
                .collect()
        } else {
            request
                .topic_names
                .into_iter()
                .map(|n| (Some(n), Uuid::default()))
                .collect()
        };
        let responses = targets
            .into_iter()
            .map(|(name, id)| {
                let name = name.or_else(|| self.topic_name_by_id(&id));
                let mut result = DeletableTopicResult {
                    name: name.clone(),
                    topic_id: id,
                    ..Default::default()
                };
                match name {
                    None => result.error_code = ErrorCode::UNKNOWN_TOPIC_ID.code(),
                    Some(name) => match self.delete_topic(&name) {
                        Ok(topic) => result.topic_id = topic.topic_id(),
                        Err(code) => result.error_code = code.code(),
                    },
                }
                result
            })
            .collect();
        DeleteTopicsResponse {
            responses,
            ..Default::default()
        }
    }

    pub(crate) fn handle_create_partitions(
        &self,
        request: CreatePartitionsRequest,
    ) -> CreatePartitionsResponse {
        let results = request
            .topics
            .into_iter()
            .map(|t| {
                let mut result = CreatePartitionsTopicResult {
                    name: t.name.clone(),
                    ..Default::default()
                };
                if let Err((code, message)) =
                    self.add_partitions(&t.name, t.count, request.validate_only)
                {
                    result.error_code = code.code();
                    result.error_message = Some(message);
                }
                result
            })
            .collect();
        CreatePartitionsResponse {
            results,
            ..Default::default()
        }
    }

    fn add_partitions(
        &self,
        name: &str,
        count: i32,
        validate_only: bool,
    ) -> Result<(), TopicError> {
        let mut store = self.metadata();
        let Some(topic) = store.image().topics.get(name).cloned() else {
            return Err((
                ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
                format!("topic '{name}' does not exist"),
            ));
        };
        if count <= topic.partitions {
            return Err((
                ErrorCode::INVALID_PARTITIONS,
                format!(
                    "topic currently has {} partitions, which is higher than the requested {count}",
                    topic.partitions
                ),
            ));
        }
        if count > MAX_PARTITIONS_PER_TOPIC {
            return Err((
                ErrorCode::INVALID_PARTITIONS,
                format!("at most {MAX_PARTITIONS_PER_TOPIC} partitions per topic"),
            ));
        }
        if validate_only {
            return Ok(());
        }
        let old = topic.partitions;
        let mut grown = topic;
        grown.partitions = count;
        store
            .update(|img| img.topics.insert(name.to_string(), grown.clone()))
            .map_err(|e| (ErrorCode::KAFKA_STORAGE_ERROR, e.to_string()))?;
        drop(store);
        self.open_topic_partitions(&grown, old)
            .map_err(|e| (ErrorCode::KAFKA_STORAGE_ERROR, e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(validate_topic_name("orders.v1_x-y").is_ok());
        assert!(validate_topic_name("").is_err());
        assert!(validate_topic_name("..").is_err());
        assert!(validate_topic_name("a/b").is_err());
        assert!(validate_topic_name(&"x".repeat(250)).is_err());
        assert!(validate_topic_name(&"x".repeat(249)).is_ok());
    }
}
