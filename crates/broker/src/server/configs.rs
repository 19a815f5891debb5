//! Configs: DescribeConfigs, AlterConfigs and IncrementalAlterConfigs.
//!
//! Topic configs are overrides kept in the metadata log (`ConfigRecord`s on the TOPIC
//! resource). Dynamic broker configs are kept there too, on the BROKER resource: named by
//! a broker id for that broker alone, or `""` for the cluster-wide default. A value is
//! resolved as in Kafka, highest first: topic override (for a topic config), this
//! broker's dynamic value, the cluster-wide dynamic default, the static file, the
//! built-in default; DescribeConfigs reports the level as `config_source` and lists the
//! lower levels as synonyms.
//!
//! A change is validated whole here, then sent to the controller as the set/delete
//! operations that turn the old entries into the new ones; every replica pushes the new
//! values to its live logs as it applies the records
//! ([`Broker::topics_affected_by_broker_config_change`] names the topic logs a broker
//! change reaches).

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

use crate::config::{self, BrokerConfig, ConfigSource, ConfigType, BROKER_DEFAULTS, TOPIC_CONFIGS};
use crate::server::Broker;
use crate::server::{client_metrics, group_configs};

use rill_metadata::{
    AlterConfigOp, AlterConfigsResource, ControllerEvent, ControllerResponse,
    IncrementalAlterConfigsRequest as CtlAlterConfigs, MetadataImage, RESOURCE_BROKER,
    RESOURCE_CLIENT_METRICS, RESOURCE_GROUP, RESOURCE_TOPIC,
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
                // Null or empty: every config (Kafka's `ConfigHelper`; sarama sends an
                // empty list for "all").
                let wanted = |name: &str| {
                    r.configuration_keys
                        .as_ref()
                        .is_none_or(|keys| keys.is_empty() || keys.iter().any(|k| k == name))
                };
                let described = match r.resource_type {
                    RESOURCE_TOPIC => self.describe_topic_configs(
                        &r.resource_name,
                        request.include_synonyms,
                        request.include_documentation,
                    ),
                    RESOURCE_BROKER => self.describe_broker_configs(
                        &r.resource_name,
                        request.include_synonyms,
                        request.include_documentation,
                    ),
                    RESOURCE_GROUP => self.describe_group_configs(
                        &r.resource_name,
                        request.include_synonyms,
                        request.include_documentation,
                    ),
                    RESOURCE_CLIENT_METRICS => {
                        client_metrics::describe(&self.image(), &r.resource_name)
                    }
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
        Ok(describe_topic(
            &self.config,
            &image,
            self.node_id,
            name,
            include_synonyms,
            include_documentation,
        ))
    }

    /// DescribeConfigs of a GROUP resource: every group config at its effective level
    /// (Kafka's `ConfigHelper`; the group need not exist).
    fn describe_group_configs(
        &self,
        name: &str,
        include_synonyms: bool,
        include_documentation: bool,
    ) -> Result<Vec<DescribeConfigsResourceResult>, ConfigError> {
        if name.is_empty() {
            return Err((
                ErrorCode::INVALID_REQUEST,
                "Group name must not be empty".to_string(),
            ));
        }
        let image = self.image();
        let overrides = image.configs.get(&(RESOURCE_GROUP, name.to_string()));
        Ok(group_configs::GROUP_CONFIGS
            .iter()
            .map(|d| {
                let levels =
                    group_configs::levels(d, &self.config, &image, self.node_id, overrides);
                let entry = Entry {
                    name: d.name,
                    default: d.default,
                    config_type: d.config_type,
                    doc: d.doc,
                };
                entry.describe(&levels, include_synonyms, include_documentation)
            })
            .collect())
    }

    /// Replaces a group's or a client metrics subscription's configs after validating
    /// all of them (`validate`); for a subscription, deleting every entry deletes it.
    async fn set_validated_configs(
        &self,
        resource_type: i8,
        name: &str,
        change: impl FnOnce(&mut BTreeMap<String, String>) -> Result<(), ConfigError>,
        validate: impl FnOnce(&BTreeMap<String, String>, &MetadataImage) -> Result<(), ConfigError>,
        validate_only: bool,
    ) -> Result<(), ConfigError> {
        let image = self.image();
        let old = image
            .configs
            .get(&(resource_type, name.to_string()))
            .cloned()
            .unwrap_or_default();
        let mut new = old.clone();
        change(&mut new)?;
        validate(&new, &image)?;
        let ops = diff_ops(&old, &new);
        if validate_only || ops.is_empty() {
            return Ok(());
        }
        self.submit_config_ops(resource_type, name, ops).await
    }

    fn describe_broker_configs(
        &self,
        name: &str,
        include_synonyms: bool,
        include_documentation: bool,
    ) -> Result<Vec<DescribeConfigsResourceResult>, ConfigError> {
        let image = self.image();
        if name.is_empty() {
            return Ok(describe_cluster_default(&image, include_documentation));
        }
        if name != self.node_id.to_string() {
            return Err((
                ErrorCode::INVALID_REQUEST,
                format!(
                    "unexpected broker id, expected {} or empty string, but received {name}",
                    self.node_id
                ),
            ));
        }
        Ok(describe_broker(
            &self.config,
            &image,
            self.node_id,
            include_synonyms,
            include_documentation,
        ))
    }

    /// The topic logs on this broker whose settings differ between two images because a
    /// dynamic broker config (this broker's or the cluster-wide default) changed; topics
    /// that override every changed key are not among them. The metadata publisher calls
    /// this after applying a batch of records and reconfigures those logs, as it does for
    /// topics whose own overrides changed.
    pub fn topics_affected_by_broker_config_change(
        &self,
        old: &MetadataImage,
        new: &MetadataImage,
    ) -> Vec<String> {
        topics_affected_by_broker_config_change(&self.config, self.node_id, old, new)
    }

    /// Replaces a BROKER resource's dynamic configs after validating all of them.
    async fn set_broker_configs(
        &self,
        name: &str,
        change: impl FnOnce(&mut BTreeMap<String, String>) -> Result<(), ConfigError>,
        validate_only: bool,
    ) -> Result<(), ConfigError> {
        if !name.is_empty() && name.parse::<i32>().is_err() {
            return Err((
                ErrorCode::INVALID_REQUEST,
                format!("broker resource name {name:?} is not a broker id"),
            ));
        }
        let image = self.image();
        let key = (RESOURCE_BROKER, name.to_string());
        let old = image.configs.get(&key).cloned().unwrap_or_default();
        let mut new = old.clone();
        change(&mut new)?;
        let ops = diff_ops(&old, &new);
        validate_broker_change(&self.config, &image, self.node_id, &key, &new, &ops)?;
        if validate_only || ops.is_empty() {
            return Ok(());
        }
        self.submit_config_ops(RESOURCE_BROKER, name, ops).await
    }

    async fn submit_config_ops(
        &self,
        resource_type: i8,
        name: &str,
        ops: Vec<(String, AlterConfigOp, Option<String>)>,
    ) -> Result<(), ConfigError> {
        let event = ControllerEvent::IncrementalAlterConfigs(CtlAlterConfigs {
            resources: vec![AlterConfigsResource {
                resource_type,
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
        let was_enabled = old
            .get("remote.storage.enable")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        self.check_remote_log_configs(&image, &new, was_enabled)
            .map_err(|m| (ErrorCode::INVALID_CONFIG, m))?;
        let ops = diff_ops(&old, &new);
        if validate_only || ops.is_empty() {
            return Ok(());
        }
        self.submit_config_ops(RESOURCE_TOPIC, name, ops).await
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
            RESOURCE_BROKER => self.set_broker_configs(name, change, validate_only).await,
            RESOURCE_GROUP if name.is_empty() => Err((
                ErrorCode::INVALID_REQUEST,
                "Group name must not be empty".to_string(),
            )),
            RESOURCE_GROUP => {
                let validate = |new: &BTreeMap<String, String>, image: &MetadataImage| {
                    group_configs::validate(new, &self.config, image, self.node_id)
                };
                self.set_validated_configs(RESOURCE_GROUP, name, change, validate, validate_only)
                    .await
            }
            RESOURCE_CLIENT_METRICS => {
                let validate = |new: &BTreeMap<String, String>, _: &MetadataImage| {
                    client_metrics::validate(name, new)
                };
                self.set_validated_configs(
                    RESOURCE_CLIENT_METRICS,
                    name,
                    change,
                    validate,
                    validate_only,
                )
                .await
            }
            other => Err((
                ErrorCode::INVALID_REQUEST,
                format!("configs of resource type {other} cannot be altered"),
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
            let resource_type = r.resource_type;
            let change = |configs: &mut BTreeMap<String, String>| {
                for c in &r.configs {
                    let value = c.value.as_deref();
                    apply_incremental(resource_type, configs, &c.name, c.config_operation, value)?;
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

/// The set/delete operations that turn `old` entries into `new` ones.
fn diff_ops(
    old: &BTreeMap<String, String>,
    new: &BTreeMap<String, String>,
) -> Vec<(String, AlterConfigOp, Option<String>)> {
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
    ops
}

/// Kafka's checks of a dynamic broker config change: no key set may be one of the broker
/// keys that are not dynamic ("Cannot update these configs dynamically"; a key no broker
/// knows is taken and kept, as Kafka keeps those for its plug-ins); every value must be
/// of the right type and bounds, and fit the value it replaces (thread pools grow to
/// double at most); and the logs of this broker must accept the result, which catches
/// values a log would refuse (a `log.segment.bytes` below a batch header) before they
/// reach the metadata log rather than when every broker applies them. Kafka 4.1 answers
/// all of these with INVALID_REQUEST on a BROKER resource, the cluster-wide default
/// included (INVALID_CONFIG is for topics).
fn validate_broker_change(
    static_config: &BrokerConfig,
    image: &MetadataImage,
    node_id: i32,
    key: &(i8, String),
    new: &BTreeMap<String, String>,
    ops: &[(String, AlterConfigOp, Option<String>)],
) -> Result<(), ConfigError> {
    let not_dynamic: Vec<&str> = ops
        .iter()
        .filter(|(k, op, _)| *op == AlterConfigOp::Set && !is_settable_broker_key(k))
        .map(|(k, _, _)| k.as_str())
        .collect();
    if !not_dynamic.is_empty() {
        return Err((
            ErrorCode::INVALID_REQUEST,
            format!(
                "Cannot update these configs dynamically: {}",
                not_dynamic.join(", ")
            ),
        ));
    }
    // The TLS keys of a listener: per broker only, as in Kafka, and only if what they
    // name loads. A broker checks its own (the files are on its disk).
    let tls_listeners: std::collections::BTreeSet<&str> = ops
        .iter()
        .filter_map(|(k, _, _)| config::listener_tls_key(k).map(|(l, _)| l))
        .collect();
    if !tls_listeners.is_empty() && key.1.is_empty() {
        let keys: Vec<&str> = ops
            .iter()
            .filter(|(k, _, _)| config::listener_tls_key(k).is_some())
            .map(|(k, _, _)| k.as_str())
            .collect();
        return Err((
            ErrorCode::INVALID_REQUEST,
            format!(
                "Cannot update these configs at default cluster level, broker id must be \
                 specified: {}",
                keys.join(", ")
            ),
        ));
    }
    if key.1 == node_id.to_string() {
        let listeners = static_config.client_listeners().unwrap_or_default();
        for l in tls_listeners {
            let Some(listener) = listeners
                .iter()
                .find(|x| x.name.eq_ignore_ascii_case(l) && x.protocol.uses_tls())
            else {
                continue;
            };
            crate::network::security::check_tls_change(static_config, &listener.name, |k| {
                new.get(k).cloned()
            })
            .map_err(|e| (ErrorCode::INVALID_REQUEST, e.to_string()))?;
        }
    }
    for (k, op, v) in ops {
        if let (AlterConfigOp::Set, Some(v), true) = (op, v, config::is_dynamic_broker_config(k)) {
            let current = config::broker_config_value(static_config, image, node_id, k);
            config::validate_broker_change_of(k, v, current.as_ref().map(|(c, _)| c.as_str()))
                .map_err(|m| (ErrorCode::INVALID_REQUEST, m))?;
        }
    }
    let mut candidate = image.clone();
    if new.is_empty() {
        candidate.configs.remove(key);
    } else {
        candidate.configs.insert(key.clone(), new.clone());
    }
    // A topic with no overrides stands for every topic that inherits the changed keys.
    config::log_config(static_config, &candidate, node_id, "")
        .validate()
        .map_err(|e| (ErrorCode::INVALID_REQUEST, e.to_string()))
}

/// Whether a BROKER resource may be given `key`: a dynamic key, or one no broker knows
/// (Kafka stores those for plug-ins to read; Rill reads none of them).
fn is_settable_broker_key(key: &str) -> bool {
    config::is_dynamic_broker_config(key) || !config::is_known_broker_key(key)
}

/// See [`Broker::topics_affected_by_broker_config_change`].
pub fn topics_affected_by_broker_config_change(
    static_config: &BrokerConfig,
    node_id: i32,
    old: &MetadataImage,
    new: &MetadataImage,
) -> Vec<String> {
    let resources = [
        (RESOURCE_BROKER, String::new()),
        (RESOURCE_BROKER, node_id.to_string()),
    ];
    if resources
        .iter()
        .all(|r| old.configs.get(r) == new.configs.get(r))
    {
        return Vec::new();
    }
    new.topics_by_name
        .keys()
        .filter(|t| old.topics_by_name.contains_key(*t))
        .filter(|t| {
            config::log_config(static_config, old, node_id, t)
                != config::log_config(static_config, new, node_id, t)
        })
        .cloned()
        .collect()
}

/// DescribeConfigs of a topic: every topic config at its effective level.
fn describe_topic(
    static_config: &BrokerConfig,
    image: &MetadataImage,
    node_id: i32,
    topic: &str,
    include_synonyms: bool,
    include_documentation: bool,
) -> Vec<DescribeConfigsResourceResult> {
    TOPIC_CONFIGS
        .iter()
        .map(|d| {
            let mut levels: Vec<(String, String, ConfigSource)> = Vec::new();
            if let Some(v) = image.topic_config(topic, d.name) {
                levels.push((
                    d.name.to_string(),
                    v.to_string(),
                    ConfigSource::DynamicTopicConfig,
                ));
            }
            for (v, source) in
                config::broker_config_synonyms(static_config, image, node_id, d.broker_key)
            {
                levels.push((d.broker_key.to_string(), v, source));
            }
            let entry = Entry {
                name: d.name,
                default: d.default,
                config_type: d.config_type,
                doc: d.doc,
            };
            entry.describe(&levels, include_synonyms, include_documentation)
        })
        .collect()
}

/// DescribeConfigs of BROKER `""`: the cluster-wide dynamic defaults alone, as Kafka
/// answers it.
fn describe_cluster_default(
    image: &MetadataImage,
    include_documentation: bool,
) -> Vec<DescribeConfigsResourceResult> {
    image
        .configs
        .get(&(RESOURCE_BROKER, String::new()))
        .into_iter()
        .flatten()
        .filter(|(k, _)| config::is_dynamic_broker_config(k))
        .map(|(k, v)| {
            let def = config::topic_config_for_broker_key(k);
            DescribeConfigsResourceResult {
                name: k.clone(),
                value: Some(v.clone()),
                read_only: false,
                is_default: false,
                config_source: ConfigSource::DynamicDefaultBrokerConfig as i8,
                synonyms: vec![synonym(k, v, ConfigSource::DynamicDefaultBrokerConfig)],
                config_type: def.map_or(broker_only_type(k), |d| d.config_type) as i8,
                documentation: include_documentation
                    .then(|| def.map(|d| d.doc.to_string()))
                    .flatten(),
                ..Default::default()
            }
        })
        .collect()
}

/// The type of a broker key that is no topic's default: the dynamic connection limits
/// are ints; the rest are described as strings.
fn broker_only_type(key: &str) -> ConfigType {
    config::dynamic_broker_key(key).map_or(ConfigType::String, |d| d.config_type)
}

/// DescribeConfigs of this broker: every key it knows, at its effective level;
/// `read_only` unless the key can be changed dynamically.
fn describe_broker(
    static_config: &BrokerConfig,
    image: &MetadataImage,
    node_id: i32,
    include_synonyms: bool,
    include_documentation: bool,
) -> Vec<DescribeConfigsResourceResult> {
    let mut keys: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
    keys.extend(BROKER_DEFAULTS.iter().map(|(k, _)| *k));
    // A topic config that no broker key supplies a default for is not a broker config
    // (it had been described as one with an empty name; sarama's admin test caught it).
    keys.extend(
        TOPIC_CONFIGS
            .iter()
            .map(|d| d.broker_key)
            .filter(|k| *k != config::NO_BROKER_KEY),
    );
    keys.extend(config::DYNAMIC_BROKER_KEYS.iter().map(|d| d.name));
    keys.extend(static_config.explicit().map(|(k, _)| k));
    keys.into_iter()
        .map(|k| {
            let levels = config::broker_config_synonyms(static_config, image, node_id, k);
            let (value, source) = levels
                .first()
                .map_or((None, ConfigSource::DefaultConfig), |(v, s)| {
                    (Some(v.clone()), *s)
                });
            let def = config::topic_config_for_broker_key(k);
            // A secret is described without its value, at every level (Kafka's PASSWORD
            // configs): a JAAS config holds users' passwords, a key password the key.
            let sensitive = config::is_sensitive_broker_key(k);
            let hide = |v: Option<String>| if sensitive { None } else { v };
            DescribeConfigsResourceResult {
                name: k.to_string(),
                value: hide(value),
                read_only: !config::is_dynamic_broker_config(k),
                is_default: source == ConfigSource::DefaultConfig,
                config_source: source as i8,
                is_sensitive: sensitive,
                synonyms: if include_synonyms {
                    levels
                        .iter()
                        .map(|(v, s)| DescribeConfigsSynonym {
                            value: hide(Some(v.clone())),
                            ..synonym(k, v, *s)
                        })
                        .collect()
                } else {
                    Vec::new()
                },
                config_type: if sensitive {
                    ConfigType::Password
                } else {
                    def.map_or(broker_only_type(k), |d| d.config_type)
                } as i8,
                documentation: include_documentation
                    .then(|| def.map(|d| d.doc.to_string()))
                    .flatten(),
                ..Default::default()
            }
        })
        .collect()
}

/// A topic or group config as DescribeConfigs lists it.
struct Entry {
    name: &'static str,
    default: &'static str,
    config_type: ConfigType,
    doc: &'static str,
}

impl Entry {
    /// The entry at its most specific level of `levels` ((synonym name, value, source),
    /// most specific first), or at its default when none applies.
    fn describe(
        &self,
        levels: &[(String, String, ConfigSource)],
        include_synonyms: bool,
        include_documentation: bool,
    ) -> DescribeConfigsResourceResult {
        let (value, source) = levels.first().map_or(
            (self.default.to_string(), ConfigSource::DefaultConfig),
            |(_, v, s)| (v.clone(), *s),
        );
        DescribeConfigsResourceResult {
            name: self.name.to_string(),
            value: Some(value),
            read_only: false,
            is_default: source == ConfigSource::DefaultConfig,
            config_source: source as i8,
            is_sensitive: false,
            synonyms: if include_synonyms {
                levels.iter().map(|(n, v, s)| synonym(n, v, *s)).collect()
            } else {
                Vec::new()
            },
            config_type: self.config_type as i8,
            documentation: include_documentation.then(|| self.doc.to_string()),
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

/// One IncrementalAlterConfigs operation on a resource's entries (a topic's overrides,
/// or a BROKER resource's dynamic configs, named by their broker keys).
fn apply_incremental(
    resource_type: i8,
    configs: &mut BTreeMap<String, String>,
    name: &str,
    op: i8,
    value: Option<&str>,
) -> Result<(), ConfigError> {
    let (is_list, default) = if resource_type == RESOURCE_BROKER {
        if let Some(d) = config::dynamic_broker_key(name) {
            let default = BROKER_DEFAULTS
                .iter()
                .find(|(k, _)| *k == name)
                .map_or("", |(_, v)| *v);
            (d.config_type == config::ConfigType::List, default)
        } else if let Some(d) = config::topic_config_for_broker_key(name) {
            (d.config_type == config::ConfigType::List, d.default)
        } else if !is_settable_broker_key(name) {
            return Err((
                ErrorCode::INVALID_REQUEST,
                format!("Cannot update these configs dynamically: {name}"),
            ));
        } else {
            (false, "")
        }
    } else if resource_type == RESOURCE_GROUP {
        // No group config is a list.
        let def = group_configs::GROUP_CONFIGS
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| {
                (
                    ErrorCode::INVALID_CONFIG,
                    format!("Unknown group config name: {name}"),
                )
            })?;
        (false, def.default)
    } else if resource_type == RESOURCE_CLIENT_METRICS {
        let is_list = client_metrics::is_list(name).ok_or_else(|| {
            (
                ErrorCode::INVALID_REQUEST,
                format!("Unknown client metrics configuration: {name}"),
            )
        })?;
        (is_list, "")
    } else {
        let def = config::topic_config_def(name).ok_or_else(|| {
            (
                ErrorCode::INVALID_CONFIG,
                format!("Unknown topic config name: {name}"),
            )
        })?;
        (def.config_type == config::ConfigType::List, def.default)
    };
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
                .unwrap_or_else(|| default.to_string());
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
        apply_incremental(RESOURCE_TOPIC, &mut c, "retention.ms", OP_SET, Some("1000")).unwrap();
        assert_eq!(c["retention.ms"], "1000");
        apply_incremental(
            RESOURCE_TOPIC,
            &mut c,
            "cleanup.policy",
            OP_APPEND,
            Some("compact"),
        )
        .unwrap();
        assert_eq!(c["cleanup.policy"], "delete,compact");
        apply_incremental(
            RESOURCE_TOPIC,
            &mut c,
            "cleanup.policy",
            OP_SUBTRACT,
            Some("delete"),
        )
        .unwrap();
        assert_eq!(c["cleanup.policy"], "compact");
        apply_incremental(RESOURCE_TOPIC, &mut c, "retention.ms", OP_DELETE, None).unwrap();
        assert!(!c.contains_key("retention.ms"));
        assert!(
            apply_incremental(RESOURCE_TOPIC, &mut c, "retention.ms", OP_APPEND, Some("1"))
                .is_err()
        );
        assert!(apply_incremental(RESOURCE_TOPIC, &mut c, "nope", OP_SET, Some("1")).is_err());
    }

    fn topic_image(names: &[&str]) -> MetadataImage {
        let mut image = MetadataImage::default();
        for (i, n) in names.iter().enumerate() {
            image.topics_by_name.insert(
                n.to_string(),
                rill_protocol::Uuid::from_u64_pair(1, i as u64),
            );
        }
        image
    }

    fn set(image: &mut MetadataImage, resource: (i8, &str), k: &str, v: &str) {
        image
            .configs
            .entry((resource.0, resource.1.to_string()))
            .or_default()
            .insert(k.to_string(), v.to_string());
    }

    #[test]
    fn a_broker_change_reaches_the_topics_that_inherit_it() {
        let static_config = BrokerConfig::default();
        let mut old = topic_image(&["a", "b", "c"]);
        set(&mut old, (RESOURCE_TOPIC, "b"), "retention.ms", "5");
        let mut new = old.clone();
        assert!(topics_affected_by_broker_config_change(&static_config, 1, &old, &new).is_empty());
        set(&mut new, (RESOURCE_BROKER, ""), "log.retention.ms", "1000");
        // `b` overrides the key, so its log is unchanged.
        assert_eq!(
            topics_affected_by_broker_config_change(&static_config, 1, &old, &new),
            ["a", "c"]
        );
        // Another broker's dynamic config does not concern this one.
        let mut other = old.clone();
        set(
            &mut other,
            (RESOURCE_BROKER, "2"),
            "log.retention.ms",
            "1000",
        );
        assert!(
            topics_affected_by_broker_config_change(&static_config, 1, &old, &other).is_empty()
        );
        // A per-broker value over an equal cluster default changes nothing either.
        let mut same = new.clone();
        set(
            &mut same,
            (RESOURCE_BROKER, "1"),
            "log.retention.ms",
            "1000",
        );
        assert!(topics_affected_by_broker_config_change(&static_config, 1, &new, &same).is_empty());
    }

    #[test]
    fn broker_changes_are_validated_like_kafka() {
        let static_config = BrokerConfig::default();
        let image = MetadataImage::default();
        let key = (RESOURCE_BROKER, String::new());
        let check = |k: &str, v: &str| {
            let new = BTreeMap::from([(k.to_string(), v.to_string())]);
            let ops = diff_ops(&BTreeMap::new(), &new);
            validate_broker_change(&static_config, &image, 1, &key, &new, &ops)
        };
        check("log.retention.ms", "1000").unwrap();
        check("compression.type", "zstd").unwrap();
        // Kafka 4.1 answers INVALID_REQUEST for every refusal on a BROKER resource, the
        // cluster-wide default included (its ConfigAdminManager's checks).
        let (code, m) = check("log.dirs", "/x").unwrap_err();
        assert_eq!(code, ErrorCode::INVALID_REQUEST);
        assert!(
            m.starts_with("Cannot update these configs dynamically"),
            "{m}"
        );
        assert_eq!(
            check("log.retention.ms", "x").unwrap_err().0,
            ErrorCode::INVALID_REQUEST
        );
        // A value the logs would refuse is refused before it reaches the metadata log.
        assert_eq!(
            check("log.segment.bytes", "10").unwrap_err().0,
            ErrorCode::INVALID_REQUEST
        );
        // A key no broker knows is kept, as Kafka keeps them for its plug-ins.
        check("custom.plugin.setting", "1").unwrap();
        // Thread pools Rill does not have take Kafka's checks against the current value
        // (Kafka's default of 8 I/O threads here): at least 1, half to double.
        check("num.io.threads", "16").unwrap();
        check("num.io.threads", "4").unwrap();
        let (code, m) = check("num.io.threads", "17").unwrap_err();
        assert_eq!(code, ErrorCode::INVALID_REQUEST);
        assert!(
            m.contains("should not be greater than double the current value 8"),
            "{m}"
        );
        let (_, m) = check("num.io.threads", "3").unwrap_err();
        assert!(
            m.contains("should be at least half the current value 8"),
            "{m}"
        );
        let (_, m) = check("num.io.threads", "0").unwrap_err();
        assert_eq!(
            m,
            "Invalid value 0 for configuration num.io.threads: Value must be at least 1"
        );
        let (_, m) = check("background.threads", "x").unwrap_err();
        assert!(m.ends_with("Not a number of type INT"), "{m}");
        let (_, m) = check("log.cleaner.threads", "3").unwrap_err();
        assert!(m.contains("more than double the current value 1"), "{m}");
        check("log.cleaner.threads", "2").unwrap();
        check("log.cleaner.backoff.ms", "100").unwrap();
        assert!(check("log.cleaner.backoff.ms", "-1").is_err());
        check("sasl.kerberos.min.time.before.relogin", "30000").unwrap();
        let (_, m) = check("sasl.kerberos.ticket.renew.jitter", "often").unwrap_err();
        assert!(m.ends_with("Not a number of type DOUBLE"), "{m}");
        check(
            "max.connections.per.ip.overrides",
            "127.0.0.1:5, localhost:3",
        )
        .unwrap();
        for bad in ["bad", "127.0.0.1:x", ":3"] {
            assert!(
                check("max.connections.per.ip.overrides", bad).is_err(),
                "{bad}"
            );
        }
        // The current value is this broker's: a static 2 bounds a change to 1..=4.
        let mut two = BrokerConfig::default();
        two.set("num.network.threads", "2");
        let ops = |v: &str| {
            let new = BTreeMap::from([("num.network.threads".to_string(), v.to_string())]);
            (diff_ops(&BTreeMap::new(), &new), new)
        };
        let (o, n) = ops("4");
        validate_broker_change(&two, &image, 1, &key, &n, &o).unwrap();
        let (o, n) = ops("5");
        assert!(validate_broker_change(&two, &image, 1, &key, &n, &o).is_err());
        // Broker list keys take APPEND/SUBTRACT under their broker names.
        let mut c = BTreeMap::new();
        apply_incremental(
            RESOURCE_BROKER,
            &mut c,
            "log.cleanup.policy",
            OP_APPEND,
            Some("compact"),
        )
        .unwrap();
        assert_eq!(c["log.cleanup.policy"], "delete,compact");
        apply_incremental(
            RESOURCE_BROKER,
            &mut c,
            "sasl.kerberos.principal.to.local.rules",
            OP_APPEND,
            Some("RULE:[1:$1]"),
        )
        .unwrap();
        assert_eq!(
            c["sasl.kerberos.principal.to.local.rules"],
            "DEFAULT,RULE:[1:$1]"
        );
        let refused = apply_incremental(RESOURCE_BROKER, &mut c, "log.dirs", OP_SET, Some("x"));
        assert_eq!(refused.unwrap_err().0, ErrorCode::INVALID_REQUEST);
    }

    #[test]
    fn described_topic_and_broker_sources() {
        let mut static_config = BrokerConfig::default();
        static_config.set("log.segment.bytes", "2000000");
        let mut image = topic_image(&["t"]);
        set(
            &mut image,
            (RESOURCE_BROKER, ""),
            "log.retention.ms",
            "1000",
        );
        set(
            &mut image,
            (RESOURCE_BROKER, "1"),
            "compression.type",
            "lz4",
        );
        let topic = describe_topic(&static_config, &image, 1, "t", true, false);
        let find = |name: &str| topic.iter().find(|c| c.name == name).unwrap();
        let r = find("retention.ms");
        assert_eq!(r.value.as_deref(), Some("1000"));
        assert_eq!(
            r.config_source,
            ConfigSource::DynamicDefaultBrokerConfig as i8
        );
        assert_eq!(r.synonyms[0].name, "log.retention.ms");
        assert_eq!(r.synonyms.len(), 2);
        assert_eq!(
            find("compression.type").config_source,
            ConfigSource::DynamicBrokerConfig as i8
        );
        assert_eq!(
            find("segment.bytes").config_source,
            ConfigSource::StaticBrokerConfig as i8
        );
        assert_eq!(
            find("flush.ms").config_source,
            ConfigSource::DefaultConfig as i8
        );

        let broker = describe_broker(&static_config, &image, 1, true, false);
        let b = |name: &str| broker.iter().find(|c| c.name == name).unwrap();
        assert!(!b("log.retention.ms").read_only);
        assert!(b("log.dirs").read_only);
        assert_eq!(b("compression.type").value.as_deref(), Some("lz4"));
        // Topic-only configs (no broker key) are not broker configs.
        assert!(broker.iter().all(|c| !c.name.is_empty()));
        assert!(broker
            .iter()
            .all(|c| c.name != "leader.replication.throttled.replicas"));
        let cluster = describe_cluster_default(&image, false);
        assert_eq!(cluster.len(), 1);
        assert_eq!(cluster[0].name, "log.retention.ms");
    }

    /// Every key Kafka 4.1 describes as dynamic on a broker is described so here too, and
    /// a change of it on this broker is taken (the value Kafka itself describes), except
    /// where Kafka refuses it too (the TLS keys without a listener prefix, a class it
    /// cannot load) and `listeners` and `listener.security.protocol.map`, which Rill
    /// refuses with its reason.
    #[test]
    fn every_key_kafka_changes_at_run_time_is_dynamic_here() {
        let static_config = BrokerConfig::default();
        let image = MetadataImage::new();
        let described = describe_broker(&static_config, &image, 1, false, false);
        let broker = (RESOURCE_BROKER, "1".to_string());
        for key in config::KAFKA_DYNAMIC_BROKER_KEYS {
            assert!(
                config::is_dynamic_broker_config(key),
                "{key} is not dynamic"
            );
            let entry = described
                .iter()
                .find(|c| c.name == *key)
                .unwrap_or_else(|| panic!("{key} is not described"));
            assert!(!entry.read_only, "{key} is described read-only");
            // What Kafka's broker describes for it (its default), or a value of its type.
            let value = match (*key, entry.value.as_deref()) {
                ("listeners", _) => "PLAINTEXT://127.0.0.1:9093".to_string(),
                ("sasl.jaas.config", _) => "org.example.Login required;".to_string(),
                (_, Some(v)) => v.to_string(),
                (_, None) => "TLSv1.3".to_string(),
            };
            let new = BTreeMap::from([(key.to_string(), value.clone())]);
            let ops = vec![(key.to_string(), AlterConfigOp::Set, Some(value.clone()))];
            let result = validate_broker_change(&static_config, &image, 1, &broker, &new, &ops);
            // Kafka's `SslConfigs.RECONFIGURABLE_CONFIGS`.
            let per_listener = [
                "ssl.key.password",
                "ssl.keystore.certificate.chain",
                "ssl.keystore.key",
                "ssl.keystore.location",
                "ssl.keystore.password",
                "ssl.keystore.type",
                "ssl.truststore.certificates",
                "ssl.truststore.location",
                "ssl.truststore.password",
                "ssl.truststore.type",
            ];
            let refused = match *key {
                k if per_listener.contains(&k) => {
                    Some("only per-listener using the listener prefix")
                }
                "listeners" | "listener.security.protocol.map" => {
                    Some("opens its listeners at start")
                }
                "ssl.engine.factory.class" => Some("could not be found"),
                _ => None,
            };
            match (refused, result) {
                (None, Ok(())) => {}
                (Some(why), Err((ErrorCode::INVALID_REQUEST, message))) => {
                    assert!(message.contains(why), "{key}: {message}");
                }
                (expected, got) => panic!("{key}={value}: expected {expected:?}, got {got:?}"),
            }
        }
        // A class Rill does not have is not found, as Kafka answers for one it cannot load.
        let ops = vec![(
            "metric.reporters".to_string(),
            AlterConfigOp::Set,
            Some("com.example.Reporter".to_string()),
        )];
        let new = BTreeMap::from([(
            "metric.reporters".to_string(),
            "com.example.Reporter".to_string(),
        )]);
        let e = validate_broker_change(&static_config, &image, 1, &broker, &new, &ops).unwrap_err();
        assert!(
            e.1.contains("Class com.example.Reporter could not be found"),
            "{e:?}"
        );
    }
}
