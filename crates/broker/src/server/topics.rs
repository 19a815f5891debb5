//! Topic administration: CreateTopics, DeleteTopics and CreatePartitions.
//!
//! Each request becomes one event for the active controller (on this node or another);
//! its decision is committed to the metadata log, and the answer goes back once this
//! broker has applied it, so that the client's next Metadata request here sees the
//! change. Logs are opened and deleted by the metadata publisher, on every replica,
//! as it applies the records.

use rill_metadata::{
    ControllerEvent, ControllerResponse, CreatableTopic,
    CreatePartitionsRequest as CtlCreatePartitions, CreatePartitionsTopic,
    CreateTopicsRequest as CtlCreateTopics, DeleteTopicsRequest as CtlDeleteTopics,
};
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

use crate::config::{self, ConfigSource};
use crate::coordinator::group_coordinator::OFFSETS_TOPIC;
use crate::server::Broker;

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
    /// Checks what the broker can check alone before the controller sees a topic:
    /// the name, the partition bound, and names that collide in metric names.
    fn precheck_topic(&self, name: &str, partitions: i32) -> Result<(), TopicError> {
        validate_topic_name(name)?;
        if partitions != -1 && !(1..=MAX_PARTITIONS_PER_TOPIC).contains(&partitions) {
            return Err((
                ErrorCode::INVALID_PARTITIONS,
                format!("number of partitions must be between 1 and {MAX_PARTITIONS_PER_TOPIC}"),
            ));
        }
        let image = self.image();
        if image.topic(name).is_some() {
            return Err((
                ErrorCode::TOPIC_ALREADY_EXISTS,
                format!("topic '{name}' already exists"),
            ));
        }
        // '.' and '_' collide in metric names, so Kafka refuses names that differ only there.
        let canonical = name.replace('.', "_");
        if let Some(other) = image
            .topics_by_name
            .keys()
            .find(|t| t.replace('.', "_") == canonical)
        {
            return Err((
                ErrorCode::INVALID_TOPIC_EXCEPTION,
                format!("topic '{name}' collides with existing topic '{other}'"),
            ));
        }
        Ok(())
    }

    /// Creates topics through the controller; one result per topic, in order.
    pub async fn create_topics(
        &self,
        topics: Vec<CreatableTopic>,
        validate_only: bool,
    ) -> Vec<rill_metadata::CreatableTopicResult> {
        let mut results: Vec<Option<rill_metadata::CreatableTopicResult>> = Vec::new();
        let mut send = Vec::new();
        for t in topics {
            let refused = |(code, message): TopicError| rill_metadata::CreatableTopicResult {
                name: t.name.clone(),
                topic_id: Uuid::default(),
                error_code: code,
                error_message: Some(message),
                num_partitions: -1,
                replication_factor: -1,
            };
            let partitions = if t.assignments.is_empty() {
                t.num_partitions
            } else {
                i32::try_from(t.assignments.len()).unwrap_or(i32::MAX)
            };
            let bad_config = t
                .configs
                .iter()
                .find_map(|(k, v)| {
                    let v = v.as_deref()?;
                    config::validate_topic_config(k, v).err()
                })
                .or_else(|| {
                    let overrides = t
                        .configs
                        .iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.clone()?)))
                        .collect();
                    self.check_remote_log_configs(&self.image(), &overrides, false)
                        .err()
                });
            match (self.precheck_topic(&t.name, partitions), bad_config) {
                (Err(e), _) => results.push(Some(refused(e))),
                (Ok(()), Some(m)) => results.push(Some(refused((ErrorCode::INVALID_CONFIG, m)))),
                (Ok(()), None) => {
                    results.push(None);
                    send.push(t);
                }
            }
        }
        if !send.is_empty() {
            let names: Vec<String> = send.iter().map(|t| t.name.clone()).collect();
            let event = ControllerEvent::CreateTopics(CtlCreateTopics {
                topics: send,
                validate_only,
            });
            let mut answers = match self.controller_call(event).await {
                Ok(ControllerResponse::CreateTopics(r)) => r.into_iter(),
                Ok(_) => Vec::new().into_iter(),
                Err(code) => names
                    .iter()
                    .map(|n| rill_metadata::CreatableTopicResult {
                        name: n.clone(),
                        topic_id: Uuid::default(),
                        error_code: code,
                        error_message: Some(format!("controller: {}", code.name())),
                        num_partitions: -1,
                        replication_factor: -1,
                    })
                    .collect::<Vec<_>>()
                    .into_iter(),
            };
            for slot in results.iter_mut().filter(|r| r.is_none()) {
                *slot = answers.next();
            }
            for (created, name) in results.iter().flatten().zip(names.iter()) {
                if created.error_code == ErrorCode::NONE && !validate_only && &created.name == name
                {
                    tracing::info!(topic = %name, partitions = created.num_partitions, "created topic");
                }
            }
        }
        results
            .into_iter()
            .map(|r| {
                r.unwrap_or(rill_metadata::CreatableTopicResult {
                    name: String::new(),
                    topic_id: Uuid::default(),
                    error_code: ErrorCode::UNKNOWN_SERVER_ERROR,
                    error_message: Some("no answer from the controller".into()),
                    num_partitions: -1,
                    replication_factor: -1,
                })
            })
            .collect()
    }

    pub(crate) async fn handle_create_topics(
        &self,
        request: CreateTopicsRequest,
        version: i16,
    ) -> CreateTopicsResponse {
        let topics: Vec<CreatableTopic> = request
            .topics
            .iter()
            .map(|t| CreatableTopic {
                name: t.name.clone(),
                num_partitions: t.num_partitions,
                replication_factor: t.replication_factor,
                assignments: t.assignments.iter().map(|a| a.broker_ids.clone()).collect(),
                configs: t
                    .configs
                    .iter()
                    .map(|c| (c.name.clone(), c.value.clone()))
                    .collect(),
            })
            .collect();
        let results = self.create_topics(topics, request.validate_only).await;
        let image = self.image();
        let topics = results
            .into_iter()
            .map(|r| {
                let mut result = CreatableTopicResult {
                    name: r.name.clone(),
                    topic_id: r.topic_id,
                    error_code: r.error_code.code(),
                    error_message: r.error_message.clone(),
                    num_partitions: r.num_partitions,
                    replication_factor: r.replication_factor,
                    ..Default::default()
                };
                if r.error_code == ErrorCode::NONE && version >= 5 {
                    result.configs = Some(self.creatable_configs(&image, &r.name));
                }
                result
            })
            .collect();
        CreateTopicsResponse {
            topics,
            ..Default::default()
        }
    }

    fn creatable_configs(
        &self,
        image: &rill_metadata::MetadataImage,
        topic: &str,
    ) -> Vec<CreatableTopicConfigs> {
        let overrides = Broker::topic_overrides(image, topic);
        config::TOPIC_CONFIGS
            .iter()
            .map(|d| {
                let source = if overrides.contains_key(d.name) {
                    ConfigSource::DynamicTopicConfig
                } else if self.config.is_set(d.broker_key) {
                    ConfigSource::StaticBrokerConfig
                } else {
                    ConfigSource::DefaultConfig
                };
                CreatableTopicConfigs {
                    name: d.name.to_string(),
                    value: self.topic_config_value(image, topic, d.name),
                    read_only: false,
                    config_source: source as i8,
                    is_sensitive: false,
                    ..Default::default()
                }
            })
            .collect()
    }

    pub(crate) async fn handle_delete_topics(
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
        let image = self.image();
        let mut responses: Vec<DeletableTopicResult> = Vec::with_capacity(targets.len());
        let mut send = Vec::new();
        for (name, id) in targets {
            let name = name.or_else(|| image.topics.get(&id).map(|t| t.name.clone()));
            let mut result = DeletableTopicResult {
                name: name.clone(),
                topic_id: id,
                ..Default::default()
            };
            match name {
                None => result.error_code = ErrorCode::UNKNOWN_TOPIC_ID.code(),
                // The group coordinator's state lives there; Kafka refuses this too.
                Some(n) if n == OFFSETS_TOPIC => {
                    result.error_code = ErrorCode::INVALID_TOPIC_EXCEPTION.code()
                }
                Some(n) => match image.topic(&n) {
                    None => result.error_code = ErrorCode::UNKNOWN_TOPIC_OR_PARTITION.code(),
                    Some(t) => {
                        result.topic_id = t.id;
                        send.push((responses.len(), n));
                    }
                },
            }
            responses.push(result);
        }
        if !send.is_empty() {
            let names: Vec<String> = send.iter().map(|(_, n)| n.clone()).collect();
            let event = ControllerEvent::DeleteTopics(CtlDeleteTopics { names });
            match self.controller_call(event).await {
                Ok(ControllerResponse::DeleteTopics(answers)) => {
                    for ((i, name), answer) in send.iter().zip(answers) {
                        responses[*i].error_code = answer.error_code.code();
                        if answer.error_code == ErrorCode::NONE {
                            tracing::info!(topic = %name, "deleted topic");
                        }
                    }
                }
                Ok(_) => {}
                Err(code) => {
                    for (i, _) in &send {
                        responses[*i].error_code = code.code();
                    }
                }
            }
        }
        DeleteTopicsResponse {
            responses,
            ..Default::default()
        }
    }

    pub(crate) async fn handle_create_partitions(
        &self,
        request: CreatePartitionsRequest,
    ) -> CreatePartitionsResponse {
        let image = self.image();
        let mut results = Vec::with_capacity(request.topics.len());
        let mut send = Vec::new();
        for t in request.topics {
            let mut result = CreatePartitionsTopicResult {
                name: t.name.clone(),
                ..Default::default()
            };
            let refused = if image.topic(&t.name).is_none() {
                Some((
                    ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
                    format!("topic '{}' does not exist", t.name),
                ))
            } else if t.count > MAX_PARTITIONS_PER_TOPIC {
                Some((
                    ErrorCode::INVALID_PARTITIONS,
                    format!("at most {MAX_PARTITIONS_PER_TOPIC} partitions per topic"),
                ))
            } else {
                None
            };
            match refused {
                Some((code, message)) => {
                    result.error_code = code.code();
                    result.error_message = Some(message);
                }
                None => send.push((
                    results.len(),
                    CreatePartitionsTopic {
                        name: t.name.clone(),
                        count: t.count,
                        assignments: t
                            .assignments
                            .unwrap_or_default()
                            .into_iter()
                            .map(|a| a.broker_ids)
                            .collect(),
                    },
                )),
            }
            results.push(result);
        }
        if !send.is_empty() {
            let (slots, topics): (Vec<usize>, Vec<CreatePartitionsTopic>) =
                send.into_iter().unzip();
            let event = ControllerEvent::CreatePartitions(CtlCreatePartitions {
                topics,
                validate_only: request.validate_only,
            });
            match self.controller_call(event).await {
                Ok(ControllerResponse::CreatePartitions(answers)) => {
                    for (i, answer) in slots.iter().zip(answers) {
                        results[*i].error_code = answer.error_code.code();
                        results[*i].error_message = answer.error_message;
                    }
                }
                Ok(_) => {}
                Err(code) => {
                    for i in &slots {
                        results[*i].error_code = code.code();
                    }
                }
            }
        }
        CreatePartitionsResponse {
            results,
            ..Default::default()
        }
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
