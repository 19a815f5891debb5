//! Configs: DescribeConfigs, AlterConfigs and IncrementalAlterConfigs.
//!
//! Topic configs are overrides kept in the metadata log (`ConfigRecord`s); a described
//! value is the override, else the broker's `log.*` key, else Kafka's default, and its
//! source says which. A change is validated whole here, then sent to the controller as
//! the set/delete operations that turn the old overrides into the new ones; every
//! replica pushes the new values to its live logs as it applies the records.

use std::collections::BTreeMap;

use rill_protocol::generated::alter_configs_request::AlterConfigsRequest;
use rill_protocol::generated::alter_configs_response::{
    AlterConfigsResourceResponse, AlterConfigsResponse,
};
use rill_protocol::generated::describe_configs_request::DescribeConfigsRequest;
use rill_protocol::generated::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResponse, DescribeConfigsResult,
    DescribeConfigsSynonym,
};
use rill_protocol::generated::incremental_alter_configs_request::IncrementalAlterConfigsRequest;
use rill_protocol::generated::incremental_alter_configs_response as inc;
use rill_protocol::ErrorCode;

use crate::config::{self, ConfigSource, BROKER_DEFAULTS, TOPIC_CONFIGS};
use crate::Broker;

use rill_metadata::{
    AlterConfigOp, AlterConfigsResource, ControllerEvent, ControllerResponse,
    IncrementalAlterConfigsRequest as CtlAlterConfigs, RESOURCE_BROKER, RESOURCE_TOPIC,
};

/// IncrementalAlterConfigs operations.
const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

type ConfigError = (ErrorCode, String);

impl Broker {
    pub(crate) fn handle_describe_configs(
        &self,
        request: DescribeConfigsRequest,
        version: i16,
    ) -> DescribeConfigsResponse {
        let results = request
            .resources
            .into_iter()
            .map(|r| {
                let mut result = DescribeConfigsResult {
                    resource_type: r.resource_type,
                    resource_name: r.resource_name.clone(),
                    ..Default::default()
                };
                let wanted = |name: &str| {
                    r.configuration_keys
                        .as_ref()
                        .is_none_or(|keys| keys.iter().any(|k| k == name))
                };
                let described = match r.resource_type {
                    RESOURCE_TOPIC => self.describe_topic_configs(
                        &r.resource_name,
                        request.include_synonyms,
                        request.include_documentation,
                    ),
                    RESOURCE_BROKER => self.describe_broker_configs(&r.resource_name),
                    other => Err((
                        ErrorCode::INVALID_REQUEST,
                        format!("unsupported resource type {other}"),
                    )),
                };
                match described {
                    Ok(configs) => {
                        result.configs = configs.into_iter().filter(|c| wanted(&c.name)).collect();
                        if version == 0 {
                            for c in &mut result.configs {
                                c.synonyms.clear();
                            }
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
        DescribeConfigsResponse {
            results,
            ..Default::default()
        }
    }

    fn describe_topic_configs(
        &self,
        name: &str,
        include_synonyms: bool,
        include_documentation: bool,
    ) -> Result<Vec<DescribeConfigsResourceResult>, ConfigError> {
        let image = self.image();
        if image.topic(name).is_none() {
            return Err((
                ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
                format!("topic '{name}' does not exist"),
            ));
        }
        let overrides = Broker::topic_overrides(&image, name);
        Ok(TOPIC_CONFIGS
            .iter()
            .map(|d| {
                let broker_value = self
                    .config
                    .is_set(d.broker_key)
                    .then(|| self.config.get(d.broker_key))
                    .flatten();
                let (value, source) = if let Some(v) = overrides.get(d.name) {
                    (v.clone(), ConfigSource::DynamicTopicConfig)
                } else if let Some(v) = broker_value {
                    (v.to_string(), ConfigSource::StaticBrokerConfig)
                } else {
                    (d.default.to_string(), ConfigSource::DefaultConfig)
                };
                let mut synonyms = Vec::new();
                if include_synonyms {
                    if let Some(v) = overrides.get(d.name) {
                        synonyms.push(synonym(d.name, v, ConfigSource::DynamicTopicConfig));
                    }
                    if let Some(v) = broker_value {
                        synonyms.push(synonym(d.broker_key, v, ConfigSource::StaticBrokerConfig));
                    }
                    synonyms.push(synonym(
                        d.broker_key,
                        d.default,
                        ConfigSource::DefaultConfig,
                    ));
                }
                DescribeConfigsResourceResult {
                    name: d.name.to_string(),
                    value: Some(value),
                    read_only: false,
                    is_default: source == ConfigSource::DefaultConfig,
                    config_source: source as i8,
                    is_sensitive: false,
                    synonyms,
                    config_type: d.config_type as i8,
                    documentation: include_documentation.then(|| d.doc.to_string()),
                    ..Default::default()
                }
            })
            .collect())
    }

    fn describe_broker_configs(
        &self,
        name: &str,
    ) -> Result<Vec<DescribeConfigsResourceResult>, ConfigError> {
        if !name.is_empty() && name != self.node_id.to_string() {
            return Err((ErrorCode::INVALID_REQUEST, format!("unknown broker {name}")));
        }
        let mut keys: BTreeMap<&str, ()> = BTreeMap::new();
        for (k, _) in BROKER_DEFAULTS {
            keys.insert(k, ());
        }
        for d in TOPIC_CONFIGS {
            keys.insert(d.broker_key, ());
        }
        for (k, _) in self.config.explicit() {
            keys.insert(k, ());
        }
        Ok(keys
            .into_keys()
            .map(|k| {
                let set = self.config.is_set(k);
                let source = if set {
                    ConfigSource::StaticBrokerConfig
                } else {
                    ConfigSource::DefaultConfig
                };
                DescribeConfigsResourceResult {
                    name: k.to_string(),
                    value: self.config.get(k).map(str::to_string),
                    read_only: true,
                    is_default: !set,
                    config_source: source as i8,
                    ..Default::default()
                }
            })
            .collect())
    }

    /// Replaces a topic's overrides after validating all of them.
    async fn set_topic_configs(
        &self,
        name: &str,
        change: impl FnOnce(&mut BTreeMap<String, String>) -> Result<(), ConfigError>,
        validate_only: bool,
    ) -> Result<(), ConfigError> {
        let image = self.image();
        if image.topic(name).is_none() {
            return Err((
                ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
                format!("topic '{name}' does not exist"),
            ));
        }
        let old = Broker::topic_overrides(&image, name);
        let mut new = old.clone();
        change(&mut new)?;
        for (k, v) in &new {
            config::validate_topic_config(k, v).map_err(|m| (ErrorCode::INVALID_CONFIG, m))?;
        }
        let mut ops: Vec<(String, AlterConfigOp, Option<String>)> = new
            .iter()
            .filter(|(k, v)| old.get(*k) != Some(*v))
            .map(|(k, v)| (k.clone(), AlterConfigOp::Set, Some(v.clone())))
            .collect();
        ops.extend(
            old.keys()
                .filter(|k| !new.contains_key(*k))
                .map(|k| (k.clone(), AlterConfigOp::Delete, None)),
        );
        if validate_only || ops.is_empty() {
            return Ok(());
        }
        let event = ControllerEvent::IncrementalAlterConfigs(CtlAlterConfigs {
            resources: vec![AlterConfigsResource {
                resource_type: RESOURCE_TOPIC,
                resource_name: name.to_string(),
                configs: ops,
            }],
            validate_only: false,
        });
        match self.controller_call(event).await {
            Ok(ControllerResponse::IncrementalAlterConfigs(results)) => match results.first() {
                Some(r) if r.error_code != ErrorCode::NONE => {
                    Err((r.error_code, r.error_message.clone().unwrap_or_default()))
                }
                _ => Ok(()),
            },
            Ok(_) => Ok(()),
            Err(code) => Err((code, format!("controller: {}", code.name()))),
        }
    }

    /// Applies a change to one resource's configs and returns the response's error fields.
    async fn alter_resource(
        &self,
        resource_type: i8,
        name: &str,
        change: impl FnOnce(&mut BTreeMap<String, String>) -> Result<(), ConfigError>,
        validate_only: bool,
    ) -> (i16, Option<String>) {
        let outcome = match resource_type {
            RESOURCE_TOPIC => self.set_topic_configs(name, change, validate_only).await,
            _ => Err((
                ErrorCode::INVALID_REQUEST,
                "only topic configs can be altered".into(),
            )),
        };
        match outcome {
            Ok(()) => (0, None),
            Err((code, m)) => (code.code(), Some(m)),
        }
    }

    pub(crate) async fn handle_alter_configs(
        &self,
        request: AlterConfigsRequest,
    ) -> AlterConfigsResponse {
        let validate_only = request.validate_only;
        let mut responses = Vec::with_capacity(request.resources.len());
        for r in request.resources {
            let change = |configs: &mut BTreeMap<String, String>| {
                // AlterConfigs replaces the whole set of overrides.
                configs.clear();
                for c in &r.configs {
                    if let Some(v) = &c.value {
                        configs.insert(c.name.clone(), v.clone());
                    }
                }
                Ok(())
            };
            let (error_code, error_message) = self
                .alter_resource(r.resource_type, &r.resource_name, change, validate_only)
                .await;
            responses.push(AlterConfigsResourceResponse {
                error_code,
                error_message,
                resource_type: r.resource_type,
                resource_name: r.resource_name.clone(),
                ..Default::default()
            });
        }
        AlterConfigsResponse {
            responses,
            ..Default::default()
        }
    }

    pub(crate) async fn handle_incremental_alter_configs(
        &self,
        request: IncrementalAlterConfigsRequest,
    ) -> inc::IncrementalAlterConfigsResponse {
        let validate_only = request.validate_only;
        let mut responses = Vec::with_capacity(request.resources.len());
        for r in request.resources {
            let change = |configs: &mut BTreeMap<String, String>| {
                for c in &r.configs {
                    let value = c.value.as_deref();
                    apply_incremental(configs, &c.name, c.config_operation, value)?;
                }
                Ok(())
            };
            let (error_code, error_message) = self
                .alter_resource(r.resource_type, &r.resource_name, change, validate_only)
                .await;
            responses.push(inc::AlterConfigsResourceResponse {
                error_code,
                error_message,
                resource_type: r.resource_type,
                resource_name: r.resource_name.clone(),
                ..Default::default()
            });
        }
        inc::IncrementalAlterConfigsResponse {
            responses,
            ..Default::default()
        }
    }
}

fn synonym(name: &str, value: &str, source: ConfigSource) -> DescribeConfigsSynonym {
    DescribeConfigsSynonym {
        name: name.to_string(),
        value: Some(value.to_string()),
        source: source as i8,
        ..Default::default()
    }
}

/// One IncrementalAlterConfigs operation on a topic's overrides.
fn apply_incremental(
    configs: &mut BTreeMap<String, String>,
    name: &str,
    op: i8,
    value: Option<&str>,
) -> Result<(), ConfigError> {
    let def = config::topic_config_def(name).ok_or_else(|| {
        (
            ErrorCode::INVALID_CONFIG,
            format!("unknown topic config name: {name}"),
        )
    })?;
    let is_list = def.config_type == config::ConfigType::List;
    match op {
        OP_SET => {
            let v = value
                .ok_or_else(|| (ErrorCode::INVALID_REQUEST, format!("null value for {name}")))?;
            configs.insert(name.to_string(), v.to_string());
        }
        OP_DELETE => {
            configs.remove(name);
        }
        OP_APPEND | OP_SUBTRACT if is_list => {
            let v = value.unwrap_or_default();
            let current = configs
                .get(name)
                .cloned()
                .unwrap_or_else(|| def.default.to_string());
            let mut items: Vec<String> = current
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                if op == OP_APPEND {
                    if !items.iter().any(|i| i == item) {
                        items.push(item.to_string());
                    }
                } else {
                    items.retain(|i| i != item);
                }
            }
            configs.insert(name.to_string(), items.join(","));
        }
        OP_APPEND | OP_SUBTRACT => {
            return Err((
                ErrorCode::INVALID_CONFIG,
                format!("{name} is not a list config"),
            ));
        }
        other => {
            return Err((
                ErrorCode::INVALID_REQUEST,
                format!("unknown config operation {other}"),
            ))
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incremental_operations() {
        let mut c = BTreeMap::new();
        apply_incremental(&mut c, "retention.ms", OP_SET, Some("1000")).unwrap();
        assert_eq!(c["retention.ms"], "1000");
        apply_incremental(&mut c, "cleanup.policy", OP_APPEND, Some("compact")).unwrap();
        assert_eq!(c["cleanup.policy"], "delete,compact");
        apply_incremental(&mut c, "cleanup.policy", OP_SUBTRACT, Some("delete")).unwrap();
        assert_eq!(c["cleanup.policy"], "compact");
        apply_incremental(&mut c, "retention.ms", OP_DELETE, None).unwrap();
        assert!(!c.contains_key("retention.ms"));
        assert!(apply_incremental(&mut c, "retention.ms", OP_APPEND, Some("1")).is_err());
        assert!(apply_incremental(&mut c, "nope", OP_SET, Some("1")).is_err());
    }
}
