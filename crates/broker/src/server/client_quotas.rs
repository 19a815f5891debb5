//! DescribeClientQuotas (answered from this broker's image) and AlterClientQuotas (decided
//! by the controller, which writes `ClientQuotaRecord`s): the quotas that
//! [`super::quotas`] enforces.

use rill_metadata::client_quotas::{describe_client_quotas, QuotaEntity, QuotaFilterComponent};
use rill_metadata::{
    AlterClientQuotasRequest as CtlAlter, ClientQuotaAlteration, ControllerEvent,
    ControllerResponse,
};
use rill_protocol::generated::alter_client_quotas_request::AlterClientQuotasRequest;
use rill_protocol::generated::alter_client_quotas_response::{self, AlterClientQuotasResponse};
use rill_protocol::generated::describe_client_quotas_request::DescribeClientQuotasRequest;
use rill_protocol::generated::describe_client_quotas_response::{
    DescribeClientQuotasResponse, EntityData, EntryData, ValueData,
};
use rill_protocol::ErrorCode;

use crate::server::Broker;

fn response_entity(entity: &QuotaEntity) -> Vec<alter_client_quotas_response::EntityData> {
    entity
        .iter()
        .map(|(t, n)| alter_client_quotas_response::EntityData {
            entity_type: t.clone(),
            entity_name: n.clone(),
            ..Default::default()
        })
        .collect()
}

impl Broker {
    pub(crate) fn handle_describe_client_quotas(
        &self,
        request: DescribeClientQuotasRequest,
    ) -> DescribeClientQuotasResponse {
        let components: Vec<QuotaFilterComponent> = request
            .components
            .into_iter()
            .map(|c| QuotaFilterComponent {
                entity_type: c.entity_type,
                match_type: c.match_type,
                r#match: c.r#match,
            })
            .collect();
        match describe_client_quotas(&self.image(), &components, request.strict) {
            Ok(entries) => DescribeClientQuotasResponse {
                entries: Some(
                    entries
                        .into_iter()
                        .map(|(entity, values)| EntryData {
                            entity: entity
                                .into_iter()
                                .map(|(entity_type, entity_name)| EntityData {
                                    entity_type,
                                    entity_name,
                                    ..Default::default()
                                })
                                .collect(),
                            values: values
                                .into_iter()
                                .map(|(key, value)| ValueData {
                                    key,
                                    value,
                                    ..Default::default()
                                })
                                .collect(),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            },
            Err((code, message)) => DescribeClientQuotasResponse {
                error_code: code.code(),
                error_message: Some(message),
                entries: None,
                ..Default::default()
            },
        }
    }

    pub(crate) async fn handle_alter_client_quotas(
        &self,
        request: AlterClientQuotasRequest,
    ) -> AlterClientQuotasResponse {
        let entries: Vec<ClientQuotaAlteration> = request
            .entries
            .into_iter()
            .map(|e| ClientQuotaAlteration {
                // A type named twice keeps its last name, as Kafka's map does.
                entity: e
                    .entity
                    .into_iter()
                    .map(|d| (d.entity_type, d.entity_name))
                    .collect(),
                ops: e
                    .ops
                    .into_iter()
                    .map(|o| (o.key, (!o.remove).then_some(o.value)))
                    .collect(),
            })
            .collect();
        let entities: Vec<QuotaEntity> = entries.iter().map(|e| e.entity.clone()).collect();
        let event = ControllerEvent::AlterClientQuotas(CtlAlter {
            entries,
            validate_only: request.validate_only,
        });
        let failed = |code: ErrorCode| {
            let mut seen: Vec<&QuotaEntity> = Vec::new();
            entities
                .iter()
                .filter(|e| {
                    let first = !seen.contains(e);
                    seen.push(e);
                    first
                })
                .map(|e| alter_client_quotas_response::EntryData {
                    error_code: code.code(),
                    error_message: Some(code.name().to_string()),
                    entity: response_entity(e),
                    ..Default::default()
                })
                .collect()
        };
        let entries = match self.controller_call(event).await {
            Ok(ControllerResponse::AlterClientQuotas(results)) => results
                .into_iter()
                .map(|r| alter_client_quotas_response::EntryData {
                    error_code: r.error_code.code(),
                    error_message: r.error_message,
                    entity: response_entity(&r.entity),
                    ..Default::default()
                })
                .collect(),
            Ok(_) => failed(ErrorCode::UNKNOWN_SERVER_ERROR),
            Err(code) => failed(code),
        };
        AlterClientQuotasResponse {
            entries,
            ..Default::default()
        }
    }
}
