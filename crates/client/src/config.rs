//! Settings shared by the producer, the consumer and the admin client.
//!
//! Names follow Kafka's configs (`bootstrap.servers`, `request.timeout.ms`, ...) with
//! [`Duration`]s where Kafka has `_ms` integers.

use std::time::Duration;

use crate::security::Security;

/// How to reach the cluster and how long to wait for it.
///
/// ```
/// use std::time::Duration;
/// use rill_client::ClientConfig;
///
/// let config = ClientConfig::new("127.0.0.1:9092,127.0.0.1:9093")
///     .client_id("billing")
///     .request_timeout(Duration::from_secs(5));
/// assert_eq!(config.bootstrap_servers.len(), 2);
/// ```
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// `bootstrap.servers`: where to ask for the cluster's metadata first.
    pub bootstrap_servers: Vec<String>,
    /// `client.id`, sent in every request header.
    pub client_id: String,
    /// `request.timeout.ms`: how long one request may wait for its response.
    pub request_timeout: Duration,
    /// `socket.connection.setup.timeout.ms`.
    pub connect_timeout: Duration,
    /// `retry.backoff.ms`: pause before retrying a failed request.
    pub retry_backoff: Duration,
    /// `metadata.max.age.ms`: metadata older than this is refreshed before use.
    pub metadata_max_age: Duration,
    /// `allow.auto.create.topics`: ask the broker to create unknown topics on metadata
    /// requests (the broker's own `auto.create.topics.enable` decides).
    pub allow_auto_create_topics: bool,
    /// TLS and SASL (`security.protocol`, `ssl.*`, `sasl.*`; see [`crate::security`]).
    pub security: Security,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            bootstrap_servers: vec!["127.0.0.1:9092".into()],
            client_id: "rill-client".into(),
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            retry_backoff: Duration::from_millis(100),
            metadata_max_age: Duration::from_secs(300),
            allow_auto_create_topics: true,
            security: Security::new(),
        }
    }
}

impl ClientConfig {
    /// A config for the comma-separated `host:port` list `bootstrap`.
    pub fn new(bootstrap: &str) -> Self {
        Self {
            bootstrap_servers: bootstrap
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            ..Default::default()
        }
    }

    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = id.into();
        self
    }

    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    pub fn retry_backoff(mut self, backoff: Duration) -> Self {
        self.retry_backoff = backoff;
        self
    }

    pub fn metadata_max_age(mut self, age: Duration) -> Self {
        self.metadata_max_age = age;
        self
    }

    /// Sets a config by its Kafka/librdkafka name: the security keys
    /// ([`crate::security`]), `client.id`, `request.timeout.ms`, `retry.backoff.ms`,
    /// `metadata.max.age.ms`, `socket.connection.setup.timeout.ms`.
    pub fn set(mut self, key: &str, value: &str) -> crate::Result<Self> {
        if self.security.set(key, value)? {
            return Ok(self);
        }
        let ms = || {
            value
                .trim()
                .parse::<u64>()
                .map(Duration::from_millis)
                .map_err(|_| {
                    crate::Error::InvalidConfig(format!("{key}: not milliseconds: {value}"))
                })
        };
        match key {
            "client.id" => self.client_id = value.to_string(),
            "request.timeout.ms" => self.request_timeout = ms()?,
            "retry.backoff.ms" => self.retry_backoff = ms()?,
            "metadata.max.age.ms" => self.metadata_max_age = ms()?,
            "socket.connection.setup.timeout.ms" => self.connect_timeout = ms()?,
            other => {
                return Err(crate::Error::InvalidConfig(format!(
                    "{other} is not a setting this client knows"
                )))
            }
        }
        Ok(self)
    }
}
