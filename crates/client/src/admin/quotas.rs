//! Client quotas on the admin client: AlterClientQuotas (sent to the controller, as
//! Kafka's admin client sends it) and DescribeClientQuotas (any broker answers from its
//! image of the metadata log). An entity is a list of `(entity type, name)`, `None` naming
//! the default entity of its type, as in Kafka's `ClientQuotaEntity`.

use rill_protocol::generated::alter_client_quotas_request::{EntityData, EntryData, OpData};
use rill_protocol::generated::describe_client_quotas_request::ComponentData;
use rill_protocol::generated::{AlterClientQuotasRequest, DescribeClientQuotasRequest};

use super::Admin;
use crate::error::{check, Result};

/// Kafka 4.1 offers versions 0 and 1 of both; 1 is the flexible encoding.
const QUOTAS_VERSION: i16 = 1;

/// A quota entity: `(entity type, name)` pairs, `None` for the type's default.
pub type QuotaEntity = Vec<(String, Option<String>)>;

/// One entity's changes: `(key, Some(value))` sets a quota, `(key, None)` removes it.
pub type QuotaAlteration = (QuotaEntity, Vec<(String, Option<f64>)>);

/// An entity's quotas as described: `(key, value)`.
pub type QuotaValues = Vec<(String, f64)>;

/// How a describe filter component matches its entity type.
#[derive(Debug, Clone, PartialEq)]
pub enum QuotaMatch {
    /// The entity of this name.
    Exact(String),
    /// The default entity of the type.
    Default,
    /// Any entity that has the type.
    Any,
}

impl Admin {
    /// Sets (`Some`) and removes (`None`) quotas of entities (AlterClientQuotas): per
    /// entity, `Ok(())` or the error the controller gave it.
    pub async fn alter_client_quotas(
        &self,
        alterations: &[QuotaAlteration],
        validate_only: bool,
    ) -> Result<Vec<(QuotaEntity, Result<()>)>> {
        let request = AlterClientQuotasRequest {
            entries: alterations
                .iter()
                .map(|(entity, ops)| EntryData {
                    entity: entity
                        .iter()
                        .map(|(t, n)| EntityData {
                            entity_type: t.clone(),
                            entity_name: n.clone(),
                            ..Default::default()
                        })
                        .collect(),
                    ops: ops
                        .iter()
                        .map(|(key, value)| OpData {
                            key: key.clone(),
                            value: value.unwrap_or(0.0),
                            remove: value.is_none(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            validate_only,
            ..Default::default()
        };
        let response = self.send_controller(&request, QUOTAS_VERSION).await?;
        Ok(response
            .entries
            .into_iter()
            .map(|e| {
                let entity: QuotaEntity = e
                    .entity
                    .into_iter()
                    .map(|d| (d.entity_type, d.entity_name))
                    .collect();
                let message = e.error_message;
                let outcome = check(e.error_code, || match message {
                    Some(m) => format!("altering client quotas: {m}"),
                    None => "altering client quotas".to_string(),
                });
                (entity, outcome)
            })
            .collect())
    }

    /// The entities the filter matches and their quotas (DescribeClientQuotas); with
    /// `strict`, only entities that have no entity type beyond the filter's.
    pub async fn describe_client_quotas(
        &self,
        filter: &[(String, QuotaMatch)],
        strict: bool,
    ) -> Result<Vec<(QuotaEntity, QuotaValues)>> {
        let request = DescribeClientQuotasRequest {
            components: filter
                .iter()
                .map(|(t, m)| {
                    let (match_type, name) = match m {
                        QuotaMatch::Exact(n) => (0, Some(n.clone())),
                        QuotaMatch::Default => (1, None),
                        QuotaMatch::Any => (2, None),
                    };
                    ComponentData {
                        entity_type: t.clone(),
                        match_type,
                        r#match: name,
                        ..Default::default()
                    }
                })
                .collect(),
            strict,
            ..Default::default()
        };
        let response = self.net.send_any(&request, QUOTAS_VERSION).await?;
        let message = response.error_message;
        check(response.error_code, || match message {
            Some(m) => format!("describing client quotas: {m}"),
            None => "describing client quotas".to_string(),
        })?;
        Ok(response
            .entries
            .unwrap_or_default()
            .into_iter()
            .map(|e| {
                let entity = e
                    .entity
                    .into_iter()
                    .map(|d| (d.entity_type, d.entity_name))
                    .collect();
                let values = e.values.into_iter().map(|v| (v.key, v.value)).collect();
                (entity, values)
            })
            .collect())
    }
}
