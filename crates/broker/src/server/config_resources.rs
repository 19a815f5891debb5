//! ListConfigResources (api key 74; Kafka 4.0 called it ListClientMetricsResources): the
//! config resources an operator can describe. Version 0 lists the client metrics
//! subscriptions only; version 1 (KIP-1142) lists every resource type it is asked for, all
//! of them when it is asked for none, and refuses a type it does not know with
//! UNSUPPORTED_VERSION, as Kafka 4.1 does.

use rill_metadata::{
    MetadataImage, RESOURCE_BROKER, RESOURCE_CLIENT_METRICS, RESOURCE_GROUP, RESOURCE_TOPIC,
};
use rill_protocol::generated::list_config_resources_request::ListConfigResourcesRequest;
use rill_protocol::generated::list_config_resources_response::{
    ConfigResource, ListConfigResourcesResponse,
};
use rill_protocol::ErrorCode;

use super::client_metrics;

/// Kafka's `ConfigResource.Type.BROKER_LOGGER`: a broker's log levels, named by its id.
const RESOURCE_BROKER_LOGGER: i8 = 8;

/// What version 1 lists when the request names no type, in Kafka's order.
const ALL_TYPES: [i8; 5] = [
    RESOURCE_TOPIC,
    RESOURCE_BROKER,
    RESOURCE_BROKER_LOGGER,
    RESOURCE_CLIENT_METRICS,
    RESOURCE_GROUP,
];

/// The answer to `request` at `version` (authorization is checked before).
pub fn list(
    image: &MetadataImage,
    request: &ListConfigResourcesRequest,
    version: i16,
) -> ListConfigResourcesResponse {
    let types: Vec<i8> = if version == 0 {
        vec![RESOURCE_CLIENT_METRICS]
    } else if request.resource_types.is_empty() {
        ALL_TYPES.to_vec()
    } else {
        request.resource_types.clone()
    };
    if types.iter().any(|t| !ALL_TYPES.contains(t)) {
        return ListConfigResourcesResponse {
            error_code: ErrorCode::UNSUPPORTED_VERSION.code(),
            ..Default::default()
        };
    }
    let mut resources = Vec::new();
    let mut add = |resource_type: i8, name: &str| {
        resources.push(ConfigResource {
            resource_name: name.to_string(),
            resource_type,
            ..Default::default()
        })
    };
    for resource_type in ALL_TYPES.into_iter().filter(|t| types.contains(t)) {
        match resource_type {
            RESOURCE_TOPIC => image
                .topics_by_name
                .keys()
                .for_each(|name| add(resource_type, name)),
            RESOURCE_BROKER | RESOURCE_BROKER_LOGGER => image
                .brokers
                .values()
                .filter(|b| !b.fenced)
                .for_each(|b| add(resource_type, &b.id.to_string())),
            RESOURCE_CLIENT_METRICS => {
                client_metrics::names(image).for_each(|name| add(resource_type, name))
            }
            // The groups with dynamic configs: a group's configs outlive its members.
            RESOURCE_GROUP => image
                .configs
                .keys()
                .filter(|(t, _)| *t == RESOURCE_GROUP)
                .for_each(|(_, name)| add(resource_type, name)),
            _ => {}
        }
    }
    ListConfigResourcesResponse {
        config_resources: resources,
        ..Default::default()
    }
}
