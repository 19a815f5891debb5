//! Produce v13 (KIP-516) names each topic by its id instead of its name. The request is
//! turned back into names before anything else looks at it, so that authorization, quotas
//! and the append path stay as they are; a topic whose id this broker does not know is
//! taken out and answered UNKNOWN_TOPIC_ID, before authorization, as Kafka 4.1 answers it.
//! The returned patch writes every answered topic's id into the response, which carries
//! ids only at this version.

use std::collections::BTreeMap;

use rill_metadata::MetadataImage;
use rill_protocol::generated::produce_request::ProduceRequest;
use rill_protocol::generated::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use rill_protocol::generated::ResponseBody;
use rill_protocol::{ErrorCode, Uuid};

use super::request_authorization::Patch;

/// Names the topics of a v13 `request` by their ids (see the module's docs).
pub(crate) fn resolve(image: &MetadataImage, request: &mut ProduceRequest) -> Patch {
    let mut ids: BTreeMap<String, Uuid> = BTreeMap::new();
    let mut unknown = Vec::new();
    request
        .topic_data
        .retain_mut(|topic| match image.topics.get(&topic.topic_id) {
            Some(known) => {
                topic.name = known.name.clone();
                ids.insert(known.name.clone(), topic.topic_id);
                true
            }
            None => {
                unknown.push(TopicProduceResponse {
                    topic_id: topic.topic_id,
                    partition_responses: topic
                        .partition_data
                        .iter()
                        .map(|p| PartitionProduceResponse {
                            index: p.index,
                            error_code: ErrorCode::UNKNOWN_TOPIC_ID.code(),
                            base_offset: -1,
                            log_append_time_ms: -1,
                            log_start_offset: -1,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                });
                false
            }
        });
    Box::new(move |body: &mut ResponseBody| {
        if let ResponseBody::Produce(response) = body {
            for topic in &mut response.responses {
                if let Some(id) = ids.get(&topic.name) {
                    topic.topic_id = *id;
                }
            }
            response.responses.extend(unknown);
        }
    })
}

#[cfg(test)]
mod tests {
    use rill_metadata::TopicImage;
    use rill_protocol::generated::produce_request::{PartitionProduceData, TopicProduceData};
    use rill_protocol::generated::produce_response::ProduceResponse;

    use super::*;

    #[test]
    fn known_ids_become_names_and_unknown_ones_are_answered_unknown_topic_id() {
        let known = Uuid([7; 16]);
        let missing = Uuid([9; 16]);
        let mut image = MetadataImage::default();
        image.topics.insert(
            known,
            TopicImage {
                name: "orders".into(),
                id: known,
                partitions: Default::default(),
            },
        );
        image.topics_by_name.insert("orders".into(), known);
        let topic = |id| TopicProduceData {
            topic_id: id,
            partition_data: vec![PartitionProduceData {
                index: 2,
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut request = ProduceRequest {
            topic_data: vec![topic(known), topic(missing)],
            ..Default::default()
        };
        let patch = resolve(&image, &mut request);
        assert_eq!(request.topic_data.len(), 1);
        assert_eq!(request.topic_data[0].name, "orders");
        // The handler answers by name; the patch adds the ids and the unknown topic.
        let mut body = ResponseBody::from(ProduceResponse {
            responses: vec![TopicProduceResponse {
                name: "orders".into(),
                ..Default::default()
            }],
            ..Default::default()
        });
        patch(&mut body);
        let ResponseBody::Produce(response) = body else {
            panic!("not a produce response");
        };
        assert_eq!(response.responses[0].topic_id, known);
        assert_eq!(response.responses[1].topic_id, missing);
        assert_eq!(
            response.responses[1].partition_responses[0].error_code,
            ErrorCode::UNKNOWN_TOPIC_ID.code()
        );
        assert_eq!(response.responses[1].partition_responses[0].index, 2);
    }
}
